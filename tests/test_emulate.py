"""Trace-driven emulation (evaluation/emulate.py, ALICCS §5.4): the estimator on hand-made traces with
known answers, each policy's decision rule on hand-made inputs, and the job on the main job's lake
(with the simulator's truth beside it)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES
from ccselect.hours import Window
from ccselect.settings import EmulateSettings
from ccselect.evaluation import emulate

H0, H1 = "2026-11-01T00", "2026-11-01T01"
T0, T1 = 1_761_955_200_000, 1_761_955_200_000 + 3_600_000   # the two hours' starts (UTC ms)
P = EmulateSettings(window_minutes=60, train_hours=0)


def _trace(spark, rows):
    """Silver-like rows (the columns `emulate.sessions` reads): (conn_id, hour, ip, prefix24,
    label, cc, rebuffer rate, retransmission rate); one node, play 10 s, 1000 segments out."""
    cols = ["conn_id", "node_id", "hour", "in_range", "client_ip", "ug_id", "cc", *FEATURES, "prefix24", "prefix48",
            "label", "pred_net_type", "ts_start_ms", "play_ms", "rebuffer_ms", "total_retrans", "data_segs_out"]
    out = []
    for cid, hour, ip, p24, label, cc, reb, ret in rows:
        t = (T0 if hour == H0 else T1) + 1000
        out.append((cid, "n1", hour, True, ip, "henan-AS4134", cc, *[100] * len(FEATURES), p24, None,
                    label, None, t, 10_000, int(round(reb * 10_000)), int(round(ret * 1000)), 1000))
    schema = ", ".join(f"{c} {t}" for c, t in zip(cols, ["string", "string", "string", "boolean", "string", "string", "string",
                                                         *["long"] * len(FEATURES), "string", "string", "string", "string",
                                                         "long", "long", "long", "long", "long"]))
    return spark.createDataFrame(out, schema)


# Window 0: /24 A (Wi-Fi) served by both CCs. Window 1: A only by CUBIC (BBR's outcome comes from
# window 0: history); /24 B (4G) only by BBR and /24 C (4G) only by CUBIC, ever (each one's other
# CC comes from the node's 4G sessions of the window); /24 D without a type, only CUBIC (BBR
# nowhere for its type: unestimated, the observed outcome kept).
TRACE = [
    ("a1", H0, "1.1.1.1", "1.1.1.0/24", "wifi", "cubic", 0.10, 0.000),
    ("a2", H0, "1.1.1.2", "1.1.1.0/24", "wifi", "bbr", 0.20, 0.000),
    ("a3", H0, "1.1.1.3", "1.1.1.0/24", "wifi", "cubic", 0.30, 0.100),
    ("a4", H1, "1.1.1.4", "1.1.1.0/24", "wifi", "cubic", 0.05, 0.000),
    ("b1", H1, "2.2.2.1", "2.2.2.0/24", "4g", "bbr", 0.02, 0.010),
    ("c1", H1, "3.3.3.1", "3.3.3.0/24", "5g", "cubic", 0.40, 0.200),
    ("d1", H1, "4.4.4.1", "4.4.4.0/24", None, "cubic", 0.50, 0.300),
]


def test_estimates_follow_the_chain_observed_window_history_node_unestimated(spark):
    est = emulate.estimates(emulate.sessions(_trace(spark, TRACE), P))
    got = est.select("conn_id", "net_type", "reb_cubic", "ret_cubic", "lvl_cubic", "reb_bbr", "ret_bbr", "lvl_bbr")
    expected = spark.createDataFrame([
        ("a1", "wifi", 0.10, 0.000, "observed", 0.20, 0.000, "window"),
        ("a2", "wifi", 0.20, 0.050, "window", 0.20, 0.000, "observed"),
        ("a3", "wifi", 0.30, 0.100, "observed", 0.20, 0.000, "window"),
        ("a4", "wifi", 0.05, 0.000, "observed", 0.20, 0.000, "history"),
        ("b1", "cell", 0.40, 0.200, "node", 0.02, 0.010, "observed"),
        ("c1", "cell", 0.40, 0.200, "observed", 0.02, 0.010, "node"),
        ("d1", "unknown", 0.50, 0.300, "observed", 0.50, 0.300, "unestimated"),
    ], got.schema)
    assertDataFrameEqual(got, expected, rtol=1e-9)


def test_a_labelled_sessions_type_is_silvers_int_label_not_the_prediction(spark):
    """silver's `label` is an int, 1 Wi-Fi / 0 4G-5G (features/labels.py): a labelled session's
    type is its label even where the champion predicted the other type; an unlabelled one takes
    the prediction, else "unknown"."""
    rows = [("w", H0, "1.1.1.1", "1.1.1.0/24", "1", "cubic", 0.1, 0.0),
            ("c", H0, "2.2.2.1", "2.2.2.0/24", "0", "bbr", 0.1, 0.0),
            ("p", H0, "3.3.3.1", "3.3.3.0/24", None, "cubic", 0.1, 0.0),
            ("u", H0, "4.4.4.1", "4.4.4.0/24", None, "cubic", 0.1, 0.0)]
    predicted = F.create_map(*map(F.lit, ("w", "cell", "c", "wifi", "p", "cell")))[F.col("conn_id")]
    silver = (_trace(spark, rows).withColumn("label", F.col("label").cast("int"))
              .withColumn("pred_net_type", predicted))
    got = emulate.sessions(silver, P).select("conn_id", "net_type", "type_label")
    expected = spark.createDataFrame([("w", "wifi", 1), ("c", "cell", 0), ("p", "cell", None), ("u", "unknown", None)],
                                     got.schema)
    assertDataFrameEqual(got, expected)


def test_scoring_a_policy_counts_every_estimate_level(spark):
    est = emulate.estimates(emulate.sessions(_trace(spark, TRACE), P))
    scored = emulate.score(est, {"bbr": emulate.fixed_policy(est, "bbr"), "cubic": emulate.fixed_policy(est, "cubic")}, P)
    w = emulate.per_window(scored)
    got = (w.groupBy("policy").agg(F.sum("sessions").alias("sessions"), *[F.sum(f"n_{lv}").alias(lv) for lv in emulate.LEVELS])
           .orderBy("policy"))
    expected = spark.createDataFrame([("bbr", 7, 2, 2, 1, 1, 1), ("cubic", 7, 5, 1, 0, 1, 0)], got.schema)
    assertDataFrameEqual(got, expected)
    # all-BBR's mean rebuffer rate: a1 .2, a2 .2, a3 .2, a4 .2 (history), b1 .02, c1 .02 (node), d1 .5 (kept)
    reb = scored.where("policy = 'bbr'").agg(F.avg("rebuffer")).first()[0]
    assert reb == pytest.approx((0.2 * 4 + 0.02 * 2 + 0.5) / 7), "all-BBR rebuffer from the estimates"
    q = scored.where("policy = 'bbr' and conn_id = 'b1'").first()["qoe"]
    assert q == pytest.approx(1 - 0.8 * 0.02 - 0.2 * 0.01), "§5.4 QoE with α = 0.8"


def _noise_trace(spark, seed: int, cells: int = 150, per_cell: int = 12, bbr_gain: float = 0.0):
    """Cells (one /24 each, one window) whose CCs are drawn from the same rebuffer distribution,
    except that BBR's mean is lower by `bbr_gain`; the CC by the client IP's parity as the A/B
    split does."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(cells):
        base = rng.uniform(0.02, 0.08)
        for i in range(per_cell):
            cc = "bbr" if i % 2 else "cubic"
            mean = base - (bbr_gain if cc == "bbr" else 0.0)
            reb = float(min(1.0, max(0.0, mean * rng.gamma(0.5, 2.0))))
            rows.append((f"x{c}-{i}", H1, f"10.{c // 250}.{c % 250}.{i + 1}", f"10.{c // 250}.{c % 250}.0/24",
                         "wifi", cc, reb, 0.0))
    return _trace(spark, rows)


def test_cross_fitted_oracle_does_not_score_the_noise_it_picked(spark):
    """With two CCs that are truly the same, the in-sample Oracle of §5.4 still 'gains' (it picks
    whichever average the noise favoured and is scored with that same average); the cross-fitted
    one gains nothing beyond noise. With a real BBR advantage, the cross-fitted Oracle finds it."""
    def gains(df):
        est = emulate.estimates(emulate.sessions(df, P)).persist()
        choices = {"cubic": emulate.fixed_policy(est, "cubic"), "oracle": emulate.oracle_crossfit(est, P),
                   "oracle_insample": emulate.oracle_insample(est, P), "bbr": emulate.fixed_policy(est, "bbr")}
        q = {r["policy"]: r["q"] for r in emulate.score(est, choices, P).groupBy("policy").agg(F.avg("qoe").alias("q")).collect()}
        return {k: v - q["cubic"] for k, v in q.items()}

    same = gains(_noise_trace(spark, 1))
    sd = 0.8 * 0.05 * np.sqrt(2) / np.sqrt(150 * 12)        # ≈ the standard error of a policy's mean QoE
    assert same["oracle_insample"] > 8 * sd, f"in-sample Oracle should show a winner's curse: {same}"
    assert abs(same["oracle"]) < 4 * sd, f"cross-fitted Oracle should not gain on pure noise: {same}"
    real = gains(_noise_trace(spark, 2, bbr_gain=0.02))
    assert real["oracle"] > 0.5 * real["bbr"] > 0, f"cross-fitted Oracle should find BBR's real advantage: {real}"


def test_pytheas_tries_each_cc_then_settles_on_the_better_one(spark):
    rows = [(f"p{i:04d}", H1, "5.5.5.1", "5.5.5.0/24", "wifi", "cubic" if i % 2 else "bbr", 0.05, 0.0)
            for i in range(400)]
    df = _trace(spark, rows).withColumn("ts_start_ms", F.col("ts_start_ms") + F.substring("conn_id", 2, 4).cast("long"))
    s = emulate.sessions(df, P)
    # outcome model: BBR's QoE is better by 0.02 rebuffer for every session of the group
    est = (s.withColumn("reb_cubic", F.lit(0.07)).withColumn("reb_bbr", F.lit(0.05) + (F.rand(3) - 0.5) * 0.01)
           .withColumn("ret_cubic", F.lit(0.0)).withColumn("ret_bbr", F.lit(0.0)))
    ch = emulate.pytheas_policy(est, P).join(s.select("conn_id", "ts_start_ms"), "conn_id").orderBy("ts_start_ms").collect()
    picks = [r["choice"] for r in ch]
    assert picks[:2] == ["cubic", "bbr"], "each CC is tried once first"
    assert picks.count("bbr") / len(picks) > 0.9, f"settles on the better CC: {picks.count('bbr')} of {len(picks)}"


def test_aliccs_uses_the_previous_hours_table_and_keeps_the_default_on_a_miss(spark, cfg):
    from ccselect.lake import table_path
    preds = [(f"q{i}", "n1", H0, f"7.7.{i}.9", "bbr", "model", "cubic", 3) for i in range(12)]   # a pure /16 → one entry
    preds += [("f1", "n1", H0, "8.8.8.8", "bbr", "fallback", "cubic", 3)]                         # fallback: no entry
    preds += [("q99", "n1", H1, "9.9.9.9", "bbr", "model", "cubic", 3)]                           # hour 1: not the table of hour 1
    (spark.createDataFrame(preds, "conn_id string, node_id string, hour string, client_ip string, cc string, decision string, "
                                  "default_cc string, requests long")
     .write.format("delta").save(table_path(cfg, "gold.predictions")))
    trace = [("s1", H1, "7.7.200.1", "7.7.200.0/24", "wifi", "cubic", 0.1, 0.0),   # inside 7.7.0.0/16
             ("s2", H1, "8.8.8.8", "8.8.8.0/24", "wifi", "cubic", 0.1, 0.0),        # only a fallback
             ("s3", H1, "9.9.9.9", "9.9.9.0/24", "wifi", "cubic", 0.1, 0.0)]        # same-hour decision only
    est = emulate.sessions(_trace(spark, trace), P)
    got = {r["conn_id"]: r["choice"] for r in emulate.aliccs_policy(spark, cfg, est, EmulateSettings()).collect()}
    assert got == {"s1": "bbr", "s2": "cubic", "s3": "cubic"}


def test_flow_policies_decide_as_the_kernel_from_the_table_entry_and_the_handshake(spark, cfg):
    """aliccs_fill / _combine / _flow (issue 27): the previous hour's entry (a pure /16, purity
    1000) or a miss, and each session's handshake, through table_format.decide as the kernel
    runs it; the tree: mss <= 1000 -> bbr (900), else cubic (600)."""
    from ccselect.contract import HANDSHAKE_FEATURES
    from ccselect.lake import table_path
    from ccselect.export.artifact import table_format as tf
    preds = [(f"q{i}", "n1", H0, f"7.7.{i}.9", "bbr", "model", "cubic", 3) for i in range(12)]
    (spark.createDataFrame(preds, "conn_id string, node_id string, hour string, client_ip string, cc string, decision string, "
                                  "default_cc string, requests long")
     .write.format("delta").save(table_path(cfg, "gold.predictions")))
    trace = [("s1", H1, "7.7.200.1", "7.7.200.0/24", "wifi", "cubic", 0.1, 0.0),
             ("s2", H1, "7.7.200.2", "7.7.200.0/24", "wifi", "cubic", 0.1, 0.0),
             ("s3", H1, "9.9.9.9", "9.9.9.0/24", "wifi", "cubic", 0.1, 0.0),
             ("s4", H1, "9.9.9.8", "9.9.9.0/24", "wifi", "cubic", 0.1, 0.0)]
    mss = F.when(F.col("conn_id").isin("s1", "s3"), F.lit(500)).otherwise(F.lit(1460)).cast("long")
    est = emulate.sessions(_trace(spark, trace), P).withColumn(HANDSHAKE_FEATURES[0], mss)
    B, C = tf.CC_IDS["bbr"], tf.CC_IDS["cubic"]
    tree = tf.Tree((tf.TreeNode(tf.TREE_FEATURES.index("mss_bytes"), 1000, 1, 2),
                    tf.TreeNode(tf.TREE_LEAF, cc=B, conf_permille=900),
                    tf.TreeNode(tf.TREE_LEAF, cc=C, conf_permille=600)), 950)
    want = {"fill": ({"s1": "bbr", "s2": "bbr", "s3": "bbr", "s4": "cubic"}, {"table": 2, "flow": 2}),
            "combine": ({"s1": "bbr", "s2": "bbr", "s3": "bbr", "s4": "cubic"}, {"table": 2, "flow": 2}),
            "flow": ({"s1": "bbr", "s2": "cubic", "s3": "bbr", "s4": "cubic"}, {"flow": 4})}
    for mode, (choices, decisions) in want.items():
        df, info = emulate.flow_policy(spark, cfg, est, EmulateSettings(), tree, mode)
        got = {r["conn_id"]: r["choice"] for r in df.collect()}
        assert got == choices, f"{mode}: {got}"
        assert info["decisions"] == decisions, f"{mode}: {info['decisions']}"


def _cells(values: dict[str, list[list[float]]]) -> "pd.DataFrame":
    """gold.emulation_cells-like rows: per policy, per node, one cell per value (10 sessions each)."""
    import pandas as pd
    return pd.DataFrame([(pol, f"n{i}", 0, f"10.0.{j}.0/24", "wifi", 10, v)
                         for pol, nodes in values.items() for i, node in enumerate(nodes) for j, v in enumerate(node)],
                        columns=["policy", "node_id", "window_ms", "prefix", "net_type", "sessions", "rebuffer_rate"])


def test_true_table_is_the_previous_hours_majority_true_type_per_prefix(spark):
    """The bound of a prefix table one hour old: hour 01's sessions get the CC of their /24's
    majority true type in hour 00 (A: 2 of 3 cellular → BBR, whatever A is in hour 01; B: Wi-Fi →
    CUBIC; D: one each, no majority → CUBIC), and a /24 without hour-00 sessions keeps the default
    (C, though cellular)."""
    rows = [("a1", H0, "1.1.1.1", "1.1.1.0/24", None, "cubic", 0.1, 0.0), ("a2", H0, "1.1.1.2", "1.1.1.0/24", None, "cubic", 0.1, 0.0),
            ("a3", H0, "1.1.1.3", "1.1.1.0/24", None, "bbr", 0.1, 0.0), ("a4", H1, "1.1.1.4", "1.1.1.0/24", None, "cubic", 0.1, 0.0),
            ("b1", H0, "2.2.2.1", "2.2.2.0/24", None, "cubic", 0.1, 0.0), ("b2", H1, "2.2.2.2", "2.2.2.0/24", None, "bbr", 0.1, 0.0),
            ("c1", H1, "3.3.3.1", "3.3.3.0/24", None, "cubic", 0.1, 0.0),
            ("d1", H0, "4.4.4.1", "4.4.4.0/24", None, "cubic", 0.1, 0.0), ("d2", H0, "4.4.4.2", "4.4.4.0/24", None, "bbr", 0.1, 0.0),
            ("d3", H1, "4.4.4.3", "4.4.4.0/24", None, "bbr", 0.1, 0.0)]
    truth = spark.createDataFrame([("a1", "4g"), ("a2", "5g"), ("a3", "wifi"), ("a4", "wifi"), ("b1", "wifi"), ("b2", "4g"),
                                   ("c1", "4g"), ("d1", "4g"), ("d2", "wifi"), ("d3", "4g")], "conn_id string, true_type string")
    s = emulate.sessions(_trace(spark, rows), P)
    est = s.where(F.col("hour") == H1)
    got = {r["conn_id"]: r["choice"] for r in emulate.true_table_policy(s, est, truth, P).collect()}
    assert got == {"a4": "bbr", "b2": "cubic", "c1": "cubic", "d3": "cubic"}, got
    p0 = EmulateSettings(window_minutes=60, train_hours=0, table_lag_hours=0)
    got0 = {r["conn_id"]: r["choice"] for r in emulate.true_table_policy(s, est, truth, p0).collect()}
    assert got0 == {"a4": "cubic", "b2": "bbr", "c1": "bbr", "d3": "bbr"}, "with lag 0, the hour's own majority"


def test_tail_contrasts_bootstrap_over_nodes():
    """Known answers: a policy whose every cell is 0.01 above the reference's is 0.01 worse at every
    percentile in every resample; two policies equal cell for cell differ by nothing, also when
    their means differ in the last bits (the same sessions summed in another order); a cell with
    fewer than min_cell_sessions sessions is left out of both."""
    rng = np.random.default_rng(0)
    ref = [list(rng.uniform(0, 0.05, 40)) for _ in range(8)]
    # each cell's mean summed in another order: equal, or a few ulps apart
    noisy = [[float(np.sum(np.array([v / 3, v / 3, v - 2 * (v / 3)])[::-1])) for v in n] for n in ref]
    assert any(a != b for n, m in zip(ref, noisy) for a, b in zip(n, m))
    cells = _cells({"aliccs": ref, "worse": [[v + 0.01 for v in n] for n in ref], "same": ref, "same_bits_apart": noisy})
    cells.loc[len(cells)] = ("aliccs", "n0", 0, "10.9.9.0/24", "wifi", 2, 0.9)      # too few sessions: ignored
    out = emulate.tail_contrasts(cells, EmulateSettings(bootstrap_reps=50))
    assert out["nodes"] == 8 and out["cells"] == 8 * 40 and out["reps"] == 50
    for q in ("p85", "p90", "p95", "p99"):
        w, s = out["vs"]["worse"][q], out["vs"]["same"][q]
        assert w["diff"] == pytest.approx(-0.01) and w["lo"] == pytest.approx(-0.01) and w["hi"] == pytest.approx(-0.01)
        assert w["p_lower"] == 1.0
        assert s["diff"] == s["lo"] == s["hi"] == 0.0 and s["p_lower"] == 0.0
        b = out["vs"]["same_bits_apart"][q]
        assert abs(b["diff"]) < 1e-15 and b["p_lower"] == 0.0, b


def test_tail_contrasts_interval_covers_a_difference_carried_by_one_node():
    """The reference is better only on one node of eight: the point difference at p99 is real on
    this sample, but resampling nodes shows it rests on that node (the interval reaches 0)."""
    base = [[0.001 * (j % 10) for j in range(50)] for _ in range(8)]
    bad = [list(n) for n in base]
    bad[3] = [v + 0.5 for v in bad[3]]                       # one node's cells far worse under "other"
    out = emulate.tail_contrasts(_cells({"aliccs": base, "other": bad}), EmulateSettings(bootstrap_reps=200))
    c = out["vs"]["other"]["p99"]
    assert c["diff"] < -0.1, c
    assert c["hi"] == pytest.approx(0.0) and 0.3 < c["p_lower"] < 0.9, c


def test_the_main_job_emulates_its_hourly_hour_under_every_policy_and_a_rerun_changes_nothing(spark, main_job):
    """The main job's step 6 (`flows.main_job._emulate`) on its lake: its champion scored hour 05
    (the one hourly run), the baselines learn from the hours before; with a single hourly run the
    ALICCS table is hour 05's own (lag 0). The simulator's truth gives true_type and the truth
    check. Then the same emulation again: gold.emulation unchanged."""
    from ccselect.lake import table_path
    cfg, res, _ = main_job
    hour = "2026-11-01T05"
    out = res["emulation"]
    assert "error" not in out, out
    assert "emulation       : hour 2026-11-01T05" in res["summary"], res["summary"]
    pol = out["policies"]
    assert set(pol) == set(emulate.POLICIES), f"every policy scored: {sorted(pol)}"
    silver = (spark.read.format("delta").load(table_path(cfg, "silver.connections"))
              .where((F.col("hour") == hour) & (F.col("play_ms") > 0)))
    n, n_cubic = silver.count(), silver.where("cc = 'cubic'").count()
    assert out["sessions"] == n > 500, "the range's playback sessions"
    for name, d in pol.items():
        assert d["sessions"] == n and sum(d["levels"].values()) == n, f"{name}: every session scored once, one level each"
        assert d["truth"]["sessions"] == n, f"{name}: truth joined for every session"
    assert pol["cubic"]["levels"]["observed"] == n_cubic, "all-CUBIC is observed exactly where the trace used CUBIC"
    assert pol["oracle"]["gap_closed"]["oracle"] == pytest.approx(1.0)
    assert 0.0 < pol["aliccs"]["share_bbr"] < 1.0, "the table sends some prefixes to BBR and keeps others on CUBIC"
    assert pol["true_type"]["truth"]["exp_qoe_gain_vs_cubic"] > 0, "the true type's CC beats all-CUBIC in truth"
    for name in ("configanator", "disco"):
        assert out["baselines"][name], f"{name} trained on the hours before"
    assert {"p85", "p90", "p95", "p99"} <= set(pol["aliccs"]["rebuffer_pct"]), "the tail of the cells' rebuffer rate"
    assert {"p85", "p90", "p95", "p99"} <= set(pol["aliccs"]["truth"]["exp_rebuffer_pct"]), "the same tail in truth"
    tc = out["tail_contrasts"]
    for kind in ("estimated", "truth"):
        assert tc[kind]["reference"] == "aliccs" and set(tc[kind]["vs"]) == set(emulate.POLICIES) - {"aliccs"}, tc[kind]
        for c in tc[kind]["vs"]["disco"].values():
            assert c["lo"] <= c["diff"] <= c["hi"] and 0.0 <= c["p_lower"] <= 1.0, c

    def table():
        return spark.read.format("delta").load(table_path(cfg, "gold.emulation")).where(F.col("window") == f"{hour}..{hour}")
    before = table().toPandas()
    assert set(before["policy"]) == set(emulate.POLICIES)
    assert (before.groupby("policy")["sessions"].sum() == n).all()
    emulate.run(spark, cfg, Window.hours(hour), truth_dir=cfg.settings.pipeline.raw_dir,
                params=replace(cfg.settings.emulate, table_lag_hours=0))
    after = table()
    assertDataFrameEqual(after, spark.createDataFrame(before, after.schema), rtol=1e-9)
