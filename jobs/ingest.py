"""`ccs ingest`: node-hour files → bronze.<stream>, bronze.quarantine, gold.ingest_audit, then
silver.connections (jobs.silver). extract → pure transforms → load.

Every table is partitioned by (node_id, hour) and written with `replaceWhere` over the
partitions of the files read, so re-ingesting a file replaces its rows.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import DUPLICATE_REASON, IDENTITY, STREAMS
from ccselect.hours import Window
from ccselect.lake import INGEST_AUDIT, QUARANTINE, bronze_table, table_path
from ccselect.spark import conf_set
from ccselect.jobs import silver as silver_job
from ccselect.jobs.parse import imputable_of, parse
from ccselect.jobs.sources import MISSING_REFERENCE_EFFECT, SourceFile, discover_all, missing_reference, read_lines

BRONZE_COLS = ("stream", "node_id", "hour", "source_file", "line_no", "raw", "ingest_time", "status",
               "reason", "record")
QUARANTINE_COLS = ("stream", "node_id", "hour", "source_file", "line_no", "raw", "reason", "ingest_time")
#: `line_no` is a bigint in every source: a file's 1-based line (jobs/sources.explode_lines) and a
#: Kafka record's offset (jobs/stream_sources.py) go into the same bronze and quarantine tables,
#: and a Delta append refuses an int column beside a bigint one (DELTA_FAILED_TO_MERGE_FIELDS, in
#: either order). A table an older ingest created with an int `line_no` is widened in place once,
#: when a writer meets it (delta_io.widen: type widening, no rewrite of its files).
LINE_TYPES = {"line_no": "bigint"}
#: Delta collects min/max statistics of a bronze file's first 32 columns by default: the raw
#: line and the record's fields, which no query skips files by. Keep them for line_no and status,
#: and for ingest_time: the stream's append (flows/stream.py append_judged) is a replaceWhere on
#: its partitions AND its own ingest time, which Delta otherwise answers by reading every file of
#: those partitions (a "Finding files to rewrite" job per stream and batch, over more files as the
#: hour goes on); with the statistics no earlier batch's file is a candidate. (Delta's conflict
#: check reads a predicate by partition values only: what conflicts with the append is unchanged.)
#: Type widening on from the table's creation (LINE_TYPES).
BRONZE_PROPERTIES = {"delta.dataSkippingStatsColumns": "line_no,status,ingest_time", delta_io.TYPE_WIDENING: "true"}
QUARANTINE_PROPERTIES = {delta_io.TYPE_WIDENING: "true"}
#: Parquet settings for the bronze, quarantine and audit writes: no dictionary encoding (the raw line,
#: the widest column, is unique to its row) and no Parquet statistics (these tables are read by
#: their (node, hour) partitions and by Delta's own file statistics, BRONZE_PROPERTIES, never by a
#: Parquet file's min/max). Measured on 3.08 M access lines, parse and Delta write, warm, two runs
#: each: 14.0–15.0 s with Parquet's defaults, 11.6–12.3 s with these. Dictionaries for the columns
#: a file repeats, which the audit and silver read back (the source file's path is one value for
#: its thousands of lines); on 6.16 M access lines, bronze, quarantine and audit, warm, 55.0 and
#: 55.4 s without them, 51.9 and 54.3 s with them (within the noise).
BRONZE_DICTIONARY_COLUMNS = ("stream", "source_file", "status", "reason")
BRONZE_PARQUET = {"parquet.enable.dictionary": "false", "parquet.size.statistics.enabled": "false",
                  "parquet.column.statistics.enabled": "false",
                  **{f"parquet.enable.dictionary#{c}": "true" for c in BRONZE_DICTIONARY_COLUMNS}}
#: Shuffle sizing for the streams' bronze writes: the duplicate rule's window sorts each shuffle
#: partition's lines, gathered by (node, hour), with their parsed records. With the session's few
#: shuffle partitions (4 on the benches' 2 cores) each sort held a quarter of a day's transport
#: lines and spilled to disk; start from 200 and let adaptive execution coalesce them to about
#: 16 MB each. Every (node, hour) still lands in one partition, and so in one file. Measured, 5 M
#: connections, the bronze.transport parse, window and write stage: 116.7 s with 4 partitions
#: (9.2 GB spilled), 93.6 s with 88 (nothing spilled). Not for the audit: its cached rows keep
#: all 200 partitions (adaptive execution does not coalesce inside a cached plan), which cost
#: 15 s of tasks over 864 rows.
BRONZE_SHUFFLE = {"spark.sql.adaptive.enabled": "true",
                  "spark.sql.adaptive.coalescePartitions.enabled": "true",
                  "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "200",
                  "spark.sql.adaptive.advisoryPartitionSizeInBytes": "16m"}
#: (Measured when the access log had no duplicate rule and so no shuffle; since issue 61 every
#: stream's rows come out of the rule's window gathered by (node, hour).) A task held several whole
#: files, each one (node, hour), and Delta's writer sorted all of the task's rows by (node, hour) before writing
#: them. With concurrent writers a task writes each (node, hour) as its rows come, a Parquet writer
#: open for each (past 16 in a task, the rest are sorted as before). Transport and QoE rows come out
#: of the duplicate rule's window already in that order, and are not sorted either way. Measured on
#: 6.16 M access lines, parse and bronze write, warm, same sitting: 50.3 and 54.9 s sorted, 42.3
#: and 40.8 s with concurrent writers.
BRONZE_WRITERS = {"spark.sql.maxConcurrentOutputFileWriters": "16"}
AUDIT_CONSTRAINTS = {
    "lines_balance": "lines_read = accepted + quarantined",
    "counts_nonnegative": "accepted >= 0 AND quarantined >= 0",
}


# ---- transforms ---------------------------------------------------------------------------------

def to_bronze(lines: DataFrame, stream: str, ingest_time: datetime, impute: tuple[str, ...] = ()) -> DataFrame:
    """Lines of one stream → bronze rows (raw line, provenance, status, reason, typed record);
    `impute`: the fields a record may miss (jobs.parse.imputable)."""
    return parse(lines, stream, impute).withColumn("ingest_time", F.lit(ingest_time)).select(*BRONZE_COLS)


def to_quarantine(bronze: DataFrame) -> DataFrame:
    return bronze.filter(F.col("status") == "quarantined").select(*QUARANTINE_COLS)


def to_audit(bronze: DataFrame, files: DataFrame, ingest_time: datetime) -> DataFrame:
    """Per file: lines read, accepted, quarantined, quarantined by reason (a map). Files with no
    lines still get a row of zeros.

    The lines are counted by their file's path alone (it names the stream, node and hour, which
    come from `files`): hashing and comparing one string a line instead of four (jobs/README.md
    gives the measurement)."""
    keys = ["stream", "node_id", "hour", "source_file"]
    by_reason = (bronze.filter(F.col("status") == "quarantined")
                 .groupBy("source_file", "reason").count()
                 .groupBy("source_file").agg(F.map_from_entries(F.sort_array(F.collect_list(
                     F.struct("reason", "count")))).alias("quarantined_by_reason")))
    totals = bronze.groupBy("source_file").agg(
        F.count(F.lit(1)).alias("lines_read"),
        F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).cast("bigint").alias("accepted"),
        F.sum(F.when(F.col("status") == "quarantined", 1).otherwise(0)).cast("bigint").alias("quarantined"))
    empty = F.create_map().cast("map<string,bigint>")
    return (files.select(*keys).join(totals, "source_file", "left").join(by_reason, "source_file", "left")
            .select(*keys,
                    F.coalesce("lines_read", F.lit(0)).cast("bigint").alias("lines_read"),
                    F.coalesce("accepted", F.lit(0)).cast("bigint").alias("accepted"),
                    F.coalesce("quarantined", F.lit(0)).cast("bigint").alias("quarantined"),
                    F.coalesce("quarantined_by_reason", empty).alias("quarantined_by_reason"),
                    F.lit(ingest_time).alias("ingest_time")))


def identity(stream: str) -> Column:
    """A bronze row's record identity (contract.IDENTITY): its identity fields, or the whole record."""
    fields = IDENTITY[stream]
    return F.struct(*[F.col("record")[f].alias(f) for f in fields]) if fields else F.col("record")


def judge_against(bronze: DataFrame, committed: DataFrame, stream: str) -> DataFrame:
    """Bronze rows of lines read now, judged against the lines a table already holds (`committed`:
    node_id, hour, source_file, line_no, status, record) — the rule across writes (micro-batches,
    checkpoints, sources; jobs/README.md "Identity"): a line already committed (the same file and
    line, read again) is not a new line and is left out; an accepted line whose identity a
    committed line holds accepted is a repeat (`contract.DUPLICATE_REASON`): the copy committed
    first wins."""
    lines = committed.select("source_file", "line_no")
    held = (committed.where(F.col("status") == "ok").select("node_id", "hour", identity(stream).alias("_held"))
            .distinct())
    fresh = bronze.join(lines, ["source_file", "line_no"], "left_anti").withColumn("_id", identity(stream))
    cond = ((fresh["node_id"] == held["node_id"]) & (fresh["hour"] == held["hour"])
            & fresh["_id"].eqNullSafe(held["_held"]))
    seen = fresh.join(held, cond, "left").select(fresh["*"], held["_held"].isNotNull().alias("_repeat"))
    repeat = F.col("_repeat") & (F.col("status") == "ok")
    return (seen.withColumn("reason", F.when(repeat, F.lit(DUPLICATE_REASON[stream])).otherwise(F.col("reason")))
            .withColumn("status", F.when(repeat, F.lit("quarantined")).otherwise(F.col("status")))
            .withColumn("record", F.when(~repeat, F.col("record")))
            .select(*BRONZE_COLS))


# ---- load ---------------------------------------------------------------------------------------

def _warn(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass
class IngestResult:
    files: int
    partitions: int
    streams: dict

    def to_dict(self) -> dict:
        return {"files": self.files, "partitions": self.partitions, "streams": self.streams}


def files_frame(spark: SparkSession, files: list[SourceFile]) -> DataFrame:
    return spark.createDataFrame([(f.stream, f.node_id, f.hour, f.path) for f in files],
                                 "stream string, node_id string, hour string, source_file string")


def ingest_bronze(spark: SparkSession, cfg: Config, files: list[SourceFile],
                  ingest_time: datetime | None = None) -> dict:
    """Load bronze.<stream>, bronze.quarantine and gold.ingest_audit for `files`; returns the audit
    totals per stream.

    Each stream's files are read once and parsed once, straight into its bronze table (one commit).
    Quarantine and audit then come from the committed bronze partitions of all streams together
    (one commit each), reading only the few columns they need: they can never disagree with what
    bronze holds, and nothing is parsed twice.
    """
    ingest_time = ingest_time or datetime.now(timezone.utc).replace(tzinfo=None)
    with conf_set(spark, BRONZE_PARQUET):
        return _ingest_bronze(spark, cfg, files, ingest_time)


def _ingest_bronze(spark: SparkSession, cfg: Config, files: list[SourceFile], ingest_time: datetime) -> dict:
    keys_by_stream = {}
    for stream in STREAMS:
        sfiles = [f for f in files if f.stream == stream]
        if not sfiles:
            continue
        keys = {(f.node_id, f.hour) for f in sfiles}
        impute = imputable_of(cfg.settings.ingest, stream)
        bronze = to_bronze(read_lines(spark, sfiles), stream, ingest_time, impute)
        with conf_set(spark, {**BRONZE_SHUFFLE, **BRONZE_WRITERS}):
            delta_io.replace_partitions(bronze, table_path(cfg, bronze_table(stream)), keys,
                                        properties=BRONZE_PROPERTIES, types=LINE_TYPES)
        keys_by_stream[stream] = keys
    pairs = {(f.stream, f.node_id, f.hour) for f in files}
    qcols = ("stream", "node_id", "hour")
    committed = None
    for stream, keys in keys_by_stream.items():
        b = (spark.read.format("delta").load(table_path(cfg, bronze_table(stream)))
             .where(delta_io.partition_predicate(keys))
             .select(*(c for c in QUARANTINE_COLS if c != "ingest_time"), "status"))
        committed = b if committed is None else committed.unionByName(b)
    qpath = table_path(cfg, QUARANTINE)
    delta_io.replace_partitions(to_quarantine(committed.withColumn("ingest_time", F.lit(ingest_time))),
                                qpath, pairs, qcols, properties=QUARANTINE_PROPERTIES, types=LINE_TYPES)
    apath = table_path(cfg, INGEST_AUDIT)
    # One row per file, partitioned by node and hour like every ingest table (the three streams'
    # rows of a node-hour share one file: a day of 12 nodes is 288 files, not 864 one-row files);
    # the summary comes from the rows just written. The rows are first gathered by (node, hour):
    # after to_audit's join by file each task held rows of most partitions and wrote a file into
    # each (measured: 672 files for that day's 288 partitions, the write 8.9 s; gathered, 288 files
    # and 4.7 s).
    audit = to_audit(committed, files_frame(spark, files), ingest_time).repartition("node_id", "hour").persist()
    try:
        delta_io.replace_partitions(audit, apath, pairs, qcols, AUDIT_CONSTRAINTS, partition_by=("node_id", "hour"))
        return summarize(audit)
    finally:
        audit.unpersist()


def summarize(audit: DataFrame) -> dict:
    """Per stream: lines read, accepted, quarantined and (when any) quarantined by reason. The
    audit has a row per file (a few hundred for a day of a fleet): its rows are summed here, one
    Spark job instead of an aggregation's two."""
    out: dict = {}
    for r in audit.select("stream", "lines_read", "accepted", "quarantined", "quarantined_by_reason").collect():
        o = out.setdefault(r["stream"], {"lines_read": 0, "accepted": 0, "quarantined": 0})
        for k in ("lines_read", "accepted", "quarantined"):
            o[k] += int(r[k])
        for reason, n in (r["quarantined_by_reason"] or {}).items():
            o.setdefault("by_reason", {})
            o["by_reason"][reason] = o["by_reason"].get(reason, 0) + int(n)
    return out


def run(spark: SparkSession, cfg: Config, input_dir: str, window: Window | None = None,
        silver: bool = True) -> dict:
    """The whole ingest for every node-hour file under `input_dir` (optionally an hour range).

    The result says what a reader of the lake must know beside the counts: `missing_reference`,
    the enrich step's reference file (`jobs.sources.REFERENCE`) when transport logs were read and
    it is not there (silver then leaves every `ug_id` null), with `warnings` saying so."""
    files, skipped = discover_all(input_dir, window, cfg=cfg)
    if not files:
        raise FileNotFoundError(f"no node-hour files under {input_dir}" + (f" for hours {window.name}" if window else "")
                                + "".join(f"; not read: {s.path} ({s.why})" for s in skipped[:5]))
    missing = missing_reference(input_dir, files, cfg) if silver else None
    result = {"input": input_dir, "files": len(files),
              "partitions": len({(f.node_id, f.hour) for f in files}),
              "skipped": [{"path": s.path, "why": s.why} for s in skipped],
              "missing_reference": missing,
              "warnings": [f"missing {missing}: {MISSING_REFERENCE_EFFECT}"] if missing else [],
              "streams": delta_io.retry_conflicts(lambda: ingest_bronze(spark, cfg, files), "ingest: bronze",
                                                  log=_warn)}
    for w in result["warnings"]:
        _warn(f"ingest: {w}")
    if silver:
        keys = {(f.node_id, f.hour) for f in files if f.stream == "transport"}
        result["silver_rows"] = delta_io.retry_conflicts(lambda: silver_job.run(spark, cfg, keys, input_dir),
                                                         "ingest: silver", log=_warn)
    return result
