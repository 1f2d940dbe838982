"""Helpers shared by the tests (importable by name, unlike conftest.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from ccselect.hours import Window

REPO = Path(__file__).resolve().parents[1]


def ccs_process(args: list[str], config, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`ccs <args>` as a process of its own (a kill or a crash stays out of the test's), on
    `config`; raises with the end of its stderr when it fails and `check`."""
    res = subprocess.run([sys.executable, "-m", "ccselect.app.cli", *args], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "CCS_CONFIG": str(config), **(env or {})}, timeout=900)
    if check and res.returncode:
        raise AssertionError(f"ccs {' '.join(args)} exited {res.returncode}:\n{res.stderr[-4000:]}")
    return res


def write_config(root: Path, **overrides) -> Path:
    """A local configuration whose data root is `root` (so tests never touch ./var)."""
    raw = yaml.safe_load((REPO / "infra" / "conf" / "local.yaml").read_text())
    raw["data_root"] = str(root)
    raw["spark"]["conf"].update({"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                 "spark.driver.memory": "4g"})
    for k, v in overrides.items():
        raw[k] = v
    # the tests train tiny models for the mechanics: exactly their epochs, not the shipped floor of
    # optimizer steps (tests/test_model_losses.py tests that floor)
    raw.setdefault("pipeline", {}).setdefault("min_steps", 0)
    path = root / "ccs.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def raw_section(name: str) -> dict:
    """A section of infra/conf/local.yaml as written (`${data_root}` not yet resolved), to
    override a few keys of it in `write_config` without pinning paths to the project's var/."""
    return dict(yaml.safe_load((REPO / "infra" / "conf" / "local.yaml").read_text())[name])


def write_cluster_config(root: Path, **overrides) -> Path:
    """infra/conf/cluster-local.yaml with its local folders under `root` (the topology's servers'
    data and logs, Airflow's home, the exported tables, the keys, the jobs' textfiles); its ports
    kept. `overrides` replace whole sections."""
    raw = yaml.safe_load((REPO / "infra" / "conf" / "cluster-local.yaml").read_text())
    raw["cluster"]["home"] = str(root / "cluster")
    raw["airflow"]["home"] = str(root / "cluster" / "airflow")
    raw["export"]["out"] = str(root / "export")
    raw["export"]["keys_dir"] = str(root / "keys")
    shipped = raw["pipeline"]["metrics_dir"]
    raw.update(overrides)
    if raw["pipeline"].get("metrics_dir") == shipped:   # a pipeline override copied from the file keeps it
        raw["pipeline"]["metrics_dir"] = str(root / "cluster" / "monitoring" / "textfile")
    path = root / "cluster-local.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def processes_naming(markers) -> list[str]:
    """Live processes (not this one) whose command line holds one of `markers`: what a test's
    servers, agents or jobs left behind."""
    import os
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmd for m in markers):
                out.append(f"{d}: {cmd[:200]}")
    return out


@dataclass(frozen=True)
class SmallLake:
    """What the `small_lake` fixture built (see tests/conftest.py)."""
    root: Path
    cfg_path: Path
    fleet_dir: str
    lo: str
    hi: str
    window: str
    hours: list
    stats_path: str
    ingest: dict
    training_rows: int

    def cfg(self):
        from ccselect.config import load_config
        return load_config(self.cfg_path)


def copy_lake(lake: SmallLake, dest: Path) -> SmallLake:
    """A writable copy of a `SmallLake` under `dest` (Delta logs hold relative paths, so a copied
    table is a valid table); the copy's configuration points at the copy."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("lake", "artifacts"):
        if (lake.root / name).exists():
            shutil.copytree(lake.root / name, dest / name)
    cfg_path = write_config(dest)
    stats_path = str(dest / Path(lake.stats_path).relative_to(lake.root))
    return replace(lake, root=dest, cfg_path=cfg_path, stats_path=stats_path)


def quick_champion(spark, cfg, lake: SmallLake) -> str:
    """Train a quick MLP on the lake's labelled rows, register it in `cfg`'s MLflow with its
    out-of-domain guard and temperature (models/ood.py) and promote it to @champion (the gate is
    not what the callers test: it is passed whatever this model scores); returns its version."""
    import pandas as pd

    from ccselect.features import scaling
    from ccselect.models import registry
    from ccselect.models.crossnode import per_node, summary
    from ccselect.models.dataset import load_labelled, to_train_data
    from ccselect.models.ood import fit_calibration, fit_guard
    from ccselect.models.train import TrainParams, fit
    stats = scaling.load(lake.stats_path)
    lab = load_labelled(spark, cfg, Window.hours(lake.lo, lake.hi), stats)
    data, _ = to_train_data(lab, pd.DataFrame(columns=["label", "prefix24", "group", "k"]))
    params = TrainParams(variant="mlp", epochs=8, seed=0, device="cpu")  # enough to leave both decisions
    trainer = fit(params, data)
    pn = per_node(lab.y, trainer.predict_proba(lab.x), lab.node)
    guard = fit_guard(lab.x, stats.features)
    calibration = fit_calibration(trainer.predict_proba(lab.x), lab.y)
    _, version = registry.log_training(cfg, params, trainer, stats, pn, summary(pn), window=lake.window,
                                       train_nodes=sorted(set(lab.node)), guard=guard, calibration=calibration)
    loose = type(cfg)(path=cfg.path, raw={**cfg.raw, "model": {**cfg.raw.get("model", {}), "gate": {
        "min_mean_accuracy": 0.0, "min_worst_accuracy": 0.0, "max_drop_vs_champion": 1.0}}})
    assert registry.gate(loose, version)["passed"]
    registry.promote(cfg, version)
    return version


def write_segments(src: str, dst: Path, nodes: list[str], hours: list[str], rotate_minutes: int = 1,
                   minutes: int = 60) -> list[Path]:
    """The hourly files of `nodes` and `hours` under `src` as the agent's segments under `dst`
    (sim.replay.write_all: minute by minute across streams, increasing modification times); only
    each hour's first `minutes`. Returns the segment paths in that order."""
    from ccselect.sim import replay
    return [Path(p) for p in replay.write_all(src, str(dst), hours, nodes, minutes, rotate_minutes)]
