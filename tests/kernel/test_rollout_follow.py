"""Issue 58 on a fleet that reacts (flows/follow.py): real agents load the tables the rollout gives
them, the simulated clients of each node get the CC its agent would give them under the table
live there (export/delivery/mirror.py), and the canary's gate (gates.CanaryVerdict, on the
simulated clock) judges the outcomes those CCs made. A planted bad table — every decision of a
good one inverted — is rolled back from the canary within the window and never reaches the next
cohort. bench/rollout_drill.py runs twenty good tables and the bad one on a larger fleet."""
from __future__ import annotations

import json
import time

import pytest
import yaml
from test_rollout import LocalFleet

from ccselect.settings import CanarySettings
from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.delivery import freeze, gates
from ccselect.export.delivery.rollout import Health, deploy
from ccselect.export.delivery.store import Store
from ccselect.contract import segment_file_name
from ccselect.sim.params import SimParams

pytestmark = pytest.mark.kernel
HEALTH = Health(wait_s=0.2, min_rate_ratio=0.5)
#: the window the canary has to roll a bad table back in, minutes of simulated traffic
WINDOW_MIN = CanarySettings().max_minutes


@pytest.fixture
def follow_fleet(edge_binary, keys, tmp_path):
    from ccs_testing import write_config
    from ccselect.config import load_config

    from ccselect.flows.follow import FollowFleet
    cfg = load_config(write_config(tmp_path))
    lf = LocalFleet(edge_binary, keys["public_path"], tmp_path, more=1,
                    cohorts=["canary", {"name": "50%", "share": 0.5}, "all"])
    doc = yaml.safe_load(open(lf.path))
    for n in doc["nodes"]:        # the kernel's A/B split on: the canary's control arm
        n["agent"]["services"][0]["ab"] = True
    with open(lf.path, "w") as f:
        yaml.safe_dump(doc, f)
    try:
        lf.attach_all(cfg)
        fleet = lf.fleet(cfg)
        store = Store(str(tmp_path / "store"))
        # nodes whose default CC is bbr (the control arm's): where the inverted table puts
        # cellular clients on cubic, ALICCS Observation III's policed paths (docs/results/rollout-drill.md)
        ff = FollowFleet(SimParams(nodes=3, hours=3, start="2026-11-01T12:00:00",
                                   conns_per_node_hour=12000, seed=7, cc_mode="default"),
                         fleet, store, keys["public_path"], str(tmp_path / "scratch"), default_cc="bbr")
        yield cfg, lf, fleet, store, ff
    finally:
        lf.cleanup(cfg)


def _publish(store, ff, keys, out, version, invert=False):
    from ccselect.flows.follow import dominance_entries
    entries = {str(e.prefix): e for i in range(len(ff.nodes)) for e in dominance_entries(ff.world, i, 0, invert=invert)}
    now = int(time.time())
    store.publish(signing.write_table(list(entries.values()), version, "m1", now + 3600, out, keys["private"],
                                      created=now, extra={"coverage": 1.0}).manifest)


def test_a_planted_bad_table_is_rolled_back_from_the_canary_on_its_own_outcomes(follow_fleet, keys, tmp_path):
    cfg, lf, fleet, store, ff = follow_fleet
    ids = [n.node_id for n in fleet.nodes]
    out = str(tmp_path / "export")
    _publish(store, ff, keys, out, 1)
    assert deploy(fleet, store, 1, HEALTH, log=lambda m: None)["ok"]
    ff.now()                      # table 1 live on every node from the clock's start ...
    ff.sleep(20 * 60)             # ... for 20 minutes of traffic
    _publish(store, ff, keys, out, 2, invert=True)
    log = gates.DecisionLog.for_config(cfg)
    gate = gates.CanaryVerdict(CanarySettings(), ff.moments, look_s=60, clock=ff.now, sleep=ff.sleep)
    t_load = ff.now()
    res = deploy(fleet, store, 2, HEALTH, gate=gate, decisions=log, log=lambda m: None)
    # rolled back on the canary, within the window, never past it; the fleet frozen on table 1
    assert not res["ok"] and list(res["nodes"]) == ids[:1], res.get("stopped")
    d = res["decisions"][-1]
    assert (d["cohort"], d["decision"]) == ("canary", "rollback") and 0 < d["minute"] <= WINDOW_MIN, d
    assert any(f"{m}: treatment {s}" in d["reason"] for m, s in (("delivery_rate", "-"), ("retrans_rate", "+"),
                                                                  ("rebuffer_rate", "+"))), d["reason"]
    assert [lf.status(cfg, i)["table"]["version"] for i in range(3)] == [1, 1, 1] and store.current() == 1
    assert freeze.current(store)["who"] == "rollout"
    assert json.loads(gates.read_decisions(log.path)[-1]["evidence"])["gate"] == "canary"
    # the canary's logs follow what was live: table 2's inverted CCs only while it was live
    t_back = ff.now()
    assert [ff.versions_seen(n) for n in ids] == [[1, 2, 1], [1], [1]]
    assert t_back - t_load == pytest.approx(d["minute"] * 60_000, abs=1)
    t_end = t_back + 10 * 60_000
    ff.sleep(10 * 60)
    tr, _ = ff.logs(ids[0], t_load - 20 * 60_000, t_end)
    v2 = tr.filter(tr["table_version"] == "2")
    assert v2.height > 1000 and v2["ts_start_ms"].min() >= t_load and v2["ts_start_ms"].max() < t_back
    later = tr.filter(tr["ts_start_ms"] >= t_back)
    assert later.height > 500 and set(later["table_version"]) == {"1"}
    t1 = {str(e.prefix): e.cc for e in _entries(store, keys, tmp_path, 1)}
    for part, flip in ((v2, True), (tr.filter((tr["table_version"] == "1") & (tr["ts_start_ms"] < t_load)), False)):
        hit = part.filter(part["decision"] == "table")
        want = [_other(t1[_p24(ip)]) if flip else t1[_p24(ip)] for ip in hit["client_ip"].to_list()]
        assert hit.height > 200 and hit["cc"].to_list() == want
        ctrl = part.filter(part["decision"] == "ab_control")
        assert ctrl.height > 200 and set(ctrl["cc"]) == {"bbr"}
        assert not any(tf.ab_bucket_odd(ip) for ip in ctrl["client_ip"].to_list()[:300])
    # the other nodes never ran table 2
    for n in ids[1:]:
        tr_n, _ = ff.logs(n, t_load, t_end)
        assert tr_n.height > 1000 and "2" not in set(tr_n["table_version"])


def _entries(store, keys, tmp_path, version):
    man, t = signing.read_manifest(store.fetch(version, str(tmp_path / "check")), signing.load_public_key(keys["public_path"]))
    return t.entries


def _other(cc):
    return {"bbr": "cubic", "cubic": "bbr"}[cc]


def _p24(ip):
    import ipaddress
    a = ipaddress.ip_address(ip)
    return str(ipaddress.ip_network(f"{ip}/24", strict=False)) if a.version == 4 else \
        str(ipaddress.ip_network(f"{ip}/48", strict=False))





def test_ccs_simulate_follow_writes_segments_that_follow_a_table_swap(edge_binary, keys, tmp_path):
    """`ccs simulate --follow` against two real agents: table 1 live, the command writing each
    node's one-minute segments on a simulated clock (a minute every 2 s); table 2 (every decision
    of 1 inverted) rolled out while it runs. The segments the stream would read hold table 1's CCs
    for the connections accepted before the swap reached the simulation, table 2's after it, the
    control arm on the default CC throughout, under the fleet's node ids."""
    import glob
    import os
    import subprocess
    import sys

    import polars as pl
    from ccs_testing import REPO, write_config
    from ccselect.app.commands.sim import FollowArgs, follow_params
    from ccselect.config import load_config
    from ccselect.flows.follow import dominance_entries
    from ccselect.sim.world import World

    cfg_path = write_config(tmp_path)
    cfg = load_config(cfg_path)
    lf = LocalFleet(edge_binary, keys["public_path"], tmp_path)
    doc = yaml.safe_load(open(lf.path))
    for n in doc["nodes"]:
        n["agent"]["services"][0]["ab"] = True
    with open(lf.path, "w") as f:
        yaml.safe_dump(doc, f)
    out, store_dir = tmp_path / "raw", str(tmp_path / "store")
    argv = ["--out", str(out), "--nodes", "2", "--conns-per-node-hour", "6000", "--seed", "7",
            "--start", "2026-11-01T12:00:00", "--minutes", "8", "--speed", "30", "--default-cc", "bbr",
            "--fleet", lf.path, "--store", store_dir, "--public-key", keys["public_path"]]
    params, _, _ = follow_params(FollowArgs(str(out), 2, "2026-11-01T12:00:00", 7, 6000, lf.path, store_dir,
                                            keys["public_path"], 0, 8, 30.0, "bbr", None, str(cfg_path), True), 2, cfg)
    world = World(params)          # the command's simulated fleet: the tables name its prefixes

    def publish(version, invert):
        entries = {str(e.prefix): e for i in range(2) for e in dominance_entries(world, i, 0, invert=invert)}
        now = int(time.time())
        store.publish(signing.write_table(list(entries.values()), version, "m1", now + 3600, str(tmp_path / "export"),
                                          keys["private"], created=now, extra={"coverage": 1.0}).manifest)
        return {str(e.prefix): e.cc for e in entries.values()}

    proc = None
    try:
        lf.attach_all(cfg)
        fleet, store = lf.fleet(cfg), Store(store_dir)
        t1 = publish(1, False)
        assert deploy(fleet, store, 1, HEALTH, log=lambda m: None)["ok"], "table 1 live on both agents"
        proc = subprocess.Popen([sys.executable, "-m", "ccselect.app.cli", "simulate", "--follow", *argv,
                                 "--json", "--config", str(cfg_path)], cwd=str(REPO), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        canary = fleet.nodes[0].node_id
        deadline = time.time() + 90
        while len(glob.glob(str(out / "transport" / canary / "*.jsonl"))) < 3:   # three minutes written
            assert proc.poll() is None and time.time() < deadline, f"the command stopped: {proc.communicate()}"
            time.sleep(0.2)
        t2 = publish(2, True)
        assert deploy(fleet, store, 2, HEALTH, log=lambda m: None)["ok"], "table 2 live on both agents"
        so, se = proc.communicate(timeout=120)
        assert proc.returncode == 0, se
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        lf.cleanup(cfg)
    rec = json.loads(so)
    assert rec == json.load(open(out / "follow.json")), "the record printed is the one written"
    assert os.path.exists(out / "reference" / "ip_asn_region.csv"), "the stream's reference beside the segments"
    for n in fleet.nodes:
        spans = rec["spans"][n.node_id]
        assert [s["version"] for s in spans] == [1, 2], f"{n.node_id}: the simulation saw table 1 then 2: {spans}"
        t_swap = spans[1]["from_ms"]
        assert rec["from_ms"] < t_swap < rec["to_ms"] and (t_swap - rec["from_ms"]) % 60_000 == 0, spans
        files = sorted(glob.glob(str(out / "transport" / n.node_id / "*.jsonl")))
        assert len(files) == 8, f"{n.node_id}: a segment a simulated minute: {files}"
        tr = pl.concat([pl.read_ndjson(f).with_columns(pl.lit(os.path.basename(f)).alias("_file")) for f in files])
        assert set(tr["node_id"]) == {n.node_id}, "records carry the agent's node id"
        assert tr["ts_end_ms"].min() >= rec["from_ms"] and tr["ts_end_ms"].max() < rec["to_ms"]
        assert all(f == segment_file_name(t) for f, t in zip(tr["_file"], tr["ts_end_ms"])), "each in its minute"
        before, after = tr.filter(pl.col("ts_start_ms") < t_swap), tr.filter(pl.col("ts_start_ms") >= t_swap)
        assert before.height > 100 and after.height > 100, (before.height, after.height)
        # each connection logged with the table live at its accept, but for those sim/follow.py
        # decided on another generation's accept time (a swap between two), counted in the record
        off = before.filter(pl.col("table_version") != "1").vstack(after.filter(pl.col("table_version") != "2"))
        counted = sum(g["decided_off_start"] for g in rec["generation"][n.node_id].values())
        assert off.height <= counted, f"{n.node_id}: {off.height} connections off their accept's table, {counted} counted"
        assert off.height == 0 or (off["ts_start_ms"] - t_swap).abs().max() < 10_000, "only near the swap"
        before, after = before.filter(pl.col("table_version") == "1"), after.filter(pl.col("table_version") == "2")
        for part, table in ((before, t1), (after, t2)):
            hit = part.filter(pl.col("decision") == "table")
            assert hit.height > 30 and hit["cc"].to_list() == [table[_p24(ip)] for ip in hit["client_ip"].to_list()], \
                "a table decision gives the live table's CC for the client's prefix"
            ctrl = part.filter(pl.col("decision") == "ab_control")
            assert ctrl.height > 30 and set(ctrl["cc"]) == {"bbr"}, "the control arm stays on the default CC"
        assert (after.filter(pl.col("decision") == "table")["cc"] == "cubic").sum() > 0 and \
            (before.filter(pl.col("decision") == "table")["cc"] == "cubic").sum() > 0
        for s in ("access", "qoe"):
            assert glob.glob(str(out / s / n.node_id / "*.jsonl")), f"{n.node_id}: {s} segments written"
        assert glob.glob(str(out / "_truth" / "connections" / n.node_id / "*.parquet")), "the truth kept apart"
