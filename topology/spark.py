"""Part `spark`: a Spark standalone master and `cluster.workers` workers, from the pyspark
distribution itself (its `bin/spark-class`; pip's pyspark has no `sbin/` start scripts to use).

The master listens where `spark.master` (spark://host:port) says; its web UI on port + 1003 (Spark's
own defaults, 7077 and 8080, keep that distance), each worker's on the next ports (worker i on web
UI + i: 18081, 18082, ... for the one-machine topology). A worker offers `cluster.worker_cores` cores
and `cluster.worker_memory` to executors and keeps each application's files under its own work
dir. Workers pass their environment on to the executors they launch: the object store's
credentials as the SDK's standard variables (the default chain finds them, as it would find an
instance role in production), and the Python the executors run (PYSPARK_PYTHON, this venv's).

A worker counts as up when the master's JSON lists it ALIVE: only then can a job use its cores.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from ccselect.config import Config

from ccselect.topology import address, home
from ccselect.topology.proc import ClusterError, Server, free_port, group_members
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark.

#: the master's web UI is this far above its RPC port (Spark's defaults: 7077 and 8080)
WEBUI_OFFSET = 8080 - 7077
#: how long a stopped application's files stay in a worker's work dir (its jars, executor logs)
APP_DATA_TTL_S = 24 * 3600


def _master(cfg: Config) -> tuple[str, int, int]:
    """(host, RPC port, web UI port) of the configured standalone master."""
    url = cfg.settings.spark.master
    if not url.startswith("spark://"):
        raise ClusterError(f"{cfg.path}: spark.master is {url!r}, not a standalone master (spark://host:port)")
    host, port = address(url, 7077)
    return host, port, port + WEBUI_OFFSET


def servers(cfg: Config) -> list[Server]:
    """The master, then the workers 1..cluster.workers (each listed by its web UI port)."""
    if not cfg.settings.spark.master.startswith("spark://"):
        return []
    host, port, webui = _master(cfg)
    root = Path(home(cfg))
    return [Server("spark-master", root / "spark-master", port, host)] + [
        Server(f"spark-worker-{i}", root / f"spark-worker-{i}", webui + i, host)
        for i in range(1, cfg.settings.cluster.workers + 1)]


def spark_class() -> str:
    """`bin/spark-class` of the installed pyspark (the launcher the sbin scripts would call)."""
    import pyspark
    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not os.access(path, os.X_OK):
        raise ClusterError(f"{path} is missing or not executable")
    return str(path)


def state(cfg: Config, timeout: float = 2.0) -> dict | None:
    """The master's JSON (`http://host:webui/json/`: status, workers with their state, apps), or
    None when it does not answer."""
    host, _, webui = _master(cfg)
    try:
        with urllib.request.urlopen(f"http://{host}:{webui}/json/", timeout=timeout) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def alive_workers(cfg: Config) -> list[dict]:
    """The workers the master lists ALIVE (a killed worker stays listed, DEAD, for a while)."""
    st = state(cfg) or {}
    return [w for w in st.get("workers", []) if w.get("state") == "ALIVE"]


def _registered(cfg: Config, worker: Server) -> bool:
    return any(w.get("webuiaddress", "").endswith(f":{worker.port}") for w in alive_workers(cfg))


def _env(env: dict[str, str], server: Server) -> dict[str, str]:
    e = dict(env)
    e["SPARK_LOCAL_IP"] = server.host                 # the web UIs and executors bind here too
    e.setdefault("PYSPARK_PYTHON", sys.executable)
    if server.name != "spark-master":
        # executors' scratch space (shuffle files, spills) under the worker's home, not /tmp; a
        # stopped application's work dir is removed after APP_DATA_TTL_S
        e["SPARK_LOCAL_DIRS"] = str(server.home / "local")
        e["SPARK_WORKER_OPTS"] = " ".join(filter(None, (
            e.get("SPARK_WORKER_OPTS", ""), "-Dspark.worker.cleanup.enabled=true",
            f"-Dspark.worker.cleanup.appDataTtl={APP_DATA_TTL_S}")))
    return e


def up(cfg: Config, env: dict[str, str]) -> None:
    """Start the master (when not running), then every worker that is not running, together; each
    is up when the master lists it ALIVE."""
    host, port, webui = _master(cfg)
    master, *workers = servers(cfg)
    cl = cfg.settings.cluster
    if not master.running():
        free_port(host, port)
        free_port(host, webui)
        master.start([spark_class(), "org.apache.spark.deploy.master.Master", "--host", host,
                      "--port", str(port), "--webui-port", str(webui)],
                     env=_env(env, master), cwd=str(master.home), timeout=120,
                     ready=lambda: (state(cfg) or {}).get("status") == "ALIVE")

    def start_worker(w: Server) -> None:
        free_port(w.host, w.port)
        work = w.home / "work"
        work.mkdir(parents=True, exist_ok=True)
        w.start([spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", w.host,
                 "--webui-port", str(w.port), "--cores", str(cl.worker_cores), "--memory", cl.worker_memory,
                 "--work-dir", str(work), cfg.settings.spark.master],
                env=_env(env, w), cwd=str(w.home), timeout=120, ready=lambda: _registered(cfg, w))

    todo = [w for w in workers if not w.running()]
    with ThreadPoolExecutor(max(1, len(todo))) as pool:
        for f in [pool.submit(start_worker, w) for w in todo]:
            f.result()


def kill_worker(cfg: Config, i: int, timeout: float = 30.0) -> list[int]:
    """SIGKILL worker `i`, the executors it launched and their Python workers, as a machine that
    dies would; → the pids killed. (PySpark's daemon puts itself in a process group of its own, so
    the worker's group alone would leave it to notice its executor's end.) The master sees the
    worker go; `up` starts it again."""
    workers = servers(cfg)[1:]
    if not 1 <= i <= len(workers):
        raise ClusterError(f"no spark-worker-{i} (cluster.workers is {len(workers)})")
    w = workers[i - 1]
    pid = w.pid()
    if pid is None:
        raise ClusterError(f"spark-worker-{i} is not running")
    procs = [psutil.Process(pid)]
    try:
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    procs += [psutil.Process(p) for p in group_members(pid) if p not in {q.pid for q in procs}]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(procs, timeout=timeout)
    if left := [p.pid for p in left if _lives(p)]:
        raise ClusterError(f"processes {left} of spark-worker-{i} survived SIGKILL")
    return sorted(p.pid for p in procs)


def _lives(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
