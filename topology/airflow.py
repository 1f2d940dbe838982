"""Part `airflow`: Airflow 3 as a deployment, its metadata in Postgres (`airflow.sql_alchemy_conn`).

`up` migrates the database (once per Airflow version, flows.airflow_env.ensure_db), then starts
  airflow-api-server     the REST API, the UI and the execution API the task runners report to,
                         on `airflow.api_url`, one worker;
  airflow-scheduler      LocalExecutor with PARALLELISM task slots (2 cores);
  airflow-dag-processor  parses dags/ into serialized DAGs in the database.
Their environment is flows.airflow_env.airflow_env's (the shared JWT secret and keys, the execution
API's URL, new DAGs paused: nothing runs on `up` until asked), on top of the topology's own
(topology.env: the object store's credentials for the tasks).

Helpers for callers that drive the deployment: `airflow_cli`, `api` (REST with a token of the
project's API user), `unpause`, `trigger`, `wait_dag_run`, `heartbeat`.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from ccselect.config import Config

from ccselect.flows.airflow_env import API_USER, DAG_IDS, airflow_env, deployment_secrets, ensure_db
from ccselect.topology import address, env as cluster_env, home
from ccselect.topology.proc import ClusterError, Server, free_port, http_ok
# Imported inside the functions that use them (heavy, not needed to import this module): psycopg2.

#: the job_type of each component's row in Airflow's `job` table (its heartbeat)
JOB_TYPES = {"airflow-scheduler": "SchedulerJob", "airflow-dag-processor": "DagProcessorJob"}
FINAL_STATES = ("success", "failed")


def _require(cfg: Config) -> tuple[str, str]:
    a = cfg.settings.airflow
    if not (a.sql_alchemy_conn and a.api_url):
        raise ClusterError(f"{cfg.path}: airflow.sql_alchemy_conn and airflow.api_url must both be set "
                           "to run Airflow as servers")
    return a.sql_alchemy_conn, a.api_url.rstrip("/")


def servers(cfg: Config) -> list[Server]:
    host, port = address(_require(cfg)[1], 8080)
    root = Path(home(cfg))
    return [Server("airflow-api-server", root / "airflow-api-server", port, host),
            Server("airflow-scheduler", root / "airflow-scheduler"),
            Server("airflow-dag-processor", root / "airflow-dag-processor")]


def _airflow() -> str:
    return str(Path(sys.executable).parent / "airflow")


def _libpq(conn: str) -> str:
    return "postgresql://" + conn.split("://", 1)[1]


def heartbeat(cfg: Config, job_type: str = "SchedulerJob") -> datetime | None:
    """The latest heartbeat of a running component (its row in `job`), None when there is none."""
    import psycopg2
    c = psycopg2.connect(_libpq(_require(cfg)[0]), connect_timeout=3)
    try:
        with c.cursor() as cur:
            cur.execute("SELECT max(latest_heartbeat) FROM job WHERE job_type = %s AND state = 'running'",
                        (job_type,))
            return cur.fetchone()[0]
    finally:
        c.close()


def _beats_since(cfg: Config, job_type: str, since: datetime) -> bool:
    try:
        beat = heartbeat(cfg, job_type)
    except Exception:  # the database not there yet, or the tables: not ready
        return False
    return beat is not None and beat >= since


def api_healthy(cfg: Config) -> bool:
    return http_ok(f"{_require(cfg)[1]}/api/v2/monitor/health")


def up(cfg: Config, env: dict[str, str]) -> None:
    _require(cfg)
    aenv = airflow_env(cfg, env)
    ensure_db(cfg, env)
    api, scheduler, processor = servers(cfg)
    if api.pid() is None:
        free_port(api.host, api.port)
    api.start(supervised(api, [_airflow(), "api-server", "--host", api.host, "--port", str(api.port),
                                "--workers", "1"]),
              env=aenv, cwd=str(api.home), timeout=180, ready=lambda: api_healthy(cfg))
    # no log server beside the scheduler (it would listen on every address, port 8793): the task
    # runners write their logs under the shared AIRFLOW_HOME, where the API server reads them
    for s, args in ((scheduler, ["scheduler", "--skip-serve-logs"]), (processor, ["dag-processor"])):
        since = datetime.now(timezone.utc)
        s.start(supervised(s, [_airflow(), *args]), env=aenv, cwd=str(s.home), timeout=180,
                ready=lambda s=s, since=since: _beats_since(cfg, JOB_TYPES[s.name], since))
    wait_dags(cfg, DAG_IDS)


def supervised(server: Server, argv: list[str]) -> list[str]:
    """`argv` under the topology's supervisor (topology/supervise.py), which starts it again
    when it exits: Airflow's scheduler and DAG processor exit when Postgres restarts under them."""
    return [sys.executable, "-m", "ccselect.topology.supervise", "--name", server.name, "--", *argv]


def wait_dags(cfg: Config, dag_ids, timeout: float = 180.0) -> None:
    """Until the DAG processor has parsed and serialized every one of `dag_ids` (the API knows
    them): before that a DAG cannot be unpaused or triggered. An import error is raised at once."""
    deadline = time.monotonic() + timeout
    token = _token(cfg)
    missing = list(dag_ids)
    while time.monotonic() < deadline:
        errors = api(cfg, "GET", "importErrors", token=token).get("import_errors", [])
        if errors:
            raise ClusterError("the DAG processor could not import: "
                               + "; ".join(f"{e['filename']}: {e['stack_trace'][-500:]}" for e in errors))
        known = {d["dag_id"] for d in api(cfg, "GET", "dags?limit=100", token=token).get("dags", [])}
        missing = [d for d in dag_ids if d not in known]
        if not missing:
            return
        time.sleep(1)
    raise ClusterError(f"the DAG processor has not serialized {', '.join(missing)} within {timeout:.0f} s")


# ---- driving the deployment ---------------------------------------------------------------------

def airflow_cli(cfg: Config, *args: str, timeout: float | None = 300) -> subprocess.CompletedProcess:
    """The venv's `airflow ARGS` with the deployment's environment (output captured as text)."""
    return subprocess.run([_airflow(), *args], env=airflow_env(cfg, cluster_env(cfg)), capture_output=True,
                          text=True, timeout=timeout)


def _token(cfg: Config) -> str:
    body = json.dumps({"username": API_USER, "password": deployment_secrets(cfg)["api_password"]}).encode()
    req = urllib.request.Request(f"{_require(cfg)[1]}/auth/token", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["access_token"]


def api(cfg: Config, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    """One call of the REST API (`/api/v2/...`) as the project's API user; → the JSON answer."""
    req = urllib.request.Request(f"{_require(cfg)[1]}/api/v2/{path.lstrip('/')}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token or _token(cfg)}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise ClusterError(f"Airflow API {method} {path}: {e.code} {detail}") from None


def unpause(cfg: Config, dag_id: str, paused: bool = False) -> dict:
    """Unpause (or pause) a DAG: a paused DAG's runs, triggered ones too, wait in `queued`."""
    return api(cfg, "PATCH", f"dags/{urllib.parse.quote(dag_id)}", {"is_paused": paused})


def trigger(cfg: Config, dag_id: str, logical_date: str | datetime | None = None,
            conf: dict | None = None) -> str:
    """A manual run of `dag_id` for `logical_date` (ISO 8601, UTC when naive; None: no logical
    date) with `conf`; → its run id. It starts once the DAG is unpaused (`unpause`)."""
    if isinstance(logical_date, str):
        logical_date = datetime.fromisoformat(logical_date.replace("Z", "+00:00"))
    if logical_date is not None and logical_date.tzinfo is None:
        logical_date = logical_date.replace(tzinfo=timezone.utc)
    run = api(cfg, "POST", f"dags/{urllib.parse.quote(dag_id)}/dagRuns",
              {"logical_date": logical_date.isoformat() if logical_date else None, "conf": conf or {}})
    return run["dag_run_id"]


def dag_run(cfg: Config, dag_id: str, run_id: str, token: str | None = None) -> dict:
    return api(cfg, "GET", f"dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id, safe='')}",
               token=token)


def wait_dag_run(cfg: Config, dag_id: str, run_id: str, timeout: float = 600, poll: float = 2.0) -> str:
    """Poll the run until it ends; → its final state (success or failed). Raises ClusterError when
    it is still going after `timeout` seconds."""
    token, got = _token(cfg), time.monotonic()
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        if time.monotonic() - got > 600:    # the API's tokens expire; renew well before
            token, got = _token(cfg), time.monotonic()
        state = dag_run(cfg, dag_id, run_id, token)["state"]
        if state in FINAL_STATES:
            return state
        time.sleep(poll)
    raise ClusterError(f"DAG run {dag_id} {run_id} still {state} after {timeout:.0f} s")
