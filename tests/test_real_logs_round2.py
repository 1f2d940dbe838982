"""Issue 57 ("Real logs, second round"): what the edge enforces for traffic unlike anything the
model learnt. Tiny hand-made frames, each case as the issue saw it on real logs."""
from __future__ import annotations

import random

import pytest

from ccselect.settings import PrefixLadder
from ccselect.export.tables import aggregate as agg

pytestmark = pytest.mark.filterwarnings("ignore")


def _both(spark, rows, settings):
    """The reference's entries, checked equal to the export job's (Arrow) and to the DataFrame
    ladder's (evaluation/emulate.py's) over the same rows."""
    ref = agg.reference_aggregate(rows, settings)
    preds = spark.createDataFrame(
        [(f"c{i}", ip, cc, (r[3] if len(r) > 3 else "model"), "cubic", int(req), "h0")
         for i, r in enumerate(rows) for ip, cc, req in [r[:3]]],
        "conn_id string, client_ip string, cc string, decision string, default_cc string, requests long, hour string")
    assert agg.spark_aggregate(agg.address_decisions(preds), settings) == ref
    by = ("hour",)
    frame = agg.ladder_entries(agg.model_weights(agg.address_decisions(preds, by), by), settings, by)
    got = sorted((agg.Aggregated(agg.key_network(r["fam"], r["level"], r["key"]), r["cc"], r["weight"],
                                 r["top_weight"], r["requests"], r["passed"]) for r in frame.collect()),
                 key=lambda a: (a.family, int(a.network.network_address), a.network.prefixlen))
    assert got == ref
    return {str(a.network): a.cc for a in ref}


# ---- item 2: one connection makes no /16 -----------------------------------------------------
def test_a_16_from_one_connection_is_refused(spark):
    """65.182.0.0/16 → bbr came from a single upload test: the default support refuses the /16
    and /24; the address keeps its own /32."""
    got = _both(spark, [("65.182.7.9", "bbr", 1)], PrefixLadder())
    assert got == {"65.182.7.9/32": "bbr"}


def test_support_counts_connections_and_distinct_clients(spark):
    s = PrefixLadder(min_support={"v4": {16: [6, 3], 24: [0, 0], 32: [0, 0]}})
    many_conns_one_client = [("81.20.1.1", "bbr", 1)] * 10
    assert _both(spark, many_conns_one_client, s) == {"81.20.1.0/24": "bbr"}
    three_clients = [(f"81.20.{i}.1", "bbr", 1) for i in range(3)] * 2
    assert _both(spark, three_clients, s) == {"81.20.0.0/16": "bbr"}
    assert _both(spark, three_clients[:5], s) == {f"81.20.{i}.0/24": "bbr" for i in range(3)}   # 5 < 6


def test_last_level_below_support_is_no_entry(spark):
    s = PrefixLadder(min_support={"v4": {16: [5, 2], 24: [5, 2], 32: [2, 1]}})
    assert _both(spark, [("81.20.1.1", "bbr", 1)], s) == {}


# ---- item 1: the table does not override the guard -----------------------------------------
def test_ood_rows_under_an_entry_lower_its_purity(spark):
    """35.225.0.0/16 → bbr came from 49 model rows and covered 96 OOD rows of the same address:
    with the OOD rows counted, the address's majority is the default — no entry covers it."""
    rows = [("35.225.1.1", "bbr", 1)] * 49 + [("35.225.1.1", "bbr", 1, "ood")] * 96
    rows += [(f"35.225.2.{i}", "bbr", 1) for i in range(1, 30)]    # a clean /24 beside it
    got = _both(spark, rows, PrefixLadder())
    assert got == {"35.225.2.0/24": "bbr"}, got


def test_a_declined_majority_prefix_ends_the_descent(spark):
    """A /16 that is 96% fallback passes as declined: no entry, and none of its /24s or /32s
    (the few model rows under it go to the default too)."""
    rows = [(f"9.9.{i}.{j}", "cubic", 1, "fallback") for i in range(8) for j in range(1, 13)]
    rows += [("9.9.0.1", "bbr", 1)] * 4
    assert _both(spark, rows, PrefixLadder()) == {}


@pytest.mark.parametrize("seed", [3, 4])
def test_three_ladders_agree_with_declined_rows_and_default_support(spark, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(300):
        ip = f"81.{20 + rng.randrange(2)}.{rng.randrange(4)}.{rng.randrange(1, 6)}"
        cc = rng.choice(("bbr", "cubic"))
        rows.append((ip, cc, rng.randrange(0, 20)) + ((rng.choice(("ood", "fallback")),) if rng.random() < 0.2 else ()))
    _both(spark, rows, PrefixLadder())


# ---- item 3: too little evidence is not decided by the model -------------------------------
def test_thin_connections_get_the_evidence_decision_in_both_engines(spark):
    """Monitoring probes (7 segments, 6 kB, 0 bytes acknowledged, a 5 ms life) keep the default
    CC with decision "evidence", before the guard and the thresholds; the Spark decision and the
    Arrow engine's agree row by row. A missing value is not judged."""
    import numpy as np
    import pyarrow as pa

    from ccselect.settings import InferSettings
    from ccselect.models.infer import decide
    from ccselect.models.infer_arrow import decide_arrays, thin_rows
    p = InferSettings(min_data_segs=8, min_bytes_acked=10_000, min_duration_us=20_000)
    rows = [  # p_wifi, ood, data_segs_out, bytes_acked, duration_us → decision
        (0.95, False, 400, 500_000, 3_000_000, "model"),
        (0.95, False, 7, 6_000, 3_000_000, "evidence"),     # the probes' median
        (0.10, False, 400, 0, 3_000_000, "evidence"),       # nothing acknowledged
        (0.95, False, 400, 500_000, 5_000, "evidence"),     # 5 ms
        (0.95, True, 3, 500_000, 3_000_000, "evidence"),    # evidence before the guard
        (0.95, True, 400, 500_000, 3_000_000, "ood"),
        (0.70, False, 400, 500_000, 3_000_000, "fallback"),
        (0.95, False, None, None, None, "model"),           # not known: not judged
    ]
    df = spark.createDataFrame([(i, *r[:5]) for i, r in enumerate(rows)],
                               "id int, p_wifi double, ood boolean, data_segs_out long, bytes_acked long, duration_us long")
    got = {r["id"]: (r["decision"], r["cc"]) for r in decide(df, p).collect()}
    want = {i: (r[5], "cubic" if r[5] != "model" else ("cubic" if r[0] >= 0.5 else "bbr")) for i, r in enumerate(rows)}
    assert got == want
    rb = pa.RecordBatch.from_pydict({c: [r[j] for r in rows] for j, c in
                                     [(2, "data_segs_out"), (3, "bytes_acked"), (4, "duration_us")]})
    d = decide_arrays(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), p, thin_rows(rb, p))
    labels = ["model", "fallback", "ood", "evidence"]
    assert [labels[c] for c in d["decision"]] == [r[5] for r in rows]
    assert [[p.default_cc, p.wifi_cc, p.cell_cc][c] for c in d["cc"]] == [want[i][1] for i in range(len(rows))]


def test_a_mostly_imputed_row_is_out_of_domain_in_both_engines(spark):
    """Under `impute`, a record with none of the twelve features sat at the training mean (z = 0,
    the guard's centre) and was decided model/cubic: more than `ood_max_imputed` imputed
    features make it "ood"; the three send-window fields alone do not."""
    import numpy as np
    import pyarrow as pa

    from ccselect.contract import FEATURES
    from ccselect.settings import InferSettings
    from ccselect.models.infer import decide
    from ccselect.models.infer_arrow import decide_arrays, over_imputed
    p = InferSettings()
    window = ["init_snd_wnd_bytes", "max_snd_wnd_bytes", "min_snd_wnd_bytes"]
    imputed = [[], window, window + ["mss_bytes"], list(FEATURES), None]
    want = ["model", "model", "ood", "ood", "model"]
    df = spark.createDataFrame([(i, 0.9, False, v) for i, v in enumerate(imputed)],
                               "id int, p_wifi double, ood boolean, imputed array<string>")
    got = {r["id"]: (r["decision"], r["cc"]) for r in decide(df, p).collect()}
    assert got == {i: (w, "cubic") for i, w in enumerate(want)}
    rb = pa.RecordBatch.from_pydict({"imputed": pa.array(imputed, pa.list_(pa.string()))})
    d = decide_arrays(np.full(len(imputed), 0.9), np.zeros(len(imputed), bool) | over_imputed(rb, p), p)
    assert [["model", "fallback", "ood", "evidence"][c] for c in d["decision"]] == want


# ---- item 6: milliseconds on long paths ------------------------------------------------------
def _units(**kw):
    row = {"source_file": "f.jsonl", "n": 40, "median_min_rtt_us": 173_000, "median_min_srtt_us": 180_000,
           "median_max_srtt_us": 260_000, "median_min_rto_us": 376_000, "median_handshake_ratio": 1.04,
           "mss_min": 1448, "mss_max": 1460}
    return {**row, **kw}


def test_rtt_in_ms_is_flagged_on_long_paths():
    """Intercontinental medians written in ms (173–280) were above the 50 µs median rule: the
    handshake ratio and Linux's 200 ms RTO floor flag them; the same path in µs is not flagged."""
    from ccselect.jobs.validate import suspicious_transport
    assert suspicious_transport(_units()) == []
    every_rtt_in_ms = _units(median_min_rtt_us=173, median_min_srtt_us=180, median_max_srtt_us=260,
                             median_min_rto_us=376)
    rtt_in_ms_beside_us = _units(median_min_rtt_us=173, median_min_srtt_us=180, median_max_srtt_us=260,
                                 median_handshake_ratio=1000.0)
    for row in (every_rtt_in_ms, rtt_in_ms_beside_us):
        assert [s["check"] for s in suspicious_transport(row)] == ["rtt_in_ms"], row


# ---- items 7-8: the missing reference file, and the setting that would accept ----------------
def test_validate_reports_the_missing_reference_and_the_setting_that_accepts(spark, small_fleet, tmp_path):
    import json
    import shutil

    from ccselect.jobs import validate
    from ccselect.jobs.sources import discover
    from test_validate import _lines, _write
    fleet_dir = small_fleet[0]
    tf = next(f for f in discover(fleet_dir) if f.stream == "transport")
    recs = _lines(tf.path)[:20]
    no_wnd = [{k: v for k, v in r.items() if k not in ("init_snd_wnd_bytes", "min_snd_wnd_bytes")} for r in recs[:2]]
    _write(tmp_path / "logs" / "transport" / tf.node_id / f"{tf.hour}.jsonl", recs[2:] + no_wnd)
    report = validate.run(spark, str(tmp_path / "logs"))
    assert report["streams"]["transport"]["quarantined"] == 2
    ref = str(tmp_path / "logs" / "reference" / "ip_asn_region.csv")
    assert report["missing_reference"] == ref
    assert any(p.startswith(f"missing {ref}") for p in report["problems"]), report["problems"]
    assert report["hints"] and "ingest.missing_features: impute would accept the 2 line(s)" in report["hints"][0]
    json.dumps(report)
    shutil.copytree(f"{fleet_dir}/reference", tmp_path / "logs" / "reference")
    again = validate.run(spark, str(tmp_path / "logs"), missing_features="impute")
    assert again["missing_reference"] is None and again["hints"] == [] and again["problems"] == []


# ---- item 8: Spark's dependency chatter ------------------------------------------------------
def test_a_fresh_session_prints_no_dependency_resolution(tmp_path):
    """A new process's first session (a JVM start, spark-submit resolving Delta's packages): its
    stderr has none of the resolution's lines (about 90 before, and still with CCS_SPARK_VERBOSE=1)."""
    import os
    import subprocess
    import sys
    script = ("import sys; sys.path[:0] = ['.', 'tests']\n"
              "from pathlib import Path\n"
              "from ccs_testing import write_config\n"
              "from ccselect.config import load_config\n"
              "from ccselect.spark import get_spark\n"
              f"s = get_spark(load_config(write_config(Path({str(tmp_path)!r}))), app_name='quiet')\n"
              "print(s.range(3).count())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CCS_SPARK_VERBOSE", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("3")
    assert ":: resolving dependencies" not in done.stderr and "ivysettings" not in done.stderr, done.stderr[:2000]
