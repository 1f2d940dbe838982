"""Guards against a bad generated table (issue 58, export/delivery/guards.py): caps on entries,
flow-tree nodes and bytes; growth against the live table; and the hysteresis that holds back a
table alternating with the one before the live one."""
from __future__ import annotations

import copy
import dataclasses
import ipaddress

import pandas as pd

from ccselect.export.artifact import table_format as tf
from ccselect.export.delivery import guards


def _cfg_with(cfg, **guards_kw):
    raw = copy.deepcopy(cfg.raw)
    raw["export"]["guards"] = {**raw["export"].get("guards", {}), **guards_kw}
    return dataclasses.replace(cfg, raw=raw)


def _entries(n: int, cc: str = "bbr", first: int = 0) -> tuple[tf.Entry, ...]:
    """n /24 entries from 81.0.0.0/24 on."""
    base = int(ipaddress.IPv4Address("81.0.0.0"))
    return tuple(tf.Entry(ipaddress.IPv4Network((base + ((first + i) << 8), 24)), cc) for i in range(n))


def _full(depth: int) -> tf.Tree:
    """A full binary flow tree of `depth` (2^(depth+1) − 1 nodes, breadth-first: node i's children
    2i+1 and 2i+2), splits on feature 0, leaves alternating CUBIC and BBR."""
    n, inner = 2 ** (depth + 1) - 1, 2 ** depth - 1
    nodes = [tf.TreeNode(feature=0, threshold=1000 + i, left=2 * i + 1, right=2 * i + 2) if i < inner
             else tf.TreeNode(feature=tf.TREE_LEAF, cc=1 + i % 2, conf_permille=900) for i in range(n)]
    return tf.Tree(tuple(nodes), 0, 0)


def test_size_caps_and_growth_refuse_with_their_reasons(cfg):
    live = tf.Table(1, 0, 1, _entries(200))
    # the same size as live, a small tree: within every cap
    rep = guards.GuardReport()
    guards.check_size(rep, cfg, tf.Table(2, 0, 1, _entries(200), _full(2)), live)
    assert rep.ok, rep.refusals
    assert rep.checks["size"]["value"] == {"entries": 200, "tree_nodes": 7,
                                          "bytes": len(tf.encode(tf.Table(2, 0, 1, _entries(200), _full(2))))}
    # twice the live table's entries: refused for growth
    rep = guards.GuardReport()
    guards.check_size(rep, cfg, tf.Table(2, 0, 1, _entries(400)), live)
    assert not rep.ok and rep.refusals == [rep.refusals[0]]
    assert rep.refusals[0].startswith("growth: the table is 2.00× the live version 1's entries (400 against 200)")
    assert "export.guards.max_growth (1.5×)" in rep.refusals[0]
    # a tree at the cap (the default 255 nodes: a full tree of depth 7): refused for size
    at_cap = tf.Table(2, 0, 1, _entries(200), _full(7))
    assert len(at_cap.tree.nodes) == 255
    rep = guards.GuardReport()
    guards.check_size(rep, cfg, at_cap, None)
    assert [r.split(":")[0] for r in rep.refusals] == ["size"]
    assert "a flow tree of 255 nodes reached the cap of 255 (export.guards.max_tree_nodes)" in rep.refusals[0]
    # entries and bytes over their caps, both named in one refusal
    small = _cfg_with(cfg, max_entries=100, max_artifact_bytes=1000)
    rep = guards.GuardReport()
    guards.check_size(rep, small, tf.Table(2, 0, 1, _entries(200)), None)
    assert "200 entries, over the cap of 100" in rep.refusals[0] and "over the cap of 1,000 (export.guards.max_artifact_bytes)" in rep.refusals[0]
    assert rep.checks["growth"]["ok"], "no live table: growth not judged"
    # a young fleet's table (under growth_floor_entries) may grow
    rep = guards.GuardReport()
    guards.check_size(rep, cfg, tf.Table(2, 0, 1, _entries(90)), tf.Table(1, 0, 1, _entries(10)))
    assert rep.ok and "growth not judged" in rep.checks["growth"]["detail"]


def _preds(spark, n: int):
    """One model decision per /24 of `_entries(n)` (one client each, 10 requests)."""
    recs = [{"conn_id": f"c{i}", "client_ip": f"81.0.{i}.7", "cc": "bbr", "requests": 10, "decision": "model",
             "default_cc": "cubic", "ug_id": "R1-AS1", "hour": "2026-11-01T00"} for i in range(n)]
    return spark.createDataFrame(pd.DataFrame(recs))


def test_alternating_tables_are_held_back_not_flapped(spark, cfg):
    """good (v1: 20 /24s → BBR) → bad (v2: 6 of them → CUBIC) → good again (v3 = v1's entries):
    v3 sends 30% of the traffic back to v1's CC, undoing v2: held back. A table that goes on from
    v2 instead (another 2 /24s changed) passes; so does the first change after a single table."""
    preds = _preds(spark, 20)
    good = _entries(20, "bbr")
    bad = _entries(6, "cubic") + _entries(14, "bbr", first=6)
    v1, v2 = tf.Table(1, 0, 1, good), tf.Table(2, 0, 1, bad)
    flip, back = guards.change_shares(preds, good, bad, good)
    assert (round(flip, 6), round(back, 6)) == (0.3, 0.3)
    rep = guards.GuardReport()
    guards.check_flips(rep, cfg, preds, good, v2, v1)
    assert rep.checks["flips"]["ok"], "30% is within the flip cap"
    assert not rep.ok and rep.refusals[0].startswith(
        "hysteresis: held back: the table would send 30.0% of traffic back to the CC of version 1, undoing live version 2's change")
    # onwards from v2: 2 more /24s to CUBIC, nothing sent back
    onward = _entries(8, "cubic") + _entries(12, "bbr", first=8)
    rep = guards.GuardReport()
    guards.check_flips(rep, cfg, preds, onward, v2, v1)
    assert rep.ok and rep.checks["hysteresis"]["value"] == 0.0
    # v2 judged against v1 with nothing before: a change, not an alternation
    rep = guards.GuardReport()
    guards.check_flips(rep, cfg, preds, bad, v1, None)
    assert rep.ok and "nothing to alternate with" in rep.checks["hysteresis"]["detail"]
    # and run_all gathers the hysteresis with the size caps
    rep = guards.run_all(_cfg_with(cfg, require_gate=False, min_coverage=0.0), {"coverage": 1.0}, good, preds,
                         v2, table=tf.Table(3, 0, 1, good), previous=v1)
    assert [r.split(":")[0] for r in rep.refusals] == ["hysteresis"], rep.refusals
