"""Issue 57 ("Real logs, second round"), what round 2 left open: impute only what the configuration
names (a record missing more is quarantined naming exactly the fields at fault; one with none of
the twelve features, or without `mss_bytes`, is not scored at the training mean); ingest reports
a missing reference file; gold.predictions' decisions include `evidence`; validate's hints name
the setting that would accept what it refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES
from ccselect.jobs.parse import imputable, parse
from test_ingest_parse import _DROP, expect, lines_df, transport

pytestmark = pytest.mark.filterwarnings("ignore")

SEND_WINDOW = ("init_snd_wnd_bytes", "max_snd_wnd_bytes", "min_snd_wnd_bytes")
NOT_IMPUTABLE = tuple(f for f in FEATURES if f not in SEND_WINDOW)


def _reasons(spark, raws, impute):
    return parse(lines_df(spark, "transport", raws), "transport", impute).select("line_no", "status", "reason")


def _lines():
    drop = lambda *fs: {f: _DROP for f in fs}   # noqa: E731
    return [json.dumps(transport(conn_id="sw", **drop(*SEND_WINDOW))),                     # tcp_info before 6.2
            json.dumps(transport(conn_id="acked", **drop(*SEND_WINDOW, "bytes_acked"))),   # the line
            json.dumps(transport(conn_id="none", **drop(*FEATURES))),                     # none of the twelve
            json.dumps(transport(conn_id="mss", **drop("mss_bytes"))),
            json.dumps(transport(conn_id="ok"))]


# ---- item 1: impute only what the configuration names --------------------------------------------
def test_impute_accepts_only_the_send_window_by_default(spark):
    """Under `missing_features: impute` with the default `imputable_features`, the send window may
    be missing; a line missing `bytes_acked` too is quarantined naming `bytes_acked` alone (it
    listed the imputable send-window fields as if they were at fault); a record with none of the
    twelve features, or without `mss_bytes`, is quarantined (it was accepted and scored at the
    training mean: p_wifi 0.997, model/cubic)."""
    impute = imputable("impute", "transport")
    assert set(impute) == set(SEND_WINDOW)
    assertDataFrameEqual(_reasons(spark, _lines(), impute), expect(spark, [
        None, "missing_key:bytes_acked", "missing_key:" + ",".join(NOT_IMPUTABLE), "missing_key:mss_bytes", None]))
    # under quarantine every missing field is at fault, and named
    assertDataFrameEqual(_reasons(spark, _lines(), imputable("quarantine", "transport")), expect(spark, [
        "missing_key:" + ",".join(SEND_WINDOW), "missing_key:" + ",".join(SEND_WINDOW + ("bytes_acked",)),
        "missing_key:" + ",".join(FEATURES), "missing_key:mss_bytes", None]))
    rec = parse(lines_df(spark, "transport", _lines()[:1]), "transport", impute).first()["record"]
    assert all(rec[f] is None for f in SEND_WINDOW) and rec["mss_bytes"] == 1448


def test_imputable_features_is_the_configured_list(spark, tmp_path):
    from ccselect.config import load_config
    from ccselect.settings import IngestSettings
    from ccs_testing import write_config
    from ccselect.jobs.parse import imputable_of
    only_mss = imputable("impute", "transport", ("mss_bytes",))
    assertDataFrameEqual(_reasons(spark, _lines(), only_mss), expect(spark, [
        "missing_key:" + ",".join(SEND_WINDOW), "missing_key:" + ",".join(SEND_WINDOW + ("bytes_acked",)),
        "missing_key:" + ",".join(f for f in FEATURES if f != "mss_bytes"), None, None]))
    assert imputable("impute", "access", ("mss_bytes",)) == () and imputable("quarantine", "transport") == ()
    with pytest.raises(ValueError, match="imputable_features"):
        IngestSettings(imputable_features=("bytes_acked",))          # an outcome is never imputed
    cfg = load_config(write_config(tmp_path, ingest={"missing_features": "impute",
                                                     "imputable_features": ["min_rto_us"]}))
    assert imputable_of(cfg.settings.ingest, "transport") == ("min_rto_us",)


# ---- items 1 and 4: validate's hints name the setting, exactly ---------------------------------
def _folder(root: Path, records: list[dict]) -> Path:
    from test_real_logs import HOUR, _t
    d = root / "logs"
    (d / "transport" / "n1").mkdir(parents=True)
    (d / "transport" / "n1" / f"{HOUR}.jsonl").write_text(
        "".join(json.dumps(_t(**r)) + "\n" for r in records))
    return d


def test_validate_hints_name_the_setting_that_would_accept(spark, tmp_path):
    """Two lines without the send window, one without min_rtt_us and min_srtt_us, one with none of
    the twelve features: `missing_features: impute` accepts the first two only; the others need
    `imputable_features`, and the featureless one would be scored ood even then."""
    from ccselect.jobs import validate
    drop = lambda *fs: {f: _DROP for f in fs}   # noqa: E731
    logs = _folder(tmp_path, [dict(conn_id="a", **drop(*SEND_WINDOW)), dict(conn_id="b", **drop(*SEND_WINDOW)),
                              dict(conn_id="c", **drop("min_rtt_us", "min_srtt_us")),
                              dict(conn_id="d", **drop(*FEATURES)), dict(conn_id="e")])
    strict = validate.run(spark, str(logs))
    assert strict["streams"]["transport"]["quarantined"] == 4
    assert len(strict["hints"]) == 2, strict["hints"]
    assert "ingest.missing_features: impute would accept the 2 line(s)" in strict["hints"][0]
    rest = strict["hints"][1]
    assert rest.startswith("transport: ingest.imputable_features with " + ", ".join(NOT_IMPUTABLE) + " added")
    assert "would accept the 2 line(s)" in rest and "at least 1 of them" in rest, rest

    imputing = validate.run(spark, str(logs), missing_features="impute")
    assert imputing["streams"]["transport"]["by_reason"] == {
        "missing_key:min_rtt_us,min_srtt_us": 1, "missing_key:" + ",".join(NOT_IMPUTABLE): 1}
    assert len(imputing["hints"]) == 1 and "would accept the 2 line(s)" in imputing["hints"][0]
    assert imputing["hints"][0].startswith("transport: ingest.imputable_features with " + ", ".join(NOT_IMPUTABLE))
    assert "init_snd_wnd_bytes" not in imputing["hints"][0]       # already imputable: not at fault


# ---- item 2: ingest reports a missing reference -------------------------------------------------
def test_ingest_reports_the_missing_reference(spark, tmp_path):
    """Without `reference/ip_asn_region.csv` every silver row's ug_id is null; ingest's result
    says so (it was only validate's to say). With the file there, the result is clean and the
    ug_id is filled."""
    from ccselect.config import load_config
    from ccselect.lake import table_path
    from ccs_testing import write_config
    from ccselect.jobs import ingest
    logs = _folder(tmp_path, [dict(conn_id="a", client_ip="10.1.2.3"), dict(conn_id="b", client_ip="10.9.9.9")])
    (tmp_path / "lake").mkdir()
    cfg = load_config(write_config(tmp_path / "lake"))
    result = ingest.run(spark, cfg, str(logs))
    ref = str(logs / "reference" / "ip_asn_region.csv")
    assert result["missing_reference"] == ref
    assert len(result["warnings"]) == 1 and result["warnings"][0].startswith(f"missing {ref}: ")
    assert "ug_id is null" in result["warnings"][0]
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    assert [r["ug_id"] for r in silver.collect()] == [None, None]

    (logs / "reference").mkdir()
    Path(ref).write_text("cidr,asn,isp,region\n10.1.2.0/24,64500,isp1,r1\n")
    again = ingest.run(spark, cfg, str(logs))
    assert again["missing_reference"] is None and again["warnings"] == []
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    assert {r["conn_id"]: r["ug_id"] for r in silver.collect()} == {"a": "r1-AS64500", "b": None}


# ---- item 3: the evidence rule's decision is in the contract ------------------------------------
def test_prediction_decisions_are_what_inference_writes(spark):
    """`evidence` (the minimum-evidence rule's decision) was missing from PREDICTION_DECISIONS and
    from docs/contract.md, though both inference engines write it."""
    from ccselect.contract import PREDICTION_DECISIONS
    from ccselect.settings import InferSettings
    from ccselect.models.infer import decide, evidence_minima
    p = InferSettings()
    cols = list(evidence_minima(p))
    rows = [(0.99, False) + tuple(10 ** 9 for _ in cols), (0.6, False) + tuple(10 ** 9 for _ in cols),
            (0.99, True) + tuple(10 ** 9 for _ in cols), (0.99, False) + tuple(0 for _ in cols)]
    df = spark.createDataFrame(rows, "p_wifi double, ood boolean, " + ", ".join(f"{c} bigint" for c in cols))
    got = [r["decision"] for r in decide(df, p).collect()]
    assert got == ["model", "fallback", "ood", "evidence"]
    assert set(got) <= set(PREDICTION_DECISIONS)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "contract.md").read_text()
    for d in PREDICTION_DECISIONS:
        assert f"| `{d}` |" in doc, d
