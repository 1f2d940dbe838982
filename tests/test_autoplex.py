"""AutoPlex Algorithm 1 on tiny inline frames with hand-computed parameters."""
from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from ccselect.hours import Window
from ccselect.jobs.autoplex import (Policy, PolicyError, band, change_rates, f_cap, parameters, parameters_all, prefix_caps,
                           with_period)

SCHEMA = ("ug_id string, conn_id string, ts_end_ms long, retrans_ratio double, delivery_rate_bps double, "
          "min_srtt_us long, max_srtt_us long, max_inflight_segs long, max_cwnd_segs long")
P0 = 0  # first 30-minute period
P1 = 1_800_000


def _rows():
    rows = []
    # group A: 20 sessions, retrans 0.00..0.19; goodput, inflight, cwnd tied to the index
    for i in range(20):
        rows.append(("henan-AS4134", f"a{i:02d}", P0 + 1000 * i, i / 100, 1e6 * (i + 1), 10_000, 30_000, 10 + i, 20 + i))
    # group B: 10 sessions, all without retransmissions (ties, broken by conn_id)
    for i in range(10):
        rows.append(("qinghai-AS9808", f"b{9 - i}", P0 + 5, 0.0, 2e6 * (i + 1), 20_000, 20_000, i, i))
    # group C: 3 sessions only
    for i in range(3):
        rows.append(("beijing-AS4837", f"c{i}", P0 + 7, 0.1, 1e6, 10_000, 10_000, 1, 1))
    return rows


@pytest.fixture
def sessions(spark):
    return with_period(spark.createDataFrame(_rows(), SCHEMA), 30)


def test_band_keeps_the_percentile_positions(sessions):
    pol = Policy("p", "retrans_ratio", True, 5, 20, 5)
    got = band(sessions, pol, ["ug_id"]).where("ug_id = 'henan-AS4134'").select("conn_id")
    # n = 20: positions 1, 2, 3 (5% of 20 = 1 inclusive, 20% of 20 = 4 exclusive)
    assertDataFrameEqual(got, sessions.sparkSession.createDataFrame([("a01",), ("a02",), ("a03",)], "conn_id string"))


def test_ties_are_broken_by_conn_id(sessions):
    pol = Policy("p", "retrans_ratio", True, 0, 30, 5)
    got = band(sessions, pol, ["ug_id"]).where("ug_id = 'qinghai-AS9808'").select("conn_id")
    assertDataFrameEqual(got, sessions.sparkSession.createDataFrame([("b0",), ("b1",), ("b2",)], "conn_id string"))


def test_parameters_hand_computed(sessions, spark):
    pol = Policy("low_retrans", "retrans_ratio", True, 5, 20, 5)
    got = parameters(sessions, pol, ["ug_id"], 30).select(
        "ug_id", "period_start_ms", "n_sessions", "n_band", "pacing_rate_last_bps", "max_cwnd_last_segs",
        "applies_from_ms", "policy")
    # A: band a01..a03 → goodput mean (2+3+4)e6/3 = 3e6; inflight 12, cwnd 22 → (12+22)/2 = 17
    # B: n=10 → positions 0.5 <= k < 2 → k=1 → b1, whose goodput is 2e6·(8+1) (b1 is i=8)
    # C: 3 sessions < 5 → no parameters
    want = spark.createDataFrame([
        ("henan-AS4134", P0, 20, 3, 3e6, 17.0, P1, "low_retrans"),
        ("qinghai-AS9808", P0, 10, 1, 18e6, 8.0, P1, "low_retrans"),
    ], "ug_id string, period_start_ms long, n_sessions long, n_band long, pacing_rate_last_bps double, "
       "max_cwnd_last_segs double, applies_from_ms long, policy string")
    assertDataFrameEqual(got, want)


def test_descending_goodput_per_srtt_policy(sessions, spark):
    pol = Policy("g", "goodput_per_srtt", False, 0, 10, 5)
    got = parameters(sessions, pol, ["ug_id"], 30).where("ug_id = 'henan-AS4134'").select("pacing_rate_last_bps")
    # highest goodput/srtt first: a19, a18 are positions 0, 1 (10% of 20 = 2) → mean (20+19)/2 e6
    assertDataFrameEqual(got, spark.createDataFrame([(19.5e6,)], "pacing_rate_last_bps double"))


@pytest.mark.parametrize("bad, msg", [
    ({"name": "x", "metric": "rtt", "band": [5, 20]}, "unknown metric"),
    ({"name": "x", "metric": "retrans_ratio", "band": [20, 5]}, "lo < hi"),
    ({"name": "x", "metric": "retrans_ratio", "band": [-1, 5]}, "lo < hi"),
    ({"name": "x", "metric": "retrans_ratio", "band": [5, 120]}, "lo < hi"),
    ({"name": "x", "metric": "retrans_ratio", "band": [5, 20], "min_sessions": 0}, "at least 1"),
    ({"name": "x", "metric": "retrans_ratio", "band": [5, 20], "direction": "sideways"}, "direction"),
    ({"name": "x", "metric": "retrans_ratio"}, "band"),
])
def test_bad_policies_are_refused(bad, msg):
    with pytest.raises(PolicyError, match=msg):
        Policy.from_dict(bad)


def test_eq1():
    assert f_cap(3.0, 5.0) == 3.0
    assert f_cap(9.0, 5.0) == 7.0
    assert f_cap(5.0, 5.0) == 5.0


def test_change_rates_between_adjacent_periods(spark):
    rows = []
    for period, scale in ((0, 1.0), (1, 1.5)):
        for i in range(20):
            rows.append(("g", f"p{period}-{i:02d}", period * P1 + i, i / 100, 1e6 * scale * (i + 1), 1, 1,
                         10 + i, 20 + i))
    df = with_period(spark.createDataFrame(rows, SCHEMA), 30)
    better = Policy("b", "retrans_ratio", True, 5, 20, 5)
    worse = Policy("w", "retrans_ratio", True, 75, 90, 5)
    got = change_rates(df, ["ug_id"], better, worse, 30).where("value = 'goodput_bps'").select("band", "change_rate")
    # goodput scaled by 1.5 in every band → change rate 0.5 for both
    assertDataFrameEqual(got, spark.createDataFrame([("better", 0.5), ("worse", 0.5)], "band string, change_rate double"))


def test_prefix_caps_map_groups_to_blocks(sessions, spark):
    pol = Policy("low_retrans", "retrans_ratio", True, 5, 20, 5)
    params = parameters(sessions, pol, ["ug_id"], 30)
    ref = spark.createDataFrame([("58.14.0.0/16", 4134, "chinanet", "henan"), ("240e:100::/32", 4134, "chinanet", "henan"),
                                 ("36.1.0.0/16", 9808, "cmcc", "beijing")], "cidr string, asn int, isp string, region string")
    got = prefix_caps(ref, params).select("cidr", "pacing_rate_bps", "cwnd_clamp_segs")
    assertDataFrameEqual(got, spark.createDataFrame([("58.14.0.0/16", 3_000_000, 17), ("240e:100::/32", 3_000_000, 17)],
                                                    "cidr string, pacing_rate_bps long, cwnd_clamp_segs int"))


def _reference_rows():
    """Two periods of three groups, with sessions whose metric is null (no retransmission ratio,
    or no RTT) and ties: the edge rows of the one-pass ranking."""
    rows = []
    for period in (0, 1):
        for i in range(40):
            retrans = None if i % 13 == 0 else (i % 7) / 50
            srtt = None if i % 11 == 0 else 10_000 + 1_000 * (i % 5)
            rows.append(("henan-AS4134", f"h{period}-{i:02d}", period * P1 + i, retrans, 1e6 * (1 + i % 9) + period * 1e5,
                         srtt, srtt, 10 + i % 6, 20 + i % 4))
        for i in range(25):
            rows.append(("qinghai-AS9808", f"q{period}-{i:02d}", period * P1 + i, 0.0, 2e6 + 1e4 * i * (period + 1),
                         20_000, 30_000, i, 2 * i))
        for i in range(4):
            rows.append(("beijing-AS4837", f"b{period}-{i}", period * P1 + i, 0.1 * i, 1e6, 10_000, 10_000, 1, 1))
    return rows


def _duckdb_reference(rows, sql: str):
    """`sql` run in DuckDB over `rows` as table `conns` (nulls stay nulls, as in Spark)."""
    import duckdb
    types = {"string": "VARCHAR", "long": "BIGINT", "double": "DOUBLE"}
    cols = [c.split() for c in SCHEMA.split(", ")]
    con = duckdb.connect()
    con.execute("CREATE TABLE conns (" + ", ".join(f"{n} {types[t]}" for n, t in cols) + ")")
    con.executemany(f"INSERT INTO conns VALUES ({', '.join('?' * len(cols))})", rows)
    return con.execute(sql).fetchall()


def test_all_policies_in_one_pass_match_duckdb(spark):
    """parameters_all ranks bands of one metric in one sort and every metric from one shuffle: per
    policy, the rows must be those of the single-policy SQL of bench/autoplex.py run in DuckDB,
    with overlapping bands of one metric, two metrics, both directions and null metrics."""
    from bench.autoplex import _BAND, _METRIC_SQL
    policies = [Policy("low_retrans", "retrans_ratio", True, 5, 20, 5),
                Policy("wide_retrans", "retrans_ratio", True, 0, 50, 5),
                Policy("high_goodput_per_srtt", "goodput_per_srtt", False, 80, 95, 5),
                Policy("low_goodput_per_srtt", "goodput_per_srtt", True, 10, 40, 30)]
    rows = _reference_rows()
    got = parameters_all(with_period(spark.createDataFrame(rows, SCHEMA), 30), policies, ["ug_id"], 30).select(
        "policy", "ug_id", "period_start_ms", "n_sessions", "n_band", "mean_goodput_bps", "mean_max_inflight_segs",
        "mean_max_cwnd_segs", "mean_metric")
    want = []
    for p in policies:
        sql = _BAND.format(t=P1, metric=_METRIC_SQL[p.metric], dir="ASC" if p.ascending else "DESC", lo=p.band_lo,
                           hi=p.band_hi, min_n=p.min_sessions)
        want += [(p.name, *r) for r in _duckdb_reference(rows, sql)]
    assert {r[0] for r in want} == {p.name for p in policies}, "every policy has rows to compare"
    assertDataFrameEqual(got, spark.createDataFrame(want, got.schema))


def test_change_rates_of_both_bands_match_duckdb(spark):
    """change_rates computes the better and the worse band in one pass: the same rates as the
    per-band SQL of bench/autoplex.py in DuckDB."""
    from bench.autoplex import _BAND
    better = Policy("better", "retrans_ratio", True, 5, 20, 5)
    worse = Policy("worse", "retrans_ratio", True, 75, 90, 5)
    rows = _reference_rows()
    got = change_rates(with_period(spark.createDataFrame(rows, SCHEMA), 30), ["ug_id"], better, worse, 30)
    want = []
    for label, p in (("better", better), ("worse", worse)):
        b = _BAND.format(t=P1, metric="retrans_ratio", dir="ASC", lo=p.band_lo, hi=p.band_hi, min_n=p.min_sessions)
        for v in ("goodput_bps", "max_inflight_segs", "max_cwnd_segs"):
            want += _duckdb_reference(rows, f"""
                WITH b AS ({b}),
                l AS (SELECT *, lag(mean_{v}) OVER w AS prev, lag(period_start_ms) OVER w AS prev_start FROM b
                      WINDOW w AS (PARTITION BY ug_id ORDER BY period_start_ms))
                SELECT ug_id, period_start_ms, '{label}', '{v}', abs(mean_{v} - prev) / prev FROM l
                WHERE prev > 0 AND period_start_ms - prev_start = {P1}""")
    assert {(r[2], r[3]) for r in want} == {(b, v) for b in ("better", "worse")
                                             for v in ("goodput_bps", "max_inflight_segs", "max_cwnd_segs")}
    assertDataFrameEqual(got, spark.createDataFrame(want, got.schema))


def test_one_window_over_every_ordering_is_a_window_per_policy(spark):
    """band_means ranks both directions of both metrics in one window over stacked sort keys: per
    policy, the same rows and the same bits as a window of its own over the metric (asc or desc,
    nulls last, ties by conn_id), with NaN metrics (Spark orders NaN above every number), -0.0
    next to 0.0, nulls and ties."""
    from pyspark.sql import Window, functions as F

    from ccselect.jobs.autoplex import METRICS, VALUES, band_means
    rows = _reference_rows()
    for i in range(30):      # one more group: NaN, -0.0, 0.0 and ties in both metrics
        rr = [float("nan"), -0.0, 0.0, 0.02, None][i % 5]
        rate = [float("nan"), 3e6, 0.0, -0.0, 5e6, None][i % 6]
        rows.append(("gansu-AS4134", f"g{29 - i:02d}", i, rr, rate, 10_000, 10_000, i, i % 3))
    df = with_period(spark.createDataFrame(rows, SCHEMA), 30)
    policies = [Policy("low_retrans", "retrans_ratio", True, 5, 20, 5),
                Policy("wide_retrans", "retrans_ratio", True, 0, 50, 5),
                Policy("high_retrans", "retrans_ratio", False, 0, 40, 5),
                Policy("high_goodput_per_srtt", "goodput_per_srtt", False, 10, 95, 5),
                Policy("low_goodput_per_srtt", "goodput_per_srtt", True, 10, 40, 5)]
    cols = ["ug_id", "period_start_ms", "_band", "n_sessions", "n_band", *[f"mean_{c}" for c in VALUES], "mean_metric"]
    got = band_means(df, [(p.name, p) for p in policies], ["ug_id"]).select(*cols).collect()
    want = []
    for p in policies:
        m = METRICS[p.metric]()
        w = Window.partitionBy("ug_id", "period_start_ms").orderBy(m.asc_nulls_last() if p.ascending
                                                                   else m.desc_nulls_last(), F.col("conn_id"))
        ranked = df.withColumns({"_m": m, "_k": F.row_number().over(w) - 1,
                                 "n_sessions": F.count(m).over(w.rowsBetween(Window.unboundedPreceding,
                                                                             Window.unboundedFollowing))})
        k, n = F.col("_k"), F.col("n_sessions")
        want += (ranked.where((k >= n * F.lit(p.band_lo / 100.0)) & (k < n * F.lit(p.band_hi / 100.0)))
                 .groupBy("ug_id", "period_start_ms")
                 .agg(F.first("n_sessions").alias("n_sessions"), F.count(F.lit(1)).alias("n_band"),
                      *[F.avg(src).alias(f"mean_{c}") for c, src in VALUES.items()], F.avg("_m").alias("mean_metric"))
                 .where(n >= p.min_sessions).withColumn("_band", F.lit(p.name)).select(*cols).collect())
    assert {r["_band"] for r in want if r["ug_id"] == "gansu-AS4134"} == {p.name for p in policies}
    key = lambda r: (r["ug_id"], r["period_start_ms"], r["_band"])   # noqa: E731
    # the same bits: NaN compared as equal to NaN, everything else exactly
    norm = lambda r: tuple("nan" if isinstance(x, float) and x != x else x for x in r)   # noqa: E731
    assert [norm(r) for r in sorted(got, key=key)] == [norm(r) for r in sorted(want, key=key)]


# ---- the driver-side Arrow engine (jobs/autoplex_arrow.py) against the Spark job -------------------

def _arrow_table(rows):
    import pyarrow as pa
    types = {"string": pa.string(), "long": pa.int64(), "double": pa.float64()}
    cols = [c.split() for c in SCHEMA.split(", ")]
    return pa.table({n: pa.array([r[i] for r in rows], types[t]) for i, (n, t) in enumerate(cols)})


def _close(got: list[tuple], want: list[tuple], rel: float) -> None:
    """Same rows in the same order (sorted by the caller); floats within `rel` (NumPy adds a band
    pairwise, Spark in sort order), everything else exactly."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            if isinstance(b, float) and a is not None:
                assert a == pytest.approx(b, rel=rel), (g, w)
            else:
                assert a == b, (g, w)


def test_arrow_engine_parameters_match_the_spark_job(spark):
    """The Arrow engine's parameters_all, row for row: overlapping bands of one metric, both
    directions, null metrics (no retransmission ratio, no RTT), ties broken by conn_id, groups
    below min_sessions."""
    from ccselect.jobs import autoplex_arrow
    policies = [Policy("low_retrans", "retrans_ratio", True, 5, 20, 5),
                Policy("wide_retrans", "retrans_ratio", True, 0, 50, 5),
                Policy("high_goodput_per_srtt", "goodput_per_srtt", False, 80, 95, 5),
                Policy("low_goodput_per_srtt", "goodput_per_srtt", True, 10, 40, 30)]
    rows = _reference_rows() + _rows()
    cols = ["policy", "ug_id", "period_start_ms", "n_sessions", "n_band", "mean_goodput_bps", "mean_max_inflight_segs",
            "mean_max_cwnd_segs", "mean_metric", "metric", "band_lo", "band_hi", "pacing_rate_last_bps",
            "max_cwnd_last_segs", "applies_from_ms"]
    want = parameters_all(with_period(spark.createDataFrame(rows, SCHEMA), 30), policies, ["ug_id"], 30).select(*cols)
    want = sorted(tuple(r) for r in want.collect())
    got = autoplex_arrow.parameters(_arrow_table(rows), policies, ["ug_id"], 30)
    assert got.column_names == ["ug_id", *[c for c in cols if c not in ("policy", "ug_id")][:7], "policy",
                                *cols[9:], "period"]
    assert set(got.column("period").to_pylist()) == {"1970-01-01T00:00", "1970-01-01T00:30"}
    got = sorted(tuple(r[c] for c in cols) for r in got.to_pylist())
    assert {r[0] for r in got} == {p.name for p in policies}
    _close(got, want, 1e-12)


def test_arrow_engine_change_rates_match_the_spark_job(spark):
    from ccselect.jobs import autoplex_arrow
    better = Policy("better", "retrans_ratio", True, 5, 20, 5)
    worse = Policy("worse", "retrans_ratio", True, 75, 90, 5)
    rows = _reference_rows()
    want = change_rates(with_period(spark.createDataFrame(rows, SCHEMA), 30), ["ug_id"], better, worse, 30)
    want = sorted(tuple(r) for r in want.collect())
    got = autoplex_arrow.change_rates(_arrow_table(rows), ["ug_id"], better, worse, 30)
    got = sorted(tuple(r.values()) for r in got.to_pylist())
    assert {(r[2], r[3]) for r in got} == {(b, v) for b in ("better", "worse")
                                           for v in ("goodput_bps", "max_inflight_segs", "max_cwnd_segs")}
    _close(got, want, 1e-9)


def test_arrow_engine_refuses_what_it_cannot_run():
    """An object-store lake and a NaN metric (Spark orders NaN above every number) are left to the
    Spark job."""
    import math

    from ccselect.jobs import autoplex_arrow
    with pytest.raises(autoplex_arrow.Unsupported, match="local filesystem"):
        autoplex_arrow.read_window("s3a://bucket/lake/silver/connections", Window(0, 1), ["conn_id", "ts_end_ms"])
    rows = [r if i else (*r[:3], math.nan, *r[4:]) for i, r in enumerate(_rows())]
    with pytest.raises(autoplex_arrow.Unsupported, match="NaN"):
        autoplex_arrow.parameters(_arrow_table(rows), [Policy("p", "retrans_ratio", True, 5, 20, 5)], ["ug_id"], 30)
    from ccselect.settings import AutoplexSettings
    with pytest.raises(ValueError, match="autoplex.engine"):
        AutoplexSettings(caps_services={}, engine="gpu")
