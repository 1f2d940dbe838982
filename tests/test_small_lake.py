"""The shared `small_lake` fixture holds what later stages build on, and its copy is independent."""
from __future__ import annotations

from ccs_testing import copy_lake


def test_small_lake_has_silver_stats_and_training_set(spark, small_lake, tmp_path):
    from ccselect.lake import table_path
    cfg = small_lake.cfg()
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    assert silver.count() == small_lake.ingest["silver_rows"] > 0
    assert small_lake.training_rows > 0
    assert len(small_lake.hours) == 6
    copy = copy_lake(small_lake, tmp_path / "copy")
    ccfg = copy.cfg()
    assert table_path(ccfg, "silver.connections") != table_path(cfg, "silver.connections")
    assert spark.read.format("delta").load(table_path(ccfg, "silver.connections")).count() == silver.count()
    ts = spark.read.format("delta").load(table_path(ccfg, "gold.training_set"))
    assert ts.count() == small_lake.training_rows
    labels = {r["label"] for r in ts.select("label").distinct().collect()}
    assert labels == {0, 1}
