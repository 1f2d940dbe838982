"""`ccs audit` (jobs/audit.py, issue 61): clean on the small lake as ingested; on a copy with a
duplicate, orphans and a stray prediction planted, it names each of them and the command exits 1."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.sql import functions as F

from ccs_testing import copy_lake

pytestmark = pytest.mark.filterwarnings("ignore")


def _path(cfg, name):
    from ccselect.lake import table_path
    return table_path(cfg, name)


def _append(df, path):
    df.write.format("delta").mode("append").save(path)


def test_audit_names_planted_duplicates_and_orphans(spark, small_lake, tmp_path):
    # `ccs audit` itself, in this process (its session is this one: a JVM of its own would only add
    # a start-up; the CLI's exit code, lines and JSON are what is tested here): on the small lake
    # as ingested, then with --json on a copy with the faults planted
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    res = CliRunner().invoke(app, ["audit", "--config", str(small_lake.cfg_path)])
    assert res.exit_code == 0 and res.stdout.rstrip().endswith("audit: clean"), \
        "the small lake as ingested:\n" + res.output[-2000:] + repr(res.exception)

    lake = copy_lake(small_lake, tmp_path)
    cfg = lake.cfg()
    read = lambda name: spark.read.format("delta").load(_path(cfg, name))    # noqa: E731
    hour = lake.lo
    bronze = read("bronze.transport").where(F.col("hour") == hour)
    line = bronze.where("status = 'ok'").orderBy("source_file", "line_no").limit(1)
    dup_conn = line.first()["record"]["conn_id"]
    # the same record accepted again (a line past the file's end), silver's row of it twice,
    # a silver row no bronze line holds, a quarantine row of no bronze line
    _append(line.withColumn("line_no", F.lit(10 ** 6).cast("bigint")), _path(cfg, "bronze.transport"))
    silver = read("silver.connections").where(F.col("hour") == hour)
    _append(silver.where(F.col("conn_id") == dup_conn), _path(cfg, "silver.connections"))
    _append(silver.limit(1).withColumn("conn_id", F.lit("ghost")), _path(cfg, "silver.connections"))
    from ccselect.jobs.ingest import QUARANTINE_COLS
    q = line.withColumn("line_no", F.lit(10 ** 7).cast("bigint")).withColumn("reason", F.lit("bad_json")).select(*QUARANTINE_COLS)
    _append(q, _path(cfg, "bronze.quarantine"))
    # predictions of the hour: one silver row left unscored, one prediction of no connection
    keep = silver.where(F.col("conn_id") != dup_conn).select("conn_id", "node_id", "hour")
    missing = keep.orderBy("conn_id").first()["conn_id"]
    preds = keep.where(F.col("conn_id") != missing).unionByName(
        keep.limit(1).withColumn("conn_id", F.lit("stray")))
    preds.withColumn("cc", F.lit("bbr")).write.format("delta").partitionBy("node_id", "hour").save(_path(cfg, "gold.predictions"))

    out = CliRunner().invoke(app, ["audit", "--json", "--config", str(lake.cfg_path)])
    assert out.exit_code == 1, out.output[-2000:] + repr(out.exception)
    res = json.loads(out.stdout[out.stdout.index("{"):])
    assert not res["clean"]
    found = {(f["check"], f["table"], f["what"]): f for f in res["findings"]}
    text = "\n".join(res["lines"])

    def named(check, table, value):
        hits = [f for (c, t, _), f in found.items() if c == check and t == table and value in str(f["examples"])]
        assert hits, f"{check} {table} should name {value}:\n{text}"
        return hits[0]

    assert named("identity", "bronze.transport", dup_conn)["count"] == 1
    assert named("identity", "silver.connections", dup_conn)["count"] == 1
    assert named("traceable", "silver.connections", "ghost")["count"] == 1
    named("balance", "gold.ingest_audit", os.path.basename(line.first()["source_file"]))
    named("balance", "bronze.quarantine", str(10 ** 7))
    named("scored", "gold.predictions", "stray")
    named("scored", "gold.predictions", missing)
    assert {c for c, _, _ in found} == {"identity", "balance", "traceable", "scored"}
    assert "ghost" in text and dup_conn in text
