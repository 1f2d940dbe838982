"""silver.connections: one row per accepted connection of the transport log, joined with its
access-log label and QoE beacons, enriched with prefixes, A/B bucket and user group.

extract (accepted bronze rows + the IP→ASN/region reference) → pure transforms → load
(`replaceWhere` on (node_id, hour), Delta CHECK constraints on the table's invariants).
Joins stay inside one (node_id, hour): a connection belongs to the hour it closed in (the agent
files it there; jobs/parse.py), and its requests and beacons logged in that hour's files join it.
A connection that began in an earlier hour keeps that hour's requests in bronze, unjoined: its
label and request totals come from its closing hour's requests.

silver.node_stats (features/node_stats.py) is rebuilt for the same (node_id, hour) partitions
after each write: the per-node feature statistics that per-node standardization reads.

`imputed` lists the Table 4 features a record was accepted without (`ingest.missing_features:
impute`); empty for a complete record.
"""
from __future__ import annotations

import csv
import io
import ipaddress

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io, files as storage
from ccselect.config import Config
from ccselect.contract import FEATURES, NET_TYPES, STREAMS, TRANSPORT_FIELDS
from ccselect.ipaddr import ab_bucket, canonical_text, with_ip
from ccselect.lake import CONNECTIONS, bronze_table, table_path
from ccselect.spark import conf_set
from ccselect.features import node_stats
from ccselect.features.labels import net_type_label
from ccselect.jobs.parse import schema

KEYS = ("node_id", "hour")
#: Invariants of silver.connections, enforced by Delta on every write (few constraints: each
#: ALTER TABLE is a commit).
SILVER_CONSTRAINTS = {
    # a feature may be null only as an imputed one (`imputed` names it)
    "transport_ranges": "conn_id IS NOT NULL AND imputed IS NOT NULL AND COALESCE(mss_bytes BETWEEN 88 AND 65535, "
                        "array_contains(imputed, 'mss_bytes')) AND COALESCE(min_rtt_us > 0, array_contains(imputed, "
                        "'min_rtt_us')) AND COALESCE(min_srtt_us > 0, array_contains(imputed, 'min_srtt_us')) AND "
                        "COALESCE(max_srtt_us > 0, array_contains(imputed, 'max_srtt_us')) AND cc IN ('cubic', 'bbr', 'reno')",
    "address": "ab_bucket BETWEEN 0 AND 4294967295 AND ("
               "(family = 4 AND prefix16 IS NOT NULL AND prefix24 IS NOT NULL AND prefix48 IS NULL) "
               "OR (family = 6 AND prefix48 IS NOT NULL AND prefix64 IS NOT NULL AND prefix24 IS NULL))",
    "label_matches_net_type": "(net_type IS NULL AND label IS NULL) OR (net_type = 'wifi' AND label = 1) "
                              "OR (net_type IN ('4g', '5g') AND label = 0)",
    "derived_nonnegative": "(goodput_bps IS NULL OR goodput_bps >= 0) AND (delivery_rate_bps IS NULL OR delivery_rate_bps >= 0) "
                           "AND (retrans_ratio IS NULL OR retrans_ratio >= 0) "
                           "AND (rtt_var_norm IS NULL OR rtt_var_norm >= 0)",
}

#: Delta collects min/max statistics of a file's first 32 columns by default, for data skipping.
#: silver is read by its (node_id, hour) partitions, which need no statistics; keep them for the
#: time span and the connection id, which an analyst's query may select by. Fewer columns to
#: summarise make the write cheaper (measured, a 1 M-connection day written as a new Delta table,
#: three pairs in one JVM: 29.3 s on average with 32 columns, 26.9 s with ts_end_ms alone; these
#: three were timed only inside a whole ingest, where the difference was within the noise).
SILVER_PROPERTIES = {"delta.dataSkippingStatsColumns": "conn_id,ts_start_ms,ts_end_ms"}

#: Parquet settings for silver's write. Most of its columns are measurements with nearly as many
#: values as rows (ids, times, counters, RTTs, the derived rates): for each, Parquet's dictionary
#: writer built a dictionary for the whole file and then wrote the column plain anyway. Those are
#: written plain from the start; the few repeated values (the CC, the decision, prefixes, user
#: group, network type, ...) keep their dictionaries. No Parquet min/max statistics: silver is read
#: by (node_id, hour) partition and Delta's own file statistics (SILVER_PROPERTIES), and a
#: partition's file is one row group. Measured: one node's day (417k connections) written warm,
#: three runs each, 18.7-30.9 s with Parquet's defaults (59 MB), 15.6-17.3 s with these (62 MB);
#: in a whole 5 M-connection ingest, silver's join-and-write stage 130.8 s (224 CPU-s) → 111.8 s
#: (180 CPU-s).
DICTIONARY_COLUMNS = ("server_port", "cc", "decision", "table_version", "mss_bytes", "family", "prefix16", "prefix24",
                      "prefix48", "prefix64", "ab_treatment", "ug_id", "imputed", "net_type", "label",
                      "requests", "qoe_sessions", "rebuffer_count")


def silver_parquet(columns: tuple[str, ...]) -> dict[str, str]:
    """The session settings for writing silver's `columns` (DICTIONARY_COLUMNS above)."""
    return {"parquet.column.statistics.enabled": "false", "parquet.size.statistics.enabled": "false",
            **{f"parquet.enable.dictionary#{c}": "false" for c in columns if c not in DICTIONARY_COLUMNS}}


# ---- reference ----------------------------------------------------------------------------------

def read_reference(path: str, cfg: Config | None = None) -> list[tuple[int, str, str]]:
    """(family, prefix bits, ug_id) per row of `reference/ip_asn_region.csv` (cidr,asn,isp,region),
    a local file or an object (s3a://, read with `cfg`'s object_store)."""
    if storage.is_remote(path):
        return _reference_rows(csv.DictReader(io.StringIO(storage.read_text(cfg, path), newline="")))
    with open(path, newline="") as fh:
        return _reference_rows(csv.DictReader(fh))


def _reference_rows(reader: csv.DictReader) -> list[tuple[int, str, str]]:
    rows = []
    for r in reader:
        net = ipaddress.ip_network(r["cidr"].strip(), strict=False)
        width = 32 if net.version == 4 else 128
        bits = format(int(net.network_address), f"0{width}b")[: net.prefixlen]
        rows.append((net.version, bits, f"{r['region'].strip()}-AS{int(r['asn'])}"))
    return rows


def reference_frame(spark: SparkSession, rows: list[tuple[int, str, str]]) -> DataFrame:
    return spark.createDataFrame(rows, "family int, bits string, ug_id string")


# ---- transforms ---------------------------------------------------------------------------------

def access_labels(access: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Per connection (JSON access log: by conn_id; nginx log: by client socket) the network type
    (null when absent or when the requests disagree), request count, bytes sent and the time
    spent serving them (the sum of nginx's $request_time, first byte read to last byte sent)."""
    # net_type as its 1-based position in contract.NET_TYPES, so that min and max (equal exactly
    # when the requests agree; nulls ignored) run in Spark's hash aggregate
    types = F.array(*[F.lit(t) for t in NET_TYPES])
    code = F.when(F.col("net_type").isNotNull(), F.array_position(types, F.col("net_type")).cast("int"))

    def agg(df: DataFrame, keys: list[str]) -> DataFrame:
        return df.groupBy(*keys).agg(
            F.min(code).alias("_lo"), F.max(code).alias("_hi"),
            F.count(F.lit(1)).alias("requests"),
            F.sum("bytes_sent").alias("bytes_sent"),
            F.sum("request_time_ms").alias("request_time_ms")) \
            .withColumn("net_type", F.when(F.col("_lo") == F.col("_hi"), F.element_at(types, F.col("_lo"))))\
            .drop("_lo", "_hi")
    by_conn = agg(access.filter(F.col("conn_id").isNotNull()), [*KEYS, "conn_id"])
    # the socket in the canonical address form, as the transport side (build_connections)
    by_socket = agg(access.filter(F.col("conn_id").isNull()).withColumn("client_ip", canonical_text(F.col("client_ip"))),
                    [*KEYS, "client_ip", "client_port"])
    return by_conn, by_socket


def qoe_per_conn(qoe: DataFrame) -> DataFrame:
    return qoe.groupBy(*KEYS, "conn_id").agg(
        F.count(F.lit(1)).alias("qoe_sessions"),
        F.sum("play_ms").alias("play_ms"),
        F.sum("rebuffer_ms").alias("rebuffer_ms"),
        F.sum("rebuffer_count").alias("rebuffer_count"),
        F.min("startup_ms").alias("startup_ms"))


def reference_levels(rows: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """The (family, prefix length) pairs of the reference's rows, longest prefix first."""
    return sorted({(fam, len(bits)) for fam, bits, _ in rows}, key=lambda x: -x[1])


def with_user_group(df: DataFrame, reference: DataFrame, levels: list[tuple[int, int]] | None = None) -> DataFrame:
    """Longest-prefix match of the client address against the reference table → `ug_id`;
    `levels`: the reference's `reference_levels` when the caller has its rows (else a Spark job
    reads them from `reference`)."""
    bits = F.when(F.col("family") == 4, F.lpad(F.conv(F.col("_hex"), 16, 2), 32, "0")).otherwise(
        F.concat(*[F.lpad(F.conv(F.substring("_hex", 1 + 8 * i, 8), 16, 2), 32, "0") for i in range(4)]))
    df = df.withColumn("_bits", bits)
    if levels is None:
        levels = reference_levels([(r["family"], r["bits"], None) for r in reference.select("family", "bits").collect()])
    found = []
    for i, (fam, plen) in enumerate(levels):
        ref = (reference.filter((F.col("family") == fam) & (F.length("bits") == plen))
               .select(F.col("bits").alias(f"_k{i}"), F.col("ug_id").alias(f"_ug{i}")).dropDuplicates([f"_k{i}"]))
        key = F.when(F.col("family") == fam, F.substring("_bits", 1, plen))
        df = df.withColumn(f"_k{i}", key).join(F.broadcast(ref), f"_k{i}", "left").drop(f"_k{i}")
        found.append(F.col(f"_ug{i}"))
    ug = F.coalesce(*found) if found else F.lit(None).cast("string")
    return df.withColumn("ug_id", ug).drop("_bits", *[f"_ug{i}" for i in range(len(levels))])


def derived(df: DataFrame) -> DataFrame:
    """Goodput (bits/s over the connection's lifetime, idle time between requests included), the
    delivery rate (bits/s of the responses while they were being served: bytes sent over the summed
    request times — the rate a pacing cap bounds, AutoPlex's goodput), retransmission ratio, and
    BBR-E2E's normalised RTT variation rttvar/srtt (here the largest of each over the connection)."""
    return (df.withColumn("goodput_bps", F.when(F.col("duration_us") > 0,
                                                F.col("bytes_acked") * 8e6 / F.col("duration_us")))
            .withColumn("delivery_rate_bps", F.when(F.col("request_time_ms") > 0,
                                                    F.col("bytes_sent") * 8e3 / F.col("request_time_ms")))
            .withColumn("retrans_ratio", F.when(F.col("data_segs_out") > 0,
                                                F.col("total_retrans") / F.col("data_segs_out")))
            .withColumn("rtt_var_norm", F.col("max_rtt_var_us") / F.col("max_srtt_us"))
            .withColumn("rebuffer_rate", F.when(F.col("play_ms") > 0, F.col("rebuffer_ms") / F.col("play_ms"))))


SILVER_COLS = (
    "conn_id", *[f for f in TRANSPORT_FIELDS if f not in ("conn_id", "node_id")],
    "family", "prefix16", "prefix24", "prefix48", "prefix64", "ab_bucket", "ab_treatment", "ug_id",
    "imputed", "net_type", "label", "requests", "bytes_sent", "request_time_ms",
    "qoe_sessions", "play_ms", "rebuffer_ms", "rebuffer_count", "startup_ms", "rebuffer_rate",
    "goodput_bps", "delivery_rate_bps", "retrans_ratio", "rtt_var_norm", "node_id", "hour",
)


def build_connections(transport: DataFrame, access: DataFrame, qoe: DataFrame, reference: DataFrame,
                      levels: list[tuple[int, int]] | None = None) -> DataFrame:
    """Accepted transport/access/qoe records (flat, with node_id and hour) → silver.connections;
    `levels`: the reference's `reference_levels` (with_user_group)."""
    by_conn, by_socket = access_labels(access)
    # one address form (ccselect/ipaddr.py): a dual-stack listener's ::ffff:a.b.c.d is a.b.c.d
    t = with_ip(transport, "client_ip").withColumn("client_ip", F.coalesce(F.col("ip.text"), F.col("client_ip")))
    t = t.select("*", F.col("ip.family").alias("family"), F.col("ip.hex").alias("_hex"),
                 *[F.col(f"ip.{p}").alias(p) for p in ("prefix16", "prefix24", "prefix48", "prefix64")],
                 ab_bucket(F.col("ip.packed")).alias("ab_bucket")).drop("ip")
    t = t.withColumn("ab_treatment", F.col("ab_bucket") % 2 == 1)
    t = t.withColumn("imputed", F.filter(F.array(*[F.when(F.col(f).isNull(), F.lit(f)) for f in FEATURES]),
                                         lambda x: x.isNotNull()))
    t = with_user_group(t, reference, levels).drop("_hex")
    sock = by_socket.select(*KEYS, "client_ip", "client_port", *[F.col(c).alias(f"_s_{c}") for c in
                                                                  ("requests", "bytes_sent", "request_time_ms", "net_type")])
    # every input is hash-partitioned by (node_id, hour) (extract): shuffled hash joins inside
    # those partitions, no sort and no further shuffle (`CO_PARTITIONED` allows partitioning by a subset
    # of the join keys)
    t = (t.join(by_conn.hint("shuffle_hash"), [*KEYS, "conn_id"], "left")
         .join(sock.hint("shuffle_hash"), [*KEYS, "client_ip", "client_port"], "left"))
    for c in ("requests", "bytes_sent", "request_time_ms", "net_type"):
        t = t.withColumn(c, F.coalesce(F.col(c), F.col(f"_s_{c}"))).drop(f"_s_{c}")
    t = t.withColumn("requests", F.coalesce("requests", F.lit(0)).cast("bigint"))
    t = t.withColumn("label", net_type_label(F.col("net_type")))
    t = t.join(qoe_per_conn(qoe).hint("shuffle_hash"), [*KEYS, "conn_id"], "left") \
        .withColumn("qoe_sessions", F.coalesce("qoe_sessions", F.lit(0)).cast("bigint"))
    return derived(t).select(*SILVER_COLS)


# ---- extract / load -----------------------------------------------------------------------------

#: Tasks per core for silver's join-and-write: its inputs are hash-partitioned by (node_id, hour)
#: into this many tasks per unit of the session's default parallelism (`spark.default.parallelism`:
#: its cores unless the configuration sets it; `silver_tasks`), never more than there are keys.
#: A task joins and writes whole (node, hour) partitions, and Delta's writer first sorts all of a
#: task's rows by (node, hour). With the session's shuffle partitions (4 on the benches' 2 cores)
#: each task held 72 of a day's 288 keys, its sort spilled (1.8 GB in memory, 0.8 GB on disk), and
#: the 4 tasks shared 2 cores unevenly (in a whole 5 M-connection ingest the stage took 107.5 s for
#: 173 CPU-s). With 8 per core (16 tasks of about 18 keys) a task's rows sort in memory and the
#: cores stay busy to the end. Measured: silver alone over the 288 keys of 5 M connections, one JVM,
#: alternating, 116.7 and 102.9 s with 4 tasks, 101.3 and 93.6 s with 16 (jobs/README.md).
SILVER_TASKS_PER_CORE = 8


def silver_tasks(spark: SparkSession, n_keys: int) -> int:
    """How many tasks silver's inputs are partitioned into for `n_keys` (node, hour) keys."""
    return max(1, min(n_keys, SILVER_TASKS_PER_CORE * spark.sparkContext.defaultParallelism))


def extract(spark: SparkSession, cfg: Config, keys: set[tuple[str, str]]) -> tuple[DataFrame, DataFrame, DataFrame]:
    pred = delta_io.partition_predicate(keys)
    tasks = silver_tasks(spark, len(keys))

    def accepted(stream: str) -> DataFrame:
        path = table_path(cfg, bronze_table(stream))
        if not delta_io.is_delta(spark, path):
            return spark.createDataFrame([], schema(stream)).withColumn("hour", F.lit(None).cast("string"))
        # Every input keyed by (node, hour) alike: the aggregates and joins of build_connections
        # then need no further shuffle, and each silver partition is written as one file.
        return (spark.read.format("delta").load(path).where(pred).filter(F.col("status") == "ok")
                .select("hour", "record.*").repartition(tasks, *KEYS))
    return accepted("transport"), accepted("access"), accepted("qoe")


#: Session settings under which a join of inputs all hash-partitioned by (node_id, hour) needs no
#: shuffle on its full keys (`spark.sql.requireAllClusterKeysForCoPartition`, default true, would
#: re-shuffle the transport rows and the access aggregates by (node_id, hour, conn_id); measured
#: on 200k connections: 86 MB + 22 MB more shuffled) and AQE keeps every side's partitions as
#: they are (coalescing one side differently would break the co-partitioning).
CO_PARTITIONED = {"spark.sql.requireAllClusterKeysForCoPartition": "false",
                  "spark.sql.adaptive.coalescePartitions.enabled": "false"}


class BronzeMoved(RuntimeError):
    """Another writer (the stream, a backfill) committed to the bronze partitions silver was just
    rebuilt from: the rebuild is run again (`delta_io.retry_conflicts`), so that the last silver
    written is built from the last bronze (jobs/README.md, "Writers")."""
    conflict = True


def bronze_files(spark: SparkSession, cfg: Config, keys: set[tuple[str, str]]) -> dict:
    """What bronze holds now for the three streams, for `bronze_moved`: per stream, the table's
    version (-1: none) where its Delta log can be read without Spark (a local lake,
    `delta_io.table_version`: no job), else the files of its `keys` partitions (planning only)."""
    out: dict = {}
    for stream in STREAMS:
        path = table_path(cfg, bronze_table(stream))
        v = delta_io.table_version(spark, path)
        out[stream] = v if v is not None else _partition_files(spark, path, keys)
    return out


def _partition_files(spark: SparkSession, path: str, keys: set[tuple[str, str]],
                     version: int | None = None) -> frozenset[str]:
    """The files of the Delta table's `keys` partitions now, or at `version` (-1: no table then)."""
    if (version is not None and version < 0) or not delta_io.is_delta(spark, path):
        return frozenset()
    r = spark.read.format("delta")
    if version is not None:
        r = r.option("versionAsOf", version)
    return frozenset(r.load(path).where(delta_io.partition_predicate(keys)).inputFiles())


def bronze_moved(spark: SparkSession, cfg: Config, keys: set[tuple[str, str]], before: dict, after: dict) -> bool:
    """Whether bronze's `keys` partitions hold other files in `after` than in `before` (two
    `bronze_files`). The same version is the same files (no job); another version, a commit to
    any partition, is compared by the files of `keys` at both versions (time travel)."""
    for stream in STREAMS:
        a, b = before.get(stream), after.get(stream)
        if a == b:
            continue
        path = table_path(cfg, bronze_table(stream))
        if isinstance(a, int) and isinstance(b, int):
            a, b = _partition_files(spark, path, keys, a), _partition_files(spark, path, keys, b)
        if a != b:
            return True
    return False


def run(spark: SparkSession, cfg: Config, keys: set[tuple[str, str]], input_dir: str,
        count: bool = True) -> int | None:
    """Rebuild silver.connections for the (node_id, hour) partitions `keys`; returns its row count
    there (None without `count`: a read of the partitions just written, which the stream does not
    need). Raises BronzeMoved when bronze changed under it (callers retry)."""
    if not keys:
        return 0
    ref_path = storage.join(input_dir, "reference", "ip_asn_region.csv")
    rows = read_reference(ref_path, cfg) if storage.exists(cfg, ref_path) else []
    transport, access, qoe = extract(spark, cfg, keys)
    read = bronze_files(spark, cfg, keys)
    conns = build_connections(transport, access, qoe, reference_frame(spark, rows), reference_levels(rows))
    path = table_path(cfg, CONNECTIONS)
    # add_columns: a silver table written before a column was added (delivery_rate_bps) gains it
    with conf_set(spark, {**CO_PARTITIONED, **silver_parquet(SILVER_COLS)}):
        delta_io.replace_partitions(conns, path, keys, constraints=SILVER_CONSTRAINTS, add_columns=True,
                                    properties=SILVER_PROPERTIES)
    if bronze_moved(spark, cfg, keys, read, bronze_files(spark, cfg, keys)):
        raise BronzeMoved(f"bronze of {len(keys)} (node, hour) partitions changed while silver was rebuilt from it")
    # the same partitions' per-node feature statistics (per-node standardization, issue 55)
    node_stats.write(spark, cfg, keys)
    return spark.read.format("delta").load(path).where(delta_io.partition_predicate(keys)).count() if count else None
