"""Helpers shared by the tests (importable by name, unlike conftest.py)."""
from __future__ import annotations

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
