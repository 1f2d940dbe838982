"""The model pipeline over the lake: dataset arrays, prefix groups, node split, per-node scores,
the Configanator-style baseline and `ccs evaluate` end to end (on the shared `small_lake`)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from ccs_testing import copy_lake
from ccselect.hours import Window


@pytest.fixture(scope="module")
def lake(small_lake, tmp_path_factory):
    """A writable copy of the small lake (this module writes gold.prefix_groups / model_eval)."""
    return copy_lake(small_lake, tmp_path_factory.mktemp("models_lake"))


@pytest.fixture(scope="module")
def stats(lake):
    from ccselect.features import scaling
    return scaling.load(lake.stats_path)


@pytest.fixture(scope="module")
def labelled(spark, lake, stats):
    from ccselect.models.dataset import load_labelled
    return load_labelled(spark, lake.cfg(), Window.hours(lake.lo, lake.hi), stats)


# -- dataset ---------------------------------------------------------------------------------------
def test_labelled_arrays_match_training_set_and_scaling(spark, lake, stats, labelled):
    from ccselect.contract import FEATURES
    from ccselect.lake import table_path
    ts = (spark.read.format("delta").load(table_path(lake.cfg(), "gold.training_set"))
          .where(F.col("window") == lake.window)
          .select("conn_id", "node_id", "hour", "label", F.coalesce("prefix24", "prefix48").alias("pfx"), *FEATURES)
          .toPandas().sort_values(["node_id", "hour", "conn_id"]).reset_index(drop=True))
    n = len(ts)
    assert n == lake.training_rows and n > 0
    assert labelled.x.shape == (n, 12) and labelled.x.dtype == np.float32
    assert labelled.y.dtype == np.int8 and set(np.unique(labelled.y)) == {0, 1}
    assert list(labelled.conn_id) == list(ts["conn_id"]) and list(labelled.node) == list(ts["node_id"])
    assert list(labelled.prefix24) == list(ts["pfx"]) and list(labelled.hour) == list(ts["hour"])
    np.testing.assert_array_equal(labelled.y, ts["label"].to_numpy())
    # standardization = features.scaling: (log1p(max(x, 0)) - mean) / std, model order
    raw = ts[list(FEATURES)].to_numpy(dtype=np.float64)
    std = np.where(np.array(stats.std) > 0, np.array(stats.std), 1.0)
    expect = (np.log1p(np.maximum(raw, 0)) - np.array(stats.mean)) / std
    np.testing.assert_allclose(labelled.x, expect, rtol=1e-5, atol=1e-5)
    assert stats.features == FEATURES


def test_to_train_data_groups_paths_and_nearest_centroid():
    from ccselect.models.dataset import Labelled, to_train_data
    x = np.array([[0, 0], [0.2, 0], [5, 5], [5.2, 5], [4.9, 5.1], [0.1, 0.1], [9, 9]], dtype=np.float32)
    lab = Labelled(x=x, y=np.array([0, 0, 0, 0, 1, 1, 1], dtype=np.int8),
                   prefix24=np.array(["a", "a", "b", "c", "a", "d", "e"], dtype=object),
                   node=np.array(["n1", "n1", "n1", "n2", "n1", "n2", "n2"], dtype=object),
                   hour=np.array(["h"] * 7, dtype=object), conn_id=np.array(list("1234567"), dtype=object))
    # 4G: a → 0, b → 1, c has no group: its mean (5.2, 5) is nearest to group 1's centroid (b)
    # Wi-Fi: d → 0, e → 1; a (4.9, 5.1) has distance² 48.0 to d (0.1, 0.1), 32.0 to e (9, 9) → 1
    groups = pd.DataFrame({"label": [0, 0, 1, 1], "prefix24": ["a", "b", "d", "e"], "group": [0, 1, 0, 1],
                           "k": [2, 2, 3, 3]})
    data, node = to_train_data(lab, groups)
    assert data.n_groups == (2, 3)
    assert data.group.tolist() == [0, 0, 1, 1, 1, 0, 1]
    # paths: (node, prefix) pairs numbered in sorted order: n1|a, n1|b, n2|c, n2|d, n2|e
    assert data.prefix.tolist() == [0, 0, 1, 2, 0, 3, 4]
    assert data.y.tolist() == [0, 0, 0, 0, 1, 1, 1] and node.tolist() == lab.node.tolist()
    assert data.x is lab.x


# -- prefix groups ---------------------------------------------------------------------------------
def test_fit_groups_every_labelled_prefix_one_group_per_type(spark, lake, stats, labelled):
    from ccselect.models.groups import fit_groups, load_groups
    cfg = lake.cfg()
    summary = fit_groups(spark, cfg, Window.hours(lake.lo, lake.hi), stats, k=3)
    g = load_groups(spark, cfg, lake.window)
    expect = (pd.DataFrame({"label": labelled.y.astype(int), "prefix24": labelled.prefix24})
              .drop_duplicates().sort_values(["label", "prefix24"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(g[["label", "prefix24"]].astype({"label": int}), expect)
    assert not g.duplicated(["label", "prefix24"]).any()
    for t, name in ((0, "4g"), (1, "wifi")):
        gt = g[g["label"] == t]
        assert set(gt["k"]) == {3} and set(gt["group"]) == {0, 1, 2}
        assert summary["types"][name]["k"] == 3 and summary["types"][name]["chosen_by"] == "config"
        assert summary["types"][name]["n_prefixes"] == len(gt)
        assert summary["types"][name]["n_rows"] == int((labelled.y == t).sum())
    assert summary["rows"] == len(g)
    # re-running the window replaces it (no duplicates)
    fit_groups(spark, cfg, Window.hours(lake.lo, lake.hi), stats, k=3)
    assert len(load_groups(spark, cfg, lake.window)) == len(g)


def test_groups_are_kmeans_of_prefix_means(spark, lake, stats, labelled):
    """Each /24 sits with the group whose centroid (mean of member /24 means) is nearest."""
    from ccselect.features.prefixes import prefix_means
    from ccselect.models.groups import compute_groups
    pdf, summary = compute_groups(spark, lake.cfg(), Window.hours(lake.lo, lake.hi), stats, k=2)
    for t in (0, 1):
        m = labelled.y == t
        pm = prefix_means(labelled.x[m].astype(np.float64), labelled.prefix24[m].astype(str))
        uniq, means = pm.keys[0], pm.means
        gmap = dict(zip(pdf[pdf.label == t].prefix24, pdf[pdf.label == t].group))
        grp = np.array([gmap[p] for p in uniq])
        cents = np.stack([means[grp == c].mean(0) for c in range(2)])
        nearest = ((means[:, None] - cents[None]) ** 2).sum(-1).argmin(1)
        assert (nearest == grp).mean() >= 0.98


def test_groups_k_by_silhouette_reported(spark, lake, stats):
    from ccselect.config import Config
    from ccselect.models.groups import compute_groups
    cfg = lake.cfg()
    model = {**cfg.raw.get("model", {}), "groups": {"k": None, "k_range": [2, 4], "seed": 7}}
    cfg = Config(cfg.path, {**cfg.raw, "model": model})     # a short K range keeps the test quick
    pdf, summary = compute_groups(spark, cfg, Window.hours(lake.lo, lake.hi), stats, k=None)
    for name, t in (("4g", 0), ("wifi", 1)):
        info = summary["types"][name]
        assert info["chosen_by"] == "silhouette"
        scores = {int(k): v for k, v in info["silhouette"].items()}
        assert sorted(scores) == [2, 3, 4] and info["k"] == max(scores, key=lambda k: (scores[k], -k))
        assert set(pdf[pdf.label == t]["group"]) == set(range(info["k"]))


# -- evaluation helpers ----------------------------------------------------------------------------
def test_split_nodes_seeded_disjoint_sorted():
    from ccselect.models.crossnode import split_nodes
    nodes = [f"n{i:02d}" for i in range(10)] + ["n03"]
    tr, te = split_nodes(nodes, share=0.3, seed=5)
    assert len(tr) == 3 and len(te) == 7
    assert tr == sorted(tr) and te == sorted(te)
    assert set(tr).isdisjoint(te) and set(tr) | set(te) == set(nodes)
    assert split_nodes(nodes, 0.3, 5) == (tr, te)
    assert any(split_nodes(nodes, 0.3, s)[0] != tr for s in range(6, 12))
    assert split_nodes(["a", "b"], 0.01, 0)[0] in (["a"], ["b"])  # at least one each side
    assert len(split_nodes(["a", "b"], 0.99, 0)[1]) == 1
    # the share is of the whole fleet (ALICCS: labels from ~30% of the nodes), drawn from the
    # labelled ones: 30% of 20 nodes is 6 of the 10 labelled
    fleet = [f"n{i:02d}" for i in range(20)]
    tr, te = split_nodes(fleet[:10], 0.3, 5, fleet=fleet)
    assert len(tr) == 6 and len(te) == 4 and set(tr) | set(te) == set(fleet[:10])


def test_per_node_and_summary_hand_made():
    from ccselect.models.crossnode import per_node, summary
    y = np.array([1, 1, 0, 0, 1, 0, 0, 0, 1])
    p = np.array([.9, .4, .1, .6, .5, .2, .3, .49, .7])
    node = np.array(["b", "b", "b", "b", "a", "a", "a", "a", "c"])
    got = per_node(y, p, node)
    expect = pd.DataFrame({
        "node_id": ["a", "b", "c"], "n": [4, 4, 1],
        "accuracy": [1.0, 0.5, 1.0], "wifi_recall": [1.0, 0.5, 1.0],
        "cell_recall": [1.0, 0.5, math.nan], "share_cell": [0.75, 0.5, 0.0]})
    pd.testing.assert_frame_equal(got, expect, check_dtype=False)
    s = summary(got)
    assert s == {"mean": pytest.approx(2.5 / 3), "worst": 0.5, "std": pytest.approx(np.std([1, .5, 1])), "nodes": 3}
    strict = per_node(y, p, node, threshold=0.95)   # everything 4G
    assert strict["accuracy"].tolist() == [0.75, 0.5, 0.0]


def test_seed_average_is_each_nodes_mean_over_seeds():
    from ccselect.models.crossnode import seed_average, summary
    a = pd.DataFrame({"node_id": ["n1", "n2"], "n": [10, 20], "accuracy": [0.9, 0.6], "wifi_recall": [1.0, 0.5],
                      "cell_recall": [0.8, np.nan], "share_cell": [0.5, 0.0]})
    b = a.assign(accuracy=[0.7, 0.8], wifi_recall=[0.6, 0.7], cell_recall=[0.6, np.nan])
    avg = seed_average([a, b])
    assert avg.accuracy.tolist() == pytest.approx([0.8, 0.7]) and avg.n.tolist() == [10, 20]
    assert avg.wifi_recall.tolist() == pytest.approx([0.8, 0.6]) and avg.cell_recall.iloc[0] == pytest.approx(0.7)
    assert np.isnan(avg.cell_recall.iloc[1]) and avg.share_cell.tolist() == [0.5, 0.0]
    # each seed alone has a worst node at 0.6 or 0.7; averaged, the worst node is at 0.7
    assert summary(avg)["worst"] == pytest.approx(0.7) and summary(a)["worst"] == 0.6
    assert seed_average([a]) is a


def test_configanator_nc_and_tree():
    """Two network classes split by a per-/24 feature mean that rows alone do not show."""
    from ccselect.settings import ConfiganatorSettings
    from ccselect.models.configanator import fit, predict_proba
    rng = np.random.default_rng(0)
    rows = []
    for p in range(40):
        cls = p % 2                    # per-/24 class: mean of feature 1 is −2 or +2
        for _ in range(30):
            y = rng.integers(0, 2)
            f0 = (1 if y else -1) * (1 if cls else -1) + rng.normal(0, 0.3)   # relation flips by class
            rows.append((f"n{p % 4}", f"p{p}", y, f0, (2 if cls else -2) + rng.normal(0, 3.0)))
    df = pd.DataFrame(rows, columns=["node", "pfx", "y", "f0", "f1"])
    x = df[["f0", "f1"]].to_numpy(np.float32)
    model, info = fit(ConfiganatorSettings(k=2, min_samples_leaf=5, seed=0), x, df.y.to_numpy(),
                      df.node.to_numpy(object), df.pfx.to_numpy(object))
    assert info["k"] == 2 and info["chosen_by"] == "config"
    acc = ((predict_proba(model, x, df.node.to_numpy(object), df.pfx.to_numpy(object)) >= 0.5) == df.y).mean()
    assert acc > 0.95
    # without the class the tree cannot tell (f1 is too noisy row by row)
    from sklearn.tree import DecisionTreeClassifier
    t = DecisionTreeClassifier(min_samples_leaf=5, max_depth=4, random_state=0).fit(x, df.y)
    assert (t.predict(x) == df.y).mean() < acc


# -- ccs evaluate end to end -----------------------------------------------------------------------
def _ccs(args: list[str]):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_ccs_evaluate_json_all_variants_writes_model_eval(spark, lake, stats, labelled, monkeypatch):
    from ccselect.lake import table_path
    from ccselect.evaluation.evaluate import ALL_VARIANTS
    from ccselect.models.crossnode import split_nodes
    from ccselect.models.dataset import load_labelled, window_nodes
    monkeypatch.delenv("CCS_CONFIG", raising=False)
    res = _ccs(["evaluate", "--hours", f"{lake.lo}..{lake.hi}", "--epochs", "1", "--k", "2",
                "--seed", "3", "--json", "--config", str(lake.cfg_path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    # training nodes: 30% of the window's nodes, drawn from the labelled ones; training rows: the
    # (balanced) training set of those nodes; held-out nodes: all their labelled connections
    natural = load_labelled(spark, lake.cfg(), Window.hours(lake.lo, lake.hi), stats, balanced=False)
    fleet = window_nodes(spark, lake.cfg(), Window.hours(lake.lo, lake.hi))
    assert set(natural.node) < set(fleet), "the small lake has nodes without labels"
    train_nodes, test_nodes = split_nodes(natural.node, 0.3, 3, fleet=fleet)
    assert out["train_nodes"] == train_nodes and out["test_nodes"] == test_nodes
    assert out["n_train"] == int(np.isin(labelled.node, train_nodes).sum())
    assert out["n_test"] == int(np.isin(natural.node, test_nodes).sum())
    assert out["n_test"] > int(np.isin(labelled.node, test_nodes).sum()), "held-out rows are not downsampled"
    assert set(out["variants"]) == set(ALL_VARIANTS)
    # the invariance probe (issue 28): the node read from the features, and from each network
    # variant's G (not Configanator's or the boosted trees': they have none)
    assert 0.0 <= out["probe"]["features"]["balanced_accuracy"] <= 1.0 and out["probe"]["features"]["nodes"] >= 2
    for v in ALL_VARIANTS:
        pr = out["variants"][v]["probe"]
        assert (pr is None) == (v in ("configanator", "gbdt", "gbdt_nodestd")), (v, pr)
    ev = (spark.read.format("delta").load(table_path(lake.cfg(), "gold.model_eval"))
          .where(F.col("window") == lake.window).toPandas())
    assert sorted(zip(ev.variant, ev.node_id)) == sorted((v, n) for v in ALL_VARIANTS for n in test_nodes)
    te = np.isin(natural.node, test_nodes)
    n_per_node = pd.Series(natural.node[te]).value_counts().to_dict()
    share_cell = pd.Series(natural.y[te] == 0).groupby(natural.node[te]).mean().to_dict()
    for _, r in ev.iterrows():
        assert r.n == n_per_node[r.node_id] and r.share_cell == pytest.approx(share_cell[r.node_id])
        assert 0.0 <= r.accuracy <= 1.0
    summ = (spark.read.format("delta").load(table_path(lake.cfg(), "gold.model_eval_summary"))
            .where(F.col("window") == lake.window).toPandas().set_index("variant"))
    for v in ALL_VARIANTS:
        acc = ev[(ev.variant == v) & ev.included].accuracy
        assert summ.loc[v, "mean"] == pytest.approx(acc.mean()) == pytest.approx(out["variants"][v]["mean"])
        assert summ.loc[v, "worst"] == pytest.approx(acc.min())
        assert summ.loc[v, "std"] == pytest.approx(acc.std(ddof=0))
        assert summ.loc[v, "nodes"] == len(acc)
        assert len(out["variants"][v]["per_node"]) == len(test_nodes)

    assert summ.loc["mlp", "train_seeds"] == 1 and pd.isna(summ.loc["mlp", "worst_sd"]), "one training seed: no spread"

    # a second run of one variant, over two training seeds, replaces its rows and leaves the others
    res = _ccs(["evaluate", "--hours", f"{lake.lo}..{lake.hi}", "--epochs", "1", "--k", "2", "--seed", "4",
                "--variants", "mlp", "--train-seeds", "2", "--json", "--config", str(lake.cfg_path)])
    assert res.exit_code == 0, res.output
    mlp = json.loads(res.stdout[res.stdout.index("{"):])["variants"]["mlp"]
    assert [x["seed"] for x in mlp["seeds"]] == [4, 5] and mlp["train_seeds"] == 2
    # the node accuracies are averaged over the seeds, so the mean is the seeds' mean and the worst
    # node of the averages is no worse than the worse seed's worst node
    assert mlp["mean"] == pytest.approx(np.mean([x["mean"] for x in mlp["seeds"]]))
    assert mlp["worst"] >= min(x["worst"] for x in mlp["seeds"]) - 1e-12
    assert mlp["worst_sd"] == pytest.approx(np.std([x["worst"] for x in mlp["seeds"]]))
    summ2 = (spark.read.format("delta").load(table_path(lake.cfg(), "gold.model_eval_summary"))
             .where(F.col("window") == lake.window).toPandas().set_index("variant"))
    assert summ2.loc["mlp", "train_seeds"] == 2 and summ2.loc["mlp", "worst_sd"] == pytest.approx(mlp["worst_sd"])
    ev2 = (spark.read.format("delta").load(table_path(lake.cfg(), "gold.model_eval"))
           .where(F.col("window") == lake.window).toPandas())
    assert sorted(ev2[ev2.variant == "mlp"].node_id) == split_nodes(natural.node, 0.3, 4, fleet=fleet)[1]
    assert set(ev2[ev2.variant == "mlp"].seed) == {4}
    assert len(ev2[ev2.variant != "mlp"]) == len(ev[ev.variant != "mlp"])


def test_ccs_groups_cli(lake, monkeypatch):
    monkeypatch.delenv("CCS_CONFIG", raising=False)
    res = _ccs(["groups", "--hours", f"{lake.lo}..{lake.hi}", "--k", "4", "--json", "--config", str(lake.cfg_path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["window"] == lake.window
    assert {t: out["types"][t]["k"] for t in ("4g", "wifi")} == {"4g": 4, "wifi": 4}
