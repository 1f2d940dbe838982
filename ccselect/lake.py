"""Where the Delta tables live: `<lake.root>/<layer>/<table>`, one folder per layer
(`bronze`, `silver`, `gold`), addressed as `layer.table` everywhere in the code."""
from __future__ import annotations

import os

from ccselect.config import Config

LAYERS = ("bronze", "silver", "gold")


def table_path(cfg: Config, name: str) -> str:
    layer, _, table = name.partition(".")
    if layer not in LAYERS or not table:
        raise ValueError(f"table name must be <layer>.<table> with layer in {LAYERS}: {name!r}")
    return os.path.join(cfg.get("lake.root"), layer, table)
