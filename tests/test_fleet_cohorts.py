"""Progressive cohorts in the fleet file (export/delivery/rollout.py, issue 58) and the freeze
record in the store (export/delivery/freeze.py); no agent needed (tests/kernel/test_rollout_gates.py
rolls out through real ones)."""
from __future__ import annotations

import time

import pytest
import yaml

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.delivery import freeze
from ccselect.export.delivery.rollout import load_fleet
from ccselect.export.delivery.store import Store


def _fleet(tmp_path, cfg, nodes, cohorts=None):
    doc = {"nodes": [{"node_id": f"n{i}", **extra, "agent": {"cgroup": f"/cg/n{i}", "pin_dir": f"/p/n{i}"}}
                     for i, extra in enumerate(nodes)]}
    if cohorts is not None:
        doc["cohorts"] = cohorts
    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump(doc))
    return load_fleet(str(p), cfg)


def _names(fleet):
    return [(c, [n.node_id for n in ns]) for c, ns in fleet.cohorts]


def test_without_cohorts_the_canary_then_the_rest(tmp_path, cfg):
    f = _fleet(tmp_path, cfg, [{"canary": False}, {"canary": True}, {}])
    assert _names(f) == [("canary", ["n1"]), ("rest", ["n0", "n2"])]
    assert [n.node_id for n in f.canaries] == ["n1"]


def test_shares_fill_cohorts_in_order_and_named_nodes_stay_put(tmp_path, cfg):
    cohorts = ["canary", {"name": "10%", "share": 0.1}, {"name": "50%", "share": 0.5}, "all"]
    f = _fleet(tmp_path, cfg, [{"canary": True}] + [{}] * 8 + [{"cohort": "all"}], cohorts)
    # 10 nodes: the canary is already 10%; 50% → 5 nodes had it (the canary + 4); all the rest
    assert _names(f) == [("canary", ["n0"]), ("50%", ["n1", "n2", "n3", "n4"]),
                         ("all", ["n5", "n6", "n7", "n8", "n9"])]
    f = _fleet(tmp_path, cfg, [{"cohort": "canary"}, {}], cohorts)
    assert _names(f) == [("canary", ["n0"]), ("all", ["n1"])] and f.nodes[0].canary
    # the shipped fleet file: two nodes, the 50% cohort empty
    from ccs_testing import REPO
    shipped = load_fleet(str(REPO / "infra" / "fleet.yaml"), cfg)
    assert _names(shipped) == [("canary", ["edge-local-canary"]), ("all", ["edge-local-01"])]


@pytest.mark.parametrize("cohorts, nodes, match", [
    (["canary"], [{"canary": True}], "at least two distinct"),
    (["canary", {"name": "half", "share": 0.5}, {"name": "ten", "share": 0.1}, "all"], [{"canary": True}], "growing"),
    (["canary", "all"], [{"canary": True}, {"cohort": "typo"}], "cohort 'typo' is not in"),
    (["canary", "all"], [{}], "no canary node"),
])
def test_bad_cohorts_are_refused(tmp_path, cfg, cohorts, nodes, match):
    with pytest.raises(ValueError, match=match):
        _fleet(tmp_path, cfg, nodes, cohorts)


def test_freeze_refuses_publish_and_current_until_lifted(tmp_path):
    key = signing.generate_key()
    now = int(time.time())

    def table(v):
        return signing.write_table([tf.Entry("81.20.0.0/16", "bbr")], v, "1", now + 60, str(tmp_path / f"o{v}"),
                                   key, created=now, extra={"coverage": 1.0}).manifest
    store = Store(str(tmp_path / "store"))
    store.publish(table(1))
    store.set_current(1)
    with pytest.raises(ValueError, match="needs a reason"):
        freeze.freeze(store, " ")
    rec = freeze.freeze(store, "v2 doubled retransmissions on pop-7", who="ana@ops")
    assert rec["pinned"] == 1 and rec["who"] == "ana@ops"
    with pytest.raises(freeze.Frozen, match="refused publishing table 2: the fleet is frozen since .* by ana@ops: "
                                            "v2 doubled retransmissions on pop-7 — table 1 .* pinned"):
        store.publish(table(2))
    store.set_current(1)          # the pinned table stays current
    with pytest.raises(freeze.Frozen, match="already frozen"):
        freeze.freeze(store, "again")
    freeze.unfreeze(store, "pop-7 fixed", who="bo@ops")
    assert freeze.current(store) is None
    store.publish(table(2))
    store.set_current(2)
    assert [(r["action"], r["who"]) for r in freeze.history(store)] == [("freeze", "ana@ops"), ("unfreeze", "bo@ops")]
    with pytest.raises(Exception, match="not frozen"):
        freeze.unfreeze(store, "twice")


def test_a_decision_recorded_again_replaces_its_row(tmp_path):
    from ccselect.export.delivery import gates
    log = gates.DecisionLog(str(tmp_path / "rollout_decisions"))
    ctx = gates.GateContext("canary", 0, ["n0"], 3, 1, 0, {})
    log.record("r1", ctx, gates.Decision("observe", "first look", {"looks": 1}, 1.0))
    log.record("r2", ctx, gates.Decision("promote", "r2's", {}, 2.0))
    log.record("r1", ctx, gates.Decision("rollback", "it's worse", {"looks": 2}, 3.0))
    rows = gates.read_decisions(log.path)
    assert sorted((r["rollout_id"], r["decision"], r["reason"], r["minute"]) for r in rows) == [
        ("r1", "rollback", "it's worse", 3.0), ("r2", "promote", "r2's", 2.0)]
    assert gates.read_decisions(str(tmp_path / "none")) == []
