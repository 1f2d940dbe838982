"""Training-set labels (wifi → 1, 4g/5g → 0, balancing) and the per-/24 best-CC label."""
from __future__ import annotations

from pyspark.testing import assertDataFrameEqual

from ccselect.features.labels import best_cc_per_prefix24, training_set


def test_training_set_maps_and_balances(spark):
    rows = [(f"w{i}", "n", "wifi") for i in range(6)] + [(f"c{i}", "n", "4g") for i in range(2)] \
        + [("f0", "n", "5g"), ("x", "n", None), ("y", "n", "satellite")]
    df = spark.createDataFrame(rows, "conn_id string, node_id string, net_type string")
    unbalanced = training_set(df, None).select("conn_id", "label")
    assertDataFrameEqual(unbalanced, spark.createDataFrame(
        [(f"w{i}", 1) for i in range(6)] + [("c0", 0), ("c1", 0), ("f0", 0)], "conn_id string, label int"))
    bal = training_set(df, 0.5).groupBy("label").count()
    assertDataFrameEqual(bal, spark.createDataFrame([(0, 3), (1, 3)], "label int, count bigint"))
    # Deterministic: the same rows every time.
    assert sorted(r.conn_id for r in training_set(df, 0.5).collect()) == \
        sorted(r.conn_id for r in training_set(df, 0.5).collect())


def test_best_cc_per_prefix24(spark):
    rows = [("1.2.3.0/24", "bbr", "ab_control", 1, 1000, 10), ("1.2.3.0/24", "cubic", "ab_control", 1, 1000, 50),
            ("1.2.4.0/24", "bbr", "ab_control", 1, 1000, 10),                         # one arm only
            ("1.2.5.0/24", "bbr", "ab_control", 1, 1000, 10), ("1.2.5.0/24", "cubic", "ab_control", 1, 1000, 10),
            ("1.2.3.0/24", "bbr", "table", 1, 1000, 999),                             # not A/B: ignored
            (None, "bbr", "ab_control", 1, 1000, 0)]
    df = spark.createDataFrame(rows, "prefix24 string, cc string, decision string, qoe_sessions bigint, "
                                     "play_ms bigint, rebuffer_ms bigint")
    got = best_cc_per_prefix24(df, min_sessions=1).select("prefix24", "sessions_bbr", "sessions_cubic", "best_cc",
                                                          "rebuffer_rate_gap")
    assertDataFrameEqual(got, spark.createDataFrame(
        [("1.2.3.0/24", 1, 1, "bbr", 0.04), ("1.2.4.0/24", 1, 0, None, None), ("1.2.5.0/24", 1, 1, None, 0.0)],
        got.schema), rtol=1e-9)
