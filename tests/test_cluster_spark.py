"""Spark standalone on the object store, for real (topology/spark.py, ccselect/spark.py): the
object store and a master with two workers brought up under a temporary `cluster.home` on the ports
of infra/conf/cluster-local.yaml; a tiny simulated fleet uploaded to `pipeline.raw_dir`
(s3a://ccselect-lake/raw); the hourly ingest (`flows.pipeline.ingest_hour`, in its own process as an
Airflow task runs it) for two hours with the lake on the store gives exactly the silver.connections
of the same ingest in local mode; a worker SIGKILLed, with its executor, while that executor runs a
task of the ingest changes nothing in the result; `up` brings the worker back; `down` leaves no
process. Both shipped cluster files load and have the same keys.

Prints the bring-up times, the ingest's time on the cluster and locally, and the memory of every
server and executor (run with -s to see them)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from ccs_testing import REPO, raw_section, write_cluster_config, write_config

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(shutil.which("java") is None, reason="no java for the object store and Spark"),
]

PARTS = ("objectstore", "spark")
HOURS = ("2026-11-01T00", "2026-11-01T01")
KEYS = ["node_id", "hour", "conn_id"]

#: one hourly ingest per hour in a process of its own, as an Airflow task runs it; the driver's UI
#: on when a port is given (the fault test watches its executors); silver.connections to Parquet
INGEST = r'''
import json, sys, time
t0 = time.time()
from ccselect.flows.pipeline import ingest_hour
from ccselect.config import load_config
from ccselect.lake import table_path
from ccselect.spark import get_spark
out, ui_port, *hours = sys.argv[1:]
cfg = load_config()
ui = {"spark.ui.enabled": "true", "spark.ui.port": ui_port} if ui_port != "-" else None
spark = get_spark(cfg, "ccs-ingest", ui)
res = {"session_s": time.time() - t0, "hours": []}
for h in hours:
    t = time.time()
    res["hours"].append({**ingest_hour(h, cfg), "s": time.time() - t})
import pyarrow.parquet as pq
pq.write_table(spark.read.format("delta").load(table_path(cfg, "silver.connections")).toArrow(), out)
print("CCS_RESULT " + json.dumps(res), flush=True)
'''


# ---- helpers --------------------------------------------------------------------------------------

def _ingest(env: dict[str, str], out: Path, hours, log: Path, ui_port: int | None = None,
            sample=None) -> subprocess.CompletedProcess:
    """Run INGEST for `hours`, its output to `log`; `sample()` is called every half second while
    it runs. → the process (its `result`: INGEST's JSON)."""
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", INGEST, str(out), str(ui_port or "-"), *hours],
                                env=env, cwd=str(REPO), stdout=fh, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if sample:
                    sample(proc.pid)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"ingest exited with {proc.returncode}; last lines of {log}:\n" + \
        "\n".join(text.splitlines()[-40:])
    proc.result = json.loads(next(ln for ln in text.splitlines() if ln.startswith("CCS_RESULT "))[11:])
    return proc


def _silver(path: Path) -> pd.DataFrame:
    """silver.connections as written by INGEST, in key order, lists as tuples (comparable)."""
    df = pq.read_table(path).to_pandas()
    df["imputed"] = df["imputed"].map(tuple)
    return df.sort_values(KEYS).reset_index(drop=True)


def _rss(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return 0.0


def _get(url: str):
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.load(r)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ours(marker: str) -> list[str]:
    """Every process (but this one) whose command line, working directory or environment names
    `marker`."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if marker in cmd or p.cwd().startswith(marker) or any(marker in v for v in p.environ().values()):
                out.append(f"{p.pid}: {cmd[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


# ---- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A tiny simulated fleet: 3 nodes × 2 hours."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = tmp_path_factory.mktemp("fleet")
    simulate(SimParams(nodes=3, hours=2, conns_per_node_hour=300, seed=11), str(out), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def local_silver(tmp_path_factory, fleet):
    """The same ingest in local mode (infra/conf/local.yaml, local[*], a local lake); → (silver,
    INGEST's result)."""
    from ccselect.config import load_config
    root = tmp_path_factory.mktemp("local")
    cfg = load_config(write_config(root, pipeline={**raw_section("pipeline"), "raw_dir": str(fleet)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["CCS_CONFIG"] = str(cfg.path)
    proc = _ingest(env, root / "silver.parquet", HOURS, root / "ingest.log")
    return _silver(root / "silver.parquet"), proc.result


@pytest.fixture(scope="module")
def topology(fleet):
    """The object store and Spark up under a fresh home, the fleet uploaded to `pipeline.raw_dir`;
    → (cfg, bring-up times, root). Torn down whatever happens (the last test brings it down itself
    and checks that nothing is left)."""
    import ccselect.topology as cluster
    from ccselect.topology import objectstore
    from ccselect.config import load_config
    root = Path(tempfile.mkdtemp(prefix="ccs-spark-"))
    cfg = load_config(write_cluster_config(root))
    timings = {}
    try:
        for name in PARTS:      # what `cluster.up` does, part by part, timed
            t0 = time.monotonic()
            cluster.part(name).up(cfg, cluster.env(cfg))
            timings[name] = time.monotonic() - t0
        t0 = time.monotonic()
        s3 = objectstore.client(cfg)
        bucket, prefix = cfg.settings.pipeline.raw_dir.removeprefix("s3a://").split("/", 1)
        for f in sorted(p for p in fleet.rglob("*") if p.is_file()):
            s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(fleet).as_posix()}")
        timings["upload"] = time.monotonic() - t0
        yield cfg, timings, root
    finally:
        cluster.down(cfg, log=lambda _m: None)
        shutil.rmtree(root, ignore_errors=True)


# ---- tests ----------------------------------------------------------------------------------------

def test_the_workers_are_registered_and_run_the_venvs_python(topology):
    from ccselect.topology import spark
    cfg, timings, _ = topology
    print("\nbring-up (s): " + "  ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    master, *workers = spark.servers(cfg)
    assert master.running() and all(w.running() for w in workers), [s.status() for s in spark.servers(cfg)]
    alive = spark.alive_workers(cfg)
    assert len(alive) == cfg.settings.cluster.workers == 2, f"ALIVE workers: {alive}"
    assert {w["cores"] for w in alive} == {cfg.settings.cluster.worker_cores}
    assert {w["memory"] for w in alive} == {3 * 1024}, "cluster.worker_memory (3g) offered to executors"
    env = psutil.Process(workers[0].pid()).environ()
    assert env["PYSPARK_PYTHON"] == sys.executable, "executors run this venv's Python"
    assert env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"), \
        "the store's credentials reach the workers (and their executors) as the SDK's variables"
    assert "fs.s3a.access.key" not in json.dumps(cfg.raw), "never in the configuration"


def test_ingest_on_the_cluster_with_a_worker_killed_gives_the_local_silver(topology, local_silver, tmp_path):
    """The hourly ingest of both hours on the cluster, and while it runs the worker whose executor
    is running one of its tasks is SIGKILLed (the worker and its executor, as a machine that dies):
    Spark runs the task again on the other worker's executor (and recomputes lost shuffle output);
    the ingest finishes with exactly the local mode's silver. `up` then starts the worker again.
    (One ingest, not two: the clean ingest and the one with a worker killed were two tests that ran
    the same hour on the same cluster, issue 63; the kill's run is the stronger check.)"""
    import ccselect.topology as cluster
    from ccselect.topology import spark
    cfg, _, _ = topology
    local, local_res = local_silver
    master, *workers = spark.servers(cfg)
    peak: dict[str, float] = {}
    killed: dict = {}
    ui = _free_port()

    def sample_memory(driver_pid: int) -> None:
        """Peak RSS (MiB) of each server, each executor JVM and its Python workers, the driver."""
        procs = {s.name: s.pid() for s in (master, *workers)}
        for name, pid in list(procs.items()):
            if pid and name != "spark-master":
                try:
                    children = psutil.Process(pid).children()
                except psutil.NoSuchProcess:        # the worker this test killed
                    continue
                for child in children:
                    procs[f"{name} executor"] = child.pid
                    pyw = sum(_rss(c.pid) for c in child.children(recursive=True))
                    peak[f"{name} executor's Python"] = max(peak.get(f"{name} executor's Python", 0), pyw)
        drv = psutil.Process(driver_pid)
        peak["driver (Python + JVM)"] = max(peak.get("driver (Python + JVM)", 0),
                                            _rss(driver_pid) + sum(_rss(c.pid) for c in drv.children(recursive=True)))
        for name, pid in procs.items():
            if pid:
                peak[name] = max(peak.get(name, 0), _rss(pid))

    def kill_a_busy_worker() -> None:
        if killed:
            return
        try:
            app_id = _get(f"http://127.0.0.1:{ui}/api/v1/applications")[0]["id"]
            busy = [e["id"] for e in _get(f"http://127.0.0.1:{ui}/api/v1/applications/{app_id}/executors")
                    if e["id"] != "driver" and e["activeTasks"] > 0]
        except (OSError, ValueError, IndexError, KeyError):
            return      # the driver's UI is not up yet
        if not busy or not any("executor" in k and v > 0 for k, v in peak.items()):
            return      # not before an executor's memory was seen
        for i, w in enumerate(spark.servers(cfg)[1:], start=1):
            running = _get(f"http://{w.host}:{w.port}/json/")["executors"]
            if any(str(e["id"]) == busy[0] and e["appid"] == app_id for e in running):
                killed.update(worker=i, executor=busy[0], app=app_id, at=time.monotonic(),
                              pids=spark.kill_worker(cfg, i))
                return

    def sample(driver_pid: int) -> None:
        sample_memory(driver_pid)
        kill_a_busy_worker()

    t0 = time.monotonic()
    proc = _ingest(cluster.env(cfg), tmp_path / "silver.parquet", HOURS, tmp_path / "ingest.log",
                   ui_port=ui, sample=sample)
    res = proc.result
    print(f"\ningest of {len(HOURS)} hours (s): cluster session {res['session_s']:.1f} + "
          + " + ".join(f"{h['s']:.1f}" for h in res["hours"])
          + f"; local session {local_res['session_s']:.1f} + " + " + ".join(f"{h['s']:.1f}" for h in local_res["hours"]))
    print("peak RSS (MiB): " + "  ".join(f"{k} {v:.0f}" for k, v in sorted(peak.items())))
    print(f"killed spark-worker-{killed.get('worker')} (pids {killed.get('pids')}, executor "
          f"{killed.get('executor')}) {killed.get('at', t0) - t0:.1f} s into the ingest; it finished "
          f"{time.monotonic() - t0:.1f} s after its start")
    assert any("executor" in k and v > 0 for k, v in peak.items()), f"the executors ran on the workers: {peak}"
    assert killed, "a worker was killed while its executor ran a task of the ingest"
    assert len(killed["pids"]) >= 2, f"the worker and its executor: {killed['pids']}"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in killed["pids"]), "all of them gone"
    assert len(spark.alive_workers(cfg)) == 1, "the master saw the worker go"

    on_cluster = _silver(tmp_path / "silver.parquet")
    assert [h["silver_rows"] for h in res["hours"]] == [h["silver_rows"] for h in local_res["hours"]]
    assert set(on_cluster["hour"]) == set(HOURS) and len(on_cluster) > 500
    assert on_cluster["ug_id"].notna().all(), "the reference (raw_dir/reference/) was read from the store"
    assert on_cluster["label"].notna().any() and on_cluster["qoe_sessions"].gt(0).any(), "access and QoE joined"
    pd.testing.assert_frame_equal(on_cluster, local, check_exact=False, rtol=1e-9)

    from ccselect.topology import objectstore
    s3 = objectstore.client(cfg)
    bucket, prefix = cfg.settings.lake.root.removeprefix("s3a://").split("/", 1)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    assert f"{prefix}/silver/connections/_delta_log/00000000000000000000.json" in keys, \
        "silver.connections is a Delta table on the object store"

    t1 = time.monotonic()
    spark.up(cfg, cluster.env(cfg))
    print(f"worker back in {time.monotonic() - t1:.1f} s")
    assert len(spark.alive_workers(cfg)) == 2, "up started the killed worker again"


def test_discover_on_the_store_judges_every_entry_as_in_a_local_folder(topology, fleet, tmp_path, monkeypatch):
    """jobs.sources.discover_all over an s3a:// prefix (one listing, the folders its keys imply)
    finds and skips exactly what it does in the same tree on a local disk, for the same reasons."""
    from ccselect.topology import objectstore
    from ccselect.hours import Window
    from ccselect.jobs.sources import Skipped, discover_all
    cfg, _, _ = topology
    for k, v in objectstore.client_env(cfg).items():
        monkeypatch.setenv(k, v)
    odd = tmp_path / "raw"
    shutil.copytree(fleet, odd)
    node = sorted(p.name for p in (odd / "transport").iterdir())[0]
    for rel in ("notes.txt", "transport/README", "transport/bad!node/2026-11-01T00.jsonl",
                f"transport/{node}/.hidden", f"transport/{node}/.2026-11-01T0005.jsonl.part",
                f"transport/{node}/junk.txt", f"transport/{node}/sub/2026-11-01T00.jsonl",
                f"access/{node}/2026-11-01T00.jsonl.gz", "_truth/anything.json"):
        (odd / rel).parent.mkdir(parents=True, exist_ok=True)
        (odd / rel).write_text("{}\n")
    s3 = objectstore.client(cfg)
    for f in (p for p in odd.rglob("*") if p.is_file()):
        s3.upload_file(str(f), "ccselect-lake", f"odd/{f.relative_to(odd).as_posix()}")
    remote = "s3a://ccselect-lake/odd"

    def relative(result, root):
        found, skipped = result
        return ([(f.stream, f.node_id, f.hour, f.path.removeprefix(root)) for f in found],
                sorted((s.path.removeprefix(root), s.why) for s in skipped))

    for window in (None, Window.hours(HOURS[1])):
        local = relative(discover_all(str(odd), window), str(odd))
        on_store = relative(discover_all(remote, window, cfg=cfg), remote)
        assert on_store == local, window
    found, skipped = relative(discover_all(remote, cfg=cfg), remote)
    assert len(found) == 3 * 3 * 2 - 1, "every node-hour file but the one there as .jsonl.gz too"
    assert [p for p, _ in skipped] == sorted(
        ["/notes.txt", "/transport/README", "/transport/bad!node", f"/transport/{node}/.hidden",
         f"/transport/{node}/junk.txt", f"/transport/{node}/sub", f"/access/{node}/2026-11-01T00.jsonl",
         f"/access/{node}/2026-11-01T00.jsonl.gz"]), skipped
    assert discover_all("s3a://ccselect-lake/nothing-here", cfg=cfg) == \
        ([], [Skipped("s3a://ccselect-lake/nothing-here", "not a folder")])


def test_down_stops_every_server_and_leaves_no_process(topology):
    import ccselect.topology as cluster
    cfg, _, root = topology
    servers = [s for name in PARTS for s in cluster.part(name).servers(cfg)]
    pids = {s.name: s.pid() for s in servers}
    t0 = time.monotonic()
    cluster.down(cfg, log=lambda _m: None)
    print(f"\ndown: {time.monotonic() - t0:.1f} s")
    assert not [s.name for s in servers if s.running() or s.pidfile.exists()], "a server still has a live pid file"
    assert not [n for n, pid in pids.items() if pid and psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], f"a server's process lives on: {pids}"
    assert not _ours(str(root)), f"processes of the topology left after down: {_ours(str(root))}"


def test_the_cluster_files_load_and_have_the_same_keys():
    """infra/conf/cluster.yaml (a real cluster) and cluster-local.yaml (it on one machine): the
    same keys, Spark's conf keys included; S3A as ccselect/spark.py resolves it."""
    from ccselect.config import load_config
    from ccselect.spark import S3A_SDK_MODULES, packages, pyspark_hadoop_version

    def keys(d: dict, pre: str = "") -> set[str]:
        return {pre + k for k in d} | {x for k, v in d.items() if isinstance(v, dict) for x in keys(v, f"{pre}{k}.")}

    files = [REPO / "infra" / "conf" / f for f in ("cluster.yaml", "cluster-local.yaml")]
    real, local = (yaml.safe_load(p.read_text()) for p in files)
    assert keys(real) ^ keys(local) == set()
    for cfg in map(load_config, files):
        s = cfg.settings
        assert cfg.data_root.startswith("s3a://") and s.object_store.endpoint
        assert s.spark.extra_packages == (f"org.apache.hadoop:hadoop-aws:{pyspark_hadoop_version()}",)
        provider = s.spark.conf["spark.hadoop.fs.s3a.aws.credentials.provider"]
        assert provider.startswith("software.amazon.awssdk."), f"{cfg.path.name}: an SDK v2 provider, not {provider}"
        extra, excludes = packages(s.spark.extra_packages)
        assert {m.rsplit(":", 1)[0] for m in extra[1:]} == set(S3A_SDK_MODULES)
        assert "software.amazon.awssdk:bundle" in excludes
        assert s.mlflow.tracking_uri.startswith("http://") and s.mlflow.backend_store_uri.startswith("postgresql://")
        assert s.airflow.sql_alchemy_conn.startswith("postgresql") and s.airflow.api_url.startswith("http://")
