"""Where the main job and the evaluation commands leave their result as JSON
(`<data_root>/results/<name>.json`), for `bench/report.py` to render into docs/results/."""
from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone

from ccselect.config import Config


def save(cfg: Config, name: str, result: dict) -> str:
    """Write `result` with when and where it was measured; returns the path."""
    path = os.path.join(cfg.data_root, "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()}, {os.cpu_count()} cores",
           "load_avg": [round(x, 2) for x in os.getloadavg()],
           "config": str(cfg.path), **result}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=False, default=str)
    os.replace(tmp, path)
    return path
