"""Lake maintenance (jobs/maintain.py, issue 62) beside a backfill: compaction of the closed hours
loses and duplicates nothing while `ccs ingest` replaces an hour at the same time, `ccs audit`
stays clean, the stream's open hours are left alone, time travel within retention still reads,
and a second run has nothing to do."""
from __future__ import annotations

import threading

from pyspark.testing import assertDataFrameEqual

from ccs_testing import copy_lake
from ccselect import delta_io
from ccselect.config import load_config
from ccselect.hours import Window
from ccselect.lake import table_path
from ccselect.jobs import audit, ingest, maintain


def _files(spark, path, hour):
    return spark.read.format("delta").load(path).where(f"hour = '{hour}'").select("_metadata.file_path").distinct().count()


def test_maintain_beside_a_backfill_loses_and_duplicates_nothing(spark, small_lake, tmp_path):
    lake = copy_lake(small_lake, tmp_path / "lake")
    cfg = load_config(lake.cfg_path)
    silver = table_path(cfg, "silver.connections")
    first, open_hour = lake.hours[0], lake.hours[-1]
    # as a stream's micro-batches leave them: every hour's partitions in several small files
    rows = spark.read.format("delta").load(silver)
    keys = {(r["node_id"], r["hour"]) for r in rows.select("node_id", "hour").distinct().collect()}
    delta_io.replace_partitions(rows.repartition(6), silver, keys)
    before = spark.read.format("delta").load(silver)
    version_before = delta_io_version(spark, silver)
    expected = before.toPandas()
    assert _files(spark, silver, first) > 8 and _files(spark, silver, open_hour) > 8

    errors, result = [], {}

    def backfill():
        try:
            ingest.run(spark, cfg, lake.fleet_dir, Window.hours(lake.hours[1]))
        except Exception as e:     # the assertion below names it
            errors.append(e)
    t = threading.Thread(target=backfill)
    t.start()
    result.update(maintain.run(spark, cfg, ["silver.connections", "bronze.transport"], log=lambda m: None))
    t.join()
    assert not errors, errors

    after = spark.read.format("delta").load(silver)
    assertDataFrameEqual(after, spark.createDataFrame(expected, after.schema))
    assert after.select("node_id", "conn_id").distinct().count() == after.count()
    # the closed hours compacted (one file per node-hour), the open hours left to the stream
    n_nodes = after.where(f"hour = '{first}'").select("node_id").distinct().count()
    assert _files(spark, silver, first) == n_nodes
    assert _files(spark, silver, open_hour) > 8
    silver_res = next(r for r in result["tables"] if r["table"] == "silver.connections")
    assert silver_res["compacted"]["files_removed"] > silver_res["compacted"]["files_added"] > 0
    assert silver_res["compacted"]["where"] == f"hour <= '{lake.hours[-1 - cfg.settings.lake.open_hours]}'"
    # time travel within retention: the version before compaction reads, the same rows
    old = spark.read.format("delta").option("versionAsOf", version_before).load(silver)
    assertDataFrameEqual(old, spark.createDataFrame(expected, old.schema))
    props = delta_io._properties(spark, silver)
    assert props["delta.deletedFileRetentionDuration"] == props["delta.logRetentionDuration"] == "interval 10080 minutes"
    assert result["vacuumed_files"] == 0, "nothing was removed longer ago than the retention"
    assert audit.run(spark, cfg)["clean"]
    # a second run: nothing left to compact in the closed hours
    again = maintain.run(spark, cfg, ["silver.connections"], log=lambda m: None)
    assert again["tables"][0]["compacted"]["files_removed"] == 0


def delta_io_version(spark, path) -> int:
    from delta.tables import DeltaTable
    return int(DeltaTable.forPath(spark, path).history(1).first()["version"])
