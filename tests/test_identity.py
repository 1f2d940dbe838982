"""One row per identity, whoever reads the logs again (issue 61): a connection is (node_id,
conn_id), a QoE session (node_id, session_id), a request its whole record (ccselect/contract.py
IDENTITY). On one node's first ten minutes of the small fleet, as the agent's segments and as one
hourly file holding the same lines, each way of reading the records twice leaves silver and
gold.predictions equal, by key, to one batch ingest of the segments, bronze with one accepted
line per identity (every repeat quarantined with its reason), and the audit balanced:

- a segment re-sent as `.1`, in one batch ingest and to a running stream;
- a stream restarted with a fresh checkpoint over segments it had ingested;
- the same records through two sources (the segments by the stream, the hourly file by a
  backfill): the stream then the backfill, and interleaved both ways: the backfill committing
  between the stream's read and its append (the stream then judged again after the whole
  backfill, which is the other order), the stream committing while the backfill rebuilds silver.

Issue 63 (the suite within budget): the stream-first stories share one lake, and the backfill-
then-stream order is judged in the interleaving that ends in it: two stream runs, a backfill and
two checks of the lake fewer; every assertion stayed.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccs_testing import raw_section, write_config, write_segments

pytestmark = pytest.mark.filterwarnings("ignore")

#: the contract's identities (ccselect/contract.py IDENTITY), spelled out so that the test reads
#: the lake without the code under test
IDENTITY = {"transport": "record.conn_id", "access": "record", "qoe": "record.session_id"}
PRED_COLS = ["conn_id", "node_id", "hour", "cc", "decision", "pred_net_type", "model_version"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, spark, small_lake, lake_with_champion):
    """(segments folder, hourly folder, champion lake, hour, the batch ingest of the segments' cfg).
    The champion is conftest's `lake_with_champion` (only read here)."""
    lake = lake_with_champion[0]
    node = sorted(os.listdir(os.path.join(small_lake.fleet_dir, "transport")))[0]
    seg = tmp_path_factory.mktemp("identity_segments")
    paths = write_segments(small_lake.fleet_dir, seg, [node], [small_lake.lo], minutes=10)
    hourly = tmp_path_factory.mktemp("identity_hourly")
    shutil.copytree(seg / "reference", hourly / "reference")
    for p in paths:       # the same lines, in order, as one hourly file per stream
        dst = hourly / p.parts[-3] / p.parts[-2] / f"{small_lake.lo}.jsonl"
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "ab") as fh:
            fh.write(p.read_bytes())
    batch = _cfg(tmp_path_factory.mktemp("identity_batch"), lake)
    _ingest(spark, batch, seg, small_lake.lo)
    return seg, hourly, lake, small_lake.lo, batch


def _cfg(root, lake, **stream):
    from ccselect.config import load_config
    src = lake.cfg()
    root.mkdir(parents=True, exist_ok=True)
    return load_config(write_config(root, mlflow={**raw_section("mlflow"), "tracking_uri": src.settings.mlflow.tracking_uri,
                                                  "artifact_root": src.settings.mlflow.artifact_root},
                                    stream={"max_files_per_trigger": 100, **stream},
                                    pipeline={**raw_section("pipeline"), "deploy": False}))


def _ingest(spark, cfg, input_dir, hour):
    from ccselect.jobs import ingest
    from ccselect.models import infer
    res = ingest.run(spark, cfg, str(input_dir))
    from ccselect.hours import Window
    infer.run(spark, cfg, Window.hours(hour))
    return res


def _stream(spark, cfg, input_dir, checkpoint, log=lambda m: None):
    from ccselect.flows import stream
    c = type(cfg)(path=cfg.path, raw={**cfg.raw, "stream": {**cfg.raw.get("stream", {}), "checkpoint": str(checkpoint)}})
    return stream.run(spark, c, str(input_dir), once=True, deploy=False, log=log)


def _table(spark, cfg, name):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, name))


def assert_one_batch_ingest(spark, cfg, batch):
    """silver and predictions equal, by key, to one batch ingest; bronze one accepted line per
    identity and one row per line; every audit row balanced."""
    silver = _table(spark, batch, "silver.connections")
    assertDataFrameEqual(_table(spark, cfg, "silver.connections").select(*silver.columns), silver)
    assertDataFrameEqual(_table(spark, cfg, "gold.predictions").select(*PRED_COLS),
                         _table(spark, batch, "gold.predictions").select(*PRED_COLS))
    for stream, ident in IDENTITY.items():
        b = _table(spark, cfg, f"bronze.{stream}")
        ok = b.where("status = 'ok'").groupBy("node_id", F.col(ident).alias("id")).count()
        assert ok.where("count > 1").count() == 0, f"bronze.{stream}: an identity accepted twice"
        assert b.groupBy("source_file", "line_no").count().where("count > 1").count() == 0, f"bronze.{stream}: a line twice"
    audit = _table(spark, cfg, "gold.ingest_audit")
    assert audit.where("lines_read != accepted + quarantined").count() == 0
    assert audit.groupBy("source_file").count().where("count > 1").count() == 0, "one audit row per file"
    from ccselect.jobs import audit as lake_audit
    res = lake_audit.run(spark, cfg)
    assert res["clean"], res["lines"]


def _resends(folder):
    """The `.1` names of each stream's second segment in `folder` (not written yet)."""
    names = []
    for stream in ("transport", "access", "qoe"):
        second = sorted((folder / stream).glob("*/*.jsonl"))[1]
        names.append(second.with_name(second.name.replace(".jsonl", ".1.jsonl")))
    return names


def _resend(copies):
    for c in copies:
        shutil.copy(c.with_name(c.name.replace(".1.jsonl", ".jsonl")), c)


def _quarantined(spark, cfg, copies):
    return _table(spark, cfg, "bronze.quarantine").where(F.col("source_file").isin([str(c) for c in copies]))


def test_a_stream_given_resends_then_a_new_checkpoint_then_a_backfill(spark, tmp_path, inputs):
    """One stream-first lake read again three ways: a segment re-sent as `.1` to the running
    stream (after its original was committed); the segments again under a lost checkpoint; then
    the hourly file of the same lines through `ccs ingest` (a backfill), which takes the hour over,
    the rows of every stream run included. (Issue 63: the stream half of the old
    test_a_segment_resent_as_dot_one and the old
    test_a_new_checkpoint_over_ingested_segments_then_a_backfill_of_the_same_records, which each
    began by streaming the same segments into a fresh lake; their assertions are all here, at the
    same points of the story.)"""
    seg, hourly, lake, hour, batch = inputs
    resent = tmp_path / "resent"
    shutil.copytree(seg, resent)
    copies = _resends(resent)
    lines = sum(sum(1 for _ in open(c.with_name(c.name.replace(".1.jsonl", ".jsonl")))) for c in copies)
    cfg = _cfg(tmp_path / "lake", lake)
    _stream(spark, cfg, resent, tmp_path / "ckpt-1")
    _resend(copies)     # to the running stream: the re-sends come after their originals were committed
    _stream(spark, cfg, resent, tmp_path / "ckpt-1")
    assert_one_batch_ingest(spark, cfg, batch)
    q = _quarantined(spark, cfg, copies)
    assert q.count() == lines and q.where(~F.col("reason").startswith("duplicate_")).count() == 0
    again = _stream(spark, cfg, resent, tmp_path / "ckpt-2")     # lost checkpoint, same segments
    assert again["files"] > 0
    assert_one_batch_ingest(spark, cfg, batch)
    # the stream, then the backfill
    _ingest(spark, cfg, hourly, hour)
    assert_one_batch_ingest(spark, cfg, batch)
    audit = {r["source_file"]: r for r in _table(spark, cfg, "gold.ingest_audit").collect()}
    assert all(f.startswith(str(hourly)) for f in audit), "the backfill replaced the stream's rows of its hour"


def test_a_segment_resent_as_dot_one_in_one_batch_ingest(spark, tmp_path, inputs):
    """Every segment and the re-sends in one batch ingest: the original lines win, every line of
    a re-send quarantined as a repeat. (The re-send to a running stream:
    test_a_stream_given_resends_then_a_new_checkpoint_then_a_backfill.)"""
    seg, _, lake, hour, batch = inputs
    resent = tmp_path / "resent"
    shutil.copytree(seg, resent)
    copies = _resends(resent)
    _resend(copies)
    cfg = _cfg(tmp_path / "batch", lake)
    _ingest(spark, cfg, resent, hour)
    assert_one_batch_ingest(spark, cfg, batch)
    q = _quarantined(spark, cfg, copies)
    lines = sum(sum(1 for _ in open(c)) for c in copies)
    assert {(r["stream"], r["reason"]) for r in q.select("stream", "reason").distinct().collect()} == {
        ("transport", "duplicate_conn_id"), ("access", "duplicate_request"), ("qoe", "duplicate_session_id")}
    assert q.count() == lines, "every line of a re-send is a repeat"


def _stream_lines_all_repeats(spark, cfg, seg):
    """The stream's audit rows: there are some, and none accepted a line (so, with the audit
    balanced, every line read was quarantined)."""
    rows = _table(spark, cfg, "gold.ingest_audit").where(F.col("source_file").startswith(str(seg))).collect()
    assert rows and all(r["accepted"] == 0 and r["quarantined"] == r["lines_read"] for r in rows), \
        "the backfill's lines won"


def test_a_backfill_commits_between_the_streams_read_and_its_append(spark, tmp_path, inputs, monkeypatch):
    """The stream judged its lines against bronze before the backfill's commit: its append is
    taken back and the batch judged again, now against the whole backfill (ingest and inference
    committed), and its silver and predictions follow that backfill; the backfill's lines win.
    (Issue 63: this is where the old test_the_same_records_backfilled_then_streamed's order, a
    finished backfill and then the stream, is judged; that test streamed into a fresh backfilled
    lake for the same assertions, so it went.)"""
    from ccselect.flows import stream
    seg, hourly, lake, hour, batch = inputs
    cfg = _cfg(tmp_path / "lake", lake)
    real, fired = stream.as_before, []

    def read_then_backfill(spark_, path, app_id, version):
        out = real(spark_, path, app_id, version)
        if not fired and path.endswith("transport"):
            fired.append(path)
            _ingest(spark, cfg, hourly, hour)
        return out
    monkeypatch.setattr(stream, "as_before", read_then_backfill)
    said = []
    _stream(spark, cfg, seg, tmp_path / "ckpt", log=said.append)
    assert fired and any("retrying" in m and "WRITE" in m for m in said), said
    assert_one_batch_ingest(spark, cfg, batch)
    _stream_lines_all_repeats(spark, cfg, seg)


def test_the_stream_commits_while_a_backfill_rebuilds_silver(spark, tmp_path, inputs, monkeypatch):
    """The backfill's silver was built from bronze before the stream's commit: it is rebuilt. The
    stream read after the backfill's bronze commit: its lines are repeats."""
    from ccselect.jobs import silver
    seg, hourly, lake, hour, batch = inputs
    cfg = _cfg(tmp_path / "lake", lake)
    real, fired = silver.bronze_files, []

    def stream_between(spark_, cfg_, keys):
        out = real(spark_, cfg_, keys)
        if not fired:
            fired.append(1)
            _stream(spark, cfg, seg, tmp_path / "ckpt")
        return out
    monkeypatch.setattr(silver, "bronze_files", stream_between)
    _ingest(spark, cfg, hourly, hour)
    assert fired
    assert_one_batch_ingest(spark, cfg, batch)
    _stream_lines_all_repeats(spark, cfg, seg)


def test_conflicts_are_retried_then_name_the_other_writer():
    from ccselect.delta_io import WriteConflict, retry_conflicts
    tries = []
    message = ("io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND] Files were added to "
               "partition [node_id=n1, hour=2026-11-01T08] by a concurrent update. Please try the operation again.\n"
               'Conflicting commit: {"timestamp":1764363000000,"operation":"WRITE","operationParameters":'
               '{"mode":"Overwrite","partitionBy":"[]","predicate":"[\\"(hour = 2026-11-01T08)\\"]"},'
               '"readVersion":6,"isolationLevel":"Serializable","isBlindAppend":false,'
               '"userMetadata":"ccs-stream-1f2e:3","version":7}\n'
               "Refer to https://docs.delta.io/latest/concurrency-control.html for more details.")

    def step():
        tries.append(1)
        raise RuntimeError(message)
    with pytest.raises(WriteConflict, match=r"3 attempts.*WRITE .*Overwrite.* by ccs-stream-1f2e:3 \(version 7\)"):
        retry_conflicts(step, "ingest: bronze", attempts=3, backoff_s=0)
    assert len(tries) == 3

    def other():
        tries.append(1)
        raise ValueError("not a conflict")
    with pytest.raises(ValueError):
        retry_conflicts(other, "x", attempts=3, backoff_s=0)
    assert len(tries) == 4, "anything else is raised at once"
