"""MLflow tracking and registry on a real SQLite store under a temporary data root: a training
run's params, per-epoch metrics (with steps), artifacts and version tags; the validation gate and
promotion (a failing version never becomes challenger or champion); loading through
`models:/<name>@champion`; and `ccs train` end to end on the small lake."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from ccs_testing import copy_lake, write_config
from ccselect.hours import Window

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def tiny():
    """A small trained model (2 epochs on separable synthetic rows) and its feature statistics."""
    from ccselect.contract import FEATURES
    from ccselect.features.scaling import FeatureStats
    from ccselect.models.train import TrainData, TrainParams, fit
    rng = np.random.default_rng(3)
    n = 512
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    x[:, 3] += 2.5 * (1 - y)  # 4G rows: larger min RTT
    data = TrainData(x, y, rng.integers(0, 40, n), rng.integers(0, 2, n), (2, 2))
    params = TrainParams(epochs=2, batch_size=128, seed=1, device="cpu")
    stats = FeatureStats(FEATURES, tuple(float(i) for i in range(12)), tuple(1.0 + i / 10 for i in range(12)),
                         n, "2026-11-01T00..2026-11-01T05")
    return params, data, stats


def _cfg(tmp_path, **gate):
    from ccselect.config import load_config
    cfg = load_config(write_config(tmp_path))
    if gate:
        raw = dict(cfg.raw)
        raw["model"] = {**(raw.get("model") or {}), "gate": {**raw.get("model", {}).get("gate", {}), **gate}}
        cfg = type(cfg)(path=cfg.path, raw=raw)
    return cfg


def _per_node(mean: float, worst: float) -> tuple[pd.DataFrame, dict]:
    pn = pd.DataFrame({"node_id": ["n01", "n02"], "n": [100, 80], "accuracy": [2 * mean - worst, worst],
                       "wifi_recall": [0.9, np.nan], "cell_recall": [0.95, 0.9], "share_cell": [0.5, 1.0]})
    return pn, {"mean": mean, "worst": worst, "std": abs(mean - worst), "nodes": 2}


def _register(cfg, tiny, mean, worst, model=None):
    from ccselect.models import registry
    params, data, stats = tiny
    pn, summ = _per_node(mean, worst)
    return registry.log_training(cfg, params, model, stats, pn, summ, history=[{"ce": 0.7}, {"ce": 0.5}],
                                 window=stats.window, train_nodes=["n03", "n04"], test_nodes=["n01", "n02"])


def test_log_and_register_sets_tags_steps_and_artifacts(tmp_path, tiny):
    import mlflow

    from ccselect.contract import FEATURES
    from ccselect.models import registry
    from ccselect.models.train import fit
    cfg = _cfg(tmp_path)
    params, data, stats = tiny
    pn, summ = _per_node(0.93, 0.91)
    with registry.training_run(cfg, run_name="test") as run_id:
        trainer = fit(params, data, on_epoch=registry.epoch_logger())
        got_run, version = registry.log_training(cfg, params, trainer, stats, pn, summ, window=stats.window,
                                                 train_nodes=["n04", "n03"], test_nodes=["n01", "n02"],
                                                 input_example=data.x[:3])
    assert got_run == run_id and version == "1"
    client = registry.configure(cfg)
    mv = client.get_model_version(registry.model_name(cfg), version)
    assert mv.run_id == run_id
    assert {k: mv.tags[k] for k in ("gate", "window", "variant", "train_nodes", "test_nodes")} == {
        "gate": "pending", "window": stats.window, "variant": "aliccs", "train_nodes": "n03,n04",
        "test_nodes": "n01,n02"}
    # per-epoch losses, one value per epoch with step = epoch
    for key in ("ce", "l_all", "l_d"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [0, 1], key
    run = client.get_run(run_id)
    assert run.data.metrics["heldout_mean_accuracy"] == pytest.approx(0.93)
    assert run.data.metrics["heldout_worst_accuracy"] == pytest.approx(0.91)
    assert run.data.params["lambda1"] == str(params.lambda1) and run.data.params["window"] == stats.window
    # the per-node table and the scaler come back as logged
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="eval/per_node.csv", dst_path=str(tmp_path / "dl"))
    pd.testing.assert_frame_equal(pd.read_csv(local), pn, check_dtype=False)
    text = mlflow.artifacts.load_text(f"runs:/{run_id}/{registry.STATS_ARTIFACT}")
    assert type(stats).from_json(text) == stats
    # the logged model carries its signature: 12 float inputs in model order, [-1, 2] output
    info = mlflow.models.get_model_info(f"models:/{registry.model_name(cfg)}/{version}")
    assert info.signature.inputs.input_names() == list(FEATURES)
    assert [c.type.name for c in info.signature.inputs.inputs] == ["float"] * 12
    assert info.signature.outputs.inputs[0].shape == (-1, 2)


def test_gate_and_promotion(tmp_path, tiny):
    import torch

    from ccselect.models import registry
    from ccselect.models.nets import Classifier, Generator, NetTypeModel
    torch.manual_seed(0)
    model = NetTypeModel(Generator(12), Classifier())
    cfg = _cfg(tmp_path, min_mean_accuracy=0.9, min_worst_accuracy=0.8, max_drop_vs_champion=0.01)
    client = registry.configure(cfg)
    name = registry.model_name(cfg)

    def aliases():
        return {a: str(v) for a, v in client.get_registered_model(name).aliases.items()}

    with pytest.raises(LookupError):
        registry.load_champion(cfg)
    _, v1 = _register(cfg, tiny, 0.95, 0.90, model)
    g1 = registry.gate(cfg, v1)           # summary read back from the run's metrics
    assert g1["passed"] and g1["champion"] is None and aliases() == {"challenger": v1}
    assert registry.promote(cfg) == {"name": name, "champion": v1, "previous_champion": None}
    assert aliases() == {"champion": v1}

    # below the configured minimum: failed, never challenger, cannot be promoted
    _, v2 = _register(cfg, tiny, 0.85, 0.70, model)
    g2 = registry.gate(cfg, v2)
    assert not g2["passed"] and g2["reasons"] == [
        "mean accuracy 0.8500 < 0.9", "worst-node accuracy 0.7000 < 0.8",
        f"mean accuracy 0.8500 below champion v{v1}'s 0.9500 by more than 0.01",
        f"worst-node accuracy 0.7000 below champion v{v1}'s 0.9000 by more than 0.01"]
    assert client.get_model_version(name, v2).tags["gate"] == "failed" and not registry.gate_passed(cfg, v2)
    assert aliases() == {"champion": v1}
    with pytest.raises(registry.GateError):
        registry.promote(cfg, v2)
    with pytest.raises(registry.GateError):   # no challenger to promote by default
        registry.promote(cfg)
    # a pending (never gated) version cannot be promoted either
    _, v3 = _register(cfg, tiny, 0.99, 0.99, model)
    with pytest.raises(registry.GateError):
        registry.promote(cfg, v3)
    # above the minimum but more than max_drop below the champion's worst node: failed
    g3 = registry.gate(cfg, v3, {"mean": 0.96, "worst": 0.885, "std": 0.04, "nodes": 2})
    assert not g3["passed"] and g3["champion"] == v1 and g3["reasons"] == [
        f"worst-node accuracy 0.8850 below champion v{v1}'s 0.9000 by more than 0.01"]
    assert aliases() == {"champion": v1}
    # within max_drop of the champion: challenger, then champion
    _, v4 = _register(cfg, tiny, 0.945, 0.895, model)
    assert registry.gate(cfg, v4)["passed"] and aliases() == {"champion": v1, "challenger": v4}
    # a challenger that fails a later gate (e.g. stricter thresholds) loses the alias
    strict = _cfg(tmp_path, min_mean_accuracy=0.99)
    assert not registry.gate(strict, v4)["passed"] and aliases() == {"champion": v1}
    assert registry.gate(cfg, v4)["passed"]
    assert registry.promote(cfg)["champion"] == v4 and aliases() == {"champion": v4}
    listed = {r["version"]: r for r in registry.list_versions(cfg)}
    assert [listed[v]["gate"] for v in (v1, v2, v3, v4)] == ["passed", "failed", "failed", "passed"]
    assert listed[v4]["aliases"] == ["champion"]


def test_load_champion_follows_the_alias(tmp_path, tiny):
    import torch

    from ccselect.models import registry
    from ccselect.models.nets import Classifier, Generator, NetTypeModel
    cfg = _cfg(tmp_path)
    params, data, stats = tiny
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(NetTypeModel(Generator(12), Classifier()))
        _, v = _register(cfg, tiny, 0.95, 0.93, models[-1])
        assert registry.gate(cfg, v)["passed"]
    x = torch.as_tensor(data.x[:64])
    registry.promote(cfg, "1")
    champ = registry.load_champion(cfg)
    assert (champ.version, champ.name, champ.stats) == ("1", registry.model_name(cfg), stats)
    assert type(champ.model).__name__ == "NetTypeModel" and not champ.model.training
    assert champ.guard is None and champ.calibration is None and champ.temperature == 1.0   # logged without them
    with torch.no_grad():
        torch.testing.assert_close(champ.model(x), models[0].eval()(x))
    registry.promote(cfg, "2")
    champ = registry.load_champion(cfg)
    with torch.no_grad():
        torch.testing.assert_close(champ.model(x), models[1].eval()(x))
    assert champ.version == "2"
    assert champ.run_id == registry.configure(cfg).get_model_version(registry.model_name(cfg), "2").run_id


def test_ccs_train_and_promote_on_the_small_lake(tmp_path, spark, small_lake):
    """`ccs train` end to end (window stats, labelled rows, groups on the training nodes, split,
    fit, per-node evaluation, MLflow, gate) then `ccs promote` / `ccs models` via the CLI."""
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    from ccselect.models import registry
    from ccselect.models.crossnode import per_node, summary
    lake = copy_lake(small_lake, tmp_path / "lake")
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--hours", f"{lake.lo}..{lake.hi}", "--variant", "mlp", "--epochs", "2",
                              "--k", "2", "--seed", "3", "--json", "--config", str(lake.cfg_path)])
    assert res.exit_code == 0, res.output + str(res.exception)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    cfg = lake.cfg()
    th = registry.gate_thresholds(cfg)
    s = out["summary"]
    pn = pd.DataFrame(out["per_node"])
    assert set(pn["node_id"]) == set(out["test_nodes"]) and not set(out["train_nodes"]) & set(out["test_nodes"])
    assert summary(pn[pn["included"]]) == pytest.approx(s)
    expect_pass = s["mean"] >= th["min_mean_accuracy"] and s["worst"] >= th["min_worst_accuracy"]
    assert out["gate"]["passed"] == expect_pass == registry.gate_passed(cfg, out["version"])
    client = registry.configure(cfg)
    assert [m.step for m in client.get_metric_history(out["run_id"], "ce")] == [0, 1]
    assert client.get_run(out["run_id"]).data.metrics["heldout_mean_accuracy"] == pytest.approx(s["mean"])
    # the out-of-domain guard and the temperature (models/ood.py) travel inside the registered model
    import os

    import mlflow

    from ccselect.models.ood import Calibration, DomainGuard
    local = mlflow.artifacts.download_artifacts(f"models:/{registry.model_name(cfg)}/{out['version']}",
                                                dst_path=str(tmp_path / "model"))
    guard = DomainGuard.from_json(open(os.path.join(local, "extra_files", registry.GUARD_FILE)).read())
    calibration = Calibration.from_json(open(os.path.join(local, "extra_files", registry.CALIBRATION_FILE)).read())
    assert guard.threshold == pytest.approx(out["ood_threshold"]) and guard.quantile == cfg.settings.infer.ood_quantile
    assert calibration.temperature == pytest.approx(out["temperature"]) and calibration.n == out["calibration"]["n"] > 0
    # the held-out per-node table is reproducible from the registered model and its logged scaler
    import torch

    from ccselect.features.scaling import FeatureStats
    from ccselect.models.dataset import load_labelled
    uri = f"models:/{registry.model_name(cfg)}/{out['version']}"
    model = mlflow.pytorch.load_model(uri).eval()
    stats = FeatureStats.from_json(mlflow.artifacts.load_text(f"runs:/{out['run_id']}/{registry.STATS_ARTIFACT}"))
    te = load_labelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats, nodes=out["test_nodes"], balanced=False)
    with torch.no_grad():
        p = model(torch.as_tensor(te.x))[:, 1].numpy()
    again = per_node(te.y, p, te.node)
    pd.testing.assert_series_equal(again["accuracy"], pn["accuracy"], check_names=False)
    if expect_pass:
        assert runner.invoke(app, ["promote", "--config", str(lake.cfg_path)]).exit_code == 0
        champ = registry.load_champion(cfg)
        assert champ.version == out["version"]
        assert champ.guard == guard and champ.calibration == calibration
    else:
        res = runner.invoke(app, ["promote", "--version", out["version"], "--config", str(lake.cfg_path)])
        assert res.exit_code == 1 and "did not pass the gate" in res.output
    res = runner.invoke(app, ["models", "--json", "--config", str(lake.cfg_path)])
    assert json.loads(res.stdout)[0]["version"] == out["version"]
