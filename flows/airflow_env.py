"""Real Airflow for ccselect, started by the project itself: the environment every Airflow
process gets (home and SQLite metadata DB under the data root, our `dags/` folder, no examples,
the configuration passed on as CCS_CONFIG), the one-time `airflow db migrate`, and the commands
the tests, `make run` and `make airflow` use.

With `airflow.sql_alchemy_conn` the metadata DB is that database instead (Postgres in the
one-machine topology, topology/); with `airflow.api_url` the environment is also the one of a
running deployment (topology/airflow.py): its executor, the API server the task runners report
to, and the secrets every component must share, generated once under the home (`secrets/`, mode
600), never in the repository or the configuration.

Airflow reads its configuration when it is first imported, so everything Airflow runs in a child
process with this environment: `python -m ccselect.flows.airflow_env dagbag|test DAG --date ...`.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import secrets
import subprocess
import sys
from base64 import urlsafe_b64encode
from pathlib import Path

from ccselect.config import Config, load_config, project_root
# Imported inside the functions that use them (heavy, not needed to import this module): airflow, pendulum,
# psycopg2.

DAG_IDS = ("ccs_hourly", "ccs_train", "ccs_autoplex", "ccs_maintain")


#: a deployment on one machine of 2 cores: tasks at once, DAG files parsed at once
PARALLELISM = 2
PARSING_PROCESSES = 1
#: the API user the project's own clients (topology/airflow.py) log in as
API_USER = "ccselect"


def airflow_env(cfg: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    a = cfg.settings.airflow
    home = a.home
    env = dict(os.environ if base is None else base)
    env.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": a.sql_alchemy_conn or f"sqlite:///{os.path.join(home, 'airflow.db')}",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING"),
        "CCS_CONFIG": str(cfg.path),
        "CCS_HOME": str(project_root()),
        "PYTHONPATH": os.pathsep.join(p for p in (str(project_root()), env.get("PYTHONPATH", "")) if p),
    })
    if os.environ.get("CCS_DATA_ROOT"):
        env["CCS_DATA_ROOT"] = os.environ["CCS_DATA_ROOT"]
    if a.api_url:
        env.update(_deployment_env(cfg))
    return env


def _deployment_env(cfg: Config) -> dict[str, str]:
    """What a scheduler, DAG processor, API server and their task runners share: the executor, the
    API server's address (Airflow 3's task runners talk to its execution API, not to the
    database), the JWT secret that signs and checks their tokens, the API's session key, the
    Fernet key of connections and variables, and the API users."""
    a = cfg.settings.airflow
    url = a.api_url.rstrip("/")
    keys = deployment_secrets(cfg)
    return {
        "AIRFLOW__CORE__EXECUTOR": a.executor,
        "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",    # nothing runs until asked
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
        "AIRFLOW__API__SECRET_KEY": keys["api_secret_key"],
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{API_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(_secrets_dir(cfg) / "passwords.json"),
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": str(PARSING_PROCESSES),
        # a deployment's task logs are what an operator reads: INFO, unless asked otherwise
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
    }


def _secrets_dir(cfg: Config) -> Path:
    return Path(cfg.settings.airflow.home) / "secrets"


def deployment_secrets(cfg: Config) -> dict[str, str]:
    """The deployment's shared secrets and the API user's password, generated at first use into
    `<airflow.home>/secrets/` (mode 700, files 600)."""
    d = _secrets_dir(cfg)
    keys, passwords = d / "keys.json", d / "passwords.json"
    if not keys.exists():
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
        _write_private(passwords, {API_USER: secrets.token_urlsafe(18)})
        _write_private(keys, {"jwt_secret": secrets.token_urlsafe(48),
                              "api_secret_key": secrets.token_urlsafe(32),
                              "fernet_key": urlsafe_b64encode(os.urandom(32)).decode()})
    return {**json.loads(keys.read_text()), "api_password": json.loads(passwords.read_text())[API_USER]}


def _write_private(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def ensure_db(cfg: Config, base: dict[str, str] | None = None) -> str:
    """`airflow db migrate` once per Airflow home and database (a stamp file remembers the Airflow
    version, and the database it migrated when that is not the SQLite file under the home)."""
    env = airflow_env(cfg, base)
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    stamp = home / ".migrated"
    conn = cfg.settings.airflow.sql_alchemy_conn
    version = md.version("apache-airflow") + (f"\n{conn}" if conn else "")
    present = _has_airflow_schema(conn) if conn else (home / "airflow.db").exists()
    if not (stamp.exists() and stamp.read_text() == version and present):
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        stamp.write_text(version)
    return str(home)


def _has_airflow_schema(conn: str) -> bool:
    """Whether the (Postgres) database has been migrated at all: a stamp beside a database made
    afresh must not skip its migration."""
    import psycopg2
    dsn = "postgresql://" + conn.split("://", 1)[1]     # libpq's URI, without SQLAlchemy's driver
    try:
        c = psycopg2.connect(dsn, connect_timeout=5)
    except psycopg2.OperationalError:
        return False
    try:
        with c.cursor() as cur:
            cur.execute("SELECT to_regclass('alembic_version') IS NOT NULL")
            return bool(cur.fetchone()[0])
    finally:
        c.close()


def run_in_airflow(cfg: Config, args: list[str], timeout: float | None = None,
                   capture: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m ccselect.flows.airflow_env ARGS` in a child with the Airflow environment."""
    ensure_db(cfg)
    return subprocess.run([sys.executable, "-m", "ccselect.flows.airflow_env", *args], env=airflow_env(cfg),
                          capture_output=capture, text=True, timeout=timeout)


def results_of(proc: subprocess.CompletedProcess) -> list[dict]:
    """Every JSON result line a child printed (`CCS_RESULT {...}`), in order."""
    return [json.loads(line[len("CCS_RESULT "):]) for line in (proc.stdout or "").splitlines()
            if line.startswith("CCS_RESULT ")]


def result_of(proc: subprocess.CompletedProcess) -> dict:
    """The JSON result line a child printed (`CCS_RESULT {...}`); raises with its output if none."""
    for line in reversed((proc.stdout or "").splitlines()):
        if line.startswith("CCS_RESULT "):
            return json.loads(line[len("CCS_RESULT "):])
    raise RuntimeError(f"airflow child exited {proc.returncode} without a result:\n"
                       f"{(proc.stdout or '')[-4000:]}\n{(proc.stderr or '')[-4000:]}")


# ---- what runs inside the child -----------------------------------------------------------------

def _dagbag() -> dict:
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "tags": sorted(dag.tags or []),
            "max_active_runs": dag.max_active_runs,
            "doc_md": bool(dag.doc_md),
            "schedule": getattr(dag.timetable, "description", None) or str(dag.timetable),
            "tasks": {t.task_id: {"retries": t.retries, "upstream": sorted(t.upstream_task_ids)}
                      for t in dag.tasks},
        }
    return {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": dags}


def _test(dag_id: str, date: str, conf: dict | None) -> dict:
    import pendulum
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if dag_id not in bag.dags:
        raise SystemExit(f"no DAG {dag_id!r}; import errors: {bag.import_errors}")
    dag = bag.dags[dag_id]
    run = dag.test(logical_date=pendulum.parse(date).in_timezone("UTC"), run_conf=conf or None)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    return {"dag_id": dag_id, "logical_date": date, "state": str(run.state), "tasks": states}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ccselect's Airflow helpers (run with the Airflow environment)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("dagbag", help="import every DAG, print tags/retries/import errors as JSON")
    t = sub.add_parser("test", help="dag.test() one DAG run for a logical date")
    t.add_argument("dag_id")
    t.add_argument("--date", required=True, help="logical date, ISO 8601 UTC")
    t.add_argument("--conf", default=None, help="run conf as JSON")
    q = sub.add_parser("sequence", help="dag.test() several runs in one process (one Spark session for all), "
                                        "in order, stopping at the first that fails")
    q.add_argument("plan", help='JSON list of {"dag_id": ..., "date": ISO, "conf": {...}}')
    sub.add_parser("env", help="print the Airflow environment for the configuration")
    sub.add_parser("migrate", help="create or upgrade Airflow's metadata DB")
    a = ap.parse_args(argv)
    if a.cmd in ("env", "migrate"):
        cfg = load_config()
        if a.cmd == "migrate":
            print(ensure_db(cfg))
        else:
            for k, v in sorted(airflow_env(cfg, {}).items()):
                print(f"export {k}={v}")
        return 0
    if "AIRFLOW_HOME" not in os.environ:  # started by hand: re-exec with the environment
        return run_in_airflow(load_config(), sys.argv[1:], capture=False).returncode
    if a.cmd == "sequence":
        for step in json.loads(a.plan):
            out = _test(step["dag_id"], step["date"], step.get("conf"))
            print("CCS_RESULT " + json.dumps(out, sort_keys=True), flush=True)
            if not out["state"].endswith("success"):
                return 1
        return 0
    out = _dagbag() if a.cmd == "dagbag" else _test(a.dag_id, a.date, json.loads(a.conf) if a.conf else None)
    print("CCS_RESULT " + json.dumps(out, sort_keys=True))
    return 0 if a.cmd == "dagbag" or out["state"].endswith("success") else 1


if __name__ == "__main__":
    raise SystemExit(main())
