"""The Airflow DAGs through real Airflow (SQLite metadata DB, `dag.test()`), each run in a child
process with the project's Airflow environment (flows.airflow_env): ccs_train and ccs_hourly as
the main job (`ccs run`, the `main_job` fixture of conftest.py) runs them, ccs_autoplex on its own;
the main job's summary; then the analysts' notebooks executed (nbclient) over the lake those runs
wrote, one after the other in one kernel (each from an empty namespace)."""
from __future__ import annotations

import json
import os

import pytest

from ccs_testing import REPO, write_config

pytestmark = pytest.mark.timeout(2400)


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """One Airflow home (metadata DB migrated once) for the module's DAG runs."""
    from ccselect.flows.airflow_env import ensure_db
    from ccselect.config import load_config
    root = tmp_path_factory.mktemp("airflow")
    home = root / "home"
    cfg = load_config(write_config(root, airflow={"home": str(home)}))
    ensure_db(cfg)
    return str(home)


def _delta(spark, cfg, name):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, name))


def test_dagbag_imports_every_dag_with_tags_retries_and_docs(airflow_home, tmp_path):
    from ccselect.flows.airflow_env import DAG_IDS, result_of, run_in_airflow
    from ccselect.config import load_config
    cfg = load_config(write_config(tmp_path, airflow={"home": airflow_home}))
    bag = result_of(run_in_airflow(cfg, ["dagbag"], timeout=600))
    assert bag["import_errors"] == {}
    assert sorted(bag["dags"]) == sorted(DAG_IDS) == sorted(p.stem for p in (REPO / "dags").glob("ccs_*.py"))
    for dag_id, d in bag["dags"].items():
        assert "ccselect" in d["tags"], dag_id
        assert d["doc_md"] and d["max_active_runs"] == 1, dag_id
        assert d["tasks"] and all(t["retries"] >= 1 for t in d["tasks"].values()), dag_id
    hourly = bag["dags"]["ccs_hourly"]["tasks"]
    assert hourly["rollout"]["upstream"] == ["export"] and hourly["export"]["upstream"] == ["infer"]
    assert hourly["infer"]["upstream"] == ["ingest"] and hourly["ingest"]["upstream"] == []
    train = bag["dags"]["ccs_train"]["tasks"]
    assert train["promote"]["upstream"] == ["gate_passed", "train"]
    assert train["handshake"]["upstream"] == ["training_set"]


def _ok(run):
    return run["state"].endswith("success") and all(v.endswith("success") for v in run["tasks"].values())


def test_train_dag_writes_training_set_groups_model_and_diagnostics(spark, main_job):
    from pyspark.sql import functions as F

    from ccselect.models import registry
    cfg, res, _ = main_job
    assert _ok(res["train"]), res["train"]
    window = "2026-11-01T00..2026-11-01T04"
    assert _delta(spark, cfg, "gold.training_set").where(F.col("window") == window).count() > 0
    assert _delta(spark, cfg, "gold.prefix_groups").count() > 0
    versions = registry.list_versions(cfg)
    assert len(versions) == 1 and versions[0]["gate"] == "passed" and "champion" in versions[0]["aliases"]
    assert _delta(spark, cfg, "gold.diagnostics").count() > 0


def test_hourly_dag_ingests_infers_exports_and_publishes(spark, main_job):
    from pyspark.sql import functions as F
    cfg, res, _ = main_job
    assert len(res["hourly"]) == 1 and _ok(res["hourly"][0]), res["hourly"]
    hour = F.col("hour") == "2026-11-01T05"
    n = _delta(spark, cfg, "silver.connections").where(hour).count()
    assert n > 0 and _delta(spark, cfg, "gold.predictions").where(hour).count() == n
    tables = _delta(spark, cfg, "gold.cc_tables").collect()
    assert len(tables) == 1
    # ccs_train's handshake tree ships inside the table (issue 27)
    with open(tables[0]["manifest_path"]) as fh:
        tree = json.load(fh)["tree"]
    assert tree["nodes"] >= 3 and tree["model"].startswith("ccs-nettype-handshake v"), tree
    store = cfg.settings.export.rollout.store
    assert any(f.startswith("table-") for f in os.listdir(store) if os.path.isfile(os.path.join(store, f))) or \
        any("table-" in f for _, _, files in os.walk(store) for f in files)


def test_autoplex_dag_writes_the_period_that_just_ended(spark, main_job):
    cfg, _, autoplex = main_job
    assert _ok(autoplex), autoplex
    periods = {r["period"] for r in _delta(spark, cfg, "gold.autoplex_params").select("period").distinct().collect()}
    assert periods == {"2026-11-01T03:00"}, periods


def test_each_job_writes_its_rows_and_duration(spark, main_job):
    """pipeline.metrics_dir (flows/job_metrics.py): every step the DAGs ran wrote its file, ok, with
    a duration; the rows are the lake's (hour 05's silver and predictions, the table's entries, the
    training set), and ingest's quarantined lines by reason code sum to its quarantined rows."""
    from pyspark.sql import functions as F

    from test_metrics_jobs import parse, promtool_check
    cfg, res, _ = main_job
    d = cfg.settings.pipeline.metrics_dir
    jobs = {"ingest", "infer", "export", "rollout", "training_set", "prefix_groups", "train", "promote",
            "handshake_tree", "distill", "autoplex"}
    assert {f"ccs-job-{j}.prom" for j in jobs} <= set(os.listdir(d)), sorted(os.listdir(d))
    m = {}
    for j in jobs:
        path = os.path.join(d, f"ccs-job-{j}.prom")
        promtool_check(path)
        m[j] = parse(open(path).read())
        assert m[j][("ccs_job_last_run_outcome", (("outcome", "ok"),))] == 1, (j, m[j])
        assert m[j][("ccs_job_duration_seconds", ())] > 0, j
    rows = {j: {k[1][0][1]: v for k, v in m[j].items() if k[0] == "ccs_job_rows"} for j in jobs}
    hour = F.col("hour") == "2026-11-01T05"
    silver = _delta(spark, cfg, "silver.connections").where(hour).count()
    assert rows["ingest"]["silver"] == silver > 0, rows["ingest"]
    assert rows["ingest"]["lines_read"] == rows["ingest"]["accepted"] + rows["ingest"]["quarantined"]
    assert sum(v for k, v in m["ingest"].items() if k[0] == "ccs_job_rows_quarantined") == rows["ingest"]["quarantined"]
    assert rows["infer"]["predictions"] == _delta(spark, cfg, "gold.predictions").where(hour).count() == silver
    table = _delta(spark, cfg, "gold.cc_tables").first()
    assert (rows["export"]["entries_v4"], rows["export"]["entries_v6"]) == (table["entries_v4"], table["entries_v6"])
    window = "2026-11-01T00..2026-11-01T04"
    assert rows["training_set"]["training"] == \
        _delta(spark, cfg, "gold.training_set").where(F.col("window") == window).count() > 0
    assert rows["autoplex"]["params"] == _delta(spark, cfg, "gold.autoplex_params").count() > 0


def test_main_job_reuses_the_fleet_and_lake_and_prints_its_summary(main_job):
    cfg, res, _ = main_job
    assert res["ok"] and {"fleet", "backfill"} <= set(res["reused"]), res["reused"]
    s = res["summary"]
    for what in ("per held-out node", "mean ", "worst ", "table           : v1 from model v1", "memory saving",
                 "flow tree      : ccs-nettype-handshake v1",
                 "rollout         : store", "make mlflow", "make airflow", "make notebooks"):
        assert what in s, f"{what!r} missing from the summary:\n{s}"
    if not res["probe"]:
        assert "not loaded into the kernel" in s


#: run in a kernel before each notebook: the previous notebook's names are gone (a notebook that
#: forgot an import or a definition fails as it would in a fresh kernel) and its figures closed
_FRESH_NAMESPACE = "%reset -f\nimport matplotlib.pyplot\nmatplotlib.pyplot.close('all')\n%reset -f"


@pytest.fixture(scope="module")
def notebook_kernel(main_job):
    """One Jupyter kernel (cwd the repository, CCS_CONFIG the main job's configuration) for the
    notebooks, which run in it one after the other: one Python start, one import of pandas,
    matplotlib and pyspark and one Spark session (app.notebook's) for all six instead of one each
    (issue 63). Each notebook starts from an empty namespace."""
    import contextlib

    import nbformat
    from nbclient import NotebookClient
    cfg, _, _ = main_job
    client = NotebookClient(nbformat.v4.new_notebook(), timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}})
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:   # the kernel inherits it at its start
            mp.setenv("CCS_CONFIG", str(cfg.path))
            stack.enter_context(client.setup_kernel())
        yield client


def _execute_in(client, nbk):
    """`nbk`'s cells in `client`'s running kernel after a fresh namespace; raises
    nbclient.exceptions.CellExecutionError (the cell and its traceback) on the first failing cell,
    as NotebookClient.execute does."""
    import nbformat
    client.nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(_FRESH_NAMESPACE)])
    client.execute_cell(client.nb.cells[0], 0)
    client.nb = nbk
    for index, cell in enumerate(nbk.cells):
        client.execute_cell(cell, index)


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb")))
def test_notebook_executes_and_writes_its_figures(main_job, notebook_kernel, name):
    import nbformat
    cfg, _, _ = main_job
    nbk = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    _execute_in(notebook_kernel, nbk)
    figs = os.path.join(cfg.data_root, "reports", "notebooks", name)
    pngs = [f for f in os.listdir(figs) if f.endswith(".png")]
    assert pngs, f"{name} wrote no figure"
    assert all(os.path.getsize(os.path.join(figs, f)) > 5000 for f in pngs), pngs
