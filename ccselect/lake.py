"""Where the Delta tables live, and reading and writing them by hour window.

Tables are `<lake.root>/<layer>/<table>`, one folder per layer (`bronze`, `silver`, `gold`),
addressed as `layer.table` everywhere in the code. Partition-keyed writes are in `delta_io`."""
from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config

LAYERS = ("bronze", "silver", "gold")
#: per (node, hour): count, exact sum and exact sum of squares of each log1p(feature) over every
#: connection of silver.connections (labelled or not), kept by jobs/silver.py (features/node_stats.py)
NODE_STATS = "silver.node_stats"


def table_path(cfg: Config, name: str) -> str:
    layer, _, table = name.partition(".")
    if layer not in LAYERS or not table:
        raise ValueError(f"table name must be <layer>.<table> with layer in {LAYERS}: {name!r}")
    return os.path.join(cfg.settings.lake.root, layer, table)


def connections_in(spark: SparkSession, cfg: Config, lo: str, hi: str) -> DataFrame:
    """silver.connections over the hours [lo, hi]."""
    return (spark.read.format("delta").load(table_path(cfg, "silver.connections"))
            .where(F.col("hour").between(lo, hi)))


def write_window(spark: SparkSession, cfg: Config, df: DataFrame, table: str, window: str) -> int:
    """Replace the `window` partition of `table` with `df`; returns its row count."""
    path = table_path(cfg, table)
    delta_io.replace_partitions(df.withColumn("window", F.lit(window)), path, {(window,)}, ("window",))
    return spark.read.format("delta").load(path).where(F.col("window") == window).count()
