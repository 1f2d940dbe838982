"""`ccs cluster up|down` for real (topology/): the object store, Postgres, the MLflow tracking
server and Airflow (API server, scheduler, DAG processor) brought up under a temporary
`cluster.home` on the ports of infra/conf/cluster-local.yaml, used the way the pipeline uses them,
a Postgres restart survived, and everything brought down with nothing left behind.

Prints each part's bring-up time and each server's memory (run with -s to see them)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from ccs_testing import write_cluster_config

from ccselect.topology import postgres

PARTS = ("objectstore", "postgres", "mlflow", "airflow")   # Spark has a test of its own

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(900),
    pytest.mark.skipif(postgres.available() is None,
                       reason="PostgreSQL's server binaries (initdb, postgres) are not installed"),
    pytest.mark.skipif(shutil.which("java") is None, reason="no java for the object store (s3proxy)"),
]

#: a DAG of our own beside dags/, in a second bundle: one task through scheduler → LocalExecutor
#: → task runner → the API server's execution API, so the shared secrets are proven to work
PROBE_DAG = '''
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="ccs_probe", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
     tags=["test"])
def ccs_probe():
    @task
    def answer(**context) -> int:
        return 40 + int(context["dag_run"].conf.get("plus", 0))

    answer()


ccs_probe()
'''


def _memory(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB of a server and all its descendants (PSS shares what they share)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    rss = pss = 0
    for p in procs:
        try:
            m = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss, pss = rss + m.rss, pss + m.pss
    return rss / 2**20, pss / 2**20


def _ours(marker: str) -> list[str]:
    """Every process whose command line, working directory or environment names `marker`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{d}/cwd")
            env = Path(f"/proc/{d}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd or cwd.startswith(marker) or marker in env:
            out.append(f"{d}: {cmd[:160]}")
    return out


def _down(cfg) -> None:
    """`ccs cluster down` (when every part module of the topology is there), then, whatever it did,
    each server this test started stopped directly, last started first (a no-op when down did it)."""
    from ccselect import topology
    try:
        if all(importlib.util.find_spec(f"ccselect.topology.{name}") for name in topology.PARTS):
            topology.down(cfg, log=lambda _m: None)
    finally:
        for name in reversed(PARTS):
            for s in reversed(topology.part(name).servers(cfg)):
                s.stop()


@pytest.fixture(scope="module")
def cluster():
    """The four parts up under a fresh home; → (cfg, timings, home). Torn down whatever happens
    (the last test brings it down itself and checks that nothing is left)."""
    from ccselect import topology
    from ccselect.config import load_config
    # not under pytest's base temp (mode 700): as root, Postgres runs as `postgres`, which must
    # be able to enter the folders down to its data directory
    root = Path(tempfile.mkdtemp(prefix="ccs-cluster-"))
    root.chmod(0o755)
    probe = root / "probe_dags"
    probe.mkdir()
    (probe / "ccs_probe.py").write_text(PROBE_DAG)
    bundles = [{"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {}},
               {"name": "probe", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(probe), "refresh_interval": 0}}]
    cfg = load_config(write_cluster_config(root))
    timings = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
        try:
            for name in PARTS:    # what `topology.up` does, part by part, timed
                t0 = time.monotonic()
                topology.part(name).up(cfg, topology.env(cfg))
                timings[name] = time.monotonic() - t0
            yield cfg, timings, root
        finally:
            _down(cfg)
            shutil.rmtree(root, ignore_errors=True)


def test_bring_up_times_and_memory(cluster):
    from ccselect import topology
    cfg, timings, _ = cluster
    print("\ncluster bring-up (s):  " + "  ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    print(f"{'server':24} {'pid':>7} {'procs':>5} {'RSS MiB':>8} {'PSS MiB':>8}")
    total = 0.0
    for s in (s for name in PARTS for s in topology.part(name).servers(cfg)):
        pid = s.pid()
        assert pid is not None, f"{s.name} is not running after up ({s.log})"
        rss, pss = _memory(pid)
        total += pss
        n = 1 + len(psutil.Process(pid).children(recursive=True))
        print(f"{s.name:24} {pid:>7} {n:>5} {rss:>8.0f} {pss:>8.0f}")
    print(f"{'all':24} {'':>7} {'':>5} {'':>8} {total:>8.0f}")
    assert set(timings) == set(PARTS)


def test_postgres_has_the_role_and_the_databases(cluster):
    cfg, _, _ = cluster
    conn = postgres.connect(cfg)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'ccselect'")
            assert cur.fetchone() == (True, False), "role ccselect: may log in, not a superuser"
            cur.execute("SELECT datname, pg_get_userbyid(datdba) FROM pg_database "
                        "WHERE datname IN ('airflow', 'mlflow') ORDER BY 1")
            assert cur.fetchall() == [("airflow", "ccselect"), ("mlflow", "ccselect")], "databases and owners"
            cur.execute("SHOW listen_addresses")
            assert cur.fetchone() == ("127.0.0.1",), "listens on loopback only"
    finally:
        conn.close()
    data = postgres.data_dir(cfg)
    assert oct(data.stat().st_mode & 0o777) == "0o700", "the data directory is private"


def test_mlflow_run_model_and_alias_in_postgres_with_artifacts_on_the_store(cluster):
    import mlflow
    import numpy as np
    import pandas as pd
    from mlflow.models import infer_signature
    from mlflow.tracking import MlflowClient

    from ccselect.topology import objectstore
    cfg, _, _ = cluster
    uri = cfg.settings.mlflow.tracking_uri
    before = mlflow.get_tracking_uri()
    name = "ccs-cluster-probe"

    class Constant(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return np.zeros(len(model_input))

    x = pd.DataFrame({"rtt_ms": [12.0, 80.5]})
    # the client has no credentials of the store: the server proxies the artifacts
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(os.environ)
    try:
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        exp = client.create_experiment("cluster-control")
        with mlflow.start_run(experiment_id=exp) as run:
            mlflow.log_param("seed", 7)
            for step in range(3):
                mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
            mlflow.log_text("probe", "notes/probe.txt")
            info = mlflow.pyfunc.log_model(name="model", python_model=Constant(), pip_requirements=["mlflow"],
                                           signature=infer_signature(x, np.zeros(2)),
                                           registered_model_name=name)
        run_id = run.info.run_id
        assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
        version = info.registered_model_version
        client.set_registered_model_alias(name, "champion", str(version))
        assert client.get_model_version_by_alias(name, "champion").run_id == run_id
    finally:
        mlflow.set_tracking_uri(before)

    conn = postgres.connect(cfg, "mlflow", "ccselect")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_uuid = %s", (run_id,))
            assert cur.fetchone() == ("FINISHED",), "the run, finished, in Postgres"
            cur.execute("SELECT count(*) FROM metrics WHERE run_uuid = %s AND key = 'loss'", (run_id,))
            assert cur.fetchone() == (3,), "three steps of the metric"
            cur.execute("SELECT version, run_id FROM model_versions WHERE name = %s", (name,))
            assert cur.fetchall() == [(int(version), run_id)], "the registered version"
            cur.execute("SELECT alias, version FROM registered_model_aliases WHERE name = %s", (name,))
            assert cur.fetchall() == [("champion", int(version))], "the alias"
    finally:
        conn.close()

    bucket, prefix = cfg.settings.mlflow.artifact_root.removeprefix("s3://").split("/", 1)
    s3 = objectstore.client(cfg)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    assert f"{prefix}/{exp}/{run_id}/artifacts/notes/probe.txt" in keys, keys
    model_files = [k for k in keys if k.endswith("/MLmodel") and info.model_id in k]
    assert model_files, f"the logged model's MLmodel on the store: {keys}"


def test_airflow_serves_our_dags_paused_without_import_errors(cluster):
    from ccselect.flows.airflow_env import DAG_IDS
    from ccselect.topology import airflow
    cfg, _, _ = cluster
    assert all(s.running() for s in airflow.servers(cfg)), [s.status() for s in airflow.servers(cfg)]
    conn = postgres.connect(cfg, "airflow", "ccselect")
    try:
        deadline = time.monotonic() + 90
        while True:    # the DAG processor's first pass over the folder may still be going
            with conn.cursor() as cur:
                cur.execute("SELECT dag_id FROM serialized_dag")
                serialized = {r[0] for r in cur.fetchall()}
            if set(DAG_IDS) <= serialized or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert set(DAG_IDS) <= serialized, f"serialized DAGs in Postgres: {serialized}"
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM dag_run WHERE dag_id = ANY(%s)", (list(DAG_IDS),))
            assert cur.fetchone() == (0,), "nothing ran by itself on up"
    finally:
        conn.close()
    errors = airflow.api(cfg, "GET", "importErrors")
    assert errors["total_entries"] == 0, errors
    dags = {d["dag_id"]: d for d in airflow.api(cfg, "GET", "dags")["dags"]}
    for dag_id in DAG_IDS:
        assert dags[dag_id]["is_paused"], f"{dag_id} is paused at creation"
        assert not dags[dag_id]["has_import_errors"], dag_id
    listed = airflow.airflow_cli(cfg, "dags", "list-import-errors", "-o", "json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert json.loads(listed.stdout.strip().splitlines()[-1]) == [], listed.stdout   # after Airflow's warnings


def test_scheduler_survives_a_postgres_restart_and_still_runs_tasks(cluster):
    from ccselect.topology import airflow
    cfg, _, _ = cluster
    scheduler = airflow.servers(cfg)[1]
    pid = scheduler.pid()
    assert pid is not None and airflow.heartbeat(cfg) is not None, "the scheduler heartbeats before"
    down_for = postgres.restart(cfg)
    restarted = datetime.now(timezone.utc)
    beat, deadline = None, time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            beat = airflow.heartbeat(cfg)
        except Exception:  # the scheduler is not the only one reconnecting
            beat = None
        if beat is not None and beat > restarted:
            break
        time.sleep(1)
    print(f"\npostgres restart: down {down_for:.1f} s, scheduler heartbeat again "
          f"{(beat - restarted).total_seconds() if beat else float('nan'):.1f} s after")
    assert beat is not None and beat > restarted, f"scheduler heartbeat after the restart: {beat}"
    assert scheduler.pid() == pid, "the same scheduler process, not a new one"
    assert all(s.running() for s in airflow.servers(cfg)), [s.status() for s in airflow.servers(cfg)]

    # and a task still goes all the way through: scheduler, executor, task runner, execution API
    deadline = time.monotonic() + 90
    while "ccs_probe" not in {d["dag_id"] for d in airflow.api(cfg, "GET", "dags")["dags"]}:
        assert time.monotonic() < deadline, "the probe DAG was never parsed"
        time.sleep(1)
    run_id = airflow.trigger(cfg, "ccs_probe", "2026-11-01T00:00:00", {"plus": 2})
    airflow.unpause(cfg, "ccs_probe")
    t0 = time.monotonic()
    state = airflow.wait_dag_run(cfg, "ccs_probe", run_id, timeout=180)
    print(f"probe DAG run: {state} in {time.monotonic() - t0:.1f} s")
    assert state == "success", f"probe run {run_id}: {state}; see {scheduler.log}"
    xcom = airflow.api(cfg, "GET", f"dags/ccs_probe/dagRuns/{run_id}/taskInstances/answer/xcomEntries/return_value")
    value = json.loads(xcom["value"]) if isinstance(xcom["value"], str) else xcom["value"]
    assert value == 42, f"the task's result through the execution API: {xcom}"
    log = airflow.api(cfg, "GET", f"dags/ccs_probe/dagRuns/{run_id}/taskInstances/answer/logs/1")
    assert "Done. Returned value was: 42" in json.dumps(log), f"the task's log, served by the API server: {log}"


def test_down_stops_every_server_and_leaves_no_process(cluster):
    from ccselect import topology
    cfg, _, root = cluster
    servers = [s for name in PARTS for s in topology.part(name).servers(cfg)]
    pids = {s.name: s.pid() for s in servers}
    t0 = time.monotonic()
    _down(cfg)
    print(f"\ncluster down: {time.monotonic() - t0:.1f} s")
    assert not [s.name for s in servers if s.running() or s.pidfile.exists()], "a server still has a live pid file"
    assert not [n for n, pid in pids.items() if pid and psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], f"a server's process lives on: {pids}"
    left = _ours(str(root))
    assert not left, f"processes of the topology left after down: {left}"
