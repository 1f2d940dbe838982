"""Part `mlflow`: the MLflow tracking server (the venv's `mlflow server`).

Its runs and registry in Postgres (`mlflow.backend_store_uri`, migrated by the server itself before
it listens), its artifacts on the object store (`mlflow.artifact_root` as `--artifacts-destination`):
the server proxies every artifact upload and download, so only it needs the store's credentials,
which come from the environment `up` gets (topology.env). It listens where
`mlflow.tracking_uri` says, with one uvicorn worker (2 cores) and without MLflow's background job
runner (GenAI scorers and prompt optimisation, which we do not use: one process less).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ccselect.config import Config

from ccselect.topology import address, home
from ccselect.topology.proc import ClusterError, Server, free_port, http_ok

WORKERS = 1


def servers(cfg: Config) -> list[Server]:
    host, port = address(cfg.settings.mlflow.tracking_uri, 5000)
    return [Server("mlflow", Path(home(cfg)) / "mlflow", port, host)]


def backend_store_uri(cfg: Config) -> str:
    uri = cfg.settings.mlflow.backend_store_uri
    if not uri:
        raise ClusterError(f"{cfg.path}: mlflow.backend_store_uri is not set (the tracking server's database)")
    scheme, rest = uri.split("://", 1)
    # SQLAlchemy's name for libpq's scheme, with the driver we install
    return f"postgresql+psycopg2://{rest}" if scheme in ("postgresql", "postgres") else uri


def healthy(url: str) -> bool:
    return http_ok(f"{url.rstrip('/')}/health")


def up(cfg: Config, env: dict[str, str]) -> int:
    m = cfg.settings.mlflow
    if not m.tracking_uri.startswith(("http://", "https://")):
        raise ClusterError(f"{cfg.path}: mlflow.tracking_uri {m.tracking_uri!r} is not a server's http:// address")
    server = servers(cfg)[0]
    if server.pid() is None:
        free_port(server.host, server.port)
    argv = [str(Path(sys.executable).parent / "mlflow"), "server",
            "--backend-store-uri", backend_store_uri(cfg),
            "--serve-artifacts", "--artifacts-destination", m.artifact_root,
            "--host", server.host, "--port", str(server.port), "--workers", str(WORKERS)]
    env = {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return server.start(argv, env=env, cwd=str(server.home), timeout=180,
                        ready=lambda: healthy(m.tracking_uri))
