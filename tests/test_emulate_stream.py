"""The streaming table's timeline in the emulation (evaluation/emulate.py, issue 26; ALICCS §3.3,
Observation IV: a prefix's type drifts): which tables a prediction enters, which table is live
when a session starts, and that a prefix whose type flips mid-hour is followed by the streaming
table within trigger + delay while the hourly export keeps the previous hour's type."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.hours import Window
from ccselect.settings import EmulateSettings
from ccselect.evaluation import emulate
from test_emulate import H0, H1, P, T0, T1, _trace

MIN = 60_000
#: a 10-minute window so that one flip empties and refills it within the hour
S = EmulateSettings(window_minutes=60, train_hours=0, stream_trigger_minutes=5, stream_window_minutes=10,
                    stream_delay_minutes=1)


def _slots(spark, ts: list[int], p: EmulateSettings) -> dict[int, list[int]]:
    df = spark.createDataFrame([(t,) for t in ts], "ts long")
    return {r["ts"]: sorted(r["slots"]) for r in df.select("ts", emulate.stream_slots("ts", p).alias("slots")).collect()}


def test_a_prediction_enters_exactly_the_slots_whose_window_covers_it(spark):
    """Slot k is the table built at b = k·T from (b − W, b]: an event at a boundary is in that
    boundary's table and not in the one a window later; one millisecond after it, the other way."""
    got = _slots(spark, [0, 1, 5 * MIN, 5 * MIN + 1, 9 * MIN], S)
    assert got == {0: [0, 1], 1: [1, 2], 5 * MIN: [1, 2], 5 * MIN + 1: [2, 3], 9 * MIN: [2, 3]}, got
    # against the definition, with a window the trigger does not divide (W = 12, T = 5)
    p = EmulateSettings(stream_trigger_minutes=5, stream_window_minutes=12)
    rng = np.random.default_rng(0)
    ts = [int(x) for x in rng.integers(T0, T0 + 3_600_000, 200)] + [T0 + 5 * MIN * k for k in range(4)]
    t, w = 5 * MIN, 12 * MIN
    for e, slots in _slots(spark, ts, p).items():
        want = [k for k in range(e // t - 5, e // t + 5) if k * t - w < e <= k * t]
        assert slots == want, f"ts {e}: {slots} != {want}"


def test_the_live_table_is_the_latest_boundary_at_least_the_lag_before(spark):
    """k = floor((t − L) / T): with the 1-minute delay a session at 35:59.999 still has the table of
    30:00 and one at 36:00 that of 35:00; with lag 0, 35:00 itself has it."""
    starts = [T1 + 35 * MIN, T1 + 36 * MIN - 1, T1 + 36 * MIN]
    df = spark.createDataFrame([(t,) for t in starts], "ts long")
    b = lambda lag: [r[0] * 5 * MIN - T1 for r in df.select(emulate.live_slot("ts", lag, S)).collect()]  # noqa: E731
    assert b(1) == [30 * MIN, 30 * MIN, 35 * MIN]
    assert b(0) == [35 * MIN, 35 * MIN, 35 * MIN]
    assert b(60) == [-25 * MIN, -25 * MIN, -25 * MIN], "an hour's lag: the previous hour's 00:35"


def test_policy_names_take_a_lag_only_on_streaming_policies():
    assert emulate.split_lag("aliccs_stream", S) == ("aliccs_stream", 1)
    assert emulate.split_lag("true_table_stream@15", S) == ("true_table_stream", 15)
    assert emulate.split_lag("aliccs", S) == ("aliccs", None)
    for bad in ("aliccs@5", "aliccs_stream@-1", "aliccs_stream@x"):
        with pytest.raises(ValueError):
            emulate.split_lag(bad, S)


def _write_lake(spark, cfg, preds):
    """gold.predictions and the silver.connections columns the streaming path reads (the end of
    each predicted connection): rows (conn_id, hour, ts_end_ms, client_ip, cc, decision)."""
    from ccselect.lake import table_path
    (spark.createDataFrame([(c, "n1", h, ip, cc, d, "cubic", 3) for c, h, _, ip, cc, d in preds],
                           "conn_id string, node_id string, hour string, client_ip string, cc string, decision string, "
                           "default_cc string, requests long")
     .write.format("delta").save(table_path(cfg, "gold.predictions")))
    (spark.createDataFrame([(c, "n1", h, end) for c, h, end, *_ in preds],
                           "conn_id string, node_id string, hour string, ts_end_ms long")
     .write.format("delta").save(table_path(cfg, "silver.connections")))


def _sessions_at(spark, rows, p):
    """emulate.sessions over `_trace` rows (conn_id, hour, ip, prefix24, start, end), the times in ms."""
    times = spark.createDataFrame([(r[0], r[4], r[5]) for r in rows], "conn_id string, s long, e long")
    df = (_trace(spark, [(c, h, ip, p24, "wifi", "cubic", 0.1, 0.0) for c, h, ip, p24, *_ in rows])
          .join(times, "conn_id").withColumn("ts_start_ms", F.col("s")).withColumn("ts_end_ms", F.col("e"))
          .drop("s", "e"))
    return emulate.sessions(df, p)


def test_the_streaming_table_follows_a_prefix_that_flips_mid_hour_and_the_hourly_one_does_not(spark, cfg):
    """7.7.0.0/16 is Wi-Fi (CUBIC) in hour 00 and until 00:08 of hour 01; its connections ending at
    01:31 are cellular (BBR). The streaming table (T 5, W 10, delay 1) holds the 01:08 decisions at
    the boundaries 01:10 and 01:15, nothing at 01:20–01:30, the 01:31 ones at 01:35 and 01:40: live
    one minute later each. The hourly export of hour 00 serves CUBIC all of hour 01. Fallback
    decisions (7.8.0.0/16) make no entries in either."""
    preds = [(f"h{i}", H0, T0 + 30 * MIN, f"7.7.{i}.9", "cubic", "model") for i in range(12)]
    preds += [(f"w{i}", H1, T1 + 8 * MIN, f"7.7.{i}.9", "cubic", "model") for i in range(12)]
    preds += [(f"c{i}", H1, T1 + 31 * MIN, f"7.7.{i}.10", "bbr", "model") for i in range(12)]
    preds += [(f"f{i}", H1, T1 + 8 * MIN, f"7.8.{i}.9", "bbr", "fallback") for i in range(12)]
    _write_lake(spark, cfg, preds)
    at = {"s10": 10 * MIN, "s11": 11 * MIN, "s15": 15 * MIN, "s21": 21 * MIN, "s36m": 36 * MIN - 1, "s36": 36 * MIN,
          "s41": 41 * MIN, "s46": 46 * MIN, "s50": 50 * MIN}                   # session starts after 01:00
    rows = [(c, H1, "7.7.200.1", "7.7.200.0/24", T1 + ms, T1 + ms + 3000) for c, ms in at.items()]
    rows += [("x12", H1, "7.8.200.1", "7.8.200.0/24", T1 + 12 * MIN, T1 + 12 * MIN + 3000)]
    est = _sessions_at(spark, rows, S).persist()
    preds_df = emulate.extract_stream_predictions(spark, cfg, Window.hours(H1), S, max_lag_minutes=1)
    entries = emulate.stream_entries(preds_df, cfg.settings.export, S).persist()
    stream = {r["conn_id"]: r["_ecc"] for r in emulate.stream_lookup(est, entries, cfg.settings.export, S, 1).collect()}
    assert stream == {"s10": None, "s11": "cubic", "s15": "cubic", "s21": None, "s36m": None, "s36": "bbr",
                      "s41": "bbr", "s46": None, "s50": None, "x12": None}, stream
    at0 = {r["conn_id"]: r["_ecc"] for r in emulate.stream_lookup(est, entries, cfg.settings.export, S, 0).collect()}
    assert at0["s10"] == "cubic" and at0["s36m"] == "bbr", f"lag 0: the boundary just passed: {at0}"
    hourly = {r["conn_id"]: r["_ecc"] for r in emulate.table_lookup(spark, cfg, est, replace(S, table_lag_hours=1)).collect()}
    assert hourly == {**{c: "cubic" for c in at}, "x12": None}, f"the hourly export of hour 00: {hourly}"
    p60 = EmulateSettings(window_minutes=60, train_hours=0)         # the default trigger, window and delay
    wide = emulate.stream_entries(preds_df, cfg.settings.export, p60)
    got = {r["conn_id"]: r["_ecc"] for r in emulate.stream_lookup(est, wide, cfg.settings.export, p60, 1).collect()}
    assert got["s11"] == "cubic" and got["s46"] is None, \
        f"a 60-minute window holds both types at 01:45: the /16 is mixed, no entry for 7.7.200.1: {got}"
    entries.unpersist()
    est.unpersist()


def test_true_table_stream_is_the_majority_true_type_of_the_sessions_ended_in_the_live_window(spark):
    """The perfect classifier's streaming table: /24 A's sessions that ended by 01:10 are 4G (2 of
    3), those that ended in (01:20, 01:30] Wi-Fi; one starting 01:07 but ending 01:11 counts from the
    01:15 table on (a prediction exists once its connection ended). /24 B has none before → default."""
    rows = [("a1", H1, "1.1.1.1", "1.1.1.0/24", T1 + 2 * MIN, T1 + 3 * MIN),
            ("a2", H1, "1.1.1.2", "1.1.1.0/24", T1 + 4 * MIN, T1 + 6 * MIN),
            ("a3", H1, "1.1.1.3", "1.1.1.0/24", T1 + 5 * MIN, T1 + 9 * MIN),
            ("a4", H1, "1.1.1.4", "1.1.1.0/24", T1 + 7 * MIN, T1 + 11 * MIN),
            ("a5", H1, "1.1.1.5", "1.1.1.0/24", T1 + 22 * MIN, T1 + 23 * MIN),
            ("q1", H1, "1.1.1.9", "1.1.1.0/24", T1 + 11 * MIN, T1 + 12 * MIN),
            ("q2", H1, "1.1.1.8", "1.1.1.0/24", T1 + 16 * MIN, T1 + 17 * MIN),
            ("q3", H1, "1.1.1.7", "1.1.1.0/24", T1 + 31 * MIN, T1 + 32 * MIN),
            ("b1", H1, "2.2.2.1", "2.2.2.0/24", T1 + 11 * MIN, T1 + 12 * MIN)]
    truth = spark.createDataFrame([("a1", "4g"), ("a2", "5g"), ("a3", "wifi"), ("a4", "wifi"), ("a5", "wifi"),
                                   ("q1", "4g"), ("q2", "4g"), ("q3", "4g"), ("b1", "4g")], "conn_id string, true_type string")
    s = _sessions_at(spark, rows, S)
    shares = emulate.true_stream_shares(s, truth, S)
    est = s.where(F.col("conn_id").isin("q1", "q2", "q3", "b1"))
    got = emulate.true_table_stream_policy(est, shares, S, 1)
    # q1 at 01:11 → table 01:10: a1, a2, a3 (2 of 3 cellular) → BBR; q2 at 01:16 → table 01:15:
    # a2, a3, a4 (1 of 3) → CUBIC; q3 at 01:31 → table 01:30: a5 only → CUBIC; b1 → default
    want = spark.createDataFrame([("q1", "bbr"), ("q2", "cubic"), ("q3", "cubic"), ("b1", "cubic")], got.schema)
    assertDataFrameEqual(got, want)
    bbr_default = EmulateSettings(window_minutes=60, train_hours=0, stream_trigger_minutes=5, stream_window_minutes=10,
                                  default_cc="bbr")
    got_b = {r["conn_id"]: r["choice"] for r in emulate.true_table_stream_policy(est, shares, bbr_default, 1).collect()}
    assert got_b["b1"] == "bbr" and got_b["q2"] == "cubic", f"only a prefix without sessions keeps the default: {got_b}"


def test_truth_check_reports_each_policys_share_of_the_true_types_gain(spark):
    """Gains against the given all-CUBIC base, as shares of true_type's gain (cubic not run)."""
    rows = [("true_type", 0.01, 0.0), ("true_type", 0.03, 0.0), ("x", 0.03, 0.0), ("x", 0.04, 0.0)]
    truthful = spark.createDataFrame([(pol, "n1", 0, "p", "wifi", reb, ret) for pol, reb, ret in rows],
                                     "policy string, node_id string, window_ms long, prefix string, net_type string, "
                                     "exp_rebuffer double, exp_retrans double")
    cells = emulate.truth_cells(truthful, EmulateSettings(min_cell_sessions=1))
    base = 1 - 0.8 * 0.05
    out = emulate.truth_check(truthful, cells, P, base=base)
    assert out["true_type"]["exp_qoe_gain_vs_cubic"] == pytest.approx(0.8 * 0.03)
    assert out["x"]["share_of_true_type_gain"] == pytest.approx((0.8 * 0.015) / (0.8 * 0.03))
    assert out["true_type"]["share_of_true_type_gain"] == pytest.approx(1.0)


def test_truth_check_bootstraps_the_share_over_nodes(spark):
    """With each node's all-CUBIC base, the share's interval comes from resampling nodes: x keeps
    half of true_type's gain on n1 and none on n2, so its interval spans [0, 0.5] around 0.25."""
    rows = [("true_type", "n1", 0.01), ("true_type", "n1", 0.03), ("x", "n1", 0.03), ("x", "n1", 0.04),
            ("true_type", "n2", 0.02), ("true_type", "n2", 0.02), ("x", "n2", 0.05), ("x", "n2", 0.05)]
    truthful = spark.createDataFrame([(pol, node, 0, "p", "wifi", reb, 0.0) for pol, node, reb in rows],
                                     "policy string, node_id string, window_ms long, prefix string, net_type string, "
                                     "exp_rebuffer double, exp_retrans double")
    cells = emulate.truth_cells(truthful, EmulateSettings(min_cell_sessions=1))
    by_node = {"n1": (2, 2 - 0.8 * 0.1), "n2": (2, 2 - 0.8 * 0.1)}
    out = emulate.truth_check(truthful, cells, P, base=1 - 0.8 * 0.05, base_by_node=by_node)
    assert out["x"]["share_of_true_type_gain"] == pytest.approx(0.25)
    assert out["x"]["share_of_true_type_gain_node_95"] == pytest.approx([0.0, 0.5])
    assert out["x"]["exp_qoe_gain_vs_cubic_node_95"] == pytest.approx([0.0, 0.8 * 0.015])
    assert out["true_type"]["share_of_true_type_gain_node_95"] == pytest.approx([1.0, 1.0])
