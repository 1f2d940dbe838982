"""Where the Delta tables live, and reading and writing them by hour window.

Tables are `<lake.root>/<layer>/<table>`, one folder per layer (`bronze`, `silver`, `gold`),
addressed as `layer.table` everywhere in the code. Partition-keyed writes are in `delta_io`."""
from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.hours import Window

LAYERS = ("bronze", "silver", "gold")

# The lake's tables by name (issue 63: one constant each, the code never spells a name twice);
# what each holds is in docs/architecture.md ("The lake").


def bronze_table(stream: str) -> str:
    """A log stream's raw lines (`transport`, `access`, `qoe`: ccselect.contract.STREAMS)."""
    return f"bronze.{stream}"


BRONZE_TRANSPORT = bronze_table("transport")
BRONZE_ACCESS = bronze_table("access")
BRONZE_QOE = bronze_table("qoe")
#: every line a parse or check refused, with its reason
QUARANTINE = "bronze.quarantine"
#: one row per connection: features, outcomes, prefixes, labels where known
CONNECTIONS = "silver.connections"
#: per (node, hour): count, exact sum and exact sum of squares of each log1p(feature) over every
#: connection of silver.connections (labelled or not), kept by jobs/silver.py (features/node_stats.py)
NODE_STATS = "silver.node_stats"
#: per micro-batch or ingest run and unit read (a file, or a Kafka range): in = accepted + quarantined
INGEST_AUDIT = "gold.ingest_audit"
TRAINING_SET = "gold.training_set"
PREFIX_GROUPS = "gold.prefix_groups"
FEATURE_STATS = "gold.feature_stats"
MODEL_EVAL = "gold.model_eval"
MODEL_EVAL_SUMMARY = "gold.model_eval_summary"
DIAGNOSTICS = "gold.diagnostics"
PREDICTIONS = "gold.predictions"
AUTOPLEX_PARAMS = "gold.autoplex_params"
AUTOPLEX_SIMILARITY = "gold.autoplex_similarity"
CC_TABLES = "gold.cc_tables"
ROLLOUT_DECISIONS = "gold.rollout_decisions"
EMULATION = "gold.emulation"
EMULATION_CELLS = "gold.emulation_cells"
AB_TEST = "gold.ab_test"


def table_path(cfg: Config, name: str) -> str:
    layer, _, table = name.partition(".")
    if layer not in LAYERS or not table:
        raise ValueError(f"table name must be <layer>.<table> with layer in {LAYERS}: {name!r}")
    return os.path.join(cfg.settings.lake.root, layer, table)


def connections_in(spark: SparkSession, cfg: Config, window: Window) -> DataFrame:
    """silver.connections over the window's hours."""
    return (spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
            .where(F.col("hour").between(window.lo, window.hi)))


def write_window(spark: SparkSession, cfg: Config, df: DataFrame, table: str, window: str) -> int:
    """Replace the `window` partition of `table` with `df`; returns its row count."""
    path = table_path(cfg, table)
    delta_io.replace_partitions(df.withColumn("window", F.lit(window)), path, {(window,)}, ("window",))
    return spark.read.format("delta").load(path).where(F.col("window") == window).count()
