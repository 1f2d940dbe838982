"""The stream's sources (issue 60): where `ccs stream`'s micro-batches come from, behind one
interface, so that parsing, quarantine and silver stay one code path (flows/stream.py).

A source has `read(spark)` (the streaming DataFrame) and `take(batch, batch_id, log)` (one
micro-batch → a `SourceBatch`):

- `lines`: the columns `jobs.sources.explode_lines` gives batch ingest (stream, node_id, hour,
  hour_start_ms, source_file, line_no, raw), which `jobs.ingest.to_bronze` parses: one parser;
- `rejected`: lines the source itself must quarantine before any parse (a Kafka record without
  its node or its hour: `no_node`, `no_hour`), as quarantine rows; never dropped;
- `units`: what the audit counts, one `gold.ingest_audit` row each, with `path` its `source_file`;
- `keys`: the (node_id, hour) partitions per stream the batch touches.

**File source**: the agent's rotated segments under the input folder (`SEGMENT_GLOB`), a row per
new segment; a unit is a file (`jobs.sources.SourceFile`), line_no its line.

**Kafka source** (Spark's `spark-sql-kafka-0-10`, `KAFKA_PACKAGE`, put in the session only when
this source is used: `session_config`): the topics `ccs.<stream>` that export/edge/shipper.py
publishes to, a record per line, keyed by node with the header `ccs.hour`. A record's
`source_file` is `kafka://<topic>/<partition>` and its `line_no` the offset: the lake's rule for
a line read again (`jobs.ingest.judge_against`: the same file and line is not a new line) makes a
replay from offsets exact, and a record the shipper sent twice (a new offset, the same identity)
is quarantined as `duplicate_*` like a repeated line of a file. The offsets live in the stream's
checkpoint. A unit is a (topic, partition, offset range) of the micro-batch: its audit row's
`source_file` is `kafka://<topic>/<partition>@<first>-<last>`, node_id and hour null (a partition
carries several nodes), lines_read = the records of the range = accepted + quarantined.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect.contract import STREAMS
from ccselect.jobs.sources import SourceFile, classify, explode_lines

#: the segments of every stream under the input folder (hourly files `…THH.jsonl` are not matched:
#: an hourly file grows while its hour lasts, which a file source must not read)
SEGMENT_GLOB = "{" + ",".join(STREAMS) + "}/*/*T[0-9][0-9][0-9][0-9]*.jsonl"
#: Spark's Kafka source, for Spark 4.2 (pyspark's version) and Scala 2.13
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
#: the topics are ccs.<stream> (topology/kafka.py, export/edge/shipper.py)
TOPIC_PREFIX = "ccs."
HOUR_HEADER = "ccs.hour"
SCHEME = "kafka://"
#: the reasons a Kafka record is quarantined before it is parsed (jobs/README.md's table)
NO_NODE, NO_HOUR = "no_node", "no_hour"
_HOUR = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3])$"
_NODE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"          # jobs/sources.py's node folder rule
QUARANTINE_ROW = ("stream", "node_id", "hour", "source_file", "line_no", "raw", "reason", "status")


@dataclass(frozen=True)
class KafkaRange:
    """One audit unit of the Kafka source: a partition's offsets [first, last] in a micro-batch."""
    stream: str
    topic: str
    partition: int
    first: int
    last: int
    records: int
    newest_ms: int

    node_id = None
    hour = None

    @property
    def path(self) -> str:
        return f"{SCHEME}{self.topic}/{self.partition}@{self.first}-{self.last}"

    @property
    def source_file(self) -> str:
        return f"{SCHEME}{self.topic}/{self.partition}"


@dataclass
class SourceBatch:
    units: list
    lines: DataFrame | None
    keys: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    rejected: DataFrame | None = None
    #: (newest, oldest) unix seconds of the batch's records' arrival (a segment's mtime, a Kafka
    #: record's timestamp): the stream's lag is measured from them when the batch is done
    arrived: tuple[float, float] | None = None
    #: bronze's source_file → the unit's `path` (the Kafka source: a partition → its range)
    unit_of: dict[str, str] | None = None

    @property
    def all_keys(self) -> set[tuple[str, str]]:
        return set().union(*self.keys.values()) if self.keys else set()

    def audit_lines(self, every: DataFrame) -> DataFrame:
        """The batch's judged lines keyed by their unit (what `jobs.ingest.to_audit` groups by)."""
        if not self.unit_of:
            return every
        m = F.create_map(*[F.lit(x) for kv in self.unit_of.items() for x in kv])
        return every.withColumn("source_file", F.coalesce(m[F.col("source_file")], F.col("source_file")))


class FileSource:
    """The agent's rotated segments under `input_dir` (the embedded default)."""
    name = "file"
    packages: tuple[str, ...] = ()

    def __init__(self, input_dir: str, max_files: int):
        self.input_dir, self.max_files = input_dir, int(max_files)

    def read(self, spark: SparkSession) -> DataFrame:
        """A row per new segment (its path as `uri`, its text as `value`)."""
        return (spark.readStream.format("text").option("wholetext", "true")
                .option("maxFilesPerTrigger", self.max_files)
                .load(os.path.join(os.path.abspath(self.input_dir), SEGMENT_GLOB))
                .select(F.regexp_replace("_metadata.file_path", "^file:(//)?", "").alias("uri"), "value"))

    def take(self, batch: DataFrame, batch_id: int, log) -> SourceBatch:
        uris = [r["uri"] for r in batch.select("uri").collect()]
        judged = [classify(u) for u in sorted(uris)]
        files = [f for f in judged if isinstance(f, SourceFile)]
        for sk in judged:
            if not isinstance(sk, SourceFile):
                log(f"stream: batch {batch_id}: not read: {sk.path} ({sk.why})")
        keys: dict[str, set] = {}
        for f in files:
            keys.setdefault(f.stream, set()).add((f.node_id, f.hour))
        lines = None
        if files:
            meta = batch.sparkSession.createDataFrame(
                [(f.path, f.stream, f.node_id, f.hour, f.hour_start_ms, f.path) for f in files],
                "uri string, stream string, node_id string, hour string, hour_start_ms bigint, source_file string")
            lines = explode_lines(batch.join(F.broadcast(meta), "uri"))
        mtimes = [os.stat(f.path).st_mtime for f in files if os.path.exists(f.path)]
        return SourceBatch(files, lines, keys, arrived=(max(mtimes), min(mtimes)) if mtimes else None)


class KafkaSource:
    """The broker's topics `ccs.<stream>` (export/edge/shipper.py's records)."""
    name = "kafka"
    packages = (KAFKA_PACKAGE,)

    def __init__(self, bootstrap: str, max_offsets: int, starting: str = "earliest",
                 streams: tuple[str, ...] = STREAMS):
        if not bootstrap:
            raise ValueError("the Kafka source needs the broker's address (stream.kafka_bootstrap)")
        self.bootstrap, self.max_offsets, self.starting, self.streams = bootstrap, int(max_offsets), starting, streams

    def read(self, spark: SparkSession) -> DataFrame:
        return (spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", ",".join(TOPIC_PREFIX + s for s in self.streams))
                .option("startingOffsets", self.starting)
                .option("includeHeaders", "true")
                .option("maxOffsetsPerTrigger", self.max_offsets)
                .load())

    @staticmethod
    def judged(batch: DataFrame) -> DataFrame:
        """The records as lines (explode_lines' columns) with `pre_reason`: why the source
        quarantines one before the parse (no_node, no_hour), null for the others."""
        hour = F.expr(f"try_element_at(filter(headers, h -> h.key = '{HOUR_HEADER}'), 1).value").cast("string")
        node = F.col("key").cast("string")
        shaped = hour.rlike(_HOUR)
        day = F.try_to_date(F.when(shaped, F.substring(hour, 1, 10)), "yyyy-MM-dd")
        good_hour = shaped & day.isNotNull()
        start = F.when(good_hour, (F.unix_date(day).cast("bigint") * 86400
                                   + F.substring(hour, 12, 2).cast("int").cast("bigint") * 3600) * 1000)
        good_node = node.rlike(_NODE)
        return (batch.select(
            F.regexp_replace("topic", "^" + re.escape(TOPIC_PREFIX), "").alias("stream"),
            F.when(good_node, node).alias("node_id"),
            F.when(good_hour, hour).alias("hour"),
            F.when(good_hour, start).alias("hour_start_ms"),
            F.concat(F.lit(SCHEME), F.col("topic"), F.lit("/"), F.col("partition").cast("string")).alias("source_file"),
            F.col("offset").alias("line_no"),
            F.col("value").cast("string").alias("raw"),
            F.when(node.isNull() | ~good_node, F.lit(NO_NODE))
             .when(hour.isNull() | ~good_hour, F.lit(NO_HOUR)).alias("pre_reason")))

    def take(self, batch: DataFrame, batch_id: int, log) -> SourceBatch:
        ranges = (batch.groupBy("topic", "partition")
                  .agg(F.min("offset").alias("first"), F.max("offset").alias("last"), F.count(F.lit(1)).alias("n"),
                       F.max("timestamp").alias("newest"), F.min("timestamp").alias("oldest"))
                  .collect())
        units = [KafkaRange(r["topic"][len(TOPIC_PREFIX):], r["topic"], int(r["partition"]), int(r["first"]),
                            int(r["last"]), int(r["n"]), int(r["newest"].timestamp() * 1000))
                 for r in sorted(ranges, key=lambda r: (r["topic"], r["partition"]))]
        if not units:
            return SourceBatch([], None)
        j = self.judged(batch)
        ok = j.where(F.col("pre_reason").isNull())
        keys: dict[str, set] = {}
        for r in ok.select("stream", "node_id", "hour").distinct().collect():
            keys.setdefault(r["stream"], set()).add((r["node_id"], r["hour"]))
        rejected = (j.where(F.col("pre_reason").isNotNull())
                    .withColumn("reason", F.col("pre_reason")).withColumn("status", F.lit("quarantined"))
                    .select(*QUARANTINE_ROW))
        arrived = (max(r["newest"] for r in ranges).timestamp(), min(r["oldest"] for r in ranges).timestamp())
        return SourceBatch(units, ok.drop("pre_reason"), keys, rejected=rejected, arrived=arrived,
                           unit_of={u.source_file: u.path for u in units})


def make(cfg: Config, input_dir: str, max_files: int | None = None, bootstrap: str | None = None):
    """The source `stream.source` names: file (segments under `input_dir`) or kafka (`bootstrap`,
    else `stream.kafka_bootstrap`)."""
    s = cfg.settings.stream
    if s.source == "kafka":
        return KafkaSource(bootstrap or s.kafka_bootstrap, s.max_offsets_per_trigger, s.kafka_starting_offsets)
    return FileSource(input_dir, max_files or s.max_files_per_trigger)


def session_config(cfg: Config, source: str | None = None) -> Config:
    """`cfg` with `stream.source` set to `source` (when given) and the Maven packages that source
    needs added to `spark.extra_packages` (the Kafka source's jar only in a session that reads
    Kafka: every other session, and CI, skips it)."""
    raw = dict(cfg.raw)
    if source is not None and source != cfg.settings.stream.source:
        raw["stream"] = {**(raw.get("stream") or {}), "source": source}
    need = KafkaSource.packages if (source or cfg.settings.stream.source) == "kafka" else ()
    spark = raw.get("spark") or {}
    have = list(spark.get("extra_packages") or [])
    if any(p not in have for p in need):
        raw["spark"] = {**spark, "extra_packages": have + [p for p in need if p not in have]}
    return cfg if raw == cfg.raw else dataclasses.replace(cfg, raw=raw)
