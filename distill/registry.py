"""MLflow side of distillation: the champion DNN comes in through `models:/<name>@champion`
(models.registry.load_champion); the distilled tree goes out as its own registered model
`<name>-tree`, each version tagged with the DNN version it was distilled from."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pandas as pd

from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect.distill.store import experiment_id, tracking
from ccselect.distill.tree import rules_text
from ccselect.models.registry import load_champion as _load
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, skops.

#: The only non-builtin type a DecisionTreeRegressor's skops file holds; skops refuses anything
#: else on load, so a tampered artifact cannot smuggle code in.
SKOPS_TRUSTED_TYPES = ["sklearn.tree._tree.Tree"]
EXPERIMENT = "ccs-distill"
TREE_ARTIFACT = "tree"


def tree_model_name(cfg: Config) -> str:
    return f"{cfg.settings.mlflow.model_name}-tree"


def load_champion(cfg: Config):
    """The champion classifier, its FeatureStats, name, version and run id, through
    `models:/<name>@champion` (models.registry.load_champion)."""
    tracking(cfg)
    return _load(cfg)


def log_tree(cfg: Config, distilled, params, champion, window: str, sample_raw) -> dict:
    """One MLflow run in experiment `ccs-distill`: params, the depth search as metrics (step =
    depth), the rules as text, the tree (skops) registered as `<name>-tree` and tagged with the
    DNN it was distilled from. Returns {run_id, name, version}."""
    import mlflow
    import mlflow.sklearn
    from mlflow.models import infer_signature


    client = tracking(cfg)
    name = tree_model_name(cfg)
    with mlflow.start_run(experiment_id=experiment_id(cfg, EXPERIMENT), run_name=f"distill {window}") as run:
        mlflow.log_params({**params.to_dict(), "window": window, "dnn_name": champion.name,
                           "dnn_version": champion.version, "input": "raw Table 4 features"})
        for step in distilled.search.steps:
            mlflow.log_metrics({"search_fidelity": step.fidelity, "search_leaves": step.leaves,
                                "search_failing_subsets": len(step.failing_subsets)}, step=step.depth)
        mlflow.log_metrics({k: float(v) for k, v in distilled.metrics.items()})
        mlflow.log_text(rules_text(distilled.tree), "tree_rules/rules.txt")
        mlflow.log_dict({"steps": [vars(s) for s in distilled.search.steps],
                         "subsets": {k: {"holdout_rows": n, "fidelity": f} for k, (n, f) in distilled.subsets.items()}},
                        "tree_rules/depth_search.json")
        x = pd.DataFrame(sample_raw, columns=list(FEATURES))
        info = mlflow.sklearn.log_model(
            distilled.tree, name=TREE_ARTIFACT, serialization_format="skops",
            skops_trusted_types=SKOPS_TRUSTED_TYPES, input_example=x.head(3),
            signature=infer_signature(x, distilled.tree.predict(x.to_numpy())),
            registered_model_name=name)
        version = str(info.registered_model_version)
        tags = {"dnn_name": champion.name, "dnn_version": str(champion.version), "dnn_run_id": champion.run_id,
                "window": window, "fidelity": f"{distilled.metrics['fidelity']:.4f}",
                "depth": str(distilled.metrics["depth"]), "input": "raw"}
        for k, v in tags.items():
            client.set_model_version_tag(name, version, k, v)
        client.set_registered_model_alias(name, f"dnn-v{champion.version}", version)
        return {"run_id": run.info.run_id, "name": name, "version": version}


@dataclass
class TreeVersion:
    tree: object
    name: str
    version: str
    window: str
    tags: dict


def load_tree_for(cfg: Config, dnn_version: str) -> TreeVersion:
    """The latest tree distilled from DNN version `dnn_version` (alias `dnn-v<version>`), loaded
    from its skops file with our own trusted-type list, not the one stored beside the model."""
    import mlflow.artifacts
    import skops.io

    client = tracking(cfg)
    name = tree_model_name(cfg)
    try:
        mv = client.get_model_version_by_alias(name, f"dnn-v{dnn_version}")
    except Exception as e:  # noqa: BLE001 - MLflow raises its own RestException subtypes
        raise LookupError(f"no distilled tree for {cfg.settings.mlflow.model_name} version {dnn_version}: "
                          "run `ccs distill` first") from e
    local = mlflow.artifacts.download_artifacts(f"models:/{name}/{mv.version}")
    tree = skops.io.load(os.path.join(local, "model.skops"), trusted=SKOPS_TRUSTED_TYPES)
    return TreeVersion(tree, name, str(mv.version), mv.tags.get("window", ""), dict(mv.tags))

