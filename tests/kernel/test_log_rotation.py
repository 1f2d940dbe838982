"""The agent's rotated transport log (issue 26, ccselect/contract.py ROTATE_MINUTES): segments under
the contract's names, hidden as `.<name>.part` while written, renamed when the agent stops or the
wall clock passes a segment's end, reopened under `.<seq>` once closed; a `.part` a killed agent
left recovered; a rotation that does not divide the hour refused.

Real connections to a listener in a throwaway cgroup, every one logged (sample rate 1); the
assertions are on the files the agent leaves, read back record by record."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import time

import pytest
from _edge_helpers import connect_accept, in_cgroup, listener, validate_transport_record

from ccselect import contract
from ccselect.export.edge.agent import EdgeConfig, Service

pytestmark = pytest.mark.kernel

GRACE_S = 2.0   # translog.c SEG_GRACE_MS


def _connect(ls, net: str, n: int) -> set[tuple[str, int]]:
    """n connections from <net>.1 .. <net>.n, each with one request, closed; -> (ip, port) each."""
    made = set()
    for i in range(1, n + 1):
        c, acc, peer = connect_accept(ls, f"{net}.{i}")
        c.sendall(b"GET /x\r\n")
        assert acc.recv(64) == b"GET /x\r\n", "request received"
        c.close()
        acc.close()
        made.add((f"{net}.{i}", peer[1]))
    return made


def _files(d: str) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """(visible files, hidden .part files) of a node's transport folder: name -> records."""
    seen, hidden = {}, {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        with open(os.path.join(d, name)) as f:
            recs = [json.loads(x) for x in f]
        (hidden if name.startswith(".") else seen)[name] = recs
    return seen, hidden


def _minute_of(ts_ms: int) -> str:
    """`YYYY-MM-DDTHHMM` of a time (rotate_minutes 1)."""
    return contract.segment_file_name(ts_ms, 1)[:-len(".jsonl")]


def _rotating_edge(edge):
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.config.rotate_minutes = 1
    edge.configure([Service(ls.getsockname()[1], "video")], sample_rate=1.0)
    return ls, contract.stream_dir(edge.logs, "transport", "test-node")


def test_segments_named_closed_on_stop_and_reopened(edge):
    ls, d = _rotating_edge(edge)
    made, closed = {}, set()
    # run 1 and run 2: the daemon, stopped with SIGTERM; run 3: a one-off drain
    for run in (1, 2):
        proc = edge.agent.run(edge.logs)
        edge.procs.append(proc)
        made[run] = _connect(ls, f"127.90.{run}", 6)
        time.sleep(0.6)
        assert proc.poll() is None, f"run {run}: agent daemon running"
        seen, hidden = _files(d)
        now_ms = time.time() * 1000
        assert hidden, f"run {run}: the open segments are hidden while written ({sorted(seen)})"
        for name in set(seen) - closed:
            end_ms = seen[name][0]["ts_end_ms"] // 60000 * 60000 + 60000
            assert end_ms + GRACE_S * 1000 <= now_ms, \
                f"run {run}: {name} visible before its minute and grace were over"
        _, err = edge.agent.stop(proc)
        assert proc.returncode == 0, f"run {run}: agent exit {proc.returncode}: {err}"
        seen, hidden = _files(d)
        assert hidden == {}, f"run {run}: .part left after SIGTERM: {sorted(hidden)}"
        closed = set(seen)
    made[3] = _connect(ls, "127.90.3", 4)
    time.sleep(0.3)
    assert edge.agent.log(edge.logs) == 4, "the drain wrote the 4 connections made while no agent ran"

    seen, hidden = _files(d)
    assert hidden == {}, f".part left after the drain: {sorted(hidden)}"
    run_of = {(ip, port): run for run, conns in made.items() for ip, port in conns}
    by_conn = collections.Counter()
    runs_in = collections.defaultdict(set)          # minute -> runs with records in it
    files_in = collections.defaultdict(list)        # minute -> seq of its files
    for name, recs in seen.items():
        m = contract.FILE_NAME.match(name)
        assert m and m.group(2) is not None and not m.group(4), f"{name}: not a segment name of the contract"
        assert recs, f"{name}: an empty segment was written"
        minute = m.group(1) + m.group(2)
        files_in[minute].append(int(m.group(3) or 0))
        runs = {run_of.get((r["client_ip"], r["client_port"])) for r in recs}
        assert len(runs) == 1 and None not in runs, f"{name}: records of runs {runs} (each stop closes its files)"
        runs_in[minute] |= runs
        for r in recs:
            assert validate_transport_record(r) == [], f"{name}: {r['client_ip']} breaks the contract"
            assert _minute_of(r["ts_end_ms"]) == minute, f"{name}: ts_end_ms {r['ts_end_ms']} outside the segment"
            assert contract.hour_file_name(r["ts_end_ms"] // 3_600_000 * 3_600_000)[:13] == m.group(1), \
                f"{name}: record outside the file's hour"
            by_conn[r["conn_id"]] += 1
    assert [c for c, n in by_conn.items() if n != 1] == [], "a connection in more than one record"
    logged = {(r["client_ip"], r["client_port"]) for recs in seen.values() for r in recs}
    want = set().union(*made.values())
    assert logged == want and sum(by_conn.values()) == len(want), \
        f"connections logged {len(logged)}, made {len(want)}; missing {sorted(want - logged)[:3]}"
    # a minute written by two runs: the second reopened it as .1 (and a third as .2)
    for minute, seqs in files_in.items():
        assert sorted(seqs) == list(range(len(runs_in[minute]))), \
            f"{minute}: files .{sorted(seqs)} for {len(runs_in[minute])} runs"


def test_part_left_by_a_killed_agent_is_recovered(edge):
    ls, d = _rotating_edge(edge)
    os.makedirs(d)
    whole = '{"conn_id": "a"}\n{"conn_id": "b"}\n'
    with open(os.path.join(d, ".2020-01-01T0000.jsonl.part"), "w") as f:
        f.write(whole + '{"conn_id": "c", "ts_')           # killed in the middle of a record
    with open(os.path.join(d, ".2020-01-01T0001.jsonl.part"), "w") as f:
        f.write('{"conn_id": "d", ')                        # not one whole record
    future = contract.segment_file_name(int(time.time() * 1000) + 3_600_000)
    with open(os.path.join(d, f".{future}.part"), "w") as f:
        f.write(whole)                                      # not over yet: left alone
    made = _connect(ls, "127.91.0", 2)
    time.sleep(0.3)
    assert edge.agent.log(edge.logs) == len(made), "drained"
    names = sorted(os.listdir(d))
    assert open(os.path.join(d, "2020-01-01T0000.jsonl")).read() == whole, \
        "the ended .part renamed into place, its partial last line cut"
    assert "2020-01-01T0001.jsonl" not in names and ".2020-01-01T0001.jsonl.part" not in names, \
        f"a .part without a whole record removed: {names}"
    assert f".{future}.part" in names and future not in names, f"a segment not over is left: {names}"


@pytest.mark.slow
def test_segment_closed_when_its_minute_is_over(edge):
    """The daemon renames a segment 2 s after its minute, while it runs and with nothing new to
    write; the next minute's stays hidden. Waits for the next minute boundary (up to a minute)."""
    ls, d = _rotating_edge(edge)
    proc = edge.agent.run(edge.logs)
    edge.procs.append(proc)
    boundary = (time.time() // 60 + 1) * 60
    if boundary - time.time() < 3:
        boundary += 60
    time.sleep(boundary - 2.5 - time.time())
    before = _connect(ls, "127.92.1", 3)                    # closed in the minute before the boundary
    time.sleep(max(0.0, boundary + 0.3 - time.time()))
    after = _connect(ls, "127.92.2", 3)                     # and after it
    time.sleep(max(0.0, boundary + GRACE_S + 0.8 - time.time()))
    assert proc.poll() is None, "agent daemon running"
    seen, hidden = _files(d)
    old = contract.segment_file_name(int(boundary * 1000) - 1)
    new = contract.segment_file_name(int(boundary * 1000))
    assert old in seen, f"the segment of the minute before renamed by the running agent: {sorted(seen)}, {sorted(hidden)}"
    assert {(r["client_ip"], r["client_port"]) for r in seen[old]} == before, f"{old} holds the minute's connections"
    assert new not in seen and f".{new}.part" in hidden, f"the current minute's segment still hidden: {sorted(hidden)}"
    assert {(r["client_ip"], r["client_port"]) for r in hidden[f".{new}.part"]} == after, f"{new}: its connections"
    _, err = edge.agent.stop(proc)
    assert proc.returncode == 0, err
    seen, hidden = _files(d)
    assert hidden == {} and new in seen, f"stopped: {sorted(seen)}, hidden {sorted(hidden)}"


@pytest.mark.parametrize("value,line,message", [
    ("7", 2, "rotate_minutes: 7 does not divide the hour"),
    ("60", 2, "rotate_minutes: 60 is out of range 0..30"),
    ("1m", 2, "rotate_minutes: \"1m\" is not an integer"),
])
def test_rotate_minutes_must_divide_the_hour(edge_binary, tmp_path, value, line, message):
    path = tmp_path / "edge.yaml"
    path.write_text(f"node_id: n1\nrotate_minutes: {value}\npin_dir: /sys/fs/bpf/ccs-test-nonexistent\n")
    r = subprocess.run([edge_binary, "--config", str(path), "status", "--json"], capture_output=True, text=True)
    assert r.returncode != 0, f"rotate_minutes {value}: accepted"
    assert f"{path}:{line}:" in r.stderr and message in r.stderr, f"rotate_minutes {value}: {r.stderr.strip()!r}"
    with pytest.raises(ValueError, match="rotate_minutes"):
        EdgeConfig.from_yaml(str(path))
