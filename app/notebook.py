"""What the analysts' notebooks share: the configuration (CCS_CONFIG), one Spark session, Delta
tables as pandas frames (a missing table is None, so a notebook says "not built yet" instead of
failing), MLflow on the configured store, and where figures go
(<data_root>/reports/notebooks/<notebook>/)."""
from __future__ import annotations

import os
import re
from functools import lru_cache

import pandas as pd

from ccselect.config import Config, load_config
from ccselect.spark import get_spark
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


@lru_cache(maxsize=1)
def config() -> Config:
    return load_config()


@lru_cache(maxsize=1)
def spark():
    return get_spark(config(), "ccs-notebook")


def table(name: str, where: str | None = None, columns: list[str] | None = None,
          limit: int | None = None) -> pd.DataFrame | None:
    """A Delta table of the lake (`layer.table`) as pandas, or None when it does not exist yet."""
    from ccselect.delta_io import is_delta
    from ccselect.lake import table_path
    path = table_path(config(), name)
    if not is_delta(spark(), path):
        return None
    df = spark().read.format("delta").load(path)
    if where:
        df = df.where(where)
    if columns:
        df = df.select(*columns)
    if limit:
        df = df.limit(limit)
    return df.toPandas()


def sql(query: str) -> pd.DataFrame:
    """Spark SQL over the lake; refer to tables as {silver.connections} and the like."""

    from ccselect.lake import table_path
    q = re.sub(r"\{(\w+\.\w+)\}", lambda m: f"delta.`{table_path(config(), m.group(1))}`", query)
    return spark().sql(q).toPandas()


def mlflow_client():
    from ccselect.models.registry import configure
    return configure(config())


def figure_dir(notebook: str) -> str:
    d = os.path.join(config().data_root, "reports", "notebooks", notebook)
    os.makedirs(d, exist_ok=True)
    return d


def save(fig, notebook: str, name: str) -> str:
    """Save a matplotlib figure as PNG under the notebook's figure folder; returns the path."""
    path = os.path.join(figure_dir(notebook), name if name.endswith(".png") else name + ".png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path
