"""Per-prefix feature means (features/prefixes.py): the numpy function on hand-made rows with
hand-computed means, the (node, prefix) path case, and the Spark frame against the numpy one."""
from __future__ import annotations

import numpy as np
import pytest

from ccselect.features.prefixes import prefix_means, prefix_means_frame

X = np.array([[1.0, 10.0],
              [3.0, 20.0],
              [5.0, 60.0],
              [2.0, -4.0],
              [4.0, 0.0]])
PFX = np.array(["10.0.1", "10.0.0", "10.0.1", "10.0.0", "10.0.9"])
NODE = np.array(["n2", "n1", "n1", "n1", "n10"])


def test_one_key_means_counts_and_inverse_by_hand():
    pm = prefix_means(X, PFX)
    assert len(pm.keys) == 1 and list(pm.keys[0]) == ["10.0.0", "10.0.1", "10.0.9"]   # np.unique order
    np.testing.assert_array_equal(pm.means, [[2.5, 8.0],        # rows 1, 3
                                             [3.0, 35.0],       # rows 0, 2
                                             [4.0, 0.0]])       # row 4 alone: its own values
    np.testing.assert_array_equal(pm.counts, [2, 2, 1])
    np.testing.assert_array_equal(pm.inverse, [1, 0, 1, 0, 2])
    assert pm.means.dtype == np.float64 and pm.inverse.dtype == np.int64 and len(pm) == 3
    # every row's own prefix mean, through the inverse index
    np.testing.assert_array_equal(pm.means[pm.inverse][0], [3.0, 35.0])


def test_one_key_keeps_the_key_dtype_order():
    """Integer codes sort as integers (evaluation/experiment.py); strings as strings."""
    codes = np.array([10, 9, 10, 2])
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    pm = prefix_means(x, codes)
    assert list(pm.keys[0]) == [2, 9, 10]
    np.testing.assert_array_equal(pm.means, [[6.0, 7.0], [2.0, 3.0], [2.0, 3.0]])
    assert list(prefix_means(x, codes.astype(str)).keys[0]) == ["10", "2", "9"]


def test_the_means_are_the_add_at_sums_bit_for_bit():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 4)).astype(np.float32)
    pfx = rng.integers(0, 37, 500).astype(str)
    uniq, inv = np.unique(pfx, return_inverse=True)
    sums = np.zeros((len(uniq), 4))
    np.add.at(sums, inv, x)
    pm = prefix_means(x, pfx)
    assert np.array_equal(pm.means, sums / np.bincount(inv)[:, None])
    np.testing.assert_array_equal(pm.keys[0], uniq)


def test_node_and_prefix_paths():
    pm = prefix_means(X, NODE, PFX)
    # "node|prefix" string order (models.dataset.path_ids): "n10|…" sorts before "n1|…"
    paths = [f"{n}|{p}" for n, p in zip(*pm.keys)]
    assert paths == ["n10|10.0.9", "n1|10.0.0", "n1|10.0.1", "n2|10.0.1"]
    np.testing.assert_array_equal(pm.means, [[4.0, 0.0], [2.5, 8.0], [5.0, 60.0], [1.0, 10.0]])
    np.testing.assert_array_equal(pm.counts, [1, 2, 1, 1])
    np.testing.assert_array_equal(pm.inverse, [3, 1, 2, 1, 0])
    from ccselect.models.dataset import path_ids
    np.testing.assert_array_equal(pm.inverse, path_ids(NODE, PFX))


def test_empty_rows_and_no_key():
    pm = prefix_means(np.zeros((0, 3)), np.array([], dtype=str), np.array([], dtype=str))
    assert pm.means.shape == (0, 3) and len(pm.inverse) == 0
    with pytest.raises(TypeError):
        prefix_means(X)


def test_spark_frame_matches_numpy(spark):
    rows = [(str(n), str(p), float(a), float(b)) for n, p, (a, b) in zip(NODE, PFX, X)]
    df = spark.createDataFrame(rows, "node_id string, prefix24 string, z_a double, z_b double")
    out = prefix_means_frame(df, ["node_id", "prefix24"], ("a", "b")).toPandas()
    assert list(out.columns) == ["node_id", "prefix24", "n_rows", "m_a", "m_b"]
    out = out.set_index(["node_id", "prefix24"])
    pm = prefix_means(X, NODE, PFX)
    for i, key in enumerate(zip(*pm.keys)):
        r = out.loc[key]
        assert int(r["n_rows"]) == pm.counts[i]
        np.testing.assert_allclose([r["m_a"], r["m_b"]], pm.means[i], rtol=0, atol=1e-12)
    assert len(out) == len(pm)
    # one key, and columns without a prefix
    one = prefix_means_frame(df.withColumnRenamed("z_a", "a"), "prefix24", ("a",), prefix="").toPandas()
    one = one.set_index("prefix24").sort_index()
    pm1 = prefix_means(X, PFX)
    assert list(one.index) == list(pm1.keys[0])
    np.testing.assert_array_equal(one["m_a"].to_numpy(), pm1.means[:, 0])
    np.testing.assert_array_equal(one["n_rows"].to_numpy(), pm1.counts)


def test_spark_means_and_groups_do_not_depend_on_the_partitioning(spark):
    """The same rows split two ways (one partition; seven, reversed) give the same per-prefix
    means and the same K-means groups, bit for bit (issue 30: local mode and a cluster)."""
    import pandas as pd

    from ccselect.models.groups import cluster_type, prefix_vectors
    rng = np.random.default_rng(5)
    n = 6_000
    pdf = pd.DataFrame({"label": rng.integers(0, 2, n).astype("int32"),
                        "prefix24": [f"10.{i // 256}.{i % 256}" for i in rng.integers(0, 300, n)],
                        **{f"z_{f}": rng.normal(0, 1, n) * (1 + i) for i, f in enumerate("abcd")}})
    one = spark.createDataFrame(pdf).repartition(1)
    seven = spark.createDataFrame(pdf.iloc[::-1].reset_index(drop=True)).repartition(7, "prefix24")
    means = [prefix_vectors(df, tuple("abcd")) for df in (one, seven)]
    got = [m.toPandas().sort_values(["label", "prefix24"]).reset_index(drop=True) for m in means]
    np.testing.assert_array_equal(np.stack(got[0]["vec"].map(lambda v: v.toArray())),
                                  np.stack(got[1]["vec"].map(lambda v: v.toArray())))
    for label in (0, 1):
        n_pfx = int((got[0]["label"] == label).sum())
        groups = [cluster_type(m.where(f"label = {label}"), n_pfx, 4, (2, 6), 7)[0]
                  .toPandas().sort_values("prefix24").reset_index(drop=True) for m in means]
        pd.testing.assert_frame_equal(groups[0], groups[1])
        assert groups[0]["group"].nunique() == 4
