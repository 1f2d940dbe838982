"""Configuration loading, the Spark factory and the CLI's help."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from ccs_testing import REPO, write_config
from ccselect.config import load_config
from ccselect.lake import table_path


def test_local_config_resolves_paths_under_the_project(monkeypatch):
    monkeypatch.delenv("CCS_CONFIG", raising=False)
    monkeypatch.delenv("CCS_DATA_ROOT", raising=False)
    cfg = load_config()
    assert cfg.env == "local"
    assert cfg.data_root == str(REPO / "var")
    assert cfg.settings.lake.root == str(REPO / "var" / "lake")
    assert cfg.settings.mlflow.tracking_uri == f"sqlite:///{REPO / 'var' / 'mlflow' / 'mlflow.db'}"
    assert cfg.settings.spark.master == "local[*]"


def test_cluster_config_has_the_same_keys():
    local = yaml.safe_load((REPO / "infra/conf/local.yaml").read_text())
    cluster = yaml.safe_load((REPO / "infra/conf/cluster.yaml").read_text())

    def keys(d, pre=""):
        return {pre + k for k, v in d.items()} | {x for k, v in d.items() if isinstance(v, dict) and k != "conf"
                                                  for x in keys(v, pre + k + ".")}
    # a deployment adds only where its servers are (the object store, the tracking server's and
    # Airflow's databases, the API server, the textfile folder its node_exporter serves) and what
    # `ccs cluster up` starts on one machine
    deployment = {"object_store", "object_store.endpoint", "cluster", "cluster.home", "cluster.buckets",
                  "cluster.prometheus", "cluster.alertmanager", "cluster.platform_exporter",
                  "mlflow.backend_store_uri", "airflow.sql_alchemy_conn", "airflow.api_url",
                  "pipeline.metrics_dir"}
    # and what only the one-machine default needs: its fleet's two agents have no clients, so the
    # health check's rate windows are shortened there (infra/conf/local.yaml); a deployment keeps
    # the class's default, which a shipped file does not repeat (tests/test_settings.py)
    one_machine_only = {"export.rollout.health_wait_s"}
    assert keys(cluster) - keys(local) == deployment and keys(local) - one_machine_only <= keys(cluster)
    one_machine = yaml.safe_load((REPO / "infra/conf/cluster-local.yaml").read_text())
    assert keys(one_machine) == keys(cluster), "the one-machine topology shares the cluster's keys"
    cfg = load_config(REPO / "infra/conf/cluster.yaml")
    assert cfg.settings.lake.root == "s3a://ccselect-lake/lake", "remote paths stay untouched"
    from ccselect.topology.monitoring import platform_textfile_dir
    for f in ("cluster.yaml", "cluster-local.yaml"):
        c = load_config(REPO / "infra/conf" / f)
        assert c.settings.pipeline.metrics_dir == str(platform_textfile_dir(c)), \
            f"{f}: the jobs' textfiles where the platform exporter serves them"


def test_env_and_overrides(tmp_path, monkeypatch):
    path = write_config(tmp_path)
    monkeypatch.setenv("CCS_CONFIG", str(path))
    assert load_config().data_root == str(tmp_path)
    monkeypatch.setenv("CCS_DATA_ROOT", str(tmp_path / "elsewhere"))
    assert load_config().settings.lake.root == str(tmp_path / "elsewhere" / "lake")


def test_bad_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("env: local\n")
    with pytest.raises(ValueError, match="data_root"):
        load_config(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("data_root: /tmp\nlake: {root: '${nope}/x'}\n")
    with pytest.raises(KeyError, match="nope"):
        load_config(tmp_path / "y.yaml")
    (tmp_path / "z.yaml").write_text("data_root: /tmp\npipeline: {deploy: true}\nlake: {}\npipeline: {deploy: false}\n")
    with pytest.raises(ValueError, match="duplicate key 'pipeline'"):
        load_config(tmp_path / "z.yaml")


def test_table_paths(cfg):
    assert table_path(cfg, "silver.connections").endswith("/lake/silver/connections")
    with pytest.raises(ValueError):
        table_path(cfg, "connections")
    with pytest.raises(ValueError):
        table_path(cfg, "platinum.x")


def test_spark_session_has_delta(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual
    df = spark.createDataFrame([(1, "a"), (2, None)], "id int, s string")
    df.write.format("delta").save(str(tmp_path / "t"))
    assertDataFrameEqual(spark.read.format("delta").load(str(tmp_path / "t")), df)
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_every_command_has_help():
    """`ccs --help` as a process (the entry point), then every command's help through Click in
    this process (the same parsing and rendering, without a Python start per command)."""
    from typer.main import get_command
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    res = subprocess.run([sys.executable, "-m", "ccselect.app.cli", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "Usage" in res.stdout, f"ccs --help failed: {res.stderr[-400:]}"
    names = sorted(get_command(app).commands)
    assert "simulate" in names and "run" in names
    assert not (unlisted := [n for n in names if n not in res.stdout]), f"not listed by ccs --help: {unlisted}"
    runner = CliRunner()
    for name in names:
        out = runner.invoke(app, [name, "--help"], prog_name="ccs")
        assert out.exit_code == 0 and "Usage" in out.output, f"ccs {name} --help failed: {out.output[-400:]}"
        assert f"ccs {name}" in out.output, out.output[:200]


def test_simulate_command_end_to_end(tmp_path):
    res = subprocess.run([sys.executable, "-m", "ccselect.app.cli", "simulate", "--out", str(tmp_path / "o"),
                          "--nodes", "2", "--hours", "1", "--conns-per-node-hour", "100", "--seed", "1",
                          "--workers", "1", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-800:]
    import json
    m = json.loads(res.stdout)
    assert m["counts"]["transport"] > 0 and len(m["nodes"]) == 2


def test_run_reuses_an_unchanged_fleet(tmp_path, capsys):
    """`ccs run`'s first step: the simulated fleet is reused when its parameters and the simulator
    are unchanged, and simulated again when a parameter changes."""
    from ccselect.flows.main_job import fleet
    sim = {"out": str(tmp_path / "raw"), "nodes": 2, "hours": 2, "start": "2026-11-01T00:00:00", "seed": 1,
           "conns_per_node_hour": 100}
    cfg = load_config(write_config(tmp_path, simulate=sim))
    first, reused_first = fleet(cfg)
    second, reused_second = fleet(cfg)
    assert not reused_first and reused_second and second == json.loads(json.dumps(first, default=str))
    assert "reusing the simulated fleet" in capsys.readouterr().out
    changed = load_config(write_config(tmp_path, simulate={**sim, "seed": 2}))
    third, reused_third = fleet(changed)
    assert not reused_third and third["params"]["seed"] == 2
