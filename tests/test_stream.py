"""`ccs stream` (flows/stream.py, issue 26) on a node's half hour of the small fleet cut into the
agent's one-minute segments, with a malformed line and a malformed file among them:

- a stream killed with SIGKILL in the middle of a micro-batch (after its bronze commit, before
  silver) and restarted holds exactly the rows of a batch ingest of the same files — silver,
  gold.predictions, quarantine (same reasons) and one audit row per file with lines_read =
  accepted + quarantined — and its last table equals an uninterrupted stream's;
- the tables: one per boundary of `stream.table_minutes` of the data's clock, each recorded in
  gold.cc_tables with its window, signed, and published through the guards.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccs_testing import ccs_process, copy_lake, quick_champion, write_config, write_segments

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, spark, small_lake):
    """(segments folder, champion lake config path): two nodes' first hour as segments, plus a
    malformed line in one segment and a file of garbage."""
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("stream_champion"))
    cfg = lake.cfg()
    quick_champion(spark, cfg, lake)
    nodes = sorted(os.listdir(os.path.join(small_lake.fleet_dir, "transport")))[:1]
    seg = tmp_path_factory.mktemp("segments")
    paths = write_segments(small_lake.fleet_dir, seg, nodes, [small_lake.lo], minutes=30)
    bad = next(p for p in paths if p.parts[-3] == "transport")
    garbage = next(p for p in paths if p.parts[-3] == "access")
    times = {p: p.stat().st_mtime for p in (bad, garbage)}
    with open(bad, "a") as fh:
        fh.write('{"conn_id": "broken", "node_id": \n')
    garbage.write_bytes(b"\x00\x01 not json\n")
    for p, t in times.items():      # where the file source takes them: in their minute
        os.utime(p, (t, t))
    return seg, lake


def _config(root, lake, **stream):
    from ccs_testing import raw_section
    src = lake.cfg()
    root.mkdir(parents=True, exist_ok=True)
    return write_config(root, mlflow={**raw_section("mlflow"), "tracking_uri": src.settings.mlflow.tracking_uri,
                                      "artifact_root": src.settings.mlflow.artifact_root},
                        stream={"max_files_per_trigger": 50, "table_minutes": 10, "window_minutes": 30, **stream},
                        pipeline={**raw_section("pipeline"), "deploy": False},
                        model={**(m := raw_section("model")), "gate": {**m["gate"], "min_mean_accuracy": 0.0,
                                                                         "min_worst_accuracy": 0.0}})


def _keys_init(config):
    """`ccs keys init` in this process (a child of its own would only add a start-up)."""
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    res = CliRunner().invoke(app, ["keys", "init", "--config", str(config)])
    assert res.exit_code == 0, res.output[-2000:] + repr(res.exception)


def _table(spark, cfg, name):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, name))


def _last_table(spark, cfg):
    from ccselect.export.artifact import signing
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.tables import aggregate
    rows = aggregate.history(spark, cfg)
    _, table = signing.read_manifest(rows[-1]["manifest_path"], signing.load_public_key(key_paths(cfg)[1]))
    return json.loads(rows[-1]["hours"]), sorted((str(e.prefix), e.cc, e.purity_permille) for e in table.entries), rows


def test_killed_stream_restarts_to_the_batch_result(spark, tmp_path, setup):
    from ccselect.config import load_config
    from ccselect.flows import stream
    from ccselect.jobs import ingest
    from ccselect.models import infer
    seg, lake = setup

    # the stream, killed after the bronze commit of its second micro-batch, then restarted
    crashed = _config(tmp_path / "crashed", lake)
    _keys_init(crashed)
    dead = ccs_process(["stream", "--input", str(seg), "--once"], crashed, env={"CCS_STREAM_CRASH": "bronze:1"}, check=False)
    assert dead.returncode == -signal.SIGKILL, dead.stderr[-3000:]
    c = load_config(crashed)
    # restarted (in this process: the replayed batch and the rest)
    done = stream.run(spark, c, str(seg), once=True, log=lambda m: None)
    assert done["batches"] >= 1 and done["tables"], done
    # the same files by batch ingest and inference
    (tmp_path / "batch").mkdir()
    batch = load_config(write_config(tmp_path / "batch", mlflow=json.loads(json.dumps(load_config(crashed).raw["mlflow"]))))
    ingest.run(spark, batch, str(seg))
    from ccselect.hours import Window
    infer.run(spark, batch, Window.hours(lake.lo))

    silver_cols = [x for x in _table(spark, batch, "silver.connections").columns]
    assertDataFrameEqual(_table(spark, c, "silver.connections").select(*silver_cols),
                         _table(spark, batch, "silver.connections").select(*silver_cols))
    keys = _table(spark, c, "gold.predictions").groupBy("conn_id").count()
    assert keys.where("count > 1").count() == 0
    pcols = ["conn_id", "node_id", "hour", "cc", "decision", "pred_net_type", "model_version"]
    assertDataFrameEqual(_table(spark, c, "gold.predictions").select(*pcols),
                         _table(spark, batch, "gold.predictions").select(*pcols))
    qcols = ["stream", "node_id", "hour", "source_file", "line_no", "raw", "reason"]
    q = _table(spark, c, "bronze.quarantine").select(*qcols)
    assertDataFrameEqual(q, _table(spark, batch, "bronze.quarantine").select(*qcols))
    assert {r["reason"] for r in q.collect()} == {"bad_json"}, "the batch path's reason"
    for name in ("bronze.transport", "bronze.access", "bronze.qoe"):
        b = _table(spark, c, name).select("source_file", "line_no", "status", "reason")
        assert b.groupBy("source_file", "line_no").count().where("count > 1").count() == 0, name
        assertDataFrameEqual(b, _table(spark, batch, name).select("source_file", "line_no", "status", "reason"))
    audit = _table(spark, c, "gold.ingest_audit")
    n_files = sum(1 for _, _, fs in os.walk(seg) for f in fs if f.endswith(".jsonl"))
    assert audit.count() == n_files == audit.select("source_file").distinct().count()
    assert audit.where("lines_read != accepted + quarantined").count() == 0
    acols = ["stream", "node_id", "hour", "source_file", "lines_read", "accepted", "quarantined"]
    assertDataFrameEqual(audit.select(*acols), _table(spark, batch, "gold.ingest_audit").select(*acols))

    # an uninterrupted stream of the same files ends on the same table
    clean = _config(tmp_path / "clean", lake)
    _keys_init(clean)
    whole = stream.run(spark, load_config(clean), str(seg), once=True, log=lambda m: None)
    window_c, entries_c, rows_c = _last_table(spark, c)
    window_w, entries_w, rows_w = _last_table(spark, load_config(clean))
    assert entries_c and entries_c == entries_w
    assert (window_c["from_ms"], window_c["to_ms"]) == (window_w["from_ms"], window_w["to_ms"])
    # every table: a boundary of 10 minutes of the data's clock, a 30-minute window, built from
    # the champion's predictions
    for r in rows_w:
        h = json.loads(r["hours"])
        assert h["to_ms"] % 600_000 == 0 and h["to_ms"] - h["from_ms"] == 1_800_000, h
    assert len(whole["tables"]) == len(rows_w)
    hour_end = max(_table(spark, batch, "silver.connections").agg(F.max("ts_end_ms")).first())
    assert window_w["to_ms"] == hour_end // 600_000 * 600_000


def test_stream_follows_a_new_champion_without_restart(spark, tmp_path, setup):
    """The champion is resolved at every micro-batch: a version promoted while the stream runs
    scores its next batch."""
    from ccselect.config import load_config
    from ccselect.flows.stream import StreamJob
    seg, lake = setup
    cfg = lake.cfg()
    job = StreamJob(spark, cfg, str(seg), str(tmp_path / "ckpt"), log=lambda m: None)
    before = job.champion()
    newer = quick_champion(spark, cfg, lake)
    after = job.champion()
    assert str(after.version) == str(newer) != str(before.version)
    assert job.champion() is after, "loaded once per version"
    assert load_config(lake.cfg_path).settings.stream.table_minutes == 5


def test_window_predictions_decay(spark, small_lake, tmp_path):
    """The sliding window holds the predictions of connections closed in (from, to]; with a half
    life, each one's requests are scaled by 2^(−age/half-life), rounded up."""
    import math

    from ccselect.config import load_config
    from ccselect.lake import table_path
    from ccselect.export.tables import aggregate
    lake = copy_lake(small_lake, tmp_path)
    cfg = load_config(lake.cfg_path)
    conns = spark.read.format("delta").load(table_path(cfg, "silver.connections")).where(F.col("hour") == lake.lo)
    # predictions stand-in: silver's own columns in gold.predictions' place (what the window reads)
    preds = conns.select("conn_id", "client_ip", "requests", "node_id", "hour",
                         F.lit("model").alias("decision"), F.lit("bbr").alias("cc"))
    preds.write.format("delta").partitionBy("node_id", "hour").save(table_path(cfg, "gold.predictions"))
    ts = {r["conn_id"]: (r["ts_end_ms"], r["requests"]) for r in conns.select("conn_id", "ts_end_ms", "requests").collect()}
    lo = min(t for t, _ in ts.values()) // 600_000 * 600_000 + 600_000
    hi = lo + 1_200_000
    plain = {r["conn_id"]: r["requests"] for r in aggregate.window_predictions(spark, cfg, lo, hi).collect()}
    assert set(plain) == {c for c, (t, _) in ts.items() if lo < t <= hi} and plain
    decayed = {r["conn_id"]: r["requests"] for r in aggregate.window_predictions(spark, cfg, lo, hi, 10).collect()}
    assert set(decayed) == set(plain)
    for c, req in decayed.items():
        t, r = ts[c]
        assert req == math.ceil(r * 2 ** (-(hi - t) / 600_000)), (c, req, r, t)
