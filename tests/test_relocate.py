"""`ccs relocate --from OLD`: a registered model version (MLflow SQLite store, no training) and a
gold.cc_tables row under one data root; the root is moved; `models:/<name>@champion` no longer
loads; a dry run changes nothing; relocate rewrites the store (idempotent) and the champion loads
from the new place."""
from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pandas as pd
import pytest

from ccs_testing import write_config

pytestmark = pytest.mark.filterwarnings("ignore")


def _values_under(db: str, root: str) -> list[str]:
    con = sqlite3.connect(db)
    out = []
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        for col in [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]:
            out += [f"{t}.{col}" for (v,) in con.execute(f'SELECT "{col}" FROM "{t}"')
                    if isinstance(v, str) and (root + "/") in v]
    con.close()
    return out


def test_relocate_after_moving_the_data_root(tmp_path, spark):
    import mlflow.pytorch
    import torch
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    from ccselect.config import load_config
    from ccselect.contract import FEATURES
    from ccselect.lake import table_path
    from ccselect.features.scaling import FeatureStats
    from ccselect.models import registry
    from ccselect.models.nets import Classifier, Generator, NetTypeModel
    from ccselect.models.train import TrainParams

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    cfg = load_config(write_config(old))
    stats = FeatureStats(FEATURES, (0.0,) * 12, (1.0,) * 12, 10, "2026-11-01T00..2026-11-01T05")
    torch.manual_seed(0)
    model = NetTypeModel(Generator(12), Classifier()).eval()
    pn = pd.DataFrame({"node_id": ["n01"], "n": [10], "accuracy": [0.95]})
    _, version = registry.log_training(cfg, TrainParams(epochs=1), model, stats, pn,
                                       {"mean": 0.95, "worst": 0.95, "std": 0.0, "nodes": 1})
    assert registry.gate(cfg, version)["passed"] and registry.promote(cfg)["champion"] == version
    manifest = str(old / "artifacts" / "tables" / "table-7.manifest.json")
    spark.createDataFrame([(7, manifest)], "version bigint, manifest_path string") \
        .write.format("delta").save(table_path(cfg, "gold.cc_tables"))
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(8, 12)).astype(np.float32))
    with torch.no_grad():
        expected = model(x)

    shutil.move(str(old), str(new))
    cfg_path = write_config(new)
    moved = load_config(cfg_path)
    db = moved.settings.mlflow.tracking_uri[len("sqlite:///"):]
    assert _values_under(db, str(old)), "the store names the old root before relocating"
    with pytest.raises(Exception):
        registry.load_champion(moved)

    runner = CliRunner()
    args = ["relocate", "--from", str(old), "--json", "--config", str(cfg_path)]
    dry = json.loads(runner.invoke(app, args + ["--dry-run"]).stdout)
    assert dry["changed"] > 0 and dry["cc_tables"] == 1
    assert {"runs.artifact_uri", "model_versions.storage_location", "experiments.artifact_location"} <= set(dry["mlflow"])
    assert json.loads(runner.invoke(app, args + ["--dry-run"]).stdout) == dry, "a dry run changes nothing"

    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output + str(res.exception)
    done = json.loads(res.stdout)
    assert {k: v for k, v in done.items() if k != "dry_run"} == {k: v for k, v in dry.items() if k != "dry_run"}
    assert _values_under(db, str(old)) == []
    again = json.loads(runner.invoke(app, args).stdout)
    assert again["changed"] == 0 and again["mlflow"] == {} and again["cc_tables"] == 0

    champ = registry.load_champion(moved)
    assert champ.version == version and champ.stats == stats
    loaded = mlflow.pytorch.load_model(f"models:/{registry.model_name(moved)}@champion").eval()
    with torch.no_grad():
        torch.testing.assert_close(champ.model(x), expected)
        torch.testing.assert_close(loaded(x), expected)
    rows = spark.read.format("delta").load(table_path(moved, "gold.cc_tables")).collect()
    assert [r["manifest_path"] for r in rows] == [str(new / "artifacts" / "tables" / "table-7.manifest.json")]
    res = runner.invoke(app, ["relocate", "--from", str(new), "--config", str(cfg_path)])
    assert res.exit_code == 1 and "already" in res.output
