"""Real Airflow for ccselect, started by the project itself: the environment every Airflow
process gets (home and SQLite metadata DB under the data root, our `dags/` folder, no examples,
the configuration passed on as CCS_CONFIG), the one-time `airflow db migrate`, and the commands
the tests, `make run` and `make airflow` use.

Airflow reads its configuration when it is first imported, so everything Airflow runs in a child
process with this environment: `python -m app.airflow_env dagbag|test DAG --date ...`.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

from ccselect.config import Config, load_config, project_root
# Imported inside the functions that use them (heavy, not needed to import this module): airflow, pendulum.

DAG_IDS = ("ccs_hourly", "ccs_train", "ccs_autoplex")


def airflow_env(cfg: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    home = cfg.settings.airflow.home
    env = dict(os.environ if base is None else base)
    env.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{os.path.join(home, 'airflow.db')}",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING"),
        "CCS_CONFIG": str(cfg.path),
        "CCS_HOME": str(project_root()),
        "PYTHONPATH": os.pathsep.join(p for p in (str(project_root()), env.get("PYTHONPATH", "")) if p),
    })
    if os.environ.get("CCS_DATA_ROOT"):
        env["CCS_DATA_ROOT"] = os.environ["CCS_DATA_ROOT"]
    return env


def ensure_db(cfg: Config) -> str:
    """`airflow db migrate` once per Airflow home (a stamp file remembers the Airflow version)."""
    env = airflow_env(cfg)
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    stamp = home / ".migrated"
    version = md.version("apache-airflow")
    if not (stamp.exists() and stamp.read_text() == version and (home / "airflow.db").exists()):
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        stamp.write_text(version)
    return str(home)


def run_in_airflow(cfg: Config, args: list[str], timeout: float | None = None,
                   capture: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m app.airflow_env ARGS` in a child with the Airflow environment."""
    ensure_db(cfg)
    return subprocess.run([sys.executable, "-m", "app.airflow_env", *args], env=airflow_env(cfg),
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
