"""The purity aggregation (ALICCS Algorithm 1 generalized to a ladder per family): Algorithm 1's
own examples on hand-made inputs, hypothesis properties of the reference version, and the Spark
job checked against the reference."""
from __future__ import annotations

import dataclasses
import ipaddress
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ccselect.settings import PrefixLadder
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables import aggregate as agg

SETTINGS = PrefixLadder(
    ladder={"v4": [16, 24, 32], "v6": [32, 48, 64, 128]},
    purity={"v4": {16: [[0, 0.9], [50, 0.97]], 24: [[0, 0.8], [50, 0.95]]},
            "v6": {32: [[0, 0.9]], 48: [[0, 0.85], [40, 0.95]], 64: [[0, 0.8]]}},
    # Algorithm 1's own behaviour without the minimum support (tested on its own below)
    min_support={"v4": {lv: [0, 0] for lv in (16, 24, 32)}, "v6": {lv: [0, 0] for lv in (32, 48, 64, 128)}},
)


def _rows(spec):
    """[(ip, cc, n_conns, requests_each)] → rows of (ip, cc, requests)."""
    return [(ip, cc, r) for ip, cc, n, r in spec for _ in range(n)]


def _by_net(aggs):
    return {str(a.network): a for a in aggs}


# ---- Algorithm 1's own behaviour ---------------------------------------------------------
def test_pure_16_stays_one_entry():
    rows = _rows([("81.20.1.5", "bbr", 10, 3), ("81.20.7.9", "bbr", 5, 2), ("81.20.200.1", "bbr", 4, 1)])
    got = _by_net(agg.reference_aggregate(rows, SETTINGS))
    assert list(got) == ["81.20.0.0/16"], f"a pure /16 must be one entry, got {list(got)}"
    e = got["81.20.0.0/16"]
    assert (e.cc, e.purity, e.requests, e.passed) == ("bbr", 1.0, 44, True), e


def test_impure_16_splits_into_24s():
    # /16 purity 30/40 = 0.75 < 0.9 → each /24 is pure → two /24 entries, no /16
    rows = _rows([("81.20.1.5", "bbr", 10, 3), ("81.20.2.9", "cubic", 5, 2)])
    got = _by_net(agg.reference_aggregate(rows, SETTINGS))
    assert set(got) == {"81.20.1.0/24", "81.20.2.0/24"}, list(got)
    assert got["81.20.1.0/24"].cc == "bbr" and got["81.20.2.0/24"].cc == "cubic"


def test_impure_24_splits_into_32s():
    # /16 impure, 81.20.1.0/24 impure (0.5) → /32s; 81.20.3.0/24 pure → stays a /24
    rows = _rows([("81.20.1.5", "bbr", 4, 1), ("81.20.1.6", "cubic", 4, 1), ("81.20.3.1", "bbr", 3, 1),
                  ("81.20.3.2", "bbr", 3, 1)])
    got = _by_net(agg.reference_aggregate(rows, SETTINGS))
    assert set(got) == {"81.20.1.5/32", "81.20.1.6/32", "81.20.3.0/24"}, list(got)
    assert got["81.20.1.5/32"].cc == "bbr" and got["81.20.1.6/32"].cc == "cubic"


def test_busy_prefix_needs_more_purity_appendix_d():
    # purity 0.95 passes 0.9 at low volume, fails 0.97 once the /16 carries ≥ 50 requests
    quiet = _rows([("81.20.1.1", "bbr", 19, 1), ("81.20.2.1", "cubic", 1, 1)])
    busy = _rows([("81.20.1.1", "bbr", 19, 10), ("81.20.2.1", "cubic", 1, 10)])
    assert set(_by_net(agg.reference_aggregate(quiet, SETTINGS))) == {"81.20.0.0/16"}
    assert set(_by_net(agg.reference_aggregate(busy, SETTINGS))) == {"81.20.1.0/24", "81.20.2.0/24"}


def test_purity_is_request_weighted():
    # 1 connection of 40 requests outweighs 2 connections of 1 request (purity 40/42 ≥ 0.9)
    rows = _rows([("81.20.1.1", "cubic", 1, 40), ("81.20.1.2", "bbr", 2, 1)])
    got = agg.reference_aggregate(rows, SETTINGS)
    assert [(str(a.network), a.cc) for a in got] == [("81.20.0.0/16", "cubic")], got
    assert got[0].weight == 42 and got[0].top_weight == 40


def test_settings_refuse_an_unknown_declined_rule():
    assert PrefixLadder().declined_rule == "plurality" and PrefixLadder(declined_rule="purity").declined_rule == "purity"
    with pytest.raises(ValueError, match="declined_rule must be one of"):
        PrefixLadder(declined_rule="majority")


def test_settings_refuse_bad_ladders():
    with pytest.raises(ValueError, match="ending at /32"):
        PrefixLadder(ladder={"v4": [16, 24], "v6": [32, 128]}, purity={})
    with pytest.raises(ValueError, match="multiples of 4"):
        PrefixLadder(ladder={"v4": [17, 32], "v6": [32, 128]}, purity={})
    with pytest.raises(ValueError, match="not in the ladder"):
        PrefixLadder(ladder={"v4": [16, 32], "v6": [32, 128]}, purity={"v4": {24: [[0, 0.9]]}})


# ---- properties ---------------------------------------------------------------------------
CCS = ("bbr", "cubic", "reno")


# few /16s and /24s so that prefixes collide and every ladder level gets exercised
v4_addr = st.builds(lambda a, b, c, d: f"81.{20 + a}.{b}.{d if c else 1}",
                    st.integers(0, 2), st.integers(0, 3), st.booleans(), st.integers(1, 254))
v6_addr = st.builds(lambda a, b, c, d: str(ipaddress.IPv6Address(
    (0x2408_8300 + a) << 96 | b << 80 | c << 64 | d)),
    st.integers(0, 1), st.integers(0, 2), st.integers(0, 2), st.integers(1, 3))
row = st.tuples(st.one_of(v4_addr, v6_addr), st.sampled_from(CCS), st.integers(0, 30))


def _first_passing_level(rows, ip, settings):
    """Brute force: the first ladder level whose prefix containing `ip` passes purity over all
    rows under it (only reachable if every shorter prefix of `ip` failed)."""
    a = ipaddress.ip_address(ip)
    fam = a.version
    for level in settings.ladder[fam]:
        net = ipaddress.ip_network(f"{a}/{level}", strict=False)
        w = defaultdict(int)
        r = 0
        for ip2, cc, req in rows:
            if ipaddress.ip_address(ip2) in net:
                w[cc] += agg.weight(req)
                r += max(req, 0)
        top = max(w.values())
        if top / sum(w.values()) >= settings.threshold(fam, level, r) or settings.is_last(fam, level):
            return level
    raise AssertionError("unreachable")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, min_size=1, max_size=60))
def test_every_address_resolves_to_its_first_passing_level(rows):
    aggs = agg.reference_aggregate(rows, SETTINGS)
    table = tf.Table(1, 0, 1, tuple(a.entry() for a in aggs))
    nets = [a.network for a in aggs]
    # no two entries overlap at all (so LPM is never ambiguous), v4 and v6 alike
    for i, n in enumerate(nets):
        for m in nets[i + 1:]:
            assert not (n.version == m.version and n.overlaps(m)), f"{n} overlaps {m}"
    for ip in {r[0] for r in rows}:
        e = tf.lookup(table, ip)
        assert e is not None, f"{ip} has no entry"
        want = _first_passing_level(rows, ip, SETTINGS)
        assert e.prefix.prefixlen == want, f"{ip}: entry /{e.prefix.prefixlen}, first passing /{want}"
    # the entry's CC is its prefix's request-weighted majority, purity as stated
    for a in aggs:
        w = defaultdict(int)
        for ip, cc, req in rows:
            if ipaddress.ip_address(ip) in a.network:
                w[cc] += agg.weight(req)
        assert a.cc == max((v, c) for c, v in w.items())[1] and a.weight == sum(w.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, min_size=1, max_size=60))
def test_agreement_at_least_the_stated_share(rows):
    aggs = agg.reference_aggregate(rows, SETTINGS)
    table = tf.Table(1, 0, 1, tuple(a.entry() for a in aggs))
    stated = sum(a.top_weight for a in aggs) / sum(a.weight for a in aggs)   # manifest "agreement"
    # per connection: the table's CC against each decision
    total = sum(agg.weight(r) for _, _, r in rows)
    per_conn = sum(agg.weight(r) for ip, cc, r in rows if tf.lookup(table, ip).cc == cc) / total
    assert per_conn >= stated - 1e-12, (per_conn, stated)
    # per address: the table's CC against the address's majority decision (request-weighted)
    per_ip = defaultdict(lambda: defaultdict(int))
    for ip, cc, r in rows:
        per_ip[ip][cc] += agg.weight(r)
    agree = sum(sum(w.values()) for ip, w in per_ip.items()
                if tf.lookup(table, ip).cc == max((v, c) for c, v in w.items())[1]) / total
    ip_major = _ip_majority_agreement(aggs, rows)
    assert abs(agree - ip_major) < 1e-12


def _ip_majority_agreement(aggs, rows):
    """Independent recomputation, as table_metrics defines it (weight of model decisions of the
    addresses whose majority CC is the table's)."""
    table = tf.Table(1, 0, 1, tuple(a.entry() for a in aggs))
    per_ip = defaultdict(lambda: defaultdict(int))
    for ip, cc, r in rows:
        per_ip[ip][cc] += agg.weight(r)
    total = sum(sum(w.values()) for w in per_ip.values())
    return sum(sum(w.values()) for ip, w in per_ip.items()
               if getattr(tf.lookup(table, ip), "cc", None) == max((v, c) for c, v in w.items())[1]) / total


def _pred_frame(spark, rows, fallbacks=()):
    import pandas as pd
    recs = []
    for i, (ip, cc, r) in enumerate(list(rows) + list(fallbacks)):
        recs.append({"conn_id": f"c{i}", "client_ip": ip, "cc": cc, "requests": int(r),
                     "decision": "model" if i < len(rows) else "fallback", "default_cc": "cubic",
                     "ug_id": "R1-AS1", "hour": "2026-11-01T00"})
    return spark.createDataFrame(pd.DataFrame(recs))


def _random_rows(seed, n):
    import random
    rng = random.Random(seed)
    v4 = lambda: f"81.{20 + rng.randrange(3)}.{rng.randrange(4)}.{rng.choice([1, rng.randrange(1, 255)])}"  # noqa: E731
    v6 = lambda: str(ipaddress.IPv6Address((0x2408_8300 + rng.randrange(2)) << 96 | rng.randrange(3) << 80  # noqa: E731
                                           | rng.randrange(3) << 64 | rng.randrange(1, 4)))
    return [((v4 if rng.random() < 0.6 else v6)(), rng.choice(CCS), rng.randrange(0, 30)) for _ in range(n)]


@pytest.mark.parametrize("seed,collected,rule", [(1, False, "purity"), (2, False, "purity"), (1, True, "purity"),
                                                (2, True, "purity"), (1, True, "plurality"), (2, False, "plurality")])
def test_spark_job_matches_reference(spark, seed, collected, rule):
    """The job against the Python reference, under each `export.declined_rule`; `collected`: as
    run_export runs it — the decisions collected to the driver once, read by both the
    aggregation and the metrics."""
    rows, fallbacks = _random_rows(seed, 400), _random_rows(seed + 100, 40)
    fallbacks.append(("9.9.9.9", "cubic", 5))        # an address no model decision covers
    settings = dataclasses.replace(SETTINGS, declined_rule=rule)
    preds = _pred_frame(spark, rows, fallbacks)
    decisions = agg.address_decisions(preds)
    if collected:
        decisions = agg.collect_decisions(decisions)
    got = agg.spark_aggregate(decisions, settings)
    entries = [a.entry() for a in got]
    m = agg.table_metrics(decisions, entries, got)
    want = agg.reference_aggregate(list(rows) + [(*f, "fallback") for f in fallbacks], settings)
    assert got == want
    table = tf.Table(1, 0, 1, tuple(entries))
    all_rows = list(rows) + list(fallbacks)
    w_all = sum(agg.weight(r) for _, _, r in all_rows)
    covered = sum(agg.weight(r) for ip, _, r in all_rows if tf.lookup(table, ip) is not None)
    assert m["coverage"] == pytest.approx(covered / w_all)
    assert m["agreement"] == pytest.approx(
        sum(agg.weight(r) for ip, cc, r in rows if getattr(tf.lookup(table, ip), "cc", None) == cc)
        / sum(agg.weight(r) for _, _, r in rows))
    assert m["agreement_ip_majority"] == pytest.approx(_ip_majority_agreement(got, rows))
    assert m["client_ips_model"] == len({ipaddress.ip_address(ip) for ip, _, _ in rows})


# Algorithm 1's hand-made cases through the Spark job: a prefix whose shorter prefix passed is
# no entry even when it passes itself (the one-pass job decides this by an anti-join)
ALGORITHM_1_CASES = {
    "pure /16 over pure /24s": ([("81.20.1.5", "bbr", 10, 3), ("81.20.7.9", "bbr", 5, 2)], {"81.20.0.0/16"}),
    "impure /16, pure /24s": ([("81.20.1.5", "bbr", 10, 3), ("81.20.2.9", "cubic", 5, 2)],
                              {"81.20.1.0/24", "81.20.2.0/24"}),
    "impure /24 → /32s beside a pure /24": (
        [("81.20.1.5", "bbr", 4, 1), ("81.20.1.6", "cubic", 4, 1), ("81.20.3.1", "bbr", 3, 1),
         ("81.20.3.2", "bbr", 3, 1)], {"81.20.1.5/32", "81.20.1.6/32", "81.20.3.0/24"}),
    # a dual-stack listener's IPv4 clients (::ffff:a.b.c.d) are IPv4: a v4 entry, never a v6 one
    # inside ::ffff:0:0/96 (which the kernel's address-space rule would refuse at load)
    "IPv4-mapped clients": ([("::ffff:81.20.1.5", "bbr", 10, 3), ("81.20.7.9", "bbr", 5, 2)], {"81.20.0.0/16"}),
    # v6: the /32 fails, one /48 passes (its /64s too), the other /48 fails down to its /64s; no v4
    "v6 /48 and /64s, no IPv4": (
        [("2408:8300:1:0:1::1", "bbr", 6, 1), ("2408:8300:1:1::2", "bbr", 6, 1),
         ("2408:8300:2:0::1", "cubic", 5, 1), ("2408:8300:2:1::1", "bbr", 5, 1)],
        {"2408:8300:1::/48", "2408:8300:2::/64", "2408:8300:2:1::/64"}),
}


@pytest.mark.parametrize("case", list(ALGORITHM_1_CASES))
def test_spark_job_on_algorithm_1_cases(spark, case):
    spec, want = ALGORITHM_1_CASES[case]
    rows = _rows(spec)
    got = agg.spark_aggregate(agg.address_decisions(_pred_frame(spark, rows)), SETTINGS)
    assert set(_by_net(got)) == want, f"{case}: {sorted(_by_net(got))}"
    assert got == agg.reference_aggregate(rows, SETTINGS), case


def _ladder_frame_entries(frame):
    """`ladder_entries`' rows as Aggregated, sorted as the other versions return them."""
    out = [agg.Aggregated(agg.key_network(r["fam"], r["level"], r["key"]), r["cc"], r["weight"], r["top_weight"],
                          r["requests"], r["passed"]) for r in frame.collect()]
    return sorted(out, key=lambda a: (a.family, int(a.network.network_address), a.network.prefixlen))


@pytest.mark.parametrize("seed", [1, 2])
def test_ladder_entries_per_table_match_reference(spark, seed):
    """The DataFrame ladder (evaluation/emulate.py's, one table per `by` value in one pass)
    against the reference, per value: two hours of different decisions."""
    from pyspark.sql import functions as F
    hours = {"h0": _random_rows(seed, 300), "h1": _random_rows(seed + 50, 200)}
    frames = [_pred_frame(spark, rows).withColumn("hour", F.lit(h)) for h, rows in hours.items()]
    preds = frames[0].unionByName(frames[1])
    by = ("hour",)
    table = agg.ladder_entries(agg.model_weights(agg.address_decisions(preds, by), by), SETTINGS, by)
    for h, rows in hours.items():
        got = _ladder_frame_entries(table.where(table["hour"] == h))
        assert got == agg.reference_aggregate(rows, SETTINGS), h


@pytest.mark.parametrize("extra", [[], [tf.Entry("9.9.8.0/22", "bbr")]], ids=["hex-keys", "bit-keys"])
def test_lpm_longest_match_and_a_family_without_entries(spark, extra):
    """lpm against the table format's own lookup: overlapping entries (longest wins), an address
    under no entry, and IPv6 addresses when the table has only IPv4 entries. With only lengths
    that are multiples of 4 lpm compares hex digits; an entry of another length (a /22 under
    none of the addresses) makes it compare bits."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType
    from pyspark.testing import assertDataFrameEqual
    entries = [tf.Entry("81.20.0.0/16", "bbr"), tf.Entry("81.20.1.0/24", "cubic"),
               tf.Entry("81.20.1.7/32", "reno", low_confidence=True), tf.Entry("81.21.0.0/16", "keep"), *extra]
    ips = ["81.20.1.7", "81.20.1.8", "81.20.9.1", "81.21.3.3", "81.22.0.1", "2408:8300::1"]
    rows = [(agg._hex(ip)[0], agg._hex(ip)[1], ip) for ip in ips]
    frame = spark.createDataFrame(rows, StructType([StructField("fam", IntegerType()),
                                                    StructField("hex", StringType()),
                                                    StructField("ip", StringType())]))
    got = agg.lpm(frame, entries, "t")
    table = tf.Table(1, 0, 1, tuple(entries))
    want = []
    for fam, hx, ip in rows:
        e = tf.lookup(table, ip)
        want.append((fam, hx, ip, e.cc if e else None,
                     e is not None and e.cc != "keep" and not e.low_confidence))
    assert [w[3] for w in want] == ["reno", "cubic", "bbr", "keep", None, None]   # the cases above
    assertDataFrameEqual(got, spark.createDataFrame(want, "fam int, hex string, ip string, t_cc string, "
                                                          "t_effective boolean"))
    # the driver's lpm (table_metrics') on the same addresses
    import numpy as np
    import pyarrow as pa
    idx = agg.lpm_index(pa.array([hx for _, hx, _ in rows]), np.array([fam for fam, _, _ in rows]), entries)
    assert [entries[i].cc if i >= 0 else None for i in idx] == [w[3] for w in want]


def test_with_caps_takes_each_entrys_main_user_group(spark, tmp_path):
    """AutoPlex caps on entries (caps switched on for a service): each entry gets the latest
    parameters of the user group with most request weight under it — an IPv4 /16, a /24 inside
    an impure /16, an IPv6 /32 — and an entry whose group has no parameters gets none."""
    import pandas as pd

    from ccs_testing import write_config
    from ccselect.config import load_config
    spec = [  # (ip, cc, requests, user group)
        ("81.20.1.5", "bbr", 10, "g1"), ("81.20.7.9", "bbr", 3, "g2"),            # pure /16: g1
        ("81.21.1.5", "bbr", 4, "g2"), ("81.21.1.6", "bbr", 5, "g2"),              # impure /16 →
        ("81.21.1.7", "bbr", 6, "g1"), ("81.21.2.9", "cubic", 9, "g1"),            # /24s: g2, g1
        ("2408:8300:1::1", "cubic", 7, "g3"), ("2408:8300:1::2", "cubic", 1, "g1"),  # pure v6 /32: g3
    ]
    recs = [{"conn_id": f"c{i}", "client_ip": ip, "cc": cc, "requests": r, "decision": "model",
             "default_cc": "cubic", "ug_id": ug, "hour": "2026-11-01T00"}
            for i, (ip, cc, r, ug) in enumerate(spec)]
    # a fallback counts against its /24's purity (9 of 10 still passes), never for its caps
    recs.append({"conn_id": "f", "client_ip": "81.21.2.10", "cc": "cubic", "requests": 1, "decision": "fallback",
                 "default_cc": "cubic", "ug_id": "g2", "hour": "2026-11-01T00"})
    preds = spark.createDataFrame(pd.DataFrame(recs))
    aggs = agg.spark_aggregate(agg.address_decisions(preds), SETTINGS)
    nets = {str(a.network): a for a in aggs}
    assert set(nets) >= {"81.20.0.0/16", "81.21.1.0/24", "81.21.2.0/24", "2408:8300::/32"}, sorted(nets)
    params = pd.DataFrame([  # two periods of g1 (the later one counts), g2 once, g3 only under another policy
        {"policy": "low_retrans", "ug_id": "g1", "period_start_ms": 1, "pacing_rate_last_bps": 1e6, "max_cwnd_last_segs": 10.0},
        {"policy": "low_retrans", "ug_id": "g1", "period_start_ms": 2, "pacing_rate_last_bps": 2e6, "max_cwnd_last_segs": 20.5},
        {"policy": "low_retrans", "ug_id": "g2", "period_start_ms": 1, "pacing_rate_last_bps": 3e6, "max_cwnd_last_segs": 30.0},
        {"policy": "other", "ug_id": "g3", "period_start_ms": 1, "pacing_rate_last_bps": 4e6, "max_cwnd_last_segs": 40.0},
    ])
    root = tmp_path / "lake"
    spark.createDataFrame(params).write.format("delta").save(str(root / "gold" / "autoplex_params"))
    cfg = load_config(write_config(tmp_path, autoplex={"caps_services": {"video": True}}))
    assert (cfg.settings.lake.root, cfg.settings.export.caps_policy) == (str(root), "low_retrans")
    out, info = agg.with_caps(spark, cfg, preds, aggs)
    assert info["caps"] == "on" and info["entries_with_caps"] == 3, info
    got = {str(a.network): (a.pacing_rate_bps, a.cwnd_clamp_segs) for a in out}
    assert got["81.20.0.0/16"] == (2_000_000, 21)        # g1's latest period, clamp rounded up
    assert got["81.21.1.0/24"] == (3_000_000, 30)        # g2: 9 of the /24's 15
    assert got["81.21.2.0/24"] == (2_000_000, 21)        # g1 (the fallback's g2 does not count)
    assert got["2408:8300::/32"] == (0, 0)               # g3 has no low_retrans parameters
    assert [(str(a.network), a.cc, a.weight) for a in out] == [(str(a.network), a.cc, a.weight) for a in aggs]
    off = load_config(write_config(tmp_path, autoplex={"caps_services": {"video": False}}))
    assert agg.with_caps(spark, off, preds, aggs) == (aggs, {"caps": "off (no service in autoplex.caps_services)"})


# ---- export.declined_rule (issue 57): purity and plurality, in the three engines ------------
def _three_engines(spark, rows, settings):
    """The reference's entries over (ip, cc, requests[, decision]) rows, checked equal to the
    export job's (Arrow, `arrow_ladder`) and to the DataFrame ladder's (`ladder_entries`,
    evaluation/emulate.py's); {prefix: cc}."""
    ref = agg.reference_aggregate(rows, settings)
    preds = spark.createDataFrame(
        [(f"c{i}", r[0], r[1], (r[3] if len(r) > 3 else "model"), "cubic", int(r[2]), "h0") for i, r in enumerate(rows)],
        "conn_id string, client_ip string, cc string, decision string, default_cc string, requests long, hour string")
    assert agg.spark_aggregate(agg.address_decisions(preds), settings) == ref, "arrow_ladder"
    by = ("hour",)
    assert _ladder_frame_entries(agg.ladder_entries(agg.model_weights(agg.address_decisions(preds, by), by),
                                                    settings, by)) == ref, "ladder_entries"
    return ref


RULES = ("purity", "plurality")


@pytest.mark.parametrize("rule", RULES)
def test_a_mostly_declined_prefix_gets_no_entry_under_either_rule(spark, rule):
    """Issue 57's case: 35.225.0.0/16 → bbr came from 49 model rows of one address and covered
    96 OOD rows of the same address. Under either rule DECLINED is the plurality of the /16, its
    /24 and the address, so none is an entry and the address keeps the default CC; a clean /24
    beside it keeps its entry."""
    rows = [("35.225.1.1", "bbr", 1)] * 49 + [("35.225.1.1", "bbr", 1, "ood")] * 96
    rows += [(f"35.225.2.{i}", "bbr", 1) for i in range(1, 30)]
    got = _by_net(_three_engines(spark, rows, PrefixLadder(declined_rule=rule)))
    assert {k: a.cc for k, a in got.items()} == {"35.225.2.0/24": "bbr"}, (rule, list(got))


@pytest.mark.parametrize("rule", RULES)
def test_a_passing_declined_plurality_ends_the_descent_under_either_rule(spark, rule):
    """A /16 that is 96% fallback passes as DECLINED under both rules: no entry there and none
    below it, though 9.9.0.1 alone is a model address."""
    rows = [(f"9.9.{i}.{j}", "cubic", 1, "fallback") for i in range(8) for j in range(1, 13)]
    rows += [("9.9.0.1", "bbr", 1)] * 4
    assert _three_engines(spark, rows, PrefixLadder(declined_rule=rule)) == []


def test_purity_rule_counts_declined_against_a_model_plurality(spark):
    """20 model addresses (bbr) and one address of 5 OOD rows in a /16: under `purity` the /16's
    bbr purity is 20/25 (< 0.95), so it splits: the model /24 is an entry, the OOD address none."""
    rows = [(f"35.225.1.{i}", "bbr", 1) for i in range(1, 21)] + [("35.225.2.1", "bbr", 1, "ood")] * 5
    got = _by_net(_three_engines(spark, rows, PrefixLadder(declined_rule="purity")))
    assert list(got) == ["35.225.1.0/24"], list(got)
    assert (got["35.225.1.0/24"].weight, got["35.225.1.0/24"].purity) == (20, 1.0)


def test_plurality_rule_judges_a_model_plurality_on_model_decisions_alone(spark):
    """The same rows under `plurality`: DECLINED (5) is not the heaviest, so the /16's purity,
    weight and requests are the model's alone (20 of 20): one /16 entry, as before issue 57."""
    rows = [(f"35.225.1.{i}", "bbr", 1) for i in range(1, 21)] + [("35.225.2.1", "bbr", 1, "ood")] * 5
    got = _by_net(_three_engines(spark, rows, PrefixLadder(declined_rule="plurality")))
    assert list(got) == ["35.225.0.0/16"], list(got)
    e = got["35.225.0.0/16"]
    assert (e.cc, e.weight, e.top_weight, e.requests, e.passed) == ("bbr", 20, 20, 20, True), e
    # the requests that pick the threshold's tier are the model's too: 4,000 model requests (bbr
    # 3,800 of them, purity 0.95) and 1,500 declined would be the busy tier (≥ 5,000: 0.98) together
    busy = [(f"35.225.1.{i}", "bbr" if i < 20 else "cubic", 200) for i in range(1, 21)]
    busy += [("35.225.2.1", "bbr", 1500, "ood")]
    got = _by_net(_three_engines(spark, busy, PrefixLadder(declined_rule="plurality")))
    assert list(got) == ["35.225.0.0/16"] and got["35.225.0.0/16"].requests == 4000, list(got)


@pytest.mark.parametrize("seed,support", [(5, "default"), (6, "none")])
def test_plurality_rule_three_engines_agree_with_declined_rows(spark, seed, support):
    """Random rows, a fifth of them declined (ood, fallback, evidence), under `plurality`: the
    three engines give the same entries, with the default minimum support and without it."""
    import random
    rng = random.Random(seed)
    rows = []
    for _ in range(300):
        ip = f"81.{20 + rng.randrange(2)}.{rng.randrange(4)}.{rng.randrange(1, 6)}"
        rows.append((ip, rng.choice(("bbr", "cubic")), rng.randrange(0, 20))
                    + ((rng.choice(("ood", "fallback", "evidence")),) if rng.random() < 0.2 else ()))
    base = PrefixLadder() if support == "default" else SETTINGS
    settings = dataclasses.replace(base, declined_rule="plurality")
    got = _three_engines(spark, rows, settings)
    assert got != agg.reference_aggregate(rows, dataclasses.replace(base, declined_rule="purity")), \
        "the rows should tell the rules apart"
