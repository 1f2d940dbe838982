"""MLflow tracking and model registry of the network-type classifier (issue 4, after
databricks/mlops-stacks): training logs a run and registers a version, the validation gate sets
the `challenger` alias, `ccs promote` sets `champion`, and every consumer loads
`models:/<name>@champion` (never a path, a run or a stage).

Conventions (shared with `ccs infer`, `ccs export` and the DAGs):
- tracking and registry: cfg `mlflow.tracking_uri` (SQLite locally), artifacts under
  cfg `mlflow.artifact_root`, registered model cfg `mlflow.model_name`, experiment of that name;
- a run logs the training parameters once, the per-epoch losses with `step=epoch`, the held-out
  per-node table (`eval/per_node.csv`, `eval/per_node.json`) and its summary
  (`heldout_mean_accuracy`, `heldout_worst_accuracy`, `heldout_std_accuracy`, `heldout_nodes`),
  the scaler (`feature_stats/feature_stats.json`) and the model (`NetTypeModel`, input float32
  [-1, 12] standardized features in `contract.FEATURES` order, output [-1, 2] probabilities
  (4G, Wi-Fi)); the scaler also travels inside the model as an extra file, so loading the
  champion gives the statistics it was trained with; so do the out-of-domain guard
  (`ood/ood_guard.json`) and the temperature (`ood/calibration.json`) of models/ood.py, when the
  training fitted them (a version without them loads with no guard and temperature 1); and, for
  a per-node standardized variant (`*_nodestd`), its trailing window and minimum count
  (`node_std.json`, features/node_stats.py; absent: fleet standardization);
- version tags: `gate` ("pending" until gated, then "passed" | "failed"), `gate_reasons`,
  `window`, `variant`, `train_nodes`, `test_nodes`.
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect.features.node_stats import NodeStandardization
from ccselect.features.scaling import FeatureStats
from ccselect.models.ood import Calibration, DomainGuard
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, torch.

CHAMPION = "champion"
CHALLENGER = "challenger"
STATS_ARTIFACT = "feature_stats/feature_stats.json"
STATS_FILE = "feature_stats.json"
GUARD_FILE = "ood_guard.json"
CALIBRATION_FILE = "calibration.json"
NODE_STD_FILE = "node_std.json"
#: summary keys of evaluation.evaluate.summary → run metrics
SUMMARY_METRICS = {"mean": "heldout_mean_accuracy", "worst": "heldout_worst_accuracy",
                   "std": "heldout_std_accuracy", "nodes": "heldout_nodes"}


class GateError(RuntimeError):
    """A version that did not pass the validation gate was about to be promoted."""


@dataclass(frozen=True)
class Champion:
    """The model behind `models:/<name>@champion`, in eval mode, with its feature statistics,
    its out-of-domain guard and its calibration (None for a version logged without them)."""
    model: Any  # models.nets.NetTypeModel (torch.nn.Module)
    stats: FeatureStats
    name: str
    version: str
    run_id: str
    guard: DomainGuard | None = None
    calibration: Calibration | None = None
    #: per-node standardization's settings when the model sees per-node standardized features
    node_std: NodeStandardization | None = None

    @property
    def temperature(self) -> float:
        return self.calibration.temperature if self.calibration is not None else 1.0


# ---- session ------------------------------------------------------------------------------------

def model_name(cfg: Config) -> str:
    return cfg.settings.mlflow.model_name


def configure(cfg: Config):
    """Point MLflow (tracking and registry) at cfg's store; returns an `MlflowClient`."""
    import mlflow
    from mlflow.tracking import MlflowClient
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = cfg.settings.mlflow.tracking_uri
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]) or ".", exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(cfg: Config) -> str:
    """The experiment named like the model, its artifacts under cfg `mlflow.artifact_root`."""
    client = configure(cfg)
    name = model_name(cfg)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    if cfg.settings.mlflow.tracking_uri.startswith(("http://", "https://")):
        # a tracking server keeps the artifacts where its own --artifacts-destination says
        # (mlflow.artifact_root) and serves them: clients need no credentials of the store
        return client.create_experiment(name)
    root = cfg.settings.mlflow.artifact_root
    if "://" not in root:
        os.makedirs(root, exist_ok=True)
    return client.create_experiment(name, artifact_location=root)


@contextlib.contextmanager
def training_run(cfg: Config, run_name: str | None = None, tags: dict[str, str] | None = None) -> Iterator[str]:
    """Open the MLflow run a training logs into (train with `on_epoch=epoch_logger()` inside it,
    then `log_training`); yields the run id. A failure inside marks the run FAILED."""
    import mlflow
    exp = experiment_id(cfg)
    with mlflow.start_run(experiment_id=exp, run_name=run_name, tags=tags) as run:
        yield run.info.run_id


def epoch_logger(extra: Callable[[int], dict[str, float]] | None = None) -> Callable[[int, dict], None]:
    """An `on_epoch(epoch, metrics)` callback for `models.train.fit` logging the epoch's losses
    (and `extra(epoch)`, if given) into the active run with `step=epoch`."""
    import mlflow

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        values = {k: float(v) for k, v in metrics.items() if _finite(v)}
        if extra:
            values.update({k: float(v) for k, v in extra(epoch).items() if _finite(v)})
        mlflow.log_metrics(values, step=int(epoch))
    return on_epoch


@contextlib.contextmanager
def _quiet(logger: str):
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


# ---- logging and registration ------------------------------------------------------------------

def model_signature(features: Sequence[str] = FEATURES):
    """Input: one float32 column per standardized feature, in model order (a [-1, 12] float32
    matrix); output: [-1, 2] float32 probabilities (4G/5G, Wi-Fi)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec
    return ModelSignature(inputs=Schema([ColSpec("float", f) for f in features]),
                          outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, 2), "probabilities")]))


def _as_model(trainer_or_model):
    import torch
    model = trainer_or_model if isinstance(trainer_or_model, torch.nn.Module) else trainer_or_model.model
    return copy.deepcopy(model).cpu().eval()


def _params_dict(params) -> dict[str, Any]:
    if hasattr(params, "to_dict"):
        return params.to_dict()
    return dict(params or {})


def _pip_requirements() -> list[str]:
    # Given explicitly: MLflow would otherwise load the model in a subprocess to infer them.
    import mlflow
    import torch
    return [f"mlflow=={mlflow.__version__}", f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]


def log_training(cfg: Config, params, trainer_or_model, stats: FeatureStats, per_node_df, summary: dict,
                 history: Sequence[dict[str, float]] | None = None, window: str | None = None,
                 train_nodes: Sequence[str] = (), test_nodes: Sequence[str] = (),
                 input_example: np.ndarray | None = None, extra_params: dict[str, Any] | None = None,
                 extra_metrics: dict[str, float] | None = None, run_name: str | None = None,
                 guard: DomainGuard | None = None, calibration: Calibration | None = None,
                 node_std: NodeStandardization | None = None) -> tuple[str, str]:
    """Log a trained model into the active run (or a new one) and register it as a new version
    of cfg's model; returns (run_id, version). `history` (per-epoch metric dicts) is logged with
    `step=` only when given — a run that trained with `epoch_logger()` has them already.
    `guard` and `calibration` (models/ood.py) go into the model's extra files beside the scaler
    and into the run (artifacts `ood/`, metrics `ood_threshold`, `calibration_*`); so does
    `node_std` (a per-node standardized model; `node_std/node_std.json`, params `node_stats_*`).
    The new version's tag `gate` is "pending" until `gate()`."""
    import mlflow
    import mlflow.pytorch

    window = window or stats.window
    p = _params_dict(params)
    name = model_name(cfg)
    with contextlib.ExitStack() as stack:
        if mlflow.active_run() is None:
            stack.enter_context(training_run(cfg, run_name=run_name))
        run_id = mlflow.active_run().info.run_id
        mlflow.log_params({**p, "window": window, "n_train_nodes": len(train_nodes),
                           "n_test_nodes": len(test_nodes), **(extra_params or {})})
        for step, metrics in enumerate(history or []):
            mlflow.log_metrics({k: float(v) for k, v in metrics.items() if _finite(v)}, step=step)
        mlflow.log_metrics({SUMMARY_METRICS[k]: float(v) for k, v in summary.items()
                            if k in SUMMARY_METRICS and _finite(v)})
        if extra_metrics:
            mlflow.log_metrics({k: float(v) for k, v in extra_metrics.items() if _finite(v)})
        mlflow.log_text(per_node_df.to_csv(index=False), "eval/per_node.csv")
        mlflow.log_text(per_node_df.to_json(orient="records", indent=1), "eval/per_node.json")
        mlflow.log_dict({k: (v if _finite(v) else None) for k, v in summary.items()}, "eval/summary.json")
        mlflow.log_text(stats.to_json(), STATS_ARTIFACT)
        if node_std is not None:
            mlflow.log_text(node_std.to_json(), f"node_std/{NODE_STD_FILE}")
            mlflow.log_params({"standardization": "node", "node_stats_hours": node_std.hours,
                               "node_stats_min_conns": node_std.min_conns})
        if guard is not None:
            mlflow.log_text(guard.to_json(), f"ood/{GUARD_FILE}")
            mlflow.log_metrics({"ood_threshold": guard.threshold, "ood_quantile": guard.quantile})
        if calibration is not None:
            mlflow.log_text(calibration.to_json(), f"ood/{CALIBRATION_FILE}")
            mlflow.log_metrics({f"calibration_{k}": float(v) for k, v in (
                ("temperature", calibration.temperature), ("nll_before", calibration.nll_before),
                ("nll_after", calibration.nll_after), ("ece_before", calibration.ece_before),
                ("ece_after", calibration.ece_after)) if _finite(v)})
            if calibration.report:       # on rows it was not fitted on (models/train_job.py)
                mlflow.log_metrics({f"calibration_report_{k}": float(v) for k, v in calibration.report.items()
                                    if k in ("n", "ece_before", "ece_after") and _finite(v)})
        variant = str(p.get("variant", "")) + ("_nodestd" if node_std is not None else "")
        run_tags = {"window": window, "variant": variant, "train_nodes": ",".join(sorted(train_nodes)),
                    "test_nodes": ",".join(sorted(test_nodes))}
        mlflow.set_tags(run_tags)

        model = _as_model(trainer_or_model)
        example = input_example if input_example is not None else np.zeros((2, len(stats.features)), np.float32)
        example = pd.DataFrame(np.asarray(example[:5], dtype=np.float32), columns=list(stats.features))
        tmp = tempfile.mkdtemp(prefix="ccs-model-")
        try:
            extra_files = []
            for fname, obj in ((STATS_FILE, stats), (GUARD_FILE, guard), (CALIBRATION_FILE, calibration),
                               (NODE_STD_FILE, node_std)):
                if obj is not None:
                    extra_files.append(os.path.join(tmp, fname))
                    with open(extra_files[-1], "w") as fh:
                        fh.write(obj.to_json())
            # pickle, not pt2: consumers get the NetTypeModel class back (train/eval, dtype casts),
            # and the repository that defines it is installed wherever the model is loaded.
            with _quiet("mlflow.pytorch"):
                info = mlflow.pytorch.log_model(
                    model, name="model", signature=model_signature(stats.features),
                    input_example=example, extra_files=extra_files,
                    pip_requirements=_pip_requirements(), serialization_format="pickle")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        mv = mlflow.register_model(info.model_uri, name, tags={**run_tags, "gate": "pending"})
    return run_id, str(mv.version)


# ---- gate and promotion -------------------------------------------------------------------------

def gate_thresholds(cfg: Config) -> dict[str, float]:
    return cfg.settings.model.gate.to_dict()


def _alias_version(client, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _version_summary(client, name: str, version: str) -> dict[str, float]:
    run_id = client.get_model_version(name, version).run_id
    metrics = client.get_run(run_id).data.metrics
    return {k: metrics.get(m, float("nan")) for k, m in SUMMARY_METRICS.items()}


def gate(cfg: Config, version: str | int, summary: dict | None = None) -> dict[str, Any]:
    """The validation gate: the version's held-out summary must meet the configured minimum mean
    and worst-node accuracy and lose at most `max_drop_vs_champion` of mean and of worst-node
    accuracy against the current `@champion`. Tags the version `gate` = passed/failed (with
    `gate_reasons`); sets `challenger` only when passed (and takes it away from a version that
    now fails). `summary` defaults to the version's logged metrics."""
    client = configure(cfg)
    name, version = model_name(cfg), str(version)
    th = gate_thresholds(cfg)
    s = dict(summary) if summary is not None else _version_summary(client, name, version)
    mean, worst = float(s.get("mean", float("nan"))), float(s.get("worst", float("nan")))
    reasons = []
    if not (_finite(mean) and _finite(worst)) or not s.get("nodes", 1):
        reasons.append("no held-out evaluation")
    else:
        if mean < th["min_mean_accuracy"]:
            reasons.append(f"mean accuracy {mean:.4f} < {th['min_mean_accuracy']}")
        if worst < th["min_worst_accuracy"]:
            reasons.append(f"worst-node accuracy {worst:.4f} < {th['min_worst_accuracy']}")
    champion = _alias_version(client, name, CHAMPION)
    champ = None
    if champion is not None and champion != version:
        champ = _version_summary(client, name, champion)
        for key, label in (("mean", "mean accuracy"), ("worst", "worst-node accuracy")):
            mine, theirs = float(s.get(key, float("nan"))), champ[key]
            if _finite(theirs) and _finite(mine) and mine < theirs - th["max_drop_vs_champion"]:
                reasons.append(f"{label} {mine:.4f} below champion v{champion}'s {theirs:.4f} "
                               f"by more than {th['max_drop_vs_champion']}")
    passed = not reasons
    client.set_model_version_tag(name, version, "gate", "passed" if passed else "failed")
    client.set_model_version_tag(name, version, "gate_reasons", "; ".join(reasons))
    client.set_model_version_tag(name, version, "gate_champion", champion or "none")
    if passed:
        client.set_registered_model_alias(name, CHALLENGER, version)
    elif _alias_version(client, name, CHALLENGER) == version:
        client.delete_registered_model_alias(name, CHALLENGER)
    return {"name": name, "version": version, "passed": passed, "reasons": reasons, "thresholds": th,
            "summary": {k: s.get(k) for k in SUMMARY_METRICS}, "champion": champion,
            "champion_summary": champ}


def gate_passed(cfg: Config, version: str | int) -> bool:
    client = configure(cfg)
    mv = client.get_model_version(model_name(cfg), str(version))
    return (mv.tags or {}).get("gate") == "passed"


def promote(cfg: Config, version: str | int | None = None) -> dict[str, Any]:
    """Set `champion` to `version` (default: the current `challenger`); refuses a version whose
    gate did not pass. The challenger alias is taken off the promoted version."""
    client = configure(cfg)
    name = model_name(cfg)
    if version is None:
        version = _alias_version(client, name, CHALLENGER)
        if version is None:
            raise GateError(f"{name} has no @{CHALLENGER} to promote (no version passed the gate since "
                            "the last promotion); name a version with --version")
    version = str(version)
    if not gate_passed(cfg, version):
        tags = client.get_model_version(name, version).tags or {}
        raise GateError(f"{name} v{version} did not pass the gate (gate={tags.get('gate')!r}"
                        f"{': ' + tags['gate_reasons'] if tags.get('gate_reasons') else ''}); not promoted")
    previous = _alias_version(client, name, CHAMPION)
    client.set_registered_model_alias(name, CHAMPION, version)
    if _alias_version(client, name, CHALLENGER) == version:
        client.delete_registered_model_alias(name, CHALLENGER)
    return {"name": name, "champion": version, "previous_champion": previous}


# ---- loading ------------------------------------------------------------------------------------

def load_champion(cfg: Config, dst: str | None = None) -> Champion:
    """The champion model, its feature statistics, guard and calibration, loaded through
    `models:/<name>@champion`."""
    import mlflow
    import mlflow.pytorch
    from mlflow.exceptions import MlflowException

    client = configure(cfg)
    name = model_name(cfg)
    uri = f"models:/{name}@{CHAMPION}"
    for _ in range(3):
        try:
            mv = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException as e:
            raise LookupError(f"no {uri}: promote a version that passed the gate (`ccs promote`)") from e
        tmp = tempfile.mkdtemp(prefix="ccs-champion-", dir=dst)
        try:
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
            model = _load_pickled_model(local)
            with open(os.path.join(local, "extra_files", STATS_FILE)) as fh:
                stats = FeatureStats.from_json(fh.read())
            guard, calibration = _read_extra(local, GUARD_FILE, DomainGuard), _read_extra(local, CALIBRATION_FILE, Calibration)
            node_std = _read_extra(local, NODE_STD_FILE, NodeStandardization)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # The alias may have moved while downloading: keep only a consistent (version, files) pair.
        if _alias_version(client, name, CHAMPION) == str(mv.version):
            return Champion(model=model, stats=stats, name=name, version=str(mv.version), run_id=mv.run_id,
                            guard=guard, calibration=calibration, node_std=node_std)
    raise RuntimeError(f"{uri} kept moving while loading it")


def _read_extra(local: str, fname: str, cls):
    """An extra file of the downloaded model parsed by `cls.from_json`, or None when absent
    (versions logged before the guard and the calibration)."""
    path = os.path.join(local, "extra_files", fname)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return cls.from_json(fh.read())


def _load_pickled_model(local: str):
    """MLflow 3.17 refuses pickle-format PyTorch models unless MLFLOW_ALLOW_PICKLE_DESERIALIZATION
    is set. The champion comes from our own registry (written by `log_training` only), so it is
    allowed for this one load and the previous setting restored."""
    import mlflow.pytorch
    key = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"
    old = os.environ.get(key)
    os.environ[key] = "true"
    try:
        return mlflow.pytorch.load_model(local).cpu().eval()
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def list_versions(cfg: Config) -> list[dict[str, Any]]:
    """Registered versions, newest first, with aliases, gate and held-out summary."""
    client = configure(cfg)
    name = model_name(cfg)
    from mlflow.exceptions import MlflowException
    try:
        aliases = client.get_registered_model(name).aliases or {}
    except MlflowException:  # no registered model yet
        return []
    by_version: dict[str, list[str]] = {}
    for alias, v in aliases.items():
        by_version.setdefault(str(v), []).append(alias)
    versions = client.search_model_versions(f"name = '{name}'")
    out = []
    for mv in sorted(versions, key=lambda v: int(v.version), reverse=True):
        tags = mv.tags or {}
        out.append({"version": str(mv.version), "aliases": sorted(by_version.get(str(mv.version), [])), "gate": tags.get("gate"),
                    "gate_reasons": tags.get("gate_reasons", ""), "window": tags.get("window"),
                    "variant": tags.get("variant"), "run_id": mv.run_id,
                    **{k: v for k, v in _version_summary(client, name, str(mv.version)).items()}})
    return out


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
