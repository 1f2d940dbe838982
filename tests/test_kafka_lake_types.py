"""One lake, both sources (issue 60): the file path's bronze `line_no` (a line) and the Kafka
source's (an offset) are one type, a bigint, so a lake written by one source takes the other's
rows in either order, and a lake an older ingest created with an int `line_no` is widened in
place when a writer meets it (jobs.ingest.LINE_TYPES, delta_io.widen).

No broker: the Kafka-shaped rows (Spark's Kafka source's columns) go through the stream's own
writer (flows.stream.StreamJob.ingest over jobs.stream_sources.KafkaSource.take), as a
micro-batch of the Kafka source would. Every check compares whole frames: the bronze lines with
their status and reason, the quarantine, and the audit's balance (in = accepted + quarantined)."""
from __future__ import annotations

import glob
import os
import shutil
from datetime import datetime, timezone

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect import delta_io
from ccselect.config import load_config
from ccselect.contract import STREAMS
from ccselect.lake import INGEST_AUDIT, QUARANTINE, bronze_table, table_path
from ccs_testing import write_config

# In the Kafka lane (the Makefile's KAFKA_LANE: at the end of `make test`'s tests beside the main run, and
# `make test-kafka`), off the main run's critical path: four Spark streams' worth of writes, 106 s on a
# quiet 2-core machine, 335 s at load average ~10 (4e055fb).
pytestmark = [pytest.mark.kafka_stream]

BAD = '{"conn_id": "x1", "node_id"'
KAFKA_BATCH = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
               "timestampType int, headers array<struct<key:string,value:binary>>")
LINE = "source_file string, line_no bigint, status string, reason string"
QLINE = "stream string, source_file string, line_no bigint, reason string"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A tiny fleet's hour: node A's files (the file path; a bad line added to its transport
    file) and node B's transport lines (the Kafka records)."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = str(tmp_path_factory.mktemp("typesfleet"))
    simulate(SimParams(nodes=2, hours=1, conns_per_node_hour=20, seed=11), out, workers=1, progress=False)
    a, b = sorted(os.path.basename(d) for d in glob.glob(f"{out}/transport/*"))
    files = str(tmp_path_factory.mktemp("files"))
    for stream in STREAMS:
        shutil.copytree(f"{out}/{stream}/{a}", f"{files}/{stream}/{a}")
    tfile = glob.glob(f"{files}/transport/{a}/*.jsonl")[0]
    with open(tfile, "a") as fh:
        fh.write(BAD + "\n")
    kfile = glob.glob(f"{out}/transport/{b}/*.jsonl")[0]
    hour = os.path.basename(kfile)[:13]
    with open(kfile) as fh:
        records = [line.rstrip("\n") for line in fh]
    return files, tfile, b, hour, records


def _lines(path):
    with open(path) as fh:
        return [line.rstrip("\n") for line in fh]


def _ingest_files(spark, cfg, files):
    from ccselect.jobs import ingest
    return ingest.run(spark, cfg, files, silver=False)


def _kafka_rows(fleet):
    """node B's transport lines as the broker gives them (offset i = line i+1), then a copy of the
    first line under a new offset (a producer's retry: duplicate_conn_id), a line that is no
    JSON (bad_json) and a record without its hour header (no_hour)."""
    _, _, node, hour, records = fleet
    ts = datetime(2026, 11, 29, 19, 0, tzinfo=timezone.utc).replace(tzinfo=None)
    hdr = [("ccs.hour", hour.encode())]
    values = [(r, hdr) for r in records] + [(records[0], hdr), (BAD, hdr), (records[1], [])]
    return [(node.encode(), v.encode(), "ccs.transport", 0, i, ts, 0, h) for i, (v, h) in enumerate(values)]


def _write_kafka(spark, cfg, fleet, tmp_path, batch_id=0):
    """The rows through the Kafka source's micro-batch path: KafkaSource.take, then the stream's
    bronze, quarantine and audit writer (StreamJob.ingest, under retry_conflicts as the stream runs it)."""
    from ccselect.flows.stream import StreamJob
    from ccselect.jobs.stream_sources import KafkaSource
    source = KafkaSource("localhost:9", 1000)
    job = StreamJob(spark, cfg, str(tmp_path / "in"), str(tmp_path / "ckpt"), deploy=False, log=lambda m: None,
                    source=source)
    job._app_id = f"ccs-stream-types-{tmp_path.name}"     # the id a checkpoint would hold
    batch = spark.createDataFrame(_kafka_rows(fleet), KAFKA_BATCH)
    got = source.take(batch, batch_id, job.log)
    # as StreamJob._process calls it: a batch that finds another commit after its read (on a fresh
    # lake, the table its own append created) takes its rows back and is judged again
    return delta_io.retry_conflicts(lambda: job.ingest(got, batch_id), f"types batch {batch_id}", log=job.log)


def _want(fleet):
    """(bronze.transport lines, quarantine rows) both sources' writes must leave."""
    files, tfile, _, _, records = fleet
    n = len(_lines(tfile))
    bronze = [(tfile, i, "ok", None) for i in range(1, n)] + [(tfile, n, "quarantined", "bad_json")]
    k = "kafka://ccs.transport/0"
    m = len(records)
    bronze += [(k, i, "ok", None) for i in range(m)]
    bronze += [(k, m, "quarantined", "duplicate_conn_id"), (k, m + 1, "quarantined", "bad_json")]
    quarantine = [("transport", tfile, n, "bad_json"), ("transport", k, m, "duplicate_conn_id"),
                  ("transport", k, m + 1, "bad_json"), ("transport", k, m + 2, "no_hour")]
    return bronze, quarantine


def _lines_in(fleet) -> int:
    files = fleet[0]
    return sum(len(_lines(p)) for p in glob.glob(f"{files}/*/*/*.jsonl")) + len(fleet[4]) + 3


def _check_lake(spark, cfg, fleet):
    bronze_want, q_want = _want(fleet)
    for name in (bronze_table("transport"), QUARANTINE):
        path = table_path(cfg, name)
        t = spark.read.format("delta").load(path)
        assert t.schema["line_no"].dataType.simpleString() == "bigint", f"{name}: line_no {t.schema['line_no']}"
        assert delta_io._properties(spark, path).get(delta_io.TYPE_WIDENING) == "true", f"{name}: type widening off"
    b = spark.read.format("delta").load(table_path(cfg, bronze_table("transport")))
    assertDataFrameEqual(b.select("source_file", "line_no", "status", "reason"), spark.createDataFrame(bronze_want, LINE))
    q = spark.read.format("delta").load(table_path(cfg, QUARANTINE)).where("stream = 'transport'")
    assertDataFrameEqual(q.select("stream", "source_file", "line_no", "reason"), spark.createDataFrame(q_want, QLINE))
    # in = accepted + quarantined: per audit row, and over the lake against the lines offered
    audit = spark.read.format("delta").load(table_path(cfg, INGEST_AUDIT))
    assert audit.where("lines_read != accepted + quarantined").count() == 0, "an audit row does not balance"
    total = audit.agg(F.sum("lines_read"), F.sum("accepted"), F.sum("quarantined")).first()
    quarantined = spark.read.format("delta").load(table_path(cfg, QUARANTINE)).count()
    accepted = sum(spark.read.format("delta").load(table_path(cfg, bronze_table(s))).where("status = 'ok'").count()
                   for s in STREAMS)
    assert (total[0], total[1], total[2]) == (_lines_in(fleet), accepted, quarantined), \
        f"audit {tuple(total)} against lines offered {_lines_in(fleet)}, bronze accepted {accepted}, quarantine {quarantined}"


def test_files_then_kafka_share_one_lake(spark, fleet, tmp_path):
    cfg = load_config(write_config(tmp_path))
    _ingest_files(spark, cfg, fleet[0])
    _write_kafka(spark, cfg, fleet, tmp_path)
    _check_lake(spark, cfg, fleet)


def test_kafka_then_files_share_one_lake(spark, fleet, tmp_path):
    cfg = load_config(write_config(tmp_path))
    _write_kafka(spark, cfg, fleet, tmp_path)
    _ingest_files(spark, cfg, fleet[0])
    _check_lake(spark, cfg, fleet)


def _make_int_lake(spark, cfg, fleet):
    """A lake as the ingest before this fix left it: bronze and quarantine with an int line_no and
    no type widening (written from a fresh ingest's rows, line_no cast back to int)."""
    _ingest_files(spark, cfg, fleet[0])
    for name in [bronze_table(s) for s in STREAMS] + [QUARANTINE]:
        path = table_path(cfg, name)
        parts = ["stream", "node_id", "hour"] if name == QUARANTINE else ["node_id", "hour"]
        old = spark.read.format("delta").load(path).withColumn("line_no", F.col("line_no").cast("int")).localCheckpoint()
        shutil.rmtree(path)
        old.write.format("delta").partitionBy(*parts).save(path)
        assert spark.read.format("delta").load(path).schema["line_no"].dataType.simpleString() == "int"
        assert delta_io.TYPE_WIDENING not in delta_io._properties(spark, path)


@pytest.mark.parametrize("writer", ["kafka", "files"])
def test_an_int_lake_is_widened_by_the_writer_that_meets_it(spark, fleet, tmp_path, writer):
    cfg = load_config(write_config(tmp_path))
    _make_int_lake(spark, cfg, fleet)
    if writer == "kafka":
        _write_kafka(spark, cfg, fleet, tmp_path)
    else:          # the file path again over the old lake (its rows replaced), then Kafka's
        _ingest_files(spark, cfg, fleet[0])
        for name in (bronze_table("transport"), QUARANTINE):
            t = spark.read.format("delta").load(table_path(cfg, name))
            assert t.schema["line_no"].dataType.simpleString() == "bigint", f"{name} not widened by the file path"
        _write_kafka(spark, cfg, fleet, tmp_path)
    _check_lake(spark, cfg, fleet)
    # widened once: a second look changes nothing and commits nothing
    path = table_path(cfg, bronze_table("transport"))
    v = delta_io.table_version(spark, path)
    assert delta_io.widen(spark, path, {"line_no": "bigint"}) == []
    assert delta_io.table_version(spark, path) == v
