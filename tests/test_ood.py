"""A model that knows when it does not know (models/ood.py): the out-of-domain guard passes the
training rows at its quantile and flags rows far outside them (RTT × 10, MSS 536); temperature
scaling lowers an over-confident classifier's calibration error; the guard and the temperature
travel with the registered model; inference gives out-of-domain rows decision "ood" and the
default CC; the export counts them and the emulated ALICCS table leaves them on the default."""
from __future__ import annotations

import ipaddress

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from ccs_testing import copy_lake
from ccselect.contract import FEATURES, PREDICTION_DECISIONS
from ccselect.hours import Window

pytestmark = pytest.mark.filterwarnings("ignore")

RTT = ("min_rtt_us", "min_srtt_us", "max_srtt_us")


def _overconfident(n=20000, seed=0):
    """Labels y and a score s with P(y = 1 | s) = sigmoid(2 s); the classifier says sigmoid(4 s)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    s = (2 * y - 1) + rng.normal(size=n)
    return 1 / (1 + np.exp(-4 * s)), y


def test_temperature_scaling_lowers_the_ece_of_an_overconfident_classifier():
    from ccselect.models.ood import calibrate, ece, fit_calibration, fit_temperature
    p, y = _overconfident()
    t = fit_temperature(p, y)
    assert t == pytest.approx(2.0, rel=0.1)          # the true posterior is sigmoid(4 s / 2)
    c = fit_calibration(p, y)
    assert c.temperature == t and c.ece_after < c.ece_before / 3 and c.nll_after < c.nll_before
    p2, y2 = _overconfident(seed=1)                  # fresh rows: the temperature generalizes
    assert ece(calibrate(p2, t), y2) < ece(p2, y2) / 3
    # what §4.2's 0.8 then means: of the rows calibrated at 0.8-0.9, about 80-90% are Wi-Fi
    q = calibrate(p2, t)
    band = (q >= 0.8) & (q < 0.9)
    assert 0.78 <= y2[band].mean() <= 0.92
    np.testing.assert_array_equal(calibrate(p, 1.0), p)
    assert fit_temperature(p[y == 1], y[y == 1]) == 1.0   # one class only: no fit


def test_guard_json_roundtrip_and_quantiles():
    from ccselect.models.ood import DomainGuard, fit_guard
    z = np.random.default_rng(0).normal(size=(5000, len(FEATURES)))
    for method in ("mahalanobis", "maxabs"):
        g = fit_guard(z, FEATURES, 0.999, method)
        assert DomainGuard.from_json(g.to_json()) == g
        assert g.flags(z).mean() <= 0.0015
        assert g.threshold_at(0.99) < g.threshold < g.threshold_at(1.0)
        assert g.flags(np.full((1, len(FEATURES)), np.nan)).all()   # non-finite rows are out of domain


def test_calibration_split_holds_out_whole_paths():
    from ccselect.models.train import TrainData
    from ccselect.models.train_job import calibration_split
    rng = np.random.default_rng(0)
    n = 2000
    data = TrainData(rng.normal(size=(n, 12)).astype(np.float32), rng.integers(0, 2, n), rng.integers(0, 200, n),
                     rng.integers(0, 3, n), (3, 3))
    fit, held = calibration_split(data, 0.1, seed=0)
    assert len(fit.y) + held.sum() == n
    assert not set(data.prefix[held]) & set(fit.prefix)
    assert len(set(data.prefix[held])) == round(0.1 * len(set(data.prefix)))
    same, none = calibration_split(data, 0.0, seed=0)
    assert same is data and not none.any()


def test_heldout_calibration_fits_half_the_nodes_and_reports_the_other_half():
    """Temperature on held-out nodes (infer.calibration_on: heldout_nodes): fitted on half of
    them, and on the other half — rows it never saw — the ECE falls and the §4.2 thresholds' trusted
    rows are fewer and right more often (an over-confident model trusts too many)."""
    from ccselect.models.ood import Calibration
    from ccselect.models.train_job import heldout_calibration
    from ccselect.settings import InferSettings
    parts = [_overconfident(n=3000, seed=s) for s in range(4)]
    p = np.concatenate([q for q, _ in parts])
    y = np.concatenate([t for _, t in parts])
    node = np.repeat(np.array(["n0", "n1", "n2", "n3"], dtype=object), 3000)
    ip = InferSettings()
    c = heldout_calibration(p, y, node, seed=3, ip=ip)
    assert c.n == 6000 and c.temperature == pytest.approx(2.0, rel=0.1)
    fitted = set(c.rows.split("(")[1].rstrip(")").split(", "))
    assert len(fitted) == 2 and c.report["n"] == 6000, (c.rows, c.report)
    r = c.report
    assert r["ece_after"] < r["ece_before"] / 3
    before, after = r["trust_before"], r["trust_after"]
    assert after["wifi_right"] >= ip.wifi_threshold and after["cell_right"] >= ip.cell_threshold
    assert after["wifi_share"] < before["wifi_share"] and after["cell_share"] < before["cell_share"]
    assert after["wifi_right"] > before["wifi_right"] and after["cell_right"] > before["cell_right"]
    assert Calibration.from_json(c.to_json()) == c
    one = heldout_calibration(p[:3000], y[:3000], node[:3000], seed=3, ip=ip)   # a single node: fit, no report
    assert one.report is None and one.n == 3000


def _raw(x, stats):
    """Raw feature values back from standardized rows (inverse of log1p + z-score)."""
    std = np.where(np.asarray(stats.std) > 0, stats.std, 1.0)
    return np.expm1(x.astype(np.float64) * std + np.asarray(stats.mean))


def _standardize(raw, stats):
    from ccselect.models.infer import standardize
    return standardize([raw[:, j] for j in range(raw.shape[1])], stats.mean, stats.std)


def _far(raw):
    """The synthetic out-of-domain rows: every row with its RTTs × 10, and every row with MSS 536."""
    ix = {f: i for i, f in enumerate(FEATURES)}
    rtt = raw.copy()
    for f in RTT:
        rtt[:, ix[f]] *= 10
    mss = raw.copy()
    mss[:, ix["mss_bytes"]] = 536
    return {"rtt_x10": rtt, "mss_536": mss}


@pytest.fixture(scope="module")
def registered(tmp_path_factory, spark, small_lake):
    """A copy of the small lake with a champion registered with its guard (fitted on the labelled
    training rows) and a calibration; the model's weights are random — the guard and the decision
    rule do not depend on them."""
    import torch

    from ccselect.features import scaling
    from ccselect.models import registry
    from ccselect.models.crossnode import per_node, summary
    from ccselect.models.dataset import load_labelled
    from ccselect.models.nets import Classifier, Generator, NetTypeModel
    from ccselect.models.ood import fit_calibration, fit_guard
    from ccselect.models.train import TrainParams
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("ood_lake"))
    cfg = lake.cfg()
    stats = scaling.load(lake.stats_path)
    lab = load_labelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats)
    torch.manual_seed(0)
    model = NetTypeModel(Generator(12), Classifier()).eval()
    with torch.no_grad():
        p = model(torch.as_tensor(lab.x))[:, 1].double().numpy()
    ip = cfg.settings.infer
    guard = fit_guard(lab.x, stats.features, ip.ood_quantile, ip.ood_method, ip.ood_margin)
    calibration = fit_calibration(p, lab.y, rows="all labelled rows (test)")
    pn = per_node(lab.y, p, lab.node)
    _, version = registry.log_training(cfg, TrainParams(variant="mlp", epochs=0), model, stats, pn, summary(pn),
                                       window=lake.window, train_nodes=sorted(set(lab.node)),
                                       guard=guard, calibration=calibration)
    loose = type(cfg)(path=cfg.path, raw={**cfg.raw, "model": {**cfg.raw.get("model", {}), "gate": {
        "min_mean_accuracy": 0.0, "min_worst_accuracy": 0.0, "max_drop_vs_champion": 1.0}}})
    assert registry.gate(loose, version)["passed"]
    registry.promote(cfg, version)
    return lake, cfg, stats, lab, guard, calibration


def test_guard_passes_the_training_rows_and_flags_far_rows(registered):
    lake, cfg, stats, lab, guard, _ = registered
    assert guard.method == cfg.settings.infer.ood_method and guard.quantile == 0.999
    assert guard.flags(lab.x).mean() <= 0.002             # its 99.9th percentile, nothing out of range
    for name, raw in _far(_raw(lab.x, stats)).items():
        share = guard.flags(_standardize(raw, stats)).mean()
        assert share >= 0.9, f"{name}: only {share:.1%} flagged"


def test_the_registered_model_carries_its_guard_and_temperature(registered):
    import mlflow

    from ccselect.models import registry
    lake, cfg, stats, lab, guard, calibration = registered
    champ = registry.load_champion(cfg)
    assert champ.guard == guard and champ.calibration == calibration
    assert champ.temperature == calibration.temperature != 1.0
    run = registry.configure(cfg).get_run(champ.run_id)
    assert run.data.metrics["calibration_temperature"] == pytest.approx(calibration.temperature)
    assert run.data.metrics["ood_threshold"] == pytest.approx(guard.threshold)
    assert mlflow.artifacts.load_text(f"runs:/{champ.run_id}/ood/{registry.GUARD_FILE}") == guard.to_json()


def test_decide_gives_ood_rows_the_default_cc(spark):
    from ccselect.settings import InferSettings
    from ccselect.models.infer import decide
    p = InferSettings(default_cc="reno")
    df = spark.createDataFrame([(0, 0.99, True), (1, 0.99, False), (2, 0.01, True), (3, 0.01, None), (4, None, None),
                                (5, 0.7, True)], "id int, p_wifi double, ood boolean")
    got = {r["id"]: (r["decision"], r["cc"]) for r in decide(df, p).collect()}
    assert got == {0: ("ood", "reno"), 1: ("model", "cubic"), 2: ("ood", "reno"), 3: ("model", "bbr"),
                   4: ("fallback", "reno"), 5: ("ood", "reno")}
    assert {d for d, _ in got.values()} <= set(PREDICTION_DECISIONS) | {"evidence"}


def test_inference_writes_ood_with_the_default_cc(spark, registered):
    from dataclasses import replace

    from ccselect.models import infer, registry
    from ccselect.models.ood import calibrate
    lake, cfg, stats, lab, guard, calibration = registered
    champ = registry.load_champion(cfg)
    src = infer.extract(spark, cfg, Window.hours(lake.lo, lake.hi)).orderBy("conn_id").limit(400).toPandas()
    raw = src[list(FEATURES)].to_numpy(dtype=np.float64)
    frames = [src.assign(kind="as_is")]
    for name, far in _far(raw).items():
        frames.append(src.assign(**{f: far[:, j].astype(np.int64) for j, f in enumerate(FEATURES)},
                                 conn_id=src["conn_id"] + "-" + name, kind=name))
    pdf = pd.concat(frames, ignore_index=True)
    df = spark.createDataFrame(pdf.drop(columns="kind"), schema=infer.extract(spark, cfg, Window.hours(lake.lo, lake.hi)).schema)
    p = cfg.settings.infer
    out = infer.transform(df, champ, p).toPandas().merge(pdf[["conn_id", "kind"]], on="conn_id")
    assert set(out["decision"]) <= set(PREDICTION_DECISIONS) | {"evidence"}
    ood = out["decision"] == "ood"
    assert (out.loc[ood, "cc"] == p.default_cc).all()
    share = out.groupby("kind")["decision"].apply(lambda d: (d == "ood").mean())
    assert share["rtt_x10"] >= 0.9 and share["mss_536"] >= 0.9, share
    assert share["as_is"] <= 0.05, share
    # the guard's own verdict, row by row, and the calibrated probability
    z = _standardize(out[["conn_id"]].merge(pdf, on="conn_id")[list(FEATURES)].to_numpy(np.float64), stats)
    judged = (out["decision"] != "evidence").to_numpy()     # the evidence rule comes first (issue 57)
    np.testing.assert_array_equal(ood.to_numpy()[judged], guard.flags(z, p.ood_quantile)[judged])
    import torch
    with torch.no_grad():
        direct = champ.model(torch.as_tensor(z))[:, 1].double().numpy()
    np.testing.assert_allclose(out["p_wifi"], calibrate(direct, calibration.temperature), rtol=1e-5, atol=1e-6)
    # switched off: no ood decisions, the raw probability
    off = infer.transform(df, champ, replace(p, ood_guard=False, calibrate=False)).toPandas()
    assert "ood" not in set(off["decision"])


def test_export_counts_ood_beside_fallback(spark):
    from ccselect.settings import PrefixLadder
    from ccselect.export.tables import aggregate as agg
    rows = [("1.1.1.%d" % i, "bbr", "model", 1) for i in range(10)] + [("2.2.2.2", "cubic", "fallback", 4),
                                                                       ("3.3.3.3", "cubic", "ood", 5)]
    preds = spark.createDataFrame([(ip, cc, d, "cubic", r) for ip, cc, d, r in rows],
                                  "client_ip string, cc string, decision string, default_cc string, requests long")
    settings = PrefixLadder()
    decisions = agg.address_decisions(preds)
    aggs = agg.spark_aggregate(decisions, settings)
    m = agg.table_metrics(decisions, [a.entry() for a in aggs], aggs)
    assert (m["weight_model"], m["weight_fallback"], m["weight_ood"], m["weight_all"]) == (10, 4, 5, 19)
    assert m["ood_share"] == pytest.approx(5 / 19) and m["fallback_share"] == pytest.approx(4 / 19)
    assert not any(a.network.overlaps(ipaddress.ip_network("3.3.3.0/24")) for a in aggs)   # no entry from it


def test_emulated_aliccs_leaves_ood_on_the_default(spark, cfg):
    from ccselect.lake import table_path
    from ccselect.settings import EmulateSettings
    from ccselect.evaluation import emulate
    from test_emulate import H0, H1, P, _trace
    preds = [(f"q{i}", "n1", H0, f"7.7.{i}.9", "bbr", "model", "cubic", 3) for i in range(24)]   # a pure /16 with its support → one entry
    preds += [("o1", "n1", H0, "6.6.6.6", "bbr", "ood", "cubic", 3)]                              # ood: no entry
    preds += [("f1", "n1", H0, "8.8.8.8", "bbr", "fallback", "cubic", 3)]
    (spark.createDataFrame(preds, "conn_id string, node_id string, hour string, client_ip string, cc string, decision string, "
                                  "default_cc string, requests long")
     .write.format("delta").save(table_path(cfg, "gold.predictions")))
    trace = [("s1", H1, "7.7.200.1", "7.7.200.0/24", "wifi", "cubic", 0.1, 0.0),
             ("s2", H1, "6.6.6.6", "6.6.6.0/24", "wifi", "cubic", 0.1, 0.0)]
    est = emulate.sessions(_trace(spark, trace), P)
    counts: dict = {}
    got = {r["conn_id"]: r["choice"] for r in emulate.aliccs_policy(spark, cfg, est, EmulateSettings(), counts).collect()}
    assert got == {"s1": "bbr", "s2": "cubic"}
    assert counts == {"model": 24, "ood": 1, "fallback": 1}
