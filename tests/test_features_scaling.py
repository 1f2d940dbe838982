"""log1p + standardization: fitted statistics, the transform, and the stored artifact."""
from __future__ import annotations

import math

from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES
from features import scaling


def test_fit_transform_and_roundtrip(spark, cfg):
    rows = [tuple(float(v) for v in [x] * len(FEATURES)) for x in (0, math.e - 1, math.e ** 2 - 1)]
    df = spark.createDataFrame(rows, ", ".join(f"{f} double" for f in FEATURES))
    stats = scaling.fit(df, window="w")
    assert stats.features == FEATURES and stats.n == 3
    assert all(abs(m - 1.0) < 1e-9 for m in stats.mean)
    assert all(abs(s - math.sqrt(2 / 3)) < 1e-9 for s in stats.std)
    got = scaling.transform(df, stats).select(*[f"z_{f}" for f in FEATURES[:2]])
    z = 1 / math.sqrt(2 / 3)
    assertDataFrameEqual(got, spark.createDataFrame([(-z, -z), (0.0, 0.0), (z, z)], got.schema), rtol=1e-9)
    path = scaling.save(spark, cfg, stats, "2026-11-01T00:00:00")
    assert scaling.load(path) == stats
    table = spark.read.format("delta").load(f"{cfg.settings.lake.root}/gold/feature_stats")
    assert [r["feature"] for r in table.orderBy("idx").collect()] == list(FEATURES)


def test_constant_feature_and_negative_values(spark):
    df = spark.createDataFrame([(5.0, -3.0), (5.0, 0.0)], "a double, b double")
    stats = scaling.fit(df, window="w", features=("a", "b"))
    got = scaling.transform(df, stats).select("z_a", "z_b")
    # a is constant: std 0 is replaced by 1; b is clipped at 0 before log1p.
    assertDataFrameEqual(got, spark.createDataFrame([(0.0, 0.0), (0.0, 0.0)], got.schema))
