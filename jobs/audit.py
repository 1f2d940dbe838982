"""`ccs audit`: the lake's invariants, checked on what the tables hold (issue 61).

- **identity**: one accepted bronze line per identity (`contract.IDENTITY`) in each bronze table,
  one silver.connections row and one gold.predictions row per (node_id, conn_id);
- **balance**: every gold.ingest_audit row has lines_read = accepted + quarantined, and agrees
  with the bronze lines of its unit (a file's lines in bronze are the audit's, per status; a
  Kafka source's unit is a micro-batch's offset range of one partition, `jobs/stream_sources.py`,
  whose records the source quarantined before the parse are in bronze.quarantine only), and
  bronze.quarantine holds exactly bronze's quarantined lines and those records;
- **traceable**: every silver row has its accepted bronze.transport line (same node, hour, conn_id);
- **scored**: in every (node, hour) that gold.predictions holds, one prediction per silver row and
  none for a connection silver does not hold.

Each check is a query over the tables (no writes); `run` returns what breaks, with examples.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import IDENTITY, STREAMS
from ccselect.lake import (BRONZE_TRANSPORT, CONNECTIONS, INGEST_AUDIT, PREDICTIONS, QUARANTINE, bronze_table,
                           table_path)
from ccselect.jobs.stream_sources import NO_HOUR, NO_NODE, SCHEME

#: examples shown per broken check
EXAMPLES = 5


@dataclass
class Finding:
    check: str
    table: str
    what: str
    count: int
    examples: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"check": self.check, "table": self.table, "what": self.what, "count": self.count,
                "examples": self.examples}

    def line(self) -> str:
        return f"{self.check}: {self.table}: {self.count} {self.what}; e.g. {self.examples}"


def _read(spark: SparkSession, cfg: Config, name: str) -> DataFrame | None:
    path = table_path(cfg, name)
    return spark.read.format("delta").load(path) if delta_io.is_delta(spark, path) else None


def _finding(check: str, table: str, what: str, bad: DataFrame, cols: list[str]) -> Finding | None:
    rows = bad.select(*cols).limit(EXAMPLES).collect()
    if not rows:
        return None
    return Finding(check, table, what, bad.count(), [{c: r[c] for c in cols} for r in rows])


def _identity_of(stream: str):
    fields = IDENTITY[stream]
    return F.to_json(F.struct(*[F.col("record")[f].alias(f) for f in fields]) if fields else F.col("record"))


def identity_checks(spark: SparkSession, cfg: Config) -> list[Finding | None]:
    out = []
    for stream in STREAMS:
        b = _read(spark, cfg, bronze_table(stream))
        if b is not None:
            rep = (b.where(F.col("status") == "ok").groupBy("node_id", "hour", _identity_of(stream).alias("identity"))
                   .count().where("count > 1"))
            out.append(_finding("identity", bronze_table(stream), "identities accepted more than once", rep,
                                ["node_id", "hour", "identity", "count"]))
    for name in (CONNECTIONS, PREDICTIONS):
        t = _read(spark, cfg, name)
        if t is not None:
            rep = t.groupBy("node_id", "conn_id").agg(F.count(F.lit(1)).alias("count"),
                                                      F.collect_set("hour").alias("hours")).where("count > 1")
            out.append(_finding("identity", name, "connections with more than one row", rep,
                                ["node_id", "conn_id", "count", "hours"]))
    return out


def _units(rows: DataFrame, audit: DataFrame) -> DataFrame:
    """`rows` (with source_file, line_no) and `unit`, the gold.ingest_audit row that counts each:
    its file, or for a Kafka record the `kafka://<topic>/<partition>@<first>-<last>` range of the
    micro-batch that read its offset (null when no audit row holds it)."""
    m = r"^(" + SCHEME + r".*)@([0-9]+)-([0-9]+)$"
    ranges = audit.select(F.col("source_file").alias("unit"), F.regexp_extract("source_file", m, 1).alias("_base"),
                          F.regexp_extract("source_file", m, 2).alias("_lo"),
                          F.regexp_extract("source_file", m, 3).alias("_hi")).where("_base != ''")
    kafka = F.col("source_file").startswith(SCHEME)
    at = ((F.col("source_file") == F.col("_base")) & (F.col("line_no") >= F.col("_lo").cast("long"))
          & (F.col("line_no") <= F.col("_hi").cast("long")))
    return rows.where(~kafka).withColumn("unit", F.col("source_file")).unionByName(
        rows.where(kafka).join(ranges, at, "left").drop("_base", "_lo", "_hi"))


def balance_checks(spark: SparkSession, cfg: Config) -> list[Finding | None]:
    audit = _read(spark, cfg, INGEST_AUDIT)
    if audit is None:
        return []
    out = [_finding("balance", INGEST_AUDIT, "rows with lines_read != accepted + quarantined",
                    audit.where("lines_read != accepted + quarantined"),
                    ["source_file", "lines_read", "accepted", "quarantined"])]
    q = _read(spark, cfg, QUARANTINE)
    # records a Kafka source quarantined before the parse: in the audit and bronze.quarantine only
    unparsed = (q.where(F.col("reason").isin(NO_NODE, NO_HOUR)).select("source_file", "line_no", F.lit("quarantined")
                                                                         .alias("status"))
                if q is not None else None)
    lines = None
    for stream in STREAMS:
        b = _read(spark, cfg, bronze_table(stream))
        if b is not None:
            s = b.select("source_file", "line_no", "status")
            lines = s if lines is None else lines.unionByName(s)
    if lines is not None or unparsed is not None:
        lines = unparsed if lines is None else (lines if unparsed is None else lines.unionByName(unparsed))
        per_unit = _units(lines, audit).groupBy("unit").agg(
            F.count(F.lit(1)).alias("b_lines"),
            F.sum(F.when(F.col("status") == "ok", 1).otherwise(0)).alias("b_accepted"),
            F.sum(F.when(F.col("status") == "quarantined", 1).otherwise(0)).alias("b_quarantined"))
        per_row = audit.groupBy(F.col("source_file").alias("unit")).agg(
            F.sum("lines_read").alias("lines_read"), F.sum("accepted").alias("accepted"),
            F.sum("quarantined").alias("quarantined"), F.count(F.lit(1)).alias("audit_rows"))
        both = per_row.join(per_unit, "unit", "full").withColumnRenamed("unit", "source_file")
        z = lambda c: F.coalesce(F.col(c), F.lit(0))    # noqa: E731  (a file with no lines, or no row)
        bad = both.where((z("lines_read") != z("b_lines")) | (z("accepted") != z("b_accepted"))
                         | (z("quarantined") != z("b_quarantined")) | (z("audit_rows") > 1))
        out.append(_finding("balance", INGEST_AUDIT, "files or offset ranges whose audit rows disagree with "
                            "their bronze lines (or have none, or several)", bad,
                            ["source_file", "audit_rows", "lines_read", "b_lines", "accepted", "b_accepted"]))
    if q is not None and lines is not None:
        quarantined = lines.where(F.col("status") == "quarantined").select("source_file", "line_no")
        keys = q.select("source_file", "line_no")
        extra = keys.join(quarantined, ["source_file", "line_no"], "left_anti").withColumn("in", F.lit("quarantine only"))
        missing = quarantined.join(keys, ["source_file", "line_no"], "left_anti").withColumn("in", F.lit("bronze only"))
        twice = keys.groupBy("source_file", "line_no").count().where("count > 1").drop("count") \
            .withColumn("in", F.lit("quarantine twice"))
        out.append(_finding("balance", QUARANTINE, "quarantined lines not one-to-one with bronze's",
                            extra.unionByName(missing).unionByName(twice), ["source_file", "line_no", "in"]))
    return out


def traceable_checks(spark: SparkSession, cfg: Config) -> list[Finding | None]:
    silver = _read(spark, cfg, CONNECTIONS)
    bronze = _read(spark, cfg, BRONZE_TRANSPORT)
    if silver is None:
        return []
    if bronze is None:
        return [_finding("traceable", CONNECTIONS, "rows with no accepted bronze.transport line", silver,
                         ["node_id", "hour", "conn_id"])]
    ok = bronze.where(F.col("status") == "ok").select("node_id", "hour", F.col("record.conn_id").alias("conn_id"))
    orphans = silver.select("node_id", "hour", "conn_id").join(ok, ["node_id", "hour", "conn_id"], "left_anti")
    return [_finding("traceable", CONNECTIONS, "rows with no accepted bronze.transport line", orphans,
                     ["node_id", "hour", "conn_id"])]


def scored_checks(spark: SparkSession, cfg: Config) -> list[Finding | None]:
    preds = _read(spark, cfg, PREDICTIONS)
    silver = _read(spark, cfg, CONNECTIONS)
    if preds is None or silver is None:
        return []
    keys = ["node_id", "hour", "conn_id"]
    scored = preds.select("node_id", "hour").distinct()
    s = silver.select(*keys).join(F.broadcast(scored), ["node_id", "hour"])
    p = preds.select(*keys)
    unscored = s.join(p, keys, "left_anti")
    stray = p.join(silver.select(*keys), keys, "left_anti")
    return [_finding("scored", PREDICTIONS, "silver rows of a scored hour without a prediction", unscored, keys),
            _finding("scored", PREDICTIONS, "predictions of connections silver does not hold", stray, keys)]


def run(spark: SparkSession, cfg: Config) -> dict:
    """Every check; {"clean": bool, "findings": [...]} (a finding per broken check, with examples)."""
    found = [f for check in (identity_checks, balance_checks, traceable_checks, scored_checks)
             for f in check(spark, cfg) if f is not None]
    return {"clean": not found, "findings": [f.to_dict() for f in found], "lines": [f.line() for f in found]}
