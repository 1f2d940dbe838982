"""Delta writes keyed by partition, so that every load is safe to repeat (never a blind append).

`replace_partitions` overwrites exactly the (node_id, hour) partitions named — also those that
now have no rows — in one Delta commit: a writer killed before the commit leaves the table as it
was (its half-written files are not referenced by the log), and a re-run replaces the same keys.
A new table with CHECK constraints or properties is first created empty with them, in one commit
(`create_table`), so that adding them never scans data (Delta validates every later write against
them as it is written); one with neither is created by its first write.

Writers cooperate (issue 61): a step that loses Delta's commit race to another writer (the stream
and a backfill of the same hour) is run again, a bounded number of times with backoff
(`retry_conflicts`), then fails naming the other writer's operation.
"""
from __future__ import annotations

import json
import os
import random
import re
import time
from typing import Callable, Iterable, TypeVar

from pyspark.sql import DataFrame, SparkSession

from ccselect import delta_arrow

# Imported inside the functions that use them (heavy, not needed to import this module): delta.

PARTITION_COLS = ("node_id", "hour")
T = TypeVar("T")


def _quote(v: str) -> str:
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def partition_predicate(keys: Iterable[tuple[str, ...]], cols: tuple[str, ...] = PARTITION_COLS) -> str:
    """A SQL predicate true exactly on the partitions `keys` (tuples over `cols`), as a union of
    rectangles: `(node_id IN (...) AND hour IN (...)) OR ...`. An ingest of 12 nodes x 24 hours is
    one term, not 288 ORs: Delta checks a replaceWhere predicate on every row written and Spark
    plans an OR chain term by term (measured on 738k lines: a write 22.6 s with the OR chain,
    15.4 s with the rectangle; a read 2.4 s vs 1.0 s)."""
    keys = set(keys)
    if not keys:
        raise ValueError("no partitions to replace")
    return " OR ".join(f"({t})" for t in _rectangles(keys, tuple(cols)))


def _rectangles(keys: set[tuple[str, ...]], cols: tuple[str, ...]) -> list[str]:
    """Exact cover of `keys` by rectangles: the values of the last column are grouped by the set
    of prefixes (the other columns) they occur with, and each group's prefixes are covered the
    same way, recursively."""
    def in_list(col: str, values) -> str:
        values = sorted(values)
        if len(values) == 1:
            return f"{col} = {_quote(values[0])}"
        return f"{col} IN (" + ", ".join(_quote(v) for v in values) + ")"

    if len(cols) == 1:
        return [in_list(cols[0], {k[0] for k in keys})]
    prefixes: dict[str, set] = {}
    for k in keys:
        prefixes.setdefault(k[-1], set()).add(k[:-1])
    groups: dict[frozenset, list[str]] = {}
    for last, pre in prefixes.items():
        groups.setdefault(frozenset(pre), []).append(last)
    terms = []
    for pre, lasts in sorted(groups.items(), key=lambda g: sorted(g[1])):
        inner = _rectangles(set(pre), cols[:-1])
        head = inner[0] if len(inner) == 1 else "(" + " OR ".join(f"({t})" for t in inner) + ")"
        terms.append(f"{head} AND {in_list(cols[-1], lasts)}")
    return terms


def tune(spark: SparkSession) -> None:
    """Delta rebuilds a table's state with 50 partitions by default: on a few local cores that
    costs seconds per commit, so follow the session's shuffle partitions instead."""
    if spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is None:
        spark.conf.set("spark.databricks.delta.snapshotPartitions", spark.conf.get("spark.sql.shuffle.partitions"))


def is_delta(spark: SparkSession, path: str) -> bool:
    """Whether `path` holds a Delta table (a commit in its log): a local table's log is looked at
    directly (`table_version`), others are asked of Delta (a call into the JVM that updates the
    table's log)."""
    tune(spark)
    v = table_version(spark, path)
    if v is not None:
        return v >= 0
    from delta.tables import DeltaTable
    return DeltaTable.isDeltaTable(spark, path)


def replace_partitions(df: DataFrame, path: str, keys: Iterable[tuple[str, ...]],
                       cols: tuple[str, ...] = PARTITION_COLS, constraints: dict[str, str] | None = None,
                       add_columns: bool = False, properties: dict[str, str] | None = None,
                       partition_by: tuple[str, ...] | None = None, types: dict[str, str] | None = None) -> None:
    """Overwrite the rows with keys `keys` (tuples over `cols`) of the Delta table at `path` with
    `df`, in one commit; `constraints` (name → CHECK expression) are added first where missing.
    `types` (column → type): an existing table's narrower columns are widened first (`widen`).
    With `add_columns`, columns `df` has and the table lacks are added (older rows read them as
    null). `properties` (Delta table properties) are set when the table is created, and on an
    existing table that lacks them or has other values (one commit, once). The table is
    partitioned by `partition_by` (default: `cols`, so that whole partitions are replaced); a
    table written with another partitioning is rewritten once with this one."""
    pred = partition_predicate(keys, cols)
    spark = df.sparkSession
    partition_by = tuple(cols if partition_by is None else partition_by)
    if not is_delta(spark, path):
        if constraints or properties:
            create_table(spark, path, df.schema, partition_by, properties, constraints)
    else:
        if partition_by != tuple(cols):
            _ensure_partitioning(spark, path, partition_by)
        # one read of the table's properties serves both checks
        have = _properties(spark, path) if constraints or properties else {}
        if constraints:
            ensure_constraints(spark, path, constraints, have)
        if properties:
            ensure_properties(spark, path, properties, have)
        if types:
            widen(spark, path, types)
    w = df.write.format("delta").partitionBy(*partition_by).mode("overwrite").option("replaceWhere", pred)
    if add_columns:
        w = w.option("mergeSchema", "true")
    w.save(path)


def _nullable(t: dict) -> dict:
    """A schema's JSON with every field, array element and map value nullable (as Delta stores a
    table created by a DataFrame write)."""
    if isinstance(t, dict):
        t = {k: _nullable(v) for k, v in t.items()}
        for key in ("nullable", "containsNull", "valueContainsNull"):
            if key in t:
                t[key] = True
    elif isinstance(t, list):
        t = [_nullable(v) for v in t]
    return t


def create_table(spark: SparkSession, path: str, schema, partition_by: tuple[str, ...],
                 properties: dict[str, str] | None = None, constraints: dict[str, str] | None = None) -> None:
    """Create an empty Delta table at `path` with its `properties` and CHECK `constraints` (name →
    expression) in one commit. A CHECK constraint is the table property `delta.constraints.<name>`
    (Delta's PROTOCOL.md, "Check Constraints"), what ALTER TABLE ADD CONSTRAINT writes, one commit
    each; creating a fresh table as a limit(0) write, a property commit and a commit per
    constraint cost about 1 s a commit on 2 cores (silver: six commits before its data)."""
    from delta.tables import DeltaTable
    from pyspark.sql import types as T
    tune(spark)
    b = (DeltaTable.createIfNotExists(spark).location(path)
         .addColumns(T.StructType.fromJson(_nullable(schema.jsonValue()))).partitionedBy(*partition_by))
    for k, v in (properties or {}).items():
        b = b.property(k, str(v))
    for name, expr in (constraints or {}).items():
        b = b.property(f"delta.constraints.{name.lower()}", expr)
    b.execute()


def _ensure_partitioning(spark: SparkSession, path: str, partition_by: tuple[str, ...]) -> None:
    from delta.tables import DeltaTable
    have = tuple(DeltaTable.forPath(spark, path).detail().select("partitionColumns").first()[0])
    if have != partition_by:
        (spark.read.format("delta").load(path).write.format("delta").mode("overwrite")
         .option("overwriteSchema", "true").partitionBy(*partition_by).save(path))


def overwrite(df: DataFrame, path: str, partition_cols: tuple[str, ...] = ()) -> None:
    w = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    if partition_cols:
        w = w.partitionBy(*partition_cols)
    w.save(path)


def _properties(spark: SparkSession, path: str) -> dict[str, str]:
    return {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}


def ensure_properties(spark: SparkSession, path: str, properties: dict[str, str],
                      have: dict[str, str] | None = None) -> None:
    """Set the Delta table properties that the table lacks or holds other values of (one commit;
    none when all are there); `have`: the table's properties, when the caller has read them."""
    have = _properties(spark, path) if have is None else have
    todo = {k: str(v) for k, v in properties.items() if have.get(k) != str(v)}
    if todo:
        sets = ", ".join(f"{_quote(k)} = {_quote(v)}" for k, v in sorted(todo.items()))
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({sets})")


#: the Delta table property that lets a column's type be widened in place (Delta's type widening:
#: int → bigint among others, the files written before read as the wider type, no rewrite)
TYPE_WIDENING = "delta.enableTypeWidening"


def widen(spark: SparkSession, path: str, types: dict[str, str]) -> list[str]:
    """Widen the columns of the Delta table at `path` whose type is not `types`' (column → type,
    e.g. line_no → bigint) with ALTER COLUMN … TYPE, type widening (`TYPE_WIDENING`) turned on
    first: a commit each, none when the table is already so (or absent, or lacks the column). A
    Delta append refuses a column of another width in either direction (DELTA_FAILED_TO_MERGE_FIELDS),
    so a table created before its writers agreed on the type is widened once, here. A change that
    is not a widening fails in Delta, loudly. Returns the columns changed."""
    from delta.tables import DeltaTable
    if not is_delta(spark, path):
        return []
    schema = DeltaTable.forPath(spark, path).toDF().schema
    todo = [c for c, t in types.items() if c in schema.fieldNames() and schema[c].dataType.simpleString() != t]
    if todo:
        ensure_properties(spark, path, {TYPE_WIDENING: "true"})
        for c in todo:
            spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN `{c}` TYPE {types[c]}")
    return todo


def ensure_constraints(spark: SparkSession, path: str, constraints: dict[str, str],
                       have: dict[str, str] | None = None) -> None:
    """Add the named Delta CHECK constraints the table does not have yet; `have`: the table's
    properties, when the caller has read them."""
    props = _properties(spark, path) if have is None else have
    for name, expr in constraints.items():
        if f"delta.constraints.{name.lower()}" not in props:
            spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT {name} CHECK ({expr})")


# ---- writers that cooperate ---------------------------------------------------------------------

#: Delta's optimistic-concurrency conflicts: another writer committed to what this one read.
CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
             "ConcurrentTransactionException", "MetadataChangedException", "ProtocolChangedException",
             "DELTA_CONCURRENT_")
#: How often a conflicted step is tried, and the first wait (doubled each time, with jitter).
RETRY_ATTEMPTS = 5
RETRY_BACKOFF_S = 0.5


class WriteConflict(RuntimeError):
    """A step that kept losing Delta's commit race; the message names the other writer."""


def conflict_in(error: BaseException) -> bool:
    """Whether `error` is a lost commit race: Delta's (by name: py4j and pyspark wrap them) or one
    a caller found itself and marked `conflict = True`."""
    if getattr(error, "conflict", False):
        return True
    text = f"{type(error).__name__}: {error}"
    return any(name in text for name in CONFLICTS)


def other_writer(error: BaseException) -> str:
    """The winning commit as Delta's conflict message gives it (`Conflicting commit: {...}`): its
    operation, parameters, version and the writer's metadata (the stream tags its commits)."""
    text = str(error)
    m = re.search(r"Conflicting commit: (\{.*\})", text)
    if not m:
        return text.strip().splitlines()[0][:300] if text.strip() else type(error).__name__
    try:
        c = json.loads(m.group(1))
    except ValueError:
        return m.group(1)[:300]
    params = c.get("operationParameters") or {}
    keep = {k: params[k] for k in ("mode", "predicate") if k in params}
    who = f" by {c['userMetadata']}" if c.get("userMetadata") else ""
    return f"{c.get('operation', '?')} {json.dumps(keep)}{who} (version {c.get('version', '?')})"


def retry_conflicts(step: Callable[[], T], what: str, attempts: int = RETRY_ATTEMPTS,
                    backoff_s: float = RETRY_BACKOFF_S, log: Callable[[str], None] | None = None) -> T:
    """Run `step` (a whole read-then-write, so a retry reads again) up to `attempts` times while
    it loses a Delta conflict, waiting backoff_s, 2·backoff_s, ... (with jitter) in between; then
    raise WriteConflict naming the other writer's operation."""
    for i in range(attempts):
        try:
            return step()
        except Exception as e:      # py4j and pyspark wrap Delta's exceptions: matched by name
            if not conflict_in(e):
                raise
            if i == attempts - 1:
                raise WriteConflict(f"{what}: gave up after {attempts} attempts; another writer kept committing "
                                    f"to the same partitions: {other_writer(e)}") from e
            wait = backoff_s * 2 ** i * (1 + random.random() / 2)
            if log:
                log(f"{what}: conflict with {other_writer(e)}; retrying in {wait:.1f} s")
            time.sleep(wait)
    raise AssertionError("unreachable")


# ---- the Delta log, read without a Spark job ----------------------------------------------------

#: a commit file or a checkpoint (one file, or a part of several) of the version it names
_VERSIONED = re.compile(r"^(\d{20})\.(json|checkpoint\.)")


def _local_log(path: str) -> str | None:
    """The `_delta_log` folder of a table on the local filesystem (`delta_arrow.local_path`); None
    for any other scheme."""
    try:
        return os.path.join(delta_arrow.local_path(path), "_delta_log")
    except delta_arrow.Unsupported:
        return None


def _newest_version(log: str) -> int:
    """The newest committed version in the local `_delta_log` `log` (-1 when there is none): from
    the last checkpoint Delta recorded, the commits after it (Delta commits a version by renaming
    its complete JSON file into place, so a file that exists is a whole commit)."""
    try:
        with open(os.path.join(log, "_last_checkpoint")) as fh:
            v = int(json.load(fh)["version"])
    except (OSError, ValueError, KeyError):
        # no checkpoint yet (a young table): the newest commit or checkpoint file listed
        found = [int(m.group(1)) for m in map(_VERSIONED.match, os.listdir(log) if os.path.isdir(log) else []) if m]
        v = max(found, default=-1)
    while os.path.exists(os.path.join(log, f"{v + 1:020d}.json")):
        v += 1
    return v


def table_version(spark: SparkSession, path: str) -> int | None:
    """The Delta table's newest version (-1: no table); None where it cannot be read without Spark
    (a table on object storage)."""
    log = _local_log(path)
    return None if log is None else _newest_version(log)


def recent_commits(spark: SparkSession, path: str, n: int) -> list[dict]:
    """The newest `n` commits of the Delta table at `path` as `DESCRIBE HISTORY` gives them
    (version, readVersion, operation, userMetadata), newest first. A local table's commit files
    are read directly (each holds its commitInfo action): Delta's history is a Spark job of its own,
    most of a micro-batch's cost in jobs (bench/stream_batch.py); other tables go through it."""
    log = _local_log(path)
    if log is None:
        from delta.tables import DeltaTable
        return [r.asDict() for r in DeltaTable.forPath(spark, path).history(n)
                .select("version", "readVersion", "operation", "userMetadata").collect()]
    out = []
    v = _newest_version(log)
    while v >= 0 and len(out) < n:
        try:
            fh = open(os.path.join(log, f"{v:020d}.json"))
        except FileNotFoundError:       # cleaned up by log retention: older ones are gone too
            break
        with fh:
            info = next((a["commitInfo"] for a in map(json.loads, fh) if "commitInfo" in a), {})
        out.append({"version": v, "readVersion": info.get("readVersion"), "operation": info.get("operation"),
                    "userMetadata": info.get("userMetadata")})
        v -= 1
    return out
