"""Logs over Kafka (issue 60), first phase: the project's own broker (topology/kafka.py) and the
edge's shipper (export/edge/shipper.py) against it. One broker for the session (conftest.kafka_broker)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from ccs_testing import REPO
from ccselect.contract import FILE_NAME, IDENTITY, STREAMS
from kafka_testing import consume_all

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A small simulated fleet's hour (3 nodes, the three streams as hourly files)."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = tmp_path_factory.mktemp("fleet")
    simulate(SimParams(nodes=3, hours=1, conns_per_node_hour=300, seed=5), str(out), workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    """The same kind of hour as the agent's rotated segments (one per 5 minutes), gzipped for one node."""
    import gzip
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = tmp_path_factory.mktemp("segments")
    simulate(SimParams(nodes=3, hours=1, conns_per_node_hour=300, seed=6), str(out), workers=1, progress=False,
             rotate_minutes=5)
    node = sorted(os.listdir(out / "transport"))[0]
    for seg in sorted((out / "transport" / node).iterdir()):
        seg.with_name(seg.name + ".gz").write_bytes(gzip.compress(seg.read_bytes()))
        seg.unlink()
    return out


def _copy(fleet, dst):
    import shutil
    shutil.copytree(fleet, dst)
    return dst


def _lines(root) -> Counter:
    """(stream, node, origin, line) of every line of the contract's files under `root`."""
    import gzip
    out = Counter()
    for stream in STREAMS:
        for node in sorted(os.listdir(root / stream)):
            for name in sorted(os.listdir(root / stream / node)):
                if not FILE_NAME.match(name):
                    continue
                data = (root / stream / node / name).read_bytes()
                data = gzip.decompress(data) if name.endswith(".gz") else data
                for i, line in enumerate(data.split(b"\n")[:len(data.split(b"\n")) - (data.endswith(b"\n"))], 1):
                    out[(stream, node, f"{stream}/{node}/{name}:{i}", line)] += 1
    return out


def _records(broker, streams=STREAMS) -> list:
    return consume_all(broker.bootstrap(), [f"ccs.{s}" for s in streams])


def _as_lines(msgs) -> Counter:
    out = Counter()
    for m in msgs:
        h = dict(m.headers())
        out[(h["ccs.stream"].decode(), m.key().decode(), h["ccs.origin"].decode(), m.value())] += 1
    return out


def test_broker_serves_a_topic_per_stream(kafka_broker):
    st = kafka_broker.status()
    print(f"broker: pid {st['pid']}, rss {st['rss_mib']:.0f} MiB, {st['address']}")
    assert st["running"] and st["listening"], f"broker not serving: {st}"
    assert st["topics"] == {f"ccs.{s}": kafka_broker.partitions for s in STREAMS}, \
        f"topics per stream with {kafka_broker.partitions} partitions each, got {st['topics']}"


def test_shipper_sends_every_line_once_keyed_by_node_and_resumes(kafka_broker, fleet, tmp_path):
    """A pass cut short (`limit`) records what was acknowledged; a new shipper (a restart) sends
    exactly the rest; the broker then holds every line of the files once, keyed and partitioned by
    node, with its origin and identity; a third pass sends nothing."""
    from ccselect.export.edge.shipper import Shipper
    root = _copy(fleet, tmp_path / "fleet")
    # what a shipper meets at an edge: a malformed line, a segment still being written, a stray file
    node = sorted(os.listdir(root / "transport"))[0]
    hourly = sorted((root / "transport" / node).iterdir())[0]
    with open(hourly, "ab") as f:
        f.write(b'{"conn_id": "broken\n')
    (root / "transport" / node / ".2026-11-01T0101.jsonl.part").write_bytes(b'{"half": 1}\n')
    (root / "transport" / node / "notes.txt").write_text("not a log\n")
    want = _lines(root)
    assert sum(want.values()) > 1000, "the fleet is too small to test anything"
    # the topics hold earlier tests' records too: count only this root's
    before = _as_lines(_records(kafka_broker))

    cut = Shipper(str(root), kafka_broker.bootstrap(), batch=250)
    first = cut.ship(limit=700)
    cut.close()
    assert first["sent"] == 700, first
    assert [os.path.basename(p) for p, _ in first["skipped"]] == ["notes.txt"], first["skipped"]
    rest = Shipper(str(root), kafka_broker.bootstrap(), batch=250)
    second = rest.ship()
    assert first["sent"] + second["sent"] == sum(want.values()), (first, second, sum(want.values()))
    assert rest.ship()["sent"] == 0, "a pass after everything was acknowledged sent records again"
    rest.close()

    msgs = [m for m in _records(kafka_broker)]
    got = _as_lines(msgs) - before
    assert got == want, (f"lines missing: {list((want - got).items())[:3]}; "
                         f"extra or repeated: {list((got - want).items())[:3]}")
    parts = {}
    for m in msgs:
        parts.setdefault((m.topic(), m.key()), set()).add(m.partition())
    assert all(len(p) == 1 for p in parts.values()), f"a node's records in several partitions: {parts}"
    for m in msgs:
        h = dict(m.headers())
        rec = None
        try:
            rec = json.loads(m.value())
        except ValueError:
            pass
        stream = h["ccs.stream"].decode()
        if isinstance(rec, dict) and IDENTITY[stream]:
            assert h["ccs.identity"].decode() == "/".join(str(rec[f]) for f in IDENTITY[stream]), h
        if rec is None:
            assert "ccs.identity" not in h, f"an identity for a line that is no JSON: {m.value()[:60]}"
    assert any(m.value() == b'{"conn_id": "broken' for m in msgs), "the malformed line was not shipped"


def test_shipper_killed_mid_pass_resends_at_most_the_unacknowledged_tail(kafka_broker, segments, tmp_path):
    """`kill -9` of a running shipper, then a restart: every line of the agent's segments (plain
    and gzipped) reaches the broker, and the lines sent twice are only those after the prefix its
    state had recorded (at most a batch per file)."""
    root = _copy(segments, tmp_path / "fleet")
    streams = ("transport",)
    want = Counter({k: v for k, v in _lines(root).items() if k[0] in streams})
    before = _as_lines(_records(kafka_broker, streams))
    state = root / "_shipper" / "state.json"
    batch = 20
    cmd = [sys.executable, "-m", "ccselect.export.edge.shipper", "--root", str(root), "--bootstrap", kafka_broker.bootstrap(),
           "--stream", "transport", "--batch", str(batch)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    recorded = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            recorded = sum(v["lines"] for v in json.loads(state.read_text())["files"].values())
        except (OSError, ValueError, KeyError):
            recorded = 0
        if recorded >= 3 * batch:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate()[0].decode()
    assert proc.returncode == -signal.SIGKILL, f"the shipper ended before the kill (rc {proc.returncode}): {out}"
    kept = {k: v["lines"] for k, v in json.loads(state.read_text())["files"].items()}
    assert 0 < sum(kept.values()) < sum(want.values()), f"not killed mid-pass: state {kept}"

    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    got = _as_lines(_records(kafka_broker, streams)) - before
    assert +(want - got) == Counter(), f"lines never shipped: {list((want - got).items())[:3]}"
    twice = got - want
    for (stream, node, origin, _), n in twice.items():
        rel, line = origin.rsplit(":", 1)
        assert n == 1 and int(line) > kept.get(rel, 0), f"{origin} sent {n + 1} times, state had {kept.get(rel)}"
    per_file = Counter(origin.rsplit(":", 1)[0] for (_, _, origin, _) in twice)
    assert all(n <= batch for n in per_file.values()), f"more than a batch resent: {per_file}"
    print(f"killed with {sum(kept.values())} lines recorded; resent {sum(twice.values())} lines")
