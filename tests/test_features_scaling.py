"""log1p + standardization: fitted statistics, the transform, and the stored artifact."""
from __future__ import annotations

import math

from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES
from ccselect.features import scaling


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


def _two_partitionings(spark, pdf):
    """The same rows as one partition in one order, and as seven hash partitions in the reverse
    order: how `local[*]` and a cluster's executors can each see one table (issue 30)."""
    one = spark.createDataFrame(pdf).repartition(1)
    seven = spark.createDataFrame(pdf.iloc[::-1].reset_index(drop=True)).repartition(7, "k")
    return one, seven


def test_statistics_do_not_depend_on_the_partitioning(spark):
    import numpy as np
    import pandas as pd

    from ccselect.models.dataset import Unlabelled  # noqa: F401  (the per-node statistics use the same sums)
    rng = np.random.default_rng(3)
    n = 20_000
    pdf = pd.DataFrame({f: rng.lognormal(5, 2.5, n) for f in FEATURES[:4]})
    pdf["k"] = rng.integers(0, 50, n)
    pdf.loc[rng.random(n) < 0.05, FEATURES[1]] = None          # missing (imputed) values are skipped
    one, seven = _two_partitionings(spark, pdf)
    a = scaling.fit(one, "w", FEATURES[:4])
    b = scaling.fit(seven, "w", FEATURES[:4])
    assert a == b                                                # to the last bit
    # and the exact sums give the statistics numpy computes in float64 (to rounding)
    for i, f in enumerate(FEATURES[:4]):
        v = np.log1p(pdf[f].dropna().to_numpy())
        assert abs(a.mean[i] - v.mean()) < 1e-12 * max(1.0, abs(v.mean()))
        assert abs(a.std[i] - v.std()) < 1e-9 * v.std()


def test_exact_moments():
    from decimal import Decimal
    m, sd = scaling.exact_moments(4, Decimal("10"), Decimal("30"))    # 1, 2, 3, 4
    assert m == 2.5 and abs(sd - 1.118033988749895) < 1e-15
    assert scaling.exact_moments(0, None, None) == (0.0, 0.0)
    assert scaling.exact_moments(3, Decimal("3"), Decimal("3")) == (1.0, 0.0)   # constant
