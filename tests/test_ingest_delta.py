"""Ingest end to end on a tiny fleet with injected bad lines: Delta tables, quarantine reasons,
balanced audit, silver one row per connection, idempotent re-runs, and kill -9 mid-write (of
bronze, then of silver)."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.config import load_config
from ccselect.lake import table_path
from ccselect.jobs.ingest import BRONZE_DICTIONARY_COLUMNS
from ccselect.jobs.silver import DICTIONARY_COLUMNS, SILVER_TASKS_PER_CORE, silver_tasks
from tests.ccs_testing import REPO, write_config

TABLES = ("bronze.transport", "bronze.access", "bronze.qoe", "bronze.quarantine", "gold.ingest_audit",
          "silver.connections")
BAD_TRANSPORT = ['{"conn_id": "x1", "node_id"', "\x07\x00 binary", '{"conn_id": 5}']
NGINX_LINE = "{ms}.250 {node} 10.9.8.7 41000 200 4096 0.020 video 4g 30000 2000 12 65483"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = str(tmp_path_factory.mktemp("tinyfleet"))
    simulate(SimParams(nodes=2, hours=2, conns_per_node_hour=40, seed=5), out, workers=1, progress=False)
    tfile = sorted(glob.glob(f"{out}/transport/*/*.jsonl"))[0]
    with open(tfile, "a") as fh:
        first = open(tfile).readline()
        fh.write("\n".join(BAD_TRANSPORT + [first.rstrip("\n")]) + "\n")  # the last one is a duplicate
    afile = sorted(glob.glob(f"{out}/access/*/*.jsonl"))[0]
    node, hour = afile.split("/")[-2], afile.split("/")[-1][:13]
    from ccselect.hours import hour_start_ms
    with open(afile, "a") as fh:
        fh.write(NGINX_LINE.format(ms=hour_start_ms(hour) // 1000 + 7, node=node) + "\n")
    return out, tfile, afile


def snapshot(spark, cfg, table):
    df = spark.read.format("delta").load(table_path(cfg, table))
    return df.drop("ingest_time") if "ingest_time" in df.columns else df


@pytest.fixture(scope="module")
def ingested(spark, fleet, tmp_path_factory):
    from ccselect.jobs import ingest
    root = tmp_path_factory.mktemp("lake")
    cfg = load_config(write_config(root))
    result = ingest.run(spark, cfg, fleet[0])
    return cfg, result


def file_lines(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read().rstrip("\n").split("\n")


def test_audit_counts_every_line_and_balances(spark, fleet, ingested):
    cfg, _ = ingested
    audit = spark.read.format("delta").load(table_path(cfg, "gold.ingest_audit"))
    got = audit.select("source_file", "lines_read", "accepted", "quarantined",
                       F.aggregate(F.map_values("quarantined_by_reason"), F.lit(0).cast("bigint"),
                                   lambda a, x: a + x).alias("by_reason_total"))
    out, tfile, _ = fleet
    want = []
    for path in sorted(glob.glob(f"{out}/*/*/*.jsonl")):
        if "/reference/" in path or "/_" in path:
            continue
        n = len(file_lines(path))
        q = len(BAD_TRANSPORT) + 1 if path == tfile else 0
        want.append((path, n, n - q, q, q))
    assertDataFrameEqual(got, spark.createDataFrame(
        want, "source_file string, lines_read bigint, accepted bigint, quarantined bigint, by_reason_total bigint"))
    # the three streams' rows of a node-hour share one file (jobs/ingest.ingest_bronze)
    files = audit.select("node_id", "hour", F.col("_metadata.file_path").alias("f")).distinct()
    assert files.count() == files.select("node_id", "hour").distinct().count()


def test_quarantine_holds_each_bad_line_with_its_reason(spark, fleet, ingested):
    cfg, _ = ingested
    out, tfile, _ = fleet
    n = len(file_lines(tfile))
    q = spark.read.format("delta").load(table_path(cfg, "bronze.quarantine")).select("stream", "source_file", "line_no", "reason")
    want = [("transport", tfile, n - 3, "bad_json"), ("transport", tfile, n - 2, "bad_json"),
            ("transport", tfile, n - 1, "wrong_type:conn_id"), ("transport", tfile, n, "duplicate_conn_id")]
    assertDataFrameEqual(q, spark.createDataFrame(want, "stream string, source_file string, line_no bigint, reason string"))


def test_silver_one_row_per_connection_with_labels(spark, fleet, ingested):
    cfg, _ = ingested
    out = fleet[0]
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    # Expected from the files themselves, in plain Python.
    label = {}
    for path in glob.glob(f"{out}/access/*/*.jsonl"):
        for line in file_lines(path):
            if line.startswith("{"):
                r = json.loads(line)
                label.setdefault((r["node_id"], r["conn_id"]), set()).add(r.get("net_type"))
    want = []
    for path in glob.glob(f"{out}/transport/*/*.jsonl"):
        seen = set()
        for line in file_lines(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if not isinstance(r.get("conn_id"), str) or r["conn_id"] in seen:
                continue
            seen.add(r["conn_id"])
            nts = label.get((r["node_id"], r["conn_id"]), set()) - {None}
            nt = nts.pop() if len(nts) == 1 else None
            want.append((r["node_id"], r["conn_id"], nt, {"wifi": 1, "4g": 0, "5g": 0}.get(nt)))
    got = silver.select("node_id", "conn_id", "net_type", "label")
    assertDataFrameEqual(got, spark.createDataFrame(want, "node_id string, conn_id string, net_type string, label int"))
    props = {r["key"]: r["value"] for r in
             spark.sql(f"SHOW TBLPROPERTIES delta.`{table_path(cfg, 'silver.connections')}`").collect()}
    constraints = [k for k in props if k.startswith("delta.constraints.")]
    assert len(constraints) == 4, constraints
    # statistics only for the columns a query may skip files by (jobs/silver.py SILVER_PROPERTIES)
    assert props["delta.dataSkippingStatsColumns"] == "conn_id,ts_start_ms,ts_end_ms"


def test_silver_tasks_and_one_file_per_partition(spark, ingested):
    """jobs/silver.silver_tasks: 8 tasks per unit of the default parallelism, never more than the
    keys; whatever the tasks, every (node, hour) of silver is one data file."""
    cfg, _ = ingested
    most = SILVER_TASKS_PER_CORE * spark.sparkContext.defaultParallelism
    assert [silver_tasks(spark, n) for n in (0, 1, 3, most, most + 1, 10_000)] == [1, 1, 3, most, most, most]
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    keys = {(r["node_id"], r["hour"]) for r in silver.select("node_id", "hour").distinct().collect()}
    files = silver.inputFiles()
    assert len(keys) == 4 and len(files) == len(keys), files
    assert {tuple(part.split("=", 1)[1] for part in f.split("/")[-3:-1]) for f in files} == keys


def test_silver_parquet_dictionaries_only_for_repeated_values(ingested):
    """jobs/silver.silver_parquet: a measurement column is written plain, a repeated one with its
    dictionary, and no column carries Parquet min/max statistics; bronze has no statistics and
    dictionaries only for the columns a file repeats (jobs/ingest.BRONZE_PARQUET)."""
    cfg, _ = ingested

    def chunks(table):
        files = glob.glob(os.path.join(table_path(cfg, table), "**", "*.parquet"), recursive=True)
        assert files, table
        for f in files:
            meta = pq.ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                for i in range(meta.num_columns):
                    yield meta.row_group(g).column(i)

    def dictionary(col):
        return any("DICTIONARY" in e for e in col.encodings)

    seen = set()
    for col in chunks("silver.connections"):
        name = col.path_in_schema.split(".")[0]
        seen.add(name)
        assert not (col.is_stats_set and col.statistics.has_min_max), name
        if name in ("conn_id", "ts_end_ms", "min_rtt_us", "goodput_bps"):
            assert not dictionary(col), name
        if name in ("cc", "decision", "ug_id"):
            assert name in DICTIONARY_COLUMNS and dictionary(col), name
    assert {"conn_id", "cc", "goodput_bps"} <= seen
    for col in chunks("bronze.transport"):
        name = col.path_in_schema
        assert not (col.is_stats_set and col.statistics.has_min_max), name
        if name != "reason":       # (null on every accepted line: a chunk of nulls has no dictionary)
            assert dictionary(col) == (name in BRONZE_DICTIONARY_COLUMNS), name


def test_reingest_leaves_every_table_unchanged(spark, fleet, ingested):
    from ccselect.jobs import ingest
    cfg, _ = ingested
    before = {t: snapshot(spark, cfg, t).collect() for t in TABLES}
    ingest.run(spark, cfg, fleet[0])
    for t in TABLES:
        after = snapshot(spark, cfg, t)
        assertDataFrameEqual(after, spark.createDataFrame(before[t], after.schema))


def _run_and_kill_when(cmd, env, pattern, committed) -> bool:
    """Start the ingest CLI (its own Spark driver) and SIGKILL its process group as soon as a data
    file matching `pattern` exists; True when it was killed before `committed()` held."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 1200   # generous: on a loaded 2-core machine a run takes minutes
    killed = False
    while time.time() < deadline and proc.poll() is None:
        if glob.glob(pattern, recursive=True):
            os.killpg(proc.pid, signal.SIGKILL)   # the python driver and its JVM
            killed = True
            break
        time.sleep(0.01)
    if proc.poll() is None and not killed:      # never got there in time: do not leave it running
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return killed and not committed()


def _has_rows(spark, path) -> bool:
    return os.path.isdir(os.path.join(path, "_delta_log")) and spark.read.format("delta").load(path).limit(1).count() > 0


def test_kill_minus_9_mid_write_then_rerun_is_consistent(spark, fleet, ingested, tmp_path):
    """The writer is killed with SIGKILL while bronze files are being written; the re-run is killed
    while silver.connections files are being written (bronze, quarantine and audit committed);
    a last run must leave exactly the tables of a clean run."""
    out = fleet[0]
    cfg_path = write_config(tmp_path)
    cfg = load_config(cfg_path)
    cmd = [sys.executable, "-m", "ccselect.app.cli", "ingest", "--input", out, "--config", str(cfg_path)]
    env = {**os.environ, "CCS_HOME": str(REPO)}
    lake = cfg.settings.lake.root
    silver_path = table_path(cfg, "silver.connections")
    assert _run_and_kill_when(cmd, env, f"{lake}/bronze/**/*.parquet",
                              lambda: _has_rows(spark, table_path(cfg, "bronze.transport"))), \
        "bronze: the writer committed before a data file was seen"
    assert _run_and_kill_when(cmd, env, f"{silver_path}/**/*.parquet", lambda: _has_rows(spark, silver_path)), \
        "silver: the writer committed before a data file was seen"
    assert _has_rows(spark, table_path(cfg, "gold.ingest_audit")), "the second run got to silver"
    # the last re-run in this process's Spark (the killed drivers left nothing behind it could share)
    from ccselect.jobs import ingest
    ingest.run(spark, cfg, out)
    clean_cfg, _ = ingested
    for t in TABLES:
        got = snapshot(spark, cfg, t)
        assertDataFrameEqual(got, snapshot(spark, clean_cfg, t))
    silver = spark.read.format("delta").load(silver_path)
    assert silver.count() == silver.select("node_id", "hour", "conn_id").distinct().count(), "duplicate connections"
