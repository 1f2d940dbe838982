"""The UIs over the results, with the project's configuration: `python -m ccselect.app.ui mlflow`
(MLflow UI on the SQLite store), `airflow` (Airflow standalone: API server, scheduler, DAG
processor on the SQLite metadata DB), `notebooks` (JupyterLab in notebooks/)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ccselect.config import load_config, project_root
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("ui", choices=("mlflow", "airflow", "notebooks"))
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args(argv)
    cfg = load_config()
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, CCS_CONFIG=str(cfg.path), CCS_HOME=str(project_root()))
    if a.ui == "mlflow":
        argv = [str(bin_dir / "mlflow"), "ui", "--backend-store-uri", cfg.settings.mlflow.tracking_uri,
                "--default-artifact-root", cfg.settings.mlflow.artifact_root, "--port", str(a.port or 5000)]
    elif a.ui == "airflow":
        from ccselect.flows.airflow_env import airflow_env, ensure_db
        ensure_db(cfg)
        env = airflow_env(cfg, env)
        env["AIRFLOW__API__PORT"] = str(a.port or 8080)
        print(f"Airflow home {env['AIRFLOW_HOME']}; the admin password is written there "
              "(simple_auth_manager_passwords.json.generated)")
        argv = [str(bin_dir / "airflow"), "standalone"]
    else:
        argv = [str(bin_dir / "jupyter"), "lab", "--no-browser", "--port", str(a.port or 8888),
                "--notebook-dir", str(project_root() / "notebooks")]
        if os.geteuid() == 0:
            argv.append("--allow-root")
    print(" ".join(argv), flush=True)
    os.execve(argv[0], argv, env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
