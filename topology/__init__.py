"""The production topology on one machine: `ccs cluster up|down|status` (`make cluster-up`...).
A developer tool beside bench/, not the product: no product layer imports it (pyproject.toml's
`topology` contract); the command line's `ccs cluster` calls it.

Each part is a real server, started by the project and stopped by it, with its data, log and pid
file under `cluster.home` (topology/proc.py):
  objectstore  s3proxy (org.gaul:s3proxy from Maven Central) on a folder: the S3 the lake, MLflow's
               artifacts and the signed tables live on;
  edges        the fleet's edge hosts (`pipeline.fleet` nodes with `netns`): a network namespace
               each, linked to this machine by a veth, with its agent attached (root only);
  monitoring   node_exporter in each edge host, Debian's Prometheus scraping them with the rules of
               infra/prometheus/, and its Alertmanager (only with `cluster.prometheus` set);
  postgres     Debian's PostgreSQL: the metadata database of Airflow and of MLflow;
  spark        a Spark standalone master and `cluster.workers` workers (the pyspark distribution);
  mlflow       the MLflow tracking server, its store on Postgres, its artifacts on the object store;
  airflow      Airflow's scheduler (LocalExecutor on Postgres), DAG processor and API server.
The addresses come from the configuration's own keys (the Spark master, `object_store.endpoint`,
`mlflow.tracking_uri`, `mlflow.backend_store_uri`, `airflow.sql_alchemy_conn`, `airflow.api_url`),
so the file that points the jobs at a server is also the one that says where it listens.

Each part module has `servers(cfg) -> list[Server]` and `up(cfg, env)`, and `down(cfg)` when it
leaves more than processes behind (the edges' namespaces); `down` goes in the reverse order of `up`.
"""
from __future__ import annotations

import importlib
import os
from urllib.parse import urlparse

from ccselect.config import Config, project_root

from ccselect.topology.proc import ClusterError, Server

#: the parts in the order `up` starts them (`down` stops them in reverse)
PARTS = ("objectstore", "edges", "monitoring", "postgres", "spark", "mlflow", "airflow")


def part(name: str):
    return importlib.import_module(f"ccselect.topology.{name}")


def home(cfg: Config) -> str:
    h = cfg.settings.cluster.home
    if not h:
        raise ClusterError(f"{cfg.path}: cluster.home is not set (the servers' data, logs and pid files)")
    return h


def address(url: str, default_port: int) -> tuple[str, int]:
    """(host, port) of a URL such as spark://h:7077, http://h:p or postgresql://u@h:p/db."""
    u = urlparse(url)
    if not u.hostname:
        raise ClusterError(f"no host in {url!r}")
    return u.hostname, u.port or default_port


def env(cfg: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every server and client of the topology runs with: the configuration
    (CCS_CONFIG, CCS_HOME), the object store's credentials (the SDKs' standard variables), the
    Python the Spark workers run."""
    e = dict(os.environ if base is None else base)
    e.update({"CCS_CONFIG": str(cfg.path), "CCS_HOME": str(project_root())})
    e.update(part("objectstore").client_env(cfg))
    return e


def servers(cfg: Config) -> list[Server]:
    return [s for name in PARTS for s in part(name).servers(cfg)]


def up(cfg: Config, parts: tuple[str, ...] = PARTS, log=print) -> dict:
    """Start the parts (each idempotent: a running server is left alone); → status."""
    for name in PARTS:
        if name in parts:
            if name == "edges" and os.geteuid() != 0:
                log("cluster: edges skipped: the edge hosts' namespaces and kernel enforcer need root")
                continue
            log(f"cluster: {name} ...")
            part(name).up(cfg, env(cfg))
    return status(cfg)


def down(cfg: Config, log=print) -> dict:
    """Stop every server of the topology, last started first; → status (nothing running)."""
    for name in reversed(PARTS):
        mod = part(name)
        if hasattr(mod, "down"):
            mod.down(cfg)
            log(f"cluster: {name} down")
            continue
        for s in reversed(mod.servers(cfg)):
            if s.stop():
                log(f"cluster: stopped {s.name}")
    return status(cfg)


def status(cfg: Config) -> dict:
    return {s.name: s.status() for s in servers(cfg)}
