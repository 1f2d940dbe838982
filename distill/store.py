"""The MLflow store the distilled models go to: the configured tracking and registry URI, and an
experiment with its artifacts under mlflow.artifact_root. Light (mlflow is imported inside), so
that the export can read the handshake tree without the training stack."""
from __future__ import annotations

import os

from ccselect.config import Config

# Imported inside the functions that use them (heavy, not needed to import this module): mlflow.


def tracking(cfg: Config):
    """Point MLflow at the configured store; returns a client."""
    import mlflow
    from mlflow.tracking import MlflowClient
    uri = cfg.settings.mlflow.tracking_uri
    if uri.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(uri[len("sqlite:///"):]), exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(uri, uri)


def experiment_id(cfg: Config, name: str) -> str:
    """The experiment `name`, created with its artifacts under mlflow.artifact_root."""
    import mlflow
    client = tracking(cfg)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    if cfg.settings.mlflow.tracking_uri.startswith(("http://", "https://")):
        return mlflow.create_experiment(name)   # the tracking server's own artifact destination
    root = cfg.settings.mlflow.artifact_root
    location = root if "://" in root else os.path.join(root, name)
    return mlflow.create_experiment(name, artifact_location=location)
