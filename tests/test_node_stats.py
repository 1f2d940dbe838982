"""Per-node standardization deployed (features/node_stats.py, issue 55): silver.node_stats is what
silver's rows say, over every connection, and a re-run of an hour replaces its rows; a node with
too few connections in its trailing window falls back to the fleet's statistics and says so;
both `ccs infer` engines score a per-node standardized champion alike, on the z that its guard
and temperature were fitted on; and the guard judges a shifted node on its own z."""
from __future__ import annotations

from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from ccs_testing import copy_lake
from ccselect.hours import Window

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def lake(tmp_path_factory, small_lake):
    return copy_lake(small_lake, tmp_path_factory.mktemp("node_stats_lake"))


def _table(spark, cfg):
    from ccselect.lake import NODE_STATS, table_path
    return spark.read.format("delta").load(table_path(cfg, NODE_STATS))


def test_table_is_silver_per_node_hour_and_a_rerun_replaces_it(spark, small_lake, tmp_path):
    """Every (node, hour) of silver has one row whose count is all its connections (labelled or
    not) and whose sums are log1p's over the known values; rebuilding two hours changes nothing,
    and rebuilding after silver lost an hour's rows drops that hour's row."""
    from ccselect.contract import FEATURES
    from ccselect.lake import table_path
    from ccselect.features import node_stats
    cfg = copy_lake(small_lake, tmp_path / "lake").cfg()   # its own copy: it deletes an hour of silver
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    pdf = silver.select("node_id", "hour", "label", *FEATURES).toPandas()
    got = _table(spark, cfg).toPandas().sort_values(["node_id", "hour"]).reset_index(drop=True)
    assert len(got) == pdf.groupby(["node_id", "hour"]).ngroups
    counts = pdf.groupby(["node_id", "hour"]).size().reset_index(name="n")
    assert got["n"].tolist() == counts["n"].tolist()
    assert (pdf.groupby(["node_id", "hour"])["label"].count().to_numpy() < got["n"].to_numpy()).all(), \
        "unlabelled rows must count too"
    for f in ("min_rtt_us", "mss_bytes", "max_cwnd_segs"):
        logs = np.log1p(np.maximum(pdf[f].astype(float), 0.0))
        want = logs.groupby([pdf["node_id"], pdf["hour"]]).agg(["count", "sum", lambda v: (v * v).sum()])
        np.testing.assert_array_equal(got[f"n_{f}"].to_numpy(), want["count"].to_numpy())
        np.testing.assert_allclose(got[f"s_{f}"].astype(float).to_numpy(), want["sum"].to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(got[f"q_{f}"].astype(float).to_numpy(), want.iloc[:, 2].to_numpy(), rtol=1e-12)
        assert isinstance(got[f"s_{f}"].iloc[0], Decimal), "sums stay exact decimals"

    keys = {tuple(r) for r in got[["node_id", "hour"]].head(2).itertuples(index=False, name=None)}
    node_stats.write(spark, cfg, keys)
    again = _table(spark, cfg).toPandas().sort_values(["node_id", "hour"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(again[got.columns], got)

    # the check can fail: an hour whose silver rows are gone loses its row on a rebuild
    (node, hour) = sorted(keys)[0]
    from ccselect import delta_io
    delta_io.replace_partitions(silver.where("false"), table_path(cfg, "silver.connections"), {(node, hour)})
    node_stats.write(spark, cfg, {(node, hour)})
    after = _table(spark, cfg).toPandas()
    assert len(after) == len(got) - 1 and not ((after["node_id"] == node) & (after["hour"] == hour)).any()


def _rows(node: str, hours_n: dict[str, int], mean: float, feats=("a", "b")) -> list[dict]:
    """silver.node_stats rows of `node`: per hour n connections whose log1p(feature) alternate
    mean ± 1 (so mean `mean`, population std 1)."""
    out = []
    for hour, n in hours_n.items():
        r = {"node_id": node, "hour": hour, "n": n}
        for f in feats:
            k = n - n % 2
            r[f"n_{f}"] = k
            r[f"s_{f}"] = Decimal(repr(mean)) * k
            r[f"q_{f}"] = Decimal(k // 2) * ((Decimal(repr(mean)) + 1) ** 2 + (Decimal(repr(mean)) - 1) ** 2)
        out.append(r)
    return out


def test_trailing_window_and_fleet_fallback_below_the_minimum():
    """Node a has 240 connections in its last 2 hours (≥ 200): its own mean and std, the hour
    three back not counted; node b has 120: the fleet's statistics, named fleet_fallback; a node
    without rows falls back too. The scored hour's own traffic is part of its window."""
    from ccselect.features.node_stats import FALLBACK, NODE, NodeStandardization, scaling_for, summary
    from ccselect.features.scaling import FeatureStats
    fleet = FeatureStats(("a", "b"), (0.5, 0.25), (2.0, 3.0), 1000, "w")
    rows = pd.DataFrame(_rows("a", {"2026-11-01T07": 1000}, 9.0) +      # outside a 2-hour window of T10
                        _rows("a", {"2026-11-01T09": 100, "2026-11-01T10": 140}, 3.0) +
                        _rows("b", {"2026-11-01T09": 60, "2026-11-01T10": 60}, 5.0))
    ns = NodeStandardization(hours=2, min_conns=200)
    keys = {("a", "2026-11-01T10"), ("b", "2026-11-01T10"), ("c", "2026-11-01T10"), ("a", "2026-11-01T08")}
    t = scaling_for(rows, keys, fleet, ns)
    a = t[("a", "2026-11-01T10")]
    assert (a.source, a.n) == (NODE, 240)
    np.testing.assert_allclose(a.mean, (3.0, 3.0), rtol=1e-15)
    np.testing.assert_allclose(a.std, (1.0, 1.0), rtol=1e-15)
    for key, n in ((("b", "2026-11-01T10"), 120), (("c", "2026-11-01T10"), 0)):
        assert (t[key].source, t[key].n, t[key].mean, t[key].std) == (FALLBACK, n, fleet.mean, fleet.std), key
    # hour T08's window (T07, T08) is T07's 1000 connections: the node's own, mean 9
    a8 = t[("a", "2026-11-01T08")]
    assert (a8.source, a8.n) == (NODE, 1000) and np.allclose(a8.mean, (9.0, 9.0))
    s = summary(t)
    assert (s[NODE], s[FALLBACK]) == (2, 2) and s["fallback_partitions"] == ["b/2026-11-01T10", "c/2026-11-01T10"]


def _sums(node: str, hour: str, raw: np.ndarray, feats) -> dict:
    """A silver.node_stats row of raw feature rows [N, F], as hour_stats computes it."""
    logs = np.log1p(np.maximum(raw, 0.0))
    r = {"node_id": node, "hour": hour, "n": len(raw)}
    for j, f in enumerate(feats):
        r[f"n_{f}"] = len(raw)
        r[f"s_{f}"] = sum((Decimal(float(v)) for v in logs[:, j]), Decimal(0))
        r[f"q_{f}"] = sum((Decimal(float(v * v)) for v in logs[:, j]), Decimal(0))
    return r


def test_guard_judges_a_shifted_node_on_its_own_z():
    """A guard fitted on a node's per-node z flags almost none of another node whose every
    feature is 20× larger (a farther, slower node with the same mix) when that node is scored on
    its own statistics, and almost all of it on the fleet's: the guard reads the z the model sees."""
    from ccselect.features.node_stats import NodeStandardization, scaling_for, standardize
    from ccselect.features.scaling import FeatureStats, exact_moments
    from ccselect.models.ood import fit_guard
    feats = ("f0", "f1", "f2")
    rng = np.random.default_rng(5)
    a = np.exp(rng.normal(5.0, 0.4, (2000, 3)))
    b = a[rng.permutation(2000)[:1000]] * 20.0
    rows = pd.DataFrame([_sums("a", "2026-11-01T10", a, feats), _sums("b", "2026-11-01T10", b, feats)])
    ra = rows.iloc[0]
    moments = [exact_moments(ra[f"n_{f}"], ra[f"s_{f}"], ra[f"q_{f}"]) for f in feats]
    fleet = FeatureStats(feats, tuple(m for m, _ in moments), tuple(s for _, s in moments), len(a), "w")
    t = scaling_for(rows, {("a", "2026-11-01T10"), ("b", "2026-11-01T10")}, fleet, NodeStandardization(1, 100))
    z_a = standardize(list(a.T), t[("a", "2026-11-01T10")], fleet)
    guard = fit_guard(z_a, feats, quantile=0.999)
    on_node = guard.flags(standardize(list(b.T), t[("b", "2026-11-01T10")], fleet)).mean()
    on_fleet = guard.flags(standardize(list(b.T), t[("a", "2026-11-01T10")], fleet)).mean()
    assert on_node < 0.02 and on_fleet > 0.95, (on_node, on_fleet)


@pytest.fixture(scope="module")
def node_champion(spark, lake):
    """A quick MLP trained on the lake's labelled rows standardized per (node, hour) from
    silver.node_stats, its guard and temperature fitted on the same z, registered with its
    NodeStandardization and promoted."""
    from dataclasses import replace

    from ccselect.features import node_stats, scaling
    from ccselect.models import registry
    from ccselect.models.crossnode import per_node, summary
    from ccselect.models.dataset import load_labelled, to_train_data
    from ccselect.models.ood import fit_calibration, fit_guard
    from ccselect.models.train import TrainParams, fit
    cfg = lake.cfg()
    ns = node_stats.NodeStandardization(hours=3, min_conns=100)
    stats = scaling.load(lake.stats_path)
    lab = load_labelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats)
    table = node_stats.lookup(cfg, set(zip(lab.node, lab.hour)), stats, ns, spark)
    lab = replace(lab, x=node_stats.from_fleet_z(lab.x, lab.node, lab.hour, table, stats))
    data, _ = to_train_data(lab, pd.DataFrame(columns=["label", "prefix24", "group", "k"]))
    params = TrainParams(variant="mlp", epochs=8, seed=0, device="cpu")
    trainer = fit(params, data)
    pn = per_node(lab.y, trainer.predict_proba(lab.x), lab.node)
    guard = fit_guard(lab.x, stats.features)
    calibration = fit_calibration(trainer.predict_proba(lab.x), lab.y)
    _, version = registry.log_training(cfg, params, trainer, stats, pn, summary(pn), window=lake.window,
                                       train_nodes=sorted(set(lab.node)), guard=guard, calibration=calibration,
                                       node_std=ns)
    loose = type(cfg)(path=cfg.path, raw={**cfg.raw, "model": {**cfg.raw.get("model", {}), "gate": {
        "min_mean_accuracy": 0.0, "min_worst_accuracy": 0.0, "max_drop_vs_champion": 1.0}}})
    assert registry.gate(loose, version)["passed"]
    registry.promote(cfg, version)
    return cfg, ns, lab


def _predictions(spark, cfg):
    from ccselect.lake import table_path
    return (spark.read.format("delta").load(table_path(cfg, "gold.predictions")).toPandas()
            .sort_values("conn_id").reset_index(drop=True))


def test_both_engines_score_a_node_standardized_champion_on_node_z(spark, lake, node_champion):
    """The champion says it is per-node standardized; the Spark job and the in-process engine
    write the same p_wifi and decisions; p_wifi is the model on each partition's node z (the
    same z training used for its labelled rows), calibrated; the guard's flags are those of that
    z; with a minimum no node reaches, every partition falls back to the fleet's statistics, the
    result says so, and p_wifi is then the fleet-standardized model's."""
    from dataclasses import replace

    from ccselect.contract import FEATURES
    from ccselect.lake import connections_in
    from ccselect.features import node_stats
    from ccselect.models import infer, registry
    from ccselect.models.infer import predict_wifi, standardize
    from ccselect.models.ood import calibrate
    cfg, ns, lab = node_champion
    champ = registry.load_champion(cfg)
    assert champ.node_std == ns
    by_spark = infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=champ, engine="spark")
    spark_rows = _predictions(spark, cfg)
    by_arrow = infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=champ, engine="arrow")
    arrow_rows = _predictions(spark, cfg)
    assert by_arrow["rows"] == by_spark["rows"] == len(spark_rows) > 0
    np.testing.assert_allclose(arrow_rows["p_wifi"], spark_rows["p_wifi"], rtol=0, atol=1e-5)
    pd.testing.assert_series_equal(arrow_rows["decision"], spark_rows["decision"])
    assert by_arrow["node_stats"] == by_spark["node_stats"]
    assert by_spark["node_stats"]["node"] == by_spark["partitions"] and by_spark["node_stats"]["fleet_fallback"] == 0

    silver = (connections_in(spark, cfg, Window.hours(lake.lo, lake.hi)).select("conn_id", "node_id", "hour", *FEATURES)
              .toPandas().sort_values("conn_id").reset_index(drop=True))
    assert silver["conn_id"].tolist() == spark_rows["conn_id"].tolist()
    cols = [silver[f].to_numpy(dtype=np.float64) for f in FEATURES]
    table = node_stats.lookup(cfg, set(zip(silver["node_id"], silver["hour"])), champ.stats, ns)
    z = node_stats.standardize_rows(cols, silver["node_id"].to_numpy(), silver["hour"].to_numpy(), table, champ.stats)
    want = calibrate(predict_wifi(champ.model, z), champ.temperature)
    np.testing.assert_allclose(spark_rows["p_wifi"], want, rtol=0, atol=1e-5)
    judged = (spark_rows["decision"] != "evidence").to_numpy()
    flags = champ.guard.flags(z, cfg.settings.infer.ood_quantile)
    np.testing.assert_array_equal((spark_rows["decision"] == "ood").to_numpy()[judged], flags[judged])
    # training's z of the labelled rows is this z (same statistics, same table)
    by_conn = dict(zip(silver["conn_id"], range(len(silver))))
    idx = np.array([by_conn[c] for c in lab.conn_id])
    np.testing.assert_allclose(lab.x, z[idx], rtol=0, atol=1e-4)
    # the fleet's z would score otherwise: the node path is what ran
    fleet_p = calibrate(predict_wifi(champ.model, standardize(cols, champ.stats.mean, champ.stats.std)),
                        champ.temperature)
    assert np.abs(fleet_p - want).max() > 0.05

    # no node reaches the minimum: every partition on the fleet's statistics, and said so
    starved = replace(champ, node_std=node_stats.NodeStandardization(ns.hours, 10**9))
    res = infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=starved, engine="arrow")
    assert res["node_stats"]["fleet_fallback"] == res["partitions"] and res["node_stats"]["node"] == 0
    assert len(res["node_stats"]["fallback_partitions"]) == res["partitions"]
    np.testing.assert_allclose(_predictions(spark, cfg)["p_wifi"], fleet_p, rtol=0, atol=1e-5)


def test_ccs_train_of_a_nodestd_variant_records_its_standardization(spark, lake, node_champion):
    """`ccs train` of `mlp_nodestd` trains on rows standardized from silver.node_stats, reports
    which partitions fell back, and the run records the window and the minimum it used."""
    import json

    import mlflow
    from ccselect.models import registry, train_job
    cfg, _, _ = node_champion
    out = train_job.run(spark, cfg, Window.hours(lake.lo, lake.hi), variant="mlp_nodestd", epochs=1, k=2, gate=False)
    ns = cfg.settings.model.node_stats
    assert out["variant"] == "mlp_nodestd" and out["params"]["variant"] == "mlp"
    assert (out["node_std"]["hours"], out["node_std"]["min_conns"]) == (ns.hours, ns.min_conns)
    assert out["node_std"]["node"] > 0 and out["node_std"]["fleet_fallback"] == 0, out["node_std"]
    registry.configure(cfg)
    assert json.loads(mlflow.artifacts.load_text(f"runs:/{out['run_id']}/node_std/node_std.json")) == \
        {"hours": ns.hours, "min_conns": ns.min_conns}
    run = mlflow.get_run(out["run_id"])
    assert run.data.tags["variant"] == "mlp_nodestd" and run.data.params["standardization"] == "node"


def test_ccs_evaluate_scores_nodestd_variants_on_the_deployed_statistics(spark, lake):
    """`ccs evaluate`'s per-node standardized variants see the z `ccs infer` would apply: from
    silver.node_stats over the node's trailing window, the fleet's statistics below min_conns.
    With a one-hour window and a minimum just above every hour of one held-out node, that node is
    scored wholly on the fleet's statistics and the result says so (its partitions listed as
    fleet_fallback, its fleet_fallback_share 1); gbdt_nodestd's per-node accuracies are those of
    the same boosted trees fitted on the rows node_stats.lookup + from_fleet_z give, which the
    whole-window per-node statistics evaluate used before do not reproduce."""
    from ccselect.evaluation.evaluate import run_evaluation
    from ccselect.features import node_stats, scaling
    from ccselect.models import gbdt
    from ccselect.models.crossnode import per_node, split_nodes
    from ccselect.models.dataset import load_labelled, window_nodes
    base = lake.cfg()
    counts = _table(spark, base).select("node_id", "hour", "n").toPandas()
    stats = scaling.load(lake.stats_path)
    natural = load_labelled(spark, base, Window.hours(lake.lo, lake.hi), stats, balanced=False)
    fleet = window_nodes(spark, base, Window.hours(lake.lo, lake.hi))
    train_nodes, test_nodes = split_nodes(natural.node, 0.3, 3, fleet=fleet)
    peak = counts.groupby("node_id")["n"].max()
    starved = str(peak[test_nodes].idxmin())
    min_conns = int(peak[starved]) + 1
    assert (counts["n"] >= min_conns).any(), "some partitions must keep their node's statistics"
    cfg = type(base)(path=base.path, raw={**base.raw, "model": {**base.raw.get("model", {}),
                                                                 "node_stats": {"hours": 1, "min_conns": min_conns}}})
    out = run_evaluation(spark, cfg, Window.hours(lake.lo, lake.hi), variants=("gbdt_nodestd", "mlp_nodestd"), seed=3,
                         epochs=1, k=2, write=False)
    assert out["test_nodes"] == test_nodes
    ns = out["node_std"]
    assert (ns["hours"], ns["min_conns"], ns["table"]) == (1, min_conns, "silver.node_stats")
    assert ns["node"] > 0 and ns["fleet_fallback"] > 0
    starved_hours = sorted(h for n, h in zip(natural.node, natural.hour) if n == starved)
    assert {f"{starved}/{h}" for h in starved_hours} <= set(ns["fallback_partitions"])
    for v in ("gbdt_nodestd", "mlp_nodestd"):
        rows = {r["node_id"]: r for r in out["variants"][v]["per_node"]}
        assert rows[starved]["fleet_fallback_share"] == 1.0, (v, rows[starved])
        assert "silver.node_stats" in out["variants"][v]["params"]["standardized"]
    # gbdt_nodestd reproduced from the deployed path
    tr = load_labelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats, nodes=train_nodes)
    te = natural.of_nodes(test_nodes)
    ns_obj = node_stats.NodeStandardization(1, min_conns)
    table = node_stats.lookup(cfg, set(zip(tr.node, tr.hour)) | set(zip(te.node, te.hour)), stats, ns_obj, spark)
    x_te = node_stats.from_fleet_z(te.x, te.node, te.hour, table, stats)
    np.testing.assert_array_equal(x_te[te.node == starved], te.x[te.node == starved])  # the fleet's z
    model = gbdt.fit(node_stats.from_fleet_z(tr.x, tr.node, tr.hour, table, stats), tr.y, 3)
    want = per_node(te.y, gbdt.predict_proba(model, x_te), te.node).set_index("node_id")["accuracy"]
    got = pd.Series({r["node_id"]: r["accuracy"] for r in out["variants"]["gbdt_nodestd"]["per_node"]})
    pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)
    # the check can fail: whole-window per-node statistics (what evaluate used before) score otherwise
    from ccselect.models.dataset import load_unlabelled
    unl = load_unlabelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats, 10)
    old = gbdt.fit(unl.per_node_standardized(tr.x, tr.node), tr.y, 3)
    before = per_node(te.y, gbdt.predict_proba(old, unl.per_node_standardized(te.x, te.node)), te.node)
    assert not np.allclose(before.set_index("node_id")["accuracy"].sort_index().to_numpy(), want.sort_index().to_numpy())
