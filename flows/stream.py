"""`ccs stream`: the edge's rotated log segments → bronze, quarantine, audit, silver and
gold.predictions within a micro-batch of their arrival, and a signed prefix→CC table over a
sliding window every few minutes of traffic (an application step: it wires jobs, models and
export, as ccs_hourly's tasks do) (issue 26; ALICCS §3.3 and Observation IV: a prefix's
network type changes within hours, so an hour-old table is already partly wrong).

One Spark Structured Streaming query, file source over the segments of the data contract
(`<input>/<stream>/<node>/<YYYY-MM-DDTHHMM>[.<seq>].jsonl`, ccselect/contract.py; the agent renames
a segment into place when it is complete, so the source never sees half a file), and per
micro-batch (`foreachBatch`), in the driver:

1. **Parse** with batch ingest's own code: `jobs.sources.explode_lines` cuts the lines,
   `jobs.ingest.to_bronze` (jobs/parse.py) types and judges them — one parser, two callers, the
   same quarantine reasons.
2. **Bronze, quarantine and audit** are appended once per batch (quarantine only when the batch
   has a line to quarantine: no empty commit): bronze tagged with the batch
   (`userMetadata` `<query id>:<batch id>`), quarantine and audit with Delta's idempotent-write
   options (`txnAppId` = this query's id from its checkpoint, `txnVersion` = the batch id): a batch
   replayed after a crash (the source's offset log gives it the same files) skips every table it
   had already committed. The lines are judged by identity against bronze as committed before
   the batch (issue 61, jobs/README.md "Identity"): a repeat is quarantined, a line read before
   (a new checkpoint over old segments) is left out. Audit: one row per file, lines_read =
   accepted + quarantined.
3. **Silver** is rebuilt for every (node, hour) the batch touched from bronze as committed
   (`jobs.silver.run`, `replaceWhere`): a pure function of bronze, so a replay writes it again
   identically, and a connection whose access-log label or QoE beacon arrives in a later segment
   is joined when that segment comes.
4. **gold.predictions** for the same partitions with `models:/<name>@champion`, resolved at every
   batch: a newly promoted champion scores the next batch, no restart.
5. **The table.** The stream's clock is the data's: T = the newest ts_end_ms seen. When T passes a
   boundary b (a multiple of `stream.table_minutes`) past the last table's, Algorithm 1 runs over
   the predictions of connections closed in (b − window, b] (`aggregate.window_predictions`, the
   hourly export's code: `aggregate.run_export`); when it would give less than `stream.min_change`
   of the window's request weight another CC than the last emitted table (the guards' flip share),
   and that one is younger than `stream.refresh_hours`, nothing is emitted. Otherwise the version is signed, recorded in gold.cc_tables with its window
   (`source_hours.from_ms/to_ms`), and goes through `flows.pipeline.rollout`: the guards, the store
   and the canary-first rollout of the hourly path. A refused table is logged; the live one stays.
   Being a function of the lake (the last table and its window are read back from gold.cc_tables),
   a restart continues where the stream stood.

A malformed line is quarantined like in batch; a file the contract does not name is logged and
left alone; neither stops the query. The hourly `ccs ingest` reads the same segments (a node-hour
at a time) for backfills: both write the same rows.
"""
from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Callable

from pyspark.sql import DataFrame, SparkSession, functions as F, types as T

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import STREAMS
from ccselect.hours import Window, hour_of_ms
from ccselect.lake import CONNECTIONS, INGEST_AUDIT, QUARANTINE, bronze_table, table_path
from ccselect.spark import conf_set
from ccselect.jobs import silver as silver_job
from ccselect.jobs.ingest import (AUDIT_CONSTRAINTS, BRONZE_PROPERTIES, LINE_TYPES, QUARANTINE_PROPERTIES, files_frame,
                                  judge_against, summarize, to_audit, to_bronze, to_quarantine)
from ccselect.jobs.parse import imputable_of
from ccselect.jobs import stream_sources
from ccselect.jobs.stream_sources import SEGMENT_GLOB  # noqa: F401  (where it was)
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, and our modules that load torch or mlflow (models, export, flows.pipeline).

#: Spark settings for a micro-batch: no adaptive execution. A micro-batch is a minute of segments
#: (tens to a few thousand lines); with adaptive execution each of its shuffles and broadcasts ran
#: as a Spark job of its own, re-planned after it. Measured by bench/stream_batch.py, warm
#: micro-batches of 2 nodes' minute (42-128 lines), 2 cores at load 11-15 (other engineers' work):
#: 106 Spark jobs a batch and a median of 50.2 s with it, 71 jobs and 42.2 s without
#: (docs/results/stream-batch.md and its data/stream-batch.json). The guarantees do not depend
#: on it (the plans' results are the same; only how Spark schedules them changes).
MICRO_BATCH_CONF = {"spark.sql.adaptive.enabled": "false"}
#: fault injection for the crash test: `CCS_STREAM_CRASH=<stage>:<batch id>` makes the process
#: kill itself with SIGKILL after that stage of that batch (stages: bronze, silver, predictions)
CRASH_ENV = "CCS_STREAM_CRASH"


def checkpoint_dir(cfg: Config) -> str:
    return cfg.settings.stream.checkpoint or os.path.join(cfg.data_root, "stream", "checkpoint")


def source(spark: SparkSession, input_dir: str, max_files: int) -> DataFrame:
    """The file source: a row per new segment (its path as `uri`, its text as `value`)."""
    return stream_sources.FileSource(input_dir, max_files).read(spark)


def batch_tag(app_id: str, version: int) -> str:
    """What the stream writes as a commit's `userMetadata`: which query and batch made it (a
    conflict message names it; a replayed batch finds its own commits by it)."""
    return f"{app_id}:{int(version)}"


def _history(spark: SparkSession, path: str, n: int = 50) -> list[dict]:
    # the table's commits read from its log (a local lake: no Spark job; delta_io.recent_commits)
    return delta_io.recent_commits(spark, path, n)


def as_before(spark: SparkSession, path: str, app_id: str, version: int) -> tuple[DataFrame | None, int, bool]:
    """(the Delta table at `path` as it stood before batch `version` of query `app_id` appended to
    it, or as it is now if that batch has not; the version read; whether the batch's append is
    there). A replayed batch judges its lines against what its first try saw, and does not append
    them again. (None, -1, False) when there is no table then."""
    if not delta_io.is_delta(spark, path):
        return None, -1, False
    rows = _history(spark, path)
    tag = batch_tag(app_id, version)
    mine = sorted((r for r in rows if r["userMetadata"] in (tag, tag + UNDONE)), key=lambda r: r["version"])
    done = bool(mine) and mine[-1]["userMetadata"] == tag
    v = mine[-1]["version"] - 1 if done else max(r["version"] for r in rows)
    # pinned to version v by time travel even when v is the newest: the judged rows are computed
    # lazily, and a read of "the table as it is" was planned again after the batch's own append
    # and judged the batch's lines against themselves (tried: every line left out as read before)
    return (spark.read.format("delta").option("versionAsOf", v).load(path) if v >= 0 else None), v, done


#: the userMetadata suffix of the commit that takes back a batch's append judged against a stale read
UNDONE = ":undone"
#: the userMetadata suffix of the empty table's CREATE TABLE commit a batch made for its first append
#: (a fresh lake): the batch's own commit, not another writer's (issue 60: it was taken for one, and
#: the first batch into a fresh lake was taken back and judged twice)
CREATED = ":created"


class StaleJudgment(RuntimeError):
    """Another writer committed to the table between the batch's read and its append (Delta's
    conflict check starts at the append's own snapshot): the append is taken back and the batch
    judged again (delta_io.retry_conflicts runs it again)."""
    conflict = True


def append_judged(df: DataFrame, path: str, app_id: str, version: int, read_version: int, ingest_time: datetime,
                  keys: set[tuple[str, str]], properties: dict[str, str] | None = None) -> None:
    """Append bronze rows judged against version `read_version` of the table, as one commit that
    conflicts with any writer of the same partitions (a `replaceWhere` that matches only this
    batch's own rows: Delta checks the partitions it read); if another writer committed between
    `read_version` and that commit, take the rows back and raise StaleJudgment."""
    spark = df.sparkSession
    tag = batch_tag(app_id, version)
    if not delta_io.is_delta(spark, path) and properties:
        with conf_set(spark, {"spark.databricks.delta.commitInfo.userMetadata": tag + CREATED}):
            delta_io.create_table(spark, path, df.schema, ("node_id", "hour"), properties)
    # the batch's rows are those of its ingest time, as Spark stored it (no time zone in a literal)
    micros = T.TimestampType().toInternal(ingest_time)
    mine = f"({delta_io.partition_predicate(keys)}) AND ingest_time = timestamp_micros({micros})"
    exists = delta_io.is_delta(spark, path)
    w = df.write.format("delta").partitionBy("node_id", "hour").option("userMetadata", tag)
    (w.mode("overwrite").option("replaceWhere", mine) if exists else w.mode("append")).save(path)
    rows = _history(spark, path, 20)
    own = max((r["version"] for r in rows if r["userMetadata"] == tag), default=None)
    if own is None:          # nothing to write (every line was read before): no commit
        return
    others = [r for r in rows if read_version < r["version"] < own and r["userMetadata"] not in (tag, tag + CREATED)]
    if others:
        from delta.tables import DeltaTable
        with conf_set(spark, {"spark.databricks.delta.commitInfo.userMetadata": tag + UNDONE}):
            DeltaTable.forPath(spark, path).delete(mine)
        o = max(others, key=lambda r: r["version"])
        raise StaleJudgment(f"{o['operation']} by {o['userMetadata'] or 'another writer'} (version {o['version']}) "
                            f"committed to {path} after this batch read version {read_version}")


def append_once(df: DataFrame, path: str, app_id: str, version: int, partition_by: tuple[str, ...],
                properties: dict[str, str] | None = None, constraints: dict[str, str] | None = None) -> None:
    """Append `df` to the Delta table at `path` unless this (app_id, version) already did
    (Delta's idempotent writes: the commit records the pair, a replay is skipped); the commit's
    userMetadata is `batch_tag`."""
    spark = df.sparkSession
    if not delta_io.is_delta(spark, path):
        if properties or constraints:
            delta_io.create_table(spark, path, df.schema, partition_by, properties, constraints)
    elif constraints:
        delta_io.ensure_constraints(spark, path, constraints)
    (df.write.format("delta").partitionBy(*partition_by).mode("append")
     .option("txnAppId", app_id).option("txnVersion", int(version))
     .option("userMetadata", batch_tag(app_id, version)).save(path))


def _crash_point(stage: str, batch_id: int) -> None:
    spec = os.environ.get(CRASH_ENV, "")
    if spec and spec == f"{stage}:{batch_id}":
        os.kill(os.getpid(), signal.SIGKILL)


def changed_share(new: list, old: list) -> float:
    """Share of the entries of two tables that differ: a prefix in only one of them, or with
    another CC (over the union of their prefixes)."""
    a = {(e.prefix, e.cc) for e in new}
    b = {(e.prefix, e.cc) for e in old}
    nets = {e.prefix for e in new} | {e.prefix for e in old}
    return len(a ^ b) / max(1, len(nets)) if nets else 0.0


class StreamJob:
    """The micro-batch function of the query (`process`) and the table step; state is read back
    from the lake, so a restarted job continues where the last one stood."""

    def __init__(self, spark: SparkSession, cfg: Config, input_dir: str, checkpoint: str,
                 deploy: bool | None = None, log: Callable[[str], None] = print, source=None):
        self.spark, self.cfg, self.input_dir, self.checkpoint = spark, cfg, input_dir, checkpoint
        # where the batches come from (jobs/stream_sources.py): file segments or Kafka records
        self.source = source or stream_sources.make(cfg, input_dir)
        self.deploy, self.log = deploy, log
        self.s = cfg.settings.stream
        self._champion = None
        self._app_id = None
        self._constrained: set[str] = set()     # tables whose constraints this run has seen to
        self._widened: set[str] = set()         # tables whose line_no this run has seen to be a bigint
        self.batches: list[dict] = []

    # ---- identity ----------------------------------------------------------------------------

    @property
    def app_id(self) -> str:
        """The query's id, kept in its checkpoint: the same across restarts, a new one for a new
        checkpoint (whose batch ids start again at 0)."""
        if self._app_id is None:
            with open(os.path.join(self.checkpoint, "metadata")) as fh:
                self._app_id = "ccs-stream-" + json.load(fh)["id"]
        return self._app_id

    # ---- one micro-batch ---------------------------------------------------------------------

    def process(self, batch: DataFrame, batch_id: int) -> None:
        # the batch's files are read once: for their paths, then by each stream's parse
        batch = batch.persist()
        # MICRO_BATCH_CONF on the session the batch came in (foreachBatch's, a clone of the
        # query's) and on this job's, which read the lake
        sessions = list({id(s): s for s in (self.spark, batch.sparkSession)}.values())
        try:
            with ExitStack() as settings:
                for s in sessions:
                    settings.enter_context(conf_set(s, MICRO_BATCH_CONF))
                self._process(batch, batch_id)
        finally:
            batch.unpersist()

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        t0 = time.time()
        spark = self.spark
        got = self.source.take(batch, batch_id, self.log)
        files = got.units       # the audit's units: files, or Kafka (topic, partition, offset range)s
        info: dict = {"batch": batch_id, "files": len(files)}
        stage = {}

        def lap(name: str, t: list = [t0]) -> None:
            now = time.time()
            stage[name] = round(now - t[0], 3)
            t[0] = now
        if files:
            # each step reads what it judges or rebuilds from, then commits: one that loses a
            # commit race (a backfill of the same hour) is run again from its read
            info.update(delta_io.retry_conflicts(lambda: self.ingest(got, batch_id),
                                                 f"stream batch {batch_id}: bronze", log=self.log))
            lap("bronze")
            keys = got.all_keys
            delta_io.retry_conflicts(lambda: silver_job.run(spark, self.cfg, keys, self.input_dir, count=False),
                                     f"stream batch {batch_id}: silver", log=self.log)
            lap("silver")
            _crash_point("silver", batch_id)
            info["predictions"] = delta_io.retry_conflicts(lambda: self.score(keys),
                                                           f"stream batch {batch_id}: predictions", log=self.log)
            lap("predictions")
            _crash_point("predictions", batch_id)
            look = self.look_rollout()
            if look is not None:
                info["rollout_look"] = look
                lap("rollout_look")
            if info.get("max_ts_end_ms") is not None:
                info["table"] = self.table_step(int(info["max_ts_end_ms"]))
                lap("table")
        info["stages_s"] = stage
        if got.arrived:     # how long the batch's records waited for their rows to be in the lake
            now = time.time()
            info["lag_s"] = {"newest": round(now - got.arrived[0], 3), "oldest": round(now - got.arrived[1], 3)}
        info["ended_unix"] = round(time.time(), 3)
        info["seconds"] = round(time.time() - t0, 3)
        self.batches.append(info)
        self.log("stream: " + json.dumps(info, default=str))

    def ingest(self, got: stream_sources.SourceBatch, batch_id: int) -> dict:
        spark, cfg = self.spark, self.cfg
        files, lines = got.units, got.lines
        ingest_time = datetime.now(timezone.utc).replace(tzinfo=None)
        parsed = []
        for stream in STREAMS:
            pkeys = got.keys.get(stream)
            if not pkeys:
                continue
            impute = imputable_of(cfg.settings.ingest, stream)
            path = self.widened(table_path(cfg, bronze_table(stream)))
            b = to_bronze(lines.where(F.col("stream") == stream), stream, ingest_time, impute)
            held, read_version, done = as_before(spark, path, self.app_id, batch_id)
            if held is not None:     # identity across batches, checkpoints and sources (issue 61)
                b = judge_against(b, held.where(delta_io.partition_predicate(pkeys)), stream)
            b = b.persist()
            parsed.append((stream, b))
            if not done:             # (a replayed batch whose append is there: judged as then)
                append_judged(b, path, self.app_id, batch_id, read_version, ingest_time, pkeys, BRONZE_PROPERTIES)
        _crash_point("bronze", batch_id)
        # a file this lake has an audit row of was read before (a new checkpoint over old
        # segments): its lines were left out above, and it gets no second row
        apath = table_path(cfg, INGEST_AUDIT)
        audited = as_before(spark, apath, self.app_id, batch_id)[0]
        if audited is not None and all(f.node_id and f.hour for f in files):
            # a file's audit row is in its (node, hour) partition: only those are read (Kafka's units
            # have neither, and their rows are looked for in the whole table)
            audited = audited.where(delta_io.partition_predicate({(f.node_id, f.hour) for f in files}))
        seen = ({r["source_file"] for r in audited.where(F.col("source_file").isin([f.path for f in files]))
                 .select("source_file").distinct().collect()} if audited is not None else set())
        new_files = [f for f in files if f.path not in seen]
        out: dict = {"max_ts_end_ms": None}
        try:
            every = None        # the lines the source quarantined itself (a Kafka record without node or hour)
            if got.rejected is not None:
                every = got.rejected.withColumn("ingest_time", F.lit(ingest_time))
            for stream, b in parsed:
                cols = b.select("stream", "node_id", "hour", "source_file", "line_no", "raw", "reason", "status",
                                "ingest_time")
                every = cols if every is None else every.unionByName(cols)
                if stream == "transport":
                    out["max_ts_end_ms"] = (b.where(F.col("status") == "ok")
                                            .agg(F.max("record.ts_end_ms")).first()[0])
            qpath = self.widened(table_path(cfg, QUARANTINE))
            qkeys = ("stream", "node_id", "hour")
            if not new_files:
                append_once(to_quarantine(every), qpath, self.app_id, batch_id, qkeys, QUARANTINE_PROPERTIES)
                return {**out, "lines_read": 0, "accepted": 0, "quarantined": 0, "read_before": len(files)}
            audit = to_audit(got.audit_lines(every), files_frame(spark, new_files), ingest_time).persist()
            # the totals, and the quarantined lines per stream and reason (the metrics' by-reason
            # counts); the collect computes the audit rows the append then writes from the cache
            per_stream = summarize(audit)
            # the audit's CHECK constraints are looked for once a run (a read of the table's
            # properties each batch otherwise); Delta enforces them on every later append
            append_once(audit, apath, self.app_id, batch_id, ("node_id", "hour"),
                        constraints=None if apath in self._constrained else AUDIT_CONSTRAINTS)
            self._constrained.add(apath)
            out.update({k: sum(v[k] for v in per_stream.values()) for k in ("lines_read", "accepted", "quarantined")})
            out["quarantined_by_reason"] = {st: v["by_reason"] for st, v in per_stream.items() if v.get("by_reason")}
            audit.unpersist()
            # every line of the batch is in a unit the audit counted just now (no unit was read
            # before): when it counts none quarantined there is nothing to append, and no commit
            # (each commit is a new table version for every later read to load)
            if len(new_files) < len(files) or out["quarantined"]:
                append_once(to_quarantine(every), qpath, self.app_id, batch_id, qkeys, QUARANTINE_PROPERTIES)
        finally:
            for _, b in parsed:
                b.unpersist()
        return out

    def widened(self, path: str) -> str:
        """`path`, its `line_no` widened to a bigint if an older ingest created it an int
        (jobs.ingest.LINE_TYPES): looked at once a run, before the table's first append."""
        if path not in self._widened:
            delta_io.widen(self.spark, path, LINE_TYPES)
            self._widened.add(path)
        return path

    def champion(self):
        """`models:/<name>@champion`, reloaded when the alias has moved; None while there is none."""
        from mlflow.exceptions import MlflowException

        from ccselect.models.registry import CHAMPION, _alias_version, configure, load_champion, model_name
        try:
            version = _alias_version(configure(self.cfg), model_name(self.cfg), CHAMPION)
        except MlflowException:
            version = None
        if version is None:
            self._champion = None
        elif self._champion is None or str(self._champion.version) != str(version):
            self._champion = load_champion(self.cfg)
            self.log(f"stream: scoring with {self._champion.name} v{self._champion.version}")
        return self._champion

    def score(self, keys: set[tuple[str, str]]) -> dict:
        from ccselect.models import infer
        if not keys:        # a batch of records only the source quarantined (no node or hour)
            return {"skipped": "no partitions"}
        champ = self.champion()
        if champ is None:
            return {"skipped": "no @champion"}
        p = self.cfg.settings.infer
        # what `ccs infer` reads (infer.inputs: the features, the evidence counts, `imputed`), so the
        # minimum-evidence and imputed-feature rules decide here as in the batch
        src = infer.inputs(self.spark.read.format("delta").load(table_path(self.cfg, CONNECTIONS))
                           .where(delta_io.partition_predicate(keys)))
        # a per-node standardized champion: each partition's node statistics as `ccs infer` reads
        # them (silver.node_stats, which this batch's silver rebuild has just refreshed)
        table = infer.node_scaling(self.cfg, champ, keys, self.spark)
        with conf_set(self.spark, {"spark.sql.execution.arrow.maxRecordsPerBatch": str(int(p.batch_rows))}):
            infer.load(infer.transform(src, champ, p, table), self.cfg, keys)
        out = {"model_version": champ.version, "partitions": len(keys), "node_stats": infer.node_report(table, champ)}
        if table is not None and out["node_stats"]["fleet_fallback"]:
            self.log(f"stream: {out['node_stats']['fleet_fallback']} of {len(keys)} partitions scored on the "
                     f"fleet's statistics (fleet_fallback: under the champion's minimum of connections)")
        return out

    # ---- the table ---------------------------------------------------------------------------

    def last_table(self) -> dict | None:
        """The newest version the stream emitted (gold.cc_tables rows with a `from_ms` window)."""
        from ccselect.export.tables import aggregate
        rows = [r for r in aggregate.history(self.spark, self.cfg) if "from_ms" in json.loads(r["hours"])]
        return rows[-1] if rows else None

    def table_step(self, max_ts_end_ms: int) -> dict:
        from ccselect.export.artifact import signing, table_format as tf
        from ccselect.export.delivery.guards import flip_share
        from ccselect.export.delivery.publish import key_paths
        from ccselect.export.tables import aggregate
        s = self.s
        step = s.table_minutes * 60_000
        b = max_ts_end_ms // step * step
        last = self.last_table()
        last_to = json.loads(last["hours"])["to_ms"] if last else None
        if last_to is not None and b <= last_to:
            return {"boundary": b, "built": False, "why": "not past the last table's boundary"}
        window = (b - s.window_minutes * 60_000, b)
        priv, pub = key_paths(self.cfg)
        if not os.path.exists(priv):
            return {"boundary": b, "built": False, "why": f"no signing key at {priv}: run `ccs keys init`"}
        preds = aggregate.window_predictions(self.spark, self.cfg, *window, decay_half_life_min=s.half_life_minutes)
        old = []
        if last is not None:
            _, table = signing.read_manifest(last["manifest_path"], signing.load_public_key(pub))
            old = table.entries
        fresh_enough = last is not None and (b - last_to) < s.refresh_hours * 3_600_000
        verdict = {}

        def unless(entries) -> bool:
            # what matters is traffic that would get another CC: the guards' flip share (request
            # weight of the window's addresses whose effective CC differs), not entries that merely
            # moved up or down the ladder
            # None: the stream's first table, nothing to compare with
            verdict["changed"] = round(flip_share(preds, entries, old), 6) if last is not None else None
            verdict["entries_changed"] = round(changed_share(entries, old), 6) if last is not None else None
            verdict["entries"] = len(entries)
            return fresh_enough and verdict["changed"] < s.min_change

        man = aggregate.run_export(self.spark, self.cfg, Window.hours(hour_of_ms(window[0] + 1), hour_of_ms(window[1])),
                                   signing.load_private_key(priv), now=int(time.time()), preds=preds,
                                   window_ms=window, unless=unless)
        out = {"boundary": b, "window_ms": list(window), **verdict}
        if man is None:
            return {**out, "built": False, "why": f"changed {verdict['changed']:.4f} < stream.min_change"}
        out.update({"built": True, "version": man["version"], "coverage": man["coverage"]})
        from ccselect.flows.pipeline import TableRefused, rollout
        try:
            out["rollout"] = rollout(int(man["version"]), self.cfg, deploy_fleet=self.deploy, spark=self.spark,
                                     look=False, clock=self.rollout_clock())
        except TableRefused as e:     # a verdict on this table: the live one stays
            out["rollout"] = {"refused": str(e)}
        except RuntimeError as e:     # the rollout stopped and rolled back: the stream goes on
            out["rollout"] = {"failed": str(e)}
        return out


    def rollout_clock(self):
        """The rollout in flight's clock for this stream (`stream.rollout_clock`): None, the wall's;
        `records`, the segments' under the input folder and silver's (flows/rollout_loop.RecordsClock)."""
        if self.s.rollout_clock != "records":
            return None
        from ccselect.flows.rollout_loop import RecordsClock
        return RecordsClock(self.spark, self.cfg, self.input_dir, self.cfg.settings.export.canary.max_minutes)

    def look_rollout(self) -> dict | None:
        """One look at the rollout in flight (gate canary: export/delivery/inflight.py), now that
        silver holds this batch's outcomes; None when the gate is health or nothing deploys. A
        look that fails is logged and given in the batch's line; the rollout stays in flight."""
        from ccselect.flows.pipeline import look_rollout
        try:
            return look_rollout(self.cfg, self.spark, self.deploy, self.rollout_clock())
        except Exception as e:  # noqa: BLE001 — the rollout's record is unchanged; the next batch looks again
            self.log(f"stream: the look at the rollout in flight failed: {type(e).__name__}: {e}")
            return {"failed": f"{type(e).__name__}: {e}"}


def run(spark: SparkSession, cfg: Config, input_dir: str, once: bool = False, deploy: bool | None = None,
        timeout_s: float | None = None, log: Callable[[str], None] = print, max_files: int | None = None,
        bootstrap: str | None = None) -> dict:
    """Run the stream over `input_dir` until stopped (SIGTERM/SIGINT), `timeout_s`, or — with
    `once` — until every segment there now is processed (Trigger.AvailableNow). `max_files`:
    segments per micro-batch (default `stream.max_files_per_trigger`)."""
    s = cfg.settings.stream
    ckpt = checkpoint_dir(cfg)
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    job = StreamJob(spark, cfg, input_dir, ckpt, deploy, log,
                    source=stream_sources.make(cfg, input_dir, max_files, bootstrap))
    writer = (job.source.read(spark).writeStream
              .foreachBatch(job.process).option("checkpointLocation", ckpt).queryName("ccs_stream"))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{s.trigger_seconds} seconds")
    query = writer.start()
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True
    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    t0 = time.time()
    try:
        while query.isActive and not stop["now"] and (timeout_s is None or time.time() - t0 < timeout_s):
            query.awaitTermination(1)
        if query.exception() is not None:
            raise RuntimeError(f"the stream failed: {query.exception()}")
    finally:
        if query.isActive:
            query.stop()
        for sig, h in old.items():
            signal.signal(sig, h)
    return {"input": input_dir, "checkpoint": ckpt, "batches": len(job.batches),
            "files": sum(b.get("files", 0) for b in job.batches),
            "lines_read": sum(b.get("lines_read", 0) for b in job.batches),
            "tables": [b["table"] for b in job.batches if b.get("table", {}).get("built")]}
