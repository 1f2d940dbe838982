"""Delta writes keyed by partition, so that every load is safe to repeat (never a blind append).

`replace_partitions` overwrites exactly the (node_id, hour) partitions named — also those that
now have no rows — in one Delta commit: a writer killed before the commit leaves the table as it
was (its half-written files are not referenced by the log), and a re-run replaces the same keys.
A new table is first created empty with its CHECK constraints, so that adding them never scans
data (Delta validates every later write against them as it is written).
"""
from __future__ import annotations

from typing import Iterable

from pyspark.sql import DataFrame, SparkSession

PARTITION_COLS = ("node_id", "hour")


def _quote(v: str) -> str:
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def partition_predicate(keys: Iterable[tuple[str, ...]], cols: tuple[str, ...] = PARTITION_COLS) -> str:
    keys = sorted(set(keys))
    if not keys:
        raise ValueError("no partitions to replace")
    return " OR ".join("(" + " AND ".join(f"{c} = {_quote(v)}" for c, v in zip(cols, k)) + ")" for k in keys)


def tune(spark: SparkSession) -> None:
    """Delta rebuilds a table's state with 50 partitions by default: on a few local cores that
    costs seconds per commit, so follow the session's shuffle partitions instead."""
    if spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is None:
        spark.conf.set("spark.databricks.delta.snapshotPartitions", spark.conf.get("spark.sql.shuffle.partitions"))


def is_delta(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable
    tune(spark)
    return DeltaTable.isDeltaTable(spark, path)


def replace_partitions(df: DataFrame, path: str, keys: Iterable[tuple[str, ...]],
                       cols: tuple[str, ...] = PARTITION_COLS, constraints: dict[str, str] | None = None,
                       add_columns: bool = False) -> None:
    """Overwrite the partitions `keys` (tuples over `cols`) of the Delta table at `path` with `df`,
    in one commit; `constraints` (name → CHECK expression) are added first where missing. With
    `add_columns`, columns `df` has and the table lacks are added (older rows read them as null)."""
    pred = partition_predicate(keys, cols)
    spark = df.sparkSession
    if not is_delta(spark, path):
        df.limit(0).write.format("delta").partitionBy(*cols).mode("overwrite").save(path)
    if constraints:
        ensure_constraints(spark, path, constraints)
    w = df.write.format("delta").partitionBy(*cols).mode("overwrite").option("replaceWhere", pred)
    if add_columns:
        w = w.option("mergeSchema", "true")
    w.save(path)


def overwrite(df: DataFrame, path: str, partition_cols: tuple[str, ...] = ()) -> None:
    w = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if partition_cols:
        w = w.partitionBy(*partition_cols)
    w.save(path)


def ensure_constraints(spark: SparkSession, path: str, constraints: dict[str, str]) -> None:
    """Add the named Delta CHECK constraints the table does not have yet."""
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    for name, expr in constraints.items():
        if f"delta.constraints.{name.lower()}" not in props:
            spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT {name} CHECK ({expr})")
