"""Helpers shared by the tests (importable by name, unlike conftest.py)."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_config(root: Path, **overrides) -> Path:
    """A local configuration whose data root is `root` (so tests never touch ./var)."""
    raw = yaml.safe_load((REPO / "infra" / "conf" / "local.yaml").read_text())
    raw["data_root"] = str(root)
    raw["spark"]["conf"].update({"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
                                 "spark.driver.memory": "2g"})
    for k, v in overrides.items():
        raw[k] = v
    path = root / "ccs.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def raw_section(name: str) -> dict:
    """A section of infra/conf/local.yaml as written (`${data_root}` not yet resolved), to
    override a few keys of it in `write_config` without pinning paths to the project's var/."""
    return dict(yaml.safe_load((REPO / "infra" / "conf" / "local.yaml").read_text())[name])


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
