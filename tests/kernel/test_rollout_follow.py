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



