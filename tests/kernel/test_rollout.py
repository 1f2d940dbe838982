"""`ccs rollout` machinery on a two-node fleet on this machine (a canary and one more node, each
its own ccs-edge agent on its own cgroup and pin dir): store → canary → health → rest; rollback;
a canary whose connection rate collapses after the load is rolled back and the rest untouched."""
from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
import yaml
from _edge_helpers import CGROUP_ROOT, connect_accept, in_cgroup, listener, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.delivery.rollout import Health, deploy, load_fleet
from ccselect.export.delivery.store import Store, StoreError

pytestmark = pytest.mark.kernel


class LocalFleet:
    """Two agents (canary + one), each attached to its own throwaway cgroup with one listener."""

    def __init__(self, binary, public_key, tmp_path, netns_runner=None, bind=None, more=0, cohorts=None):
        tag = f"{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.nodes = []
        for nid, canary in ((f"ro-canary-{tag}", True), (f"ro-node-{tag}", False),
                            *((f"ro-n{i}-{tag}", False) for i in range(more))):
            cg = os.path.join(CGROUP_ROOT, nid)
            os.makedirs(cg)
            with in_cgroup(cg):
                if netns_runner is not None:   # bind: ("::", AF_INET6) serves v4 and v6 clients
                    ls = netns_runner.call(listener, bind[1], bind[0])
                else:
                    ls = listener()
            self.nodes.append({"node_id": nid, "canary": canary, "cgroup": cg, "pin_dir": f"/sys/fs/bpf/{nid}",
                               "listener": ls, "table_dir": str(tmp_path / nid / "tables")})
        self.path = str(tmp_path / "fleet.yaml")
        doc = {"nodes": [{"node_id": n["node_id"], "canary": n["canary"], "table_dir": n["table_dir"],
                          "binary": binary,
                          "agent": {"cgroup": n["cgroup"], "pin_dir": n["pin_dir"], "public_key": public_key,
                                    "sample_rate": 0.0,
                                    **({} if os.environ.get("CCS_EDGE_NO_STATE_DIR")   # conftest.py
                                       else {"state_dir": str(tmp_path / n["node_id"] / "state")}),
                                    "services": [{"port": n["listener"].getsockname()[1], "name": "video"}]}}
                         for n in self.nodes]}
        if cohorts:
            doc["cohorts"] = cohorts
        with open(self.path, "w") as f:
            yaml.safe_dump(doc, f)
        self.binary = binary

    def fleet(self, cfg):
        return load_fleet(self.path, cfg)

    def attach_all(self, cfg):
        for n in self.fleet(cfg).nodes:
            a = n.agent()
            a.attach(n.config.cgroup)
            a.close()

    def status(self, cfg, i):
        a = self.fleet(cfg).nodes[i].agent()
        try:
            return a.status()
        finally:
            a.close()

    def cleanup(self, cfg):
        for n, fn in zip(self.nodes, self.fleet(cfg).nodes):
            n["listener"].close()
            a = fn.agent()
            try:
                a.detach(purge=True)
            except Exception as exc:
                print(f"detach failed: {exc}")
            a.close()
            subprocess.run(["rm", "-rf", n["pin_dir"]])
            for _ in range(50):
                try:
                    os.rmdir(n["cgroup"])
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.fixture
def fleet_env(edge_binary, keys, tmp_path):
    from ccs_testing import write_config
    from ccselect.config import load_config
    cfg = load_config(write_config(tmp_path))
    lf = LocalFleet(edge_binary, keys["public_path"], tmp_path)
    try:
        lf.attach_all(cfg)
        yield cfg, lf
    finally:
        lf.cleanup(cfg)


def _table(keys, out, version, cc, epoch=0):
    now = int(time.time())
    return signing.write_table([tf.Entry("127.0.0.0/8", cc)], version, "1", now + 3600, out,
                               keys["private"], created=now, extra={"coverage": 1.0}, epoch=epoch)


def _cc_through(lf, i, src="127.70.1.2"):
    c, a, _ = connect_accept(lf.nodes[i]["listener"], src)
    try:
        return sock_cc(a)
    finally:
        a.close()
        c.close()


def test_rollout_canary_then_rest_then_rollback(fleet_env, keys, tmp_path):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    cfg, lf = fleet_env
    default = sysctl_cc()
    a, b = other_ccs(default)
    store = Store(str(tmp_path / "store"))
    health = Health(wait_s=0.3, min_rate_ratio=0.5)
    fleet = lf.fleet(cfg)
    assert [n.canary for n in fleet.nodes] == [True, False]
    logs = []
    for version, cc in ((1, a), (2, b)):
        store.publish(_table(keys, str(tmp_path / "export"), version, cc).manifest)
        res = deploy(fleet, store, version, health, log=logs.append)
        assert res["ok"], res
        assert list(res["nodes"]) == [fleet.nodes[0].node_id, fleet.nodes[1].node_id], "canary first"
        assert store.current() == version
        for i in range(2):
            st = lf.status(cfg, i)
            assert st["table"]["version"] == version and st["table"]["enforced"], f"node {i}: {st['table']}"
            assert _cc_through(lf, i) == cc, f"node {i} enforces version {version}'s CC {cc}"
    assert res["nodes"][fleet.nodes[1].node_id]["previous_version"] == 1
    # `ccs rollback` republishes the previous version (1) on the whole fleet
    keys_dir = cfg.settings.export.keys_dir
    os.makedirs(keys_dir, exist_ok=True)
    signing.save_keypair(keys["private"], os.path.join(keys_dir, "table-signing.key.pem"),
                         os.path.join(keys_dir, "table-signing.pub.pem"))
    cfg.raw["export"]["rollout"]["health_wait_s"] = 0.3
    with open(cfg.path, "w") as f:
        yaml.safe_dump(cfg.raw, f)
    r = CliRunner().invoke(app, ["rollback", "--fleet", lf.path, "--store", str(tmp_path / "store"),
                                 "--config", str(cfg.path)])
    assert r.exit_code == 0, r.output + str(r.exception)
    assert store.current() == 1
    for i in range(2):
        assert lf.status(cfg, i)["table"]["version"] == 1
        assert _cc_through(lf, i) == a, f"node {i} back on version 1's CC"


def test_undeploy_takes_the_fleets_enforcement_off_and_says_what_a_process_keeps(fleet_env, keys, tmp_path):
    """`ccs undeploy` (make clean runs it): every node's program detached and its pins gone, so
    connections get the default CC again; a cgroup a process is still in stays, and the command
    says so and exits 1; run again once the process is gone, it removes that cgroup and exits 0."""
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    cfg, lf = fleet_env
    default = sysctl_cc()
    a, _ = other_ccs(default)
    store = Store(str(tmp_path / "store"))
    fleet = lf.fleet(cfg)
    store.publish(_table(keys, str(tmp_path / "export"), 1, a).manifest)
    assert deploy(fleet, store, 1, Health(wait_s=0.3, min_rate_ratio=0.5), log=lambda m: None)["ok"]
    assert [_cc_through(lf, i) for i in range(2)] == [a, a]
    canary, rest = lf.nodes
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        with open(os.path.join(canary["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        r = CliRunner().invoke(app, ["undeploy", "--fleet", lf.path, "--config", str(cfg.path)])
        assert r.exit_code == 1, r.output + str(r.exception)
        for n in lf.nodes:
            assert not os.path.exists(n["pin_dir"]), f"{n['node_id']}: pins purged"
        assert not os.path.exists(rest["cgroup"]) and os.path.isdir(canary["cgroup"])
        assert f"still there: cgroup {canary['cgroup']}" in r.output
        assert [_cc_through(lf, i) for i in range(2)] == [default, default], "no enforcement left"
    finally:
        sleeper.kill()
        sleeper.wait()
    r = CliRunner().invoke(app, ["undeploy", "--fleet", lf.path, "--config", str(cfg.path)])
    assert r.exit_code == 0, r.output + str(r.exception)
    assert not os.path.exists(canary["cgroup"])
    res = yaml.safe_load(r.output[r.output.index("{"):])
    assert res == {rest["node_id"]: {"was": [], "left": []}, canary["node_id"]: {"was": ["cgroup"], "left": []}}


def test_failed_canary_health_rolls_back_canary_only(fleet_env, keys, tmp_path):
    """Clients of the canary stop connecting once the new table is live (the connection rate
    collapses): the canary goes back to version 1, the other node never sees version 2, and the
    store's current version stays 1."""
    cfg, lf = fleet_env
    default = sysctl_cc()
    a, b = other_ccs(default)
    store = Store(str(tmp_path / "store"))
    fleet = lf.fleet(cfg)
    for version, cc in ((1, a), (2, b)):
        store.publish(_table(keys, str(tmp_path / "export"), version, cc).manifest)
    assert deploy(fleet, store, 1, Health(wait_s=0.2, min_rate_ratio=0.5))["ok"]

    stop = threading.Event()
    made = []

    def clients():
        while not stop.is_set():
            got = _cc_through(lf, 0, "127.70.9.9")
            made.append(got)
            if got == b:      # the new table reached these clients: they stop coming
                return
            time.sleep(0.005)

    t = threading.Thread(target=clients, daemon=True)
    t.start()
    try:
        res = deploy(fleet, store, 2, Health(wait_s=1.0, min_rate_ratio=0.5), log=print)
    finally:
        stop.set()
        t.join(10)
    canary, other = fleet.nodes[0].node_id, fleet.nodes[1].node_id
    assert not res["ok"], res
    assert "connection rate fell" in res["stopped"] and canary in res["stopped"], res["stopped"]
    assert res["nodes"][canary]["rate_before"] > 0, res["nodes"][canary]
    assert other not in res["nodes"], "the rest must not be touched after a failed canary"
    assert res["rolled_back"][canary]["rolled_back"] and res["rolled_back"][canary]["live_version"] == 1
    assert lf.status(cfg, 0)["table"]["version"] == 1, "canary back on version 1"
    assert lf.status(cfg, 1)["table"]["version"] == 1, "the other node still on version 1"
    assert store.current() == 1
    assert _cc_through(lf, 0) == a and _cc_through(lf, 1) == a


def test_refused_load_on_canary_stops_rollout(fleet_env, keys, tmp_path):
    """A table signed by a key the fleet does not trust: the canary refuses it, nothing changes."""
    cfg, lf = fleet_env
    default = sysctl_cc()
    a, _ = other_ccs(default)
    store = Store(str(tmp_path / "store"))
    now = int(time.time())
    bad = signing.write_table([tf.Entry("127.0.0.0/8", a)], 7, "1", now + 3600, str(tmp_path / "x"),
                              keys["other"], created=now)
    store.publish(bad.manifest)
    res = deploy(lf.fleet(cfg), store, 7, Health(wait_s=0.1, min_rate_ratio=0.5))
    assert not res["ok"] and "load refused" in res["stopped"] and "bad signature" in res["stopped"], res
    assert store.current() is None
    assert lf.status(cfg, 0)["table"] is None and lf.status(cfg, 1)["table"] is None


def test_new_lake_in_the_next_epoch_rolls_out_without_an_override(fleet_env, keys, tmp_path):
    """Issue 56, item 3: the fleet ran an old lake's table 7; a new lake numbers from 1. Signed
    in the next epoch its tables 1 then 2 roll out through a new store with no override (before
    the epoch, the canary refused table 1 as a replay of 7, and table 2 after it). The new lake's
    table 1 cannot replace the old store's own table 1, and `ccs rollback` to table 1 (in the
    store's history, older by (epoch, version)) is the one override the rollout passes."""
    cfg, lf = fleet_env
    a, b = other_ccs(sysctl_cc())
    health = Health(wait_s=0.2, min_rate_ratio=0.5)
    fleet = lf.fleet(cfg)
    old_store = Store(str(tmp_path / "old-store"))
    old_store.publish(_table(keys, str(tmp_path / "old-lake-1"), 1, b).manifest)
    old_store.publish(_table(keys, str(tmp_path / "old-lake"), 7, a).manifest)
    assert deploy(fleet, old_store, 7, health)["ok"]
    new_store = Store(str(tmp_path / "new-store"))
    for version, cc in ((1, b), (2, a)):
        m = _table(keys, str(tmp_path / "new-lake"), version, cc, epoch=1).manifest
        if version == 1:
            with pytest.raises(StoreError, match="already holds another table 1"):
                old_store.publish(m)
        new_store.publish(m)
        res = deploy(fleet, new_store, version, health, log=print)
        assert res["ok"], res
        for i in range(2):
            st = lf.status(cfg, i)
            assert (st["epoch_floor"], st["version_floor"]) == (1, version), st
            assert st["overrides"]["count"] == 0, f"node {i}: no override for a newer epoch: {st}"
            assert res["nodes"][fleet.nodes[i].node_id]["load"]["override"] is False
            assert _cc_through(lf, i) == cc
    # the store goes back: table 1 of epoch 1, with the agents' override naming it
    res = deploy(fleet, new_store, 1, health)
    assert res["ok"] and new_store.current() == 1, res
    for i in range(2):
        st = lf.status(cfg, i)
        assert st["overrides"]["count"] == 1 and st["overrides"]["last"]["to_epoch"] == 1, st
        assert (st["epoch_floor"], st["version_floor"]) == (1, 2), "the floor does not move down"
    # the old store's table 7 is a replay now: refused, no override (never the store's history here)
    res = deploy(fleet, old_store, 7, health)
    assert not res["ok"] and "versions only go forward" in res["stopped"], res
