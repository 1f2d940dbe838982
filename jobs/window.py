"""Reading silver over an hour window and writing gold tables keyed by that window."""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ccselect.config import Config
from ccselect.lake import table_path
from jobs import delta_io


def connections_in(spark: SparkSession, cfg: Config, lo: str, hi: str) -> DataFrame:
    return (spark.read.format("delta").load(table_path(cfg, "silver.connections"))
            .where(F.col("hour").between(lo, hi)))


def write_window(spark: SparkSession, cfg: Config, df: DataFrame, table: str, window: str) -> int:
    """Replace the `window` partition of `table` with `df`; returns its row count."""
    path = table_path(cfg, table)
    delta_io.replace_partitions(df.withColumn("window", F.lit(window)), path, {(window,)}, ("window",))
    return spark.read.format("delta").load(path).where(F.col("window") == window).count()
