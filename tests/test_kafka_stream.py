"""Logs over Kafka into the lake (issue 60): `ccs stream --source kafka` (jobs/stream_sources.py)
on the records the edge's shipper published, against a batch `ccs ingest` and `ccs infer` of the
same files. One broker for the session (conftest.kafka_broker); the stream runs as `ccs stream`
(its session is the only one that loads Spark's Kafka source), one process at a time.

Exactly once through the issue's three faults, in one run of two stream processes:

1. a stream killed with SIGKILL after the bronze commit of its first micro-batch (the first two
   nodes' records), restarted on the same checkpoint and left running;
2. the broker SIGKILLed while that stream runs and the shipper is sending (the third node's files
   have arrived), then started again on its data and port (`topology.kafka.Broker.kill/restart`);
3. in the same sending, a producer retrying what it had sent: the second node's acknowledged
   prefixes are lost, so its records go out again at new offsets.

Then silver and gold.predictions equal the batch's by key (the first node's rows are built only
by the replay of the killed batch: nothing later touches its partitions), bronze holds each
accepted record once, every resent record is quarantined `duplicate_*`, the audit has a row per
(topic, partition, offset range) per micro-batch covering each offset once with in = accepted +
quarantined, and `ccs audit`'s checks find the lake clean."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccs_testing import REPO, SmallLake, ccs_process, quick_champion, raw_section, write_config
from ccselect.contract import DUPLICATE_REASON, STREAMS

# the Kafka lane: at the end of `make test`'s tests beside the main run (the Makefile's KAFKA_LANE), and
# `make test-kafka` alone
pytestmark = [pytest.mark.kafka_stream, pytest.mark.filterwarnings("ignore")]

#: how long the stream may take to read what is on the topics (a micro-batch is tens of seconds
#: on a loaded machine; this only bounds a hang)
CATCH_UP_S = 900


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small simulated fleet's hour (3 nodes, hourly files, the reference), with a malformed line."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = tmp_path_factory.mktemp("kafka_fleet")
    simulate(SimParams(nodes=3, hours=1, conns_per_node_hour=100, seed=9), str(out), workers=1, progress=False)
    node = sorted(os.listdir(out / "transport"))[0]
    with open(sorted((out / "transport" / node).iterdir())[0], "ab") as f:
        f.write(b'{"conn_id": "broken", "node_id": \n')
    return out


def _end_offsets(bootstrap: str) -> dict:
    """Spark's startingOffsets JSON for the topics' ends now (the session's topics hold other tests' records)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ccs-tests-ends"})
    try:
        md = c.list_topics(timeout=10)
        return {f"ccs.{s}": {str(p): c.get_watermark_offsets(TopicPartition(f"ccs.{s}", p), timeout=10)[1]
                             for p in md.topics[f"ccs.{s}"].partitions} for s in STREAMS}
    finally:
        c.close()


def _copy_nodes(fleet, root, nodes) -> None:
    """The nodes' files of every stream (and the reference) into the edge's folder `root`."""
    for entry in os.listdir(fleet):
        if entry not in STREAMS and not (root / entry).exists():
            (shutil.copytree if (fleet / entry).is_dir() else shutil.copy)(fleet / entry, root / entry)
    for s in STREAMS:
        for n in nodes:
            if (fleet / s / n).is_dir():
                shutil.copytree(fleet / s / n, root / s / n)


def _committed(checkpoint: str) -> dict:
    """The source offsets (Spark's JSON: topic → partition → next offset) of the stream's last
    committed micro-batch; {} before the first."""
    done = [int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit()] \
        if os.path.isdir(os.path.join(checkpoint, "commits")) else []
    if not done:
        return {}
    with open(os.path.join(checkpoint, "offsets", str(max(done)))) as fh:
        return json.loads(fh.read().splitlines()[2])      # v1, the batch's metadata, the source's offsets


def _read_up_to(checkpoint: str, ends: dict) -> bool:
    got = _committed(checkpoint)
    return all(got.get(t, {}).get(p, -1) >= o for t in ends for p, o in ends[t].items())


def _wait_read(proc: subprocess.Popen, checkpoint: str, ends: dict) -> bool:
    """Wait until the running stream has committed a micro-batch up to `ends` (True), or exited (False)."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if _read_up_to(checkpoint, ends):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(1)
    raise AssertionError(f"the stream did not read up to {ends} within {CATCH_UP_S} s")


def _table(spark, cfg, name):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, name))


def _accepted(spark, cfg):
    """Per stream, the accepted bronze rows' records' JSON (what silver is built from), counted."""
    return {s: Counter(r[0] for r in _table(spark, cfg, f"bronze.{s}").where("status = 'ok'")
                       .select(F.to_json("record")).collect()) for s in STREAMS}


def _reference(spark, fleet, root):
    """The batch path on the same files: `ccs ingest`, the feature statistics of the hour, a quick
    champion registered in this lake's MLflow (the stream scores with it too), `ccs infer`."""
    from datetime import datetime, timezone

    from ccselect.config import load_config
    from ccselect.lake import connections_in
    from ccselect.features import scaling
    from ccselect.jobs import ingest
    from ccselect.jobs.sources import discover
    from ccselect.models import infer
    root.mkdir()
    path = write_config(root)
    cfg = load_config(path)
    result = ingest.run(spark, cfg, str(fleet))
    hours = sorted({f.hour for f in discover(str(fleet), streams=("transport",))})
    lo, hi = hours[0], hours[-1]
    window = f"{lo}..{hi}"
    from ccselect.hours import Window
    stats = scaling.fit(connections_in(spark, cfg, Window.hours(lo, hi)), window=window)
    stats_path = scaling.save(spark, cfg, stats, datetime.now(timezone.utc).isoformat())
    lake = SmallLake(root=root, cfg_path=path, fleet_dir=str(fleet), lo=lo, hi=hi, window=window, hours=hours,
                     stats_path=stats_path, ingest=result, training_rows=0)
    version = quick_champion(spark, cfg, lake)
    infer.run(spark, cfg, Window.hours(lo, hi))
    return cfg, version


def test_kafka_stream_equals_batch_through_a_kill_a_broker_restart_and_a_producer_retry(
        spark, kafka_broker, fleet, tmp_path):
    from confluent_kafka import Producer

    from ccselect.config import load_config
    from ccselect.export.edge.shipper import STATE, Shipper, ShipError
    from ccselect.flows.stream import checkpoint_dir
    boot = kafka_broker.bootstrap()
    nodes = sorted(os.listdir(fleet / "transport"))
    assert len(nodes) == 3
    batch, version = _reference(spark, fleet, tmp_path / "batch")

    # the edge: the first two nodes' files, shipped; records a misconfigured producer could send
    root = tmp_path / "edge"
    root.mkdir()
    _copy_nodes(fleet, root, nodes[:2])
    start = _end_offsets(boot)
    first = Shipper(str(root), boot, batch=200)
    shipped = first.ship()["sent"]
    first.close()
    p = Producer({"bootstrap.servers": boot})
    p.produce("ccs.transport", key=b"edge-x", value=b'{"conn_id": "no-hour"}')
    p.produce("ccs.transport", value=b'{"conn_id": "no-node"}', headers=[("ccs.hour", b"2026-11-01T00")])
    assert p.flush(30) == 0
    del p
    before = _end_offsets(boot)
    assert sum(before[t][q] - start[t][q] for t in before for q in before[t]) == shipped + 2

    (tmp_path / "kafka").mkdir()
    config = write_config(tmp_path / "kafka", pipeline={**raw_section("pipeline"), "deploy": False},
                          mlflow={**raw_section("mlflow"), "tracking_uri": batch.settings.mlflow.tracking_uri,
                                  "artifact_root": batch.settings.mlflow.artifact_root},
                          # a micro-batch takes whatever is there (each costs the stream's fixed cost, not
                          # its records); a trigger every 2 s while running
                          stream={"source": "kafka", "kafka_bootstrap": boot, "max_offsets_per_trigger": 100_000,
                                  "trigger_seconds": 2, "kafka_starting_offsets": json.dumps(start)})
    k = load_config(config)
    ckpt = checkpoint_dir(k)
    args = ["stream", "--input", str(root), "--no-deploy"]

    # 1. killed after its first micro-batch's bronze commit
    dead = ccs_process([*args, "--once"], config, env={"CCS_STREAM_CRASH": "bronze:0"}, check=False)
    assert dead.returncode == -signal.SIGKILL, dead.stderr[-3000:]
    assert _committed(ckpt) == {}, "the killed batch was not committed"

    # ... restarted on the same checkpoint, running on (a trigger every 2 s)
    log = open(tmp_path / "stream.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ccselect.app.cli", *args, "--timeout", str(3 * CATCH_UP_S)], cwd=REPO,
                            env={**os.environ, "CCS_CONFIG": str(config)}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    seen = {"rode_through": None}
    try:
        assert _wait_read(proc, ckpt, before), "the restarted stream exited:\n" + _tail(tmp_path / "stream.log")

        # 2 + 3. the third node's files arrive; the second node's acknowledged prefixes are lost
        _copy_nodes(fleet, root, nodes[2:])
        state_path = root / STATE
        state = json.loads(state_path.read_text())
        again = {rel: at for rel, at in state["files"].items() if rel.split("/")[1] == nodes[1]}
        resent = sum(at["lines"] for at in again.values())
        assert resent > 0
        state["files"] = {rel: at for rel, at in state["files"].items() if rel not in again}
        state_path.write_text(json.dumps(state))
        sh = Shipper(str(root), boot, batch=200)
        early = sh.ship(limit=300)["sent"]        # the stream reads these while ...
        killed = kafka_broker.kill()              # ... the broker dies, no controlled shutdown
        seen["broker_killed_unix"] = round(time.time(), 3)
        assert killed is not None
        out = {}

        def rest():                               # sent into the outage: queued in the producer
            try:
                out["sent"] = sh.ship()["sent"]
            except ShipError as e:                # not acknowledged within the shipper's wait
                out["error"] = str(e)
        sender = threading.Thread(target=rest)
        sender.start()
        time.sleep(3)
        kafka_broker.restart(log=print)
        seen["broker_back_unix"] = round(time.time(), 3)
        assert kafka_broker.bootstrap() == boot
        sender.join(120)
        assert not sender.is_alive()
        if "error" in out:                        # the next pass resends from the acknowledged prefix
            out["sent"] = sh.ship()["sent"]
        sh.close()
        assert early + out["sent"] >= resent
        after = _end_offsets(boot)
        seen["rode_through"] = _wait_read(proc, ckpt, after)
        if seen["rode_through"]:
            os.kill(proc.pid, signal.SIGTERM)     # a clean stop
            assert proc.wait(120) == 0, _tail(tmp_path / "stream.log")
        else:                                     # failed without the broker: restarted, it reads the rest
            ccs_process([*args, "--once"], config)
        assert _read_up_to(ckpt, after)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
    print("kafka stream: " + json.dumps({**seen, "shipper": out, "batches": _batches(tmp_path / "stream.log")}))

    # silver equals the batch's by key
    cols = _table(spark, batch, "silver.connections").columns
    ks = _table(spark, k, "silver.connections").select(*cols)
    assert ks.groupBy("node_id", "conn_id").count().where("count > 1").count() == 0
    assertDataFrameEqual(ks, _table(spark, batch, "silver.connections").select(*cols))
    # bronze: each accepted record once
    assert _accepted(spark, k) == _accepted(spark, batch), "bronze's accepted records differ from batch ingest's"

    # quarantine: the batch's malformed line, the two records without hour or node, and every
    # record sent again (a new offset, an identity the lake holds)
    qcols = ["stream", "node_id", "hour", "raw", "reason"]
    q = _table(spark, k, "bronze.quarantine")
    reasons = Counter(r["reason"] for r in q.collect())
    dup = sum(n for r, n in reasons.items() if r in DUPLICATE_REASON.values())
    assert {r: n for r, n in reasons.items() if r not in DUPLICATE_REASON.values()} == \
        {"bad_json": 1, "no_hour": 1, "no_node": 1}, reasons
    assert dup >= resent, (dup, resent)
    assertDataFrameEqual(q.where("reason = 'bad_json'").select(*qcols),
                         _table(spark, batch, "bronze.quarantine").select(*qcols))

    # the audit without files: a row per (topic, partition, offset range) per micro-batch, each
    # offset from the test's start to the topics' ends once
    a = _table(spark, k, "gold.ingest_audit").collect()
    assert a and all(r["source_file"].startswith("kafka://") and r["node_id"] is None for r in a)
    assert all(r["lines_read"] == r["accepted"] + r["quarantined"] for r in a)
    got = {}
    for r in a:
        tp, rng = r["source_file"][len("kafka://"):].split("@")
        lo, hi = map(int, rng.split("-"))
        assert r["lines_read"] == hi - lo + 1, f"{r['source_file']}: {r['lines_read']} records"
        got.setdefault(tp, []).append((lo, hi))
    want = {f"{t}/{p}": (start[t][p], after[t][p]) for t in after for p in after[t] if after[t][p] > start[t][p]}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for tp, rngs in got.items():
        rngs.sort()
        assert rngs[0][0] == want[tp][0] and rngs[-1][1] == want[tp][1] - 1, (tp, rngs, want[tp])
        assert all(b[0] == x[1] + 1 for x, b in zip(rngs, rngs[1:])), f"{tp}: a gap or an overlap: {rngs}"
    on_topics = sum(after[t][p] - start[t][p] for t in after for p in after[t])
    accepted = sum(sum(c.values()) for c in _accepted(spark, batch).values())
    assert (sum(r["lines_read"] for r in a), sum(r["quarantined"] for r in a)) == (on_topics, on_topics - accepted)

    # `ccs audit`'s checks: each range's row agrees with its bronze lines and bronze.quarantine,
    # one accepted line per identity, silver traced
    from ccselect.jobs import audit
    report = audit.run(spark, k)
    assert report["clean"], report["lines"]

    # gold.predictions: one row per connection, by the champion, equal to `ccs infer`'s
    pcols = ["conn_id", "node_id", "hour", "cc", "decision", "pred_net_type", "model_version"]
    kp = _table(spark, k, "gold.predictions").select(*pcols)
    ref = _table(spark, batch, "gold.predictions").select(*pcols)
    assert kp.groupBy("node_id", "conn_id").count().where("count > 1").count() == 0
    assert {str(r[0]) for r in kp.select("model_version").distinct().collect()} == {str(version)}
    assertDataFrameEqual(kp, ref)


def _tail(path, n: int = 4000) -> str:
    try:
        return open(path).read()[-n:]
    except OSError:
        return ""


def _batches(path) -> list[dict]:
    """The micro-batches the running stream logged: id, ranges read, records, seconds."""
    out = []
    for line in _tail(path, 10**7).splitlines():
        if line.startswith("stream: {"):
            b = json.loads(line[len("stream: "):])
            out.append({k: b.get(k) for k in ("batch", "files", "lines_read", "seconds", "ended_unix")})
    return out
