"""Logs over Kafka into the lake (issue 60, second phase): `ccs stream --source kafka`
(jobs/stream_sources.py) on the records the edge's shipper published, against a batch `ccs ingest`
of the same files. One broker for the session (conftest.kafka_broker); the stream runs as `ccs stream`
(its session is the only one that loads Spark's Kafka source), one at a time.

Exactly once: a stream killed with SIGKILL after the bronze commit of a micro-batch and restarted,
then a producer resending every record (its state lost), leave silver equal to the batch ingest's,
by key, and bronze with each accepted record once; the audit has a row per (topic, partition,
offset range) per micro-batch covering each offset once, in = accepted + quarantined, and `ccs audit`'s
checks find the lake clean."""
from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccs_testing import ccs_process, raw_section, write_config
from ccselect.contract import DUPLICATE_REASON, STREAMS

# `cluster` keeps it out of `make test`; `kafka_stream` out of `make test-cluster` (make test-kafka runs it)
pytestmark = [pytest.mark.cluster, pytest.mark.kafka_stream, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small simulated fleet's hour (3 nodes, hourly files, the reference), with a malformed line."""
    from sim.fleet import simulate
    from sim.params import SimParams
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


def _table(spark, cfg, name):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, name))


def _accepted(spark, cfg):
    """Per stream, the accepted bronze rows' records' JSON (what silver is built from), counted."""
    return {s: Counter(r[0] for r in _table(spark, cfg, f"bronze.{s}").where("status = 'ok'")
                       .select(F.to_json("record")).collect()) for s in STREAMS}


def test_kafka_stream_equals_batch_ingest_through_a_kill_and_a_producer_retry(spark, kafka_broker, fleet,
                                                                                tmp_path):
    from confluent_kafka import Producer

    from ccselect.config import load_config
    from export.edge.shipper import Shipper
    from jobs import ingest
    boot = kafka_broker.bootstrap()
    root = tmp_path / "edge"
    shutil.copytree(fleet, root)
    start = _end_offsets(boot)

    first = Shipper(str(root), boot, batch=500)
    shipped = first.ship()["sent"]
    first.close()
    # records the shipper would never send, as a misconfigured producer could: no hour, no node
    p = Producer({"bootstrap.servers": boot})
    p.produce("ccs.transport", key=b"edge-x", value=b'{"conn_id": "no-hour"}')
    p.produce("ccs.transport", value=b'{"conn_id": "no-node"}', headers=[("ccs.hour", b"2026-11-01T00")])
    assert p.flush(30) == 0
    del p
    end = _end_offsets(boot)
    on_topics = sum(end[t][q] - start[t][q] for t in end for q in end[t])
    assert on_topics == shipped + 2, (on_topics, shipped)

    (tmp_path / "kafka").mkdir()
    config = write_config(tmp_path / "kafka", pipeline={**raw_section("pipeline"), "deploy": False},
                          # about three micro-batches a run: the kill after the second's bronze commit leaves one
                          # to the restart (each batch costs the stream's fixed cost, not its records)
                          stream={"source": "kafka", "kafka_bootstrap": boot,
                                  "max_offsets_per_trigger": max(100, (shipped + 2) // 3 + 1),
                                  "kafka_starting_offsets": json.dumps(start)})
    args = ["stream", "--input", str(root), "--once", "--no-deploy"]
    # killed after its second micro-batch's bronze commit, then restarted on the same checkpoint
    dead = ccs_process(args, config, env={"CCS_STREAM_CRASH": "bronze:1"}, check=False)
    assert dead.returncode == -signal.SIGKILL, dead.stderr[-3000:]
    done = json.loads(ccs_process(args, config).stdout)
    assert done["batches"] >= 1, done
    k = load_config(config)

    (tmp_path / "batch").mkdir()
    batch = load_config(write_config(tmp_path / "batch"))
    ingest.run(spark, batch, str(root))

    def same_silver():
        cols = _table(spark, batch, "silver.connections").columns
        ks = _table(spark, k, "silver.connections").select(*cols)
        assert ks.groupBy("node_id", "conn_id").count().where("count > 1").count() == 0
        assertDataFrameEqual(ks, _table(spark, batch, "silver.connections").select(*cols))
        assert _accepted(spark, k) == _accepted(spark, batch), "bronze's accepted records differ from batch ingest's"

    same_silver()

    def lake_clean():
        """`ccs audit`'s checks on the Kafka-written lake: each offset range's audit row agrees
        with its bronze lines and bronze.quarantine, one accepted line per identity, silver traced."""
        from jobs import audit
        report = audit.run(spark, k)
        assert report["clean"], report["lines"]

    qcols = ["stream", "node_id", "hour", "raw", "reason"]
    q = _table(spark, k, "bronze.quarantine")
    assert Counter(r["reason"] for r in q.collect()) == Counter({"bad_json": 1, "no_hour": 1, "no_node": 1})
    assertDataFrameEqual(q.where("reason = 'bad_json'").select(*qcols),
                         _table(spark, batch, "bronze.quarantine").select(*qcols))

    # the audit without files: a row per (topic, partition, offset range) per micro-batch
    def audit_covers(ends):
        a = _table(spark, k, "gold.ingest_audit").collect()
        assert a and all(r["source_file"].startswith("kafka://") and r["node_id"] is None for r in a)
        assert all(r["lines_read"] == r["accepted"] + r["quarantined"] for r in a)
        got = {}
        for r in a:
            tp, rng = r["source_file"][len("kafka://"):].split("@")
            lo, hi = map(int, rng.split("-"))
            assert r["lines_read"] == hi - lo + 1, f"{r['source_file']}: {r['lines_read']} records"
            got.setdefault(tp, []).append((lo, hi))
        want = {f"{t}/{q}": (start[t][q], ends[t][q]) for t in ends for q in ends[t] if ends[t][q] > start[t][q]}
        assert set(got) == set(want), (sorted(got), sorted(want))
        for tp, rngs in got.items():
            rngs.sort()
            assert rngs[0][0] == want[tp][0] and rngs[-1][1] == want[tp][1] - 1, (tp, rngs, want[tp])
            assert all(b[0] == a[1] + 1 for a, b in zip(rngs, rngs[1:])), f"{tp}: a gap or an overlap: {rngs}"
        return sum(r["lines_read"] for r in a), sum(r["quarantined"] for r in a)

    assert audit_covers(end) == (shipped + 2, 3)
    lake_clean()

    # a producer retrying everything (its state lost): every record again, at new offsets
    os.remove(root / "_shipper" / "state.json")
    again = Shipper(str(root), boot, batch=500)
    assert again.ship()["sent"] == shipped
    again.close()
    ccs_process(args, config)
    same_silver()
    q = Counter(r["reason"] for r in _table(spark, k, "bronze.quarantine").collect())
    dup = sum(n for r, n in q.items() if r in DUPLICATE_REASON.values())
    assert dup == shipped - 1 and q["bad_json"] == 2, q
    assert audit_covers(_end_offsets(boot)) == (2 * shipped + 2, shipped + 3)
    lake_clean()
