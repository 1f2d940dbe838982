"""Lake maintenance (issue 62): `ccs maintain` and the `ccs_maintain` DAG, as a user of Delta
expects it, beside the writers and out of their way.

For every Delta table of the lake (`<lake.root>/<layer>/<table>`):

1. **Retention as table properties**: `delta.deletedFileRetentionDuration` and
   `delta.logRetentionDuration` = `lake.retention_days` (the log at least as long as the files,
   so time travel within retention finds both); Delta deletes expired log files itself when it
   writes a checkpoint (`delta.enableExpiredLogCleanup`, on by default).
2. **Compaction** (`OPTIMIZE`, Delta's bin-packing: in each partition, files under the target
   size are rewritten into few large ones; a partition with one file is left alone) of the closed
   hours only: a table partitioned by `hour` is compacted where `hour` is older than the newest
   `lake.open_hours` hours present (the partition values in its Delta log), which the stream
   still appends to. OPTIMIZE commits a rewrite with `dataChange = false`: the rows are the
   same, so readers, the stream's checkpoints and `ccs audit` see the same table. A partition a
   backfill replaces while it is being compacted makes one of the two lose Delta's commit race;
   each retries (`delta_io.retry_conflicts`), so neither loses nor duplicates a row.
3. **VACUUM** with the same retention: files the table stopped referencing more than
   `retention_days` ago are deleted; every version within retention still reads. Delta refuses a
   retention under 7 days unless its check is switched off; under 1 hour is refused here: a
   concurrent writer's files are not in the log until it commits, and VACUUM would take them for
   orphans.

Idempotent: a second run finds nothing to compact and nothing to delete.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.lake import LAYERS, table_path
# Imported inside the functions that use them (heavy, not needed to import this module): delta.

#: VACUUM under this many hours could delete a concurrent writer's uncommitted files
MIN_RETENTION_HOURS = 1.0
#: Delta's own floor for VACUUM's retention without switching its check off (7 days)
DELTA_CHECK_HOURS = 168.0


def tables(cfg: Config) -> list[str]:
    """Every Delta table of the lake, as `layer.table`, sorted."""
    root = cfg.settings.lake.root
    out = []
    for layer in LAYERS:
        d = os.path.join(root, layer)
        if not os.path.isdir(d):
            continue
        out += [f"{layer}.{t}" for t in sorted(os.listdir(d)) if os.path.isdir(os.path.join(d, t, "_delta_log"))]
    return out


def _interval(hours: float) -> str:
    return f"interval {max(int(round(hours * 60)), 1)} minutes"


def _detail(spark: SparkSession, path: str) -> dict[str, Any]:
    from delta.tables import DeltaTable
    r = DeltaTable.forPath(spark, path).detail().first()
    return {"files": int(r["numFiles"]), "bytes": int(r["sizeInBytes"]), "partition_by": list(r["partitionColumns"])}


def _hours(spark: SparkSession, path: str) -> list[str]:
    """The `hour` partition values of the table's live files, sorted: the partitionValues of the
    add actions of its Delta log's latest snapshot (the log only, no data file is read; a
    distinct scan of `hour` read every file's column). Through delta-spark's DeltaLog, which
    its Python API does not wrap; `SHOW PARTITIONS` on a Delta table scans the data too."""
    from delta.tables import DeltaTable
    none = spark.sparkContext._jvm.scala.Option.empty()
    snapshot = DeltaTable.forPath(spark, path)._jdt.deltaLog().update(False, none, none)
    adds = DataFrame(snapshot.allFiles().toDF(), spark)
    return sorted(r[0] for r in adds.select(F.col("partitionValues")["hour"]).distinct().collect() if r[0] is not None)


def maintain_table(spark: SparkSession, cfg: Config, name: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Retention properties, compaction of closed hours and VACUUM of one table; → what it did."""
    from delta.tables import DeltaTable

    lake = cfg.settings.lake
    hours = lake.retention_days * 24
    if hours < MIN_RETENTION_HOURS:
        raise ValueError(f"lake.retention_days {lake.retention_days} is under {MIN_RETENTION_HOURS} hour: VACUUM "
                         "could delete a concurrent writer's files before it commits")
    path = table_path(cfg, name)
    delta_io.tune(spark)
    t0 = time.perf_counter()
    before = _detail(spark, path)
    delta_io.retry_conflicts(lambda: delta_io.ensure_properties(
        spark, path, {"delta.deletedFileRetentionDuration": _interval(hours), "delta.logRetentionDuration": _interval(hours)}),
        f"retention properties of {name}", log=log)
    where = None
    if "hour" in before["partition_by"]:
        present = _hours(spark, path)
        closed = present[:-lake.open_hours] if lake.open_hours else present
        if not closed:
            return {"table": name, **{f"{k}_before": v for k, v in before.items() if k != "partition_by"},
                    "compacted": "no closed hour", "vacuumed_files": 0, "seconds": round(time.perf_counter() - t0, 2)}
        where = f"hour <= '{closed[-1]}'"

    def compact():
        dt = DeltaTable.forPath(spark, path).optimize()
        return (dt.where(where) if where else dt).executeCompaction()
    metrics = delta_io.retry_conflicts(compact, f"compact {name}", log=log).first()["metrics"]
    if hours < DELTA_CHECK_HOURS:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    n_before_vacuum = _referenced_and_orphans(path)
    DeltaTable.forPath(spark, path).vacuum(hours)
    after = _detail(spark, path)
    out = {"table": name, "files_before": before["files"], "files_after": after["files"],
           "bytes_before": before["bytes"], "bytes_after": after["bytes"],
           "compacted": {"files_removed": int(metrics["numFilesRemoved"]), "files_added": int(metrics["numFilesAdded"]),
                         "where": where},
           "vacuumed_files": max(n_before_vacuum - _referenced_and_orphans(path), 0),
           "seconds": round(time.perf_counter() - t0, 2)}
    log(f"maintain {name}: {out['files_before']} → {out['files_after']} files "
        f"(compacted {out['compacted']['files_removed']} into {out['compacted']['files_added']}"
        + (f" where {where}" if where else "") + f"), vacuumed {out['vacuumed_files']} files")
    return out


def _referenced_and_orphans(path: str) -> int:
    """Data files on disk under the table's folder (Parquet), referenced or not."""
    n = 0
    for d, dirs, files in os.walk(path):
        if "_delta_log" in d.split(os.sep):
            continue
        n += sum(1 for f in files if f.endswith(".parquet"))
    return n


def run(spark: SparkSession, cfg: Config, names: list[str] | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Maintain `names` (default: every table of the lake); → per-table results and totals."""
    chosen = names or tables(cfg)
    unknown = sorted(set(chosen) - set(tables(cfg)))
    if unknown:
        raise ValueError(f"not a Delta table of the lake: {', '.join(unknown)}")
    results = [maintain_table(spark, cfg, n, log) for n in chosen]
    return {"tables": results, "retention_days": cfg.settings.lake.retention_days,
            "files_before": sum(r.get("files_before", 0) for r in results),
            "files_after": sum(r.get("files_after", r.get("files_before", 0)) for r in results),
            "vacuumed_files": sum(r["vacuumed_files"] for r in results)}
