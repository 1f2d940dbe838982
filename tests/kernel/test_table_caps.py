"""The agent's own caps on a table (issue 58): entries, flow-tree nodes and bytes from its config
(the deployment writes them from export.guards: rollout.caps_from_guards), and growth against the
live table. A table over a cap is refused naming it; the live table stays and still decides.

Each test also shows that the cap comes from the config: the same table loads once the config
leaves the cap out (the compiled bound). Run against an agent that ignores the configured caps
(CCS_EDGE_BINARY), these tests fail."""
from __future__ import annotations

import socket
import struct

import pytest
from _edge_helpers import in_cgroup, listener, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import table_format as tf
from ccselect.export.delivery.rollout import caps_from_guards
from ccselect.export.edge.agent import CAP_KEYS, EdgeAgentError, EdgeConfig, Service

pytestmark = pytest.mark.kernel

N = tf.TreeNode
MSS = tf.TREE_FEATURES.index("mss_bytes")


def _entries(n: int, cc: str) -> list[tf.Entry]:
    """n /24s from 127.60.0.0/24 on (the live table's decide 127.60.0.1)."""
    return [tf.Entry(f"127.{60 + i // 256}.{i % 256}.0/24", cc) for i in range(n)]


def _tree(splits: int) -> tf.Tree:
    """A chain of `splits` splits on the MSS (2 × splits + 1 nodes), each left child a leaf."""
    nodes = []
    for d in range(splits):
        i = len(nodes)
        nodes += [N(MSS, threshold=100 + d, left=i + 1, right=i + 2), N(tf.TREE_LEAF, cc=1, conf_permille=900)]
    nodes.append(N(tf.TREE_LEAF, cc=2, conf_permille=900))
    return tf.Tree(tuple(nodes), 900, 0)


def _cc_of(ls, src="127.60.0.1") -> str:
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.bind((src, 0))
    c.connect(ls.getsockname()[:2])
    a, _ = ls.accept()
    cc = sock_cc(a)
    a.close()
    c.close()
    return cc


def _setup(edge, **caps):
    """The edge with `caps` in its config, a served port, and table 1 (20 entries → a) live."""
    a, b = other_ccs(sysctl_cc())
    for k, v in caps.items():
        setattr(edge.config, k, v)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video", flow_mode="off")])
    edge.agent.load(edge.table(_entries(20, a), 1).manifest)
    assert _cc_of(ls) == a
    return ls, a, b


def _refused(edge, manifest, message):
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(manifest)
    assert message in err.value.stderr, f"the refusal names the cap: {err.value.stderr!r}"
    return err.value.stderr


def _uncapped(edge):
    """The config without the caps: the agent's compiled bounds."""
    for k in CAP_KEYS:
        setattr(edge.config, k, None)
    edge.agent.write_config(edge.config)


def test_entries_tree_and_bytes_caps_from_the_config(edge):
    # bytes: a table of 45 entries (no tree) is 64 + 45 × 40 bytes; one more entry is over
    cap_bytes = tf.HEADER_SIZE + 45 * tf.ENTRY_SIZE
    ls, a, b = _setup(edge, max_entries=50, max_tree_nodes=7, max_artifact_bytes=cap_bytes)
    st = edge.agent.status()
    assert st["caps"] == {"max_entries": 50, "max_tree_nodes": 7, "max_artifact_bytes": cap_bytes,
                          "max_growth": 0, "growth_floor_entries": 0}, st["caps"]
    # entries: 50 (at the cap) would be within it; 51 is over
    _refused(edge, edge.table(_entries(51, b), 2).manifest, "refused: table 2: 51 entries, over the cap of 50 (max_entries)")
    # tree: a tree of 7 nodes reached the cap of 7 (export.guards.max_tree_nodes' rule); 5 loads below
    at_cap = edge.table(_entries(20, b), 3, tree=_tree(3), tree_model="caps").manifest
    _refused(edge, at_cap, "refused: table 3: a flow tree of 7 nodes reached the cap of 7 (max_tree_nodes)")
    # bytes: 46 entries (within max_entries) are 40 bytes over
    over_bytes = edge.table(_entries(46, b), 4).manifest
    _refused(edge, over_bytes, f"refused: table 4: {cap_bytes + 40} bytes, over the cap of {cap_bytes} (max_artifact_bytes)")
    st = edge.agent.status()
    assert st["table"]["version"] == 1 and st["table"]["tree"] is None, f"the live table stays: {st['table']}"
    assert _cc_of(ls) == a, "the live table still decides"
    # within every cap: 40 entries and a tree of 5 nodes (64 + 1,600 + 80 bytes)
    edge.agent.load(edge.table(_entries(40, b), 5, tree=_tree(2), tree_model="caps").manifest)
    assert edge.agent.status()["table"]["version"] == 5 and _cc_of(ls) == b
    # the caps came from the config: without them the refused tables load (compiled bounds)
    _uncapped(edge)
    assert edge.agent.status()["caps"]["max_entries"] == 4_000_000
    for v, n, tree in ((6, 51, None), (7, 46, _tree(3))):
        edge.agent.load(edge.table(_entries(n, a), v, tree=tree, tree_model="caps" if tree else "").manifest)
        assert edge.agent.status()["table"]["version"] == v


def test_growth_against_the_live_table(edge):
    ls, a, b = _setup(edge, max_growth=1.5, growth_floor_entries=10)
    # twice the live table's size: refused, naming both ratios
    err = _refused(edge, edge.table(_entries(40, b), 2).manifest,
                   "refused: table 2 is 2.00x the live table 1's entries (40 against 20) and 1.93x its bytes")
    assert "over max_growth (1.5x)" in err
    st = edge.agent.status()
    assert st["table"]["version"] == 1 and _cc_of(ls) == a, "the live table stays and decides"
    # 1.5 × the entries (1.46 × the bytes): at the factor, not over it
    edge.agent.load(edge.table(_entries(30, b), 3).manifest)
    assert edge.agent.status()["table"]["version"] == 3 and _cc_of(ls) == b
    # a live table under growth_floor_entries is not judged (a young fleet's table may grow)
    edge.config.growth_floor_entries = 31
    edge.agent.write_config(edge.config)
    edge.agent.load(edge.table(_entries(90, a), 4).manifest)
    assert edge.agent.status()["table"]["version"] == 4
    # the factor came from the config: without it twice the size loads
    edge.config.growth_floor_entries = 10
    edge.agent.write_config(edge.config)
    _refused(edge, edge.table(_entries(180, b), 5).manifest, "over max_growth (1.5x)")
    _uncapped(edge)
    edge.agent.load(edge.table(_entries(180, b), 6).manifest)
    assert edge.agent.status()["table"]["version"] == 6
    # the operator's way back is not judged: a small table 7 live, then table 6 (15x) named by
    # --allow-downgrade loads, where a new table of its size is refused
    edge.config.max_growth, edge.config.growth_floor_entries = 1.5, 10
    edge.agent.write_config(edge.config)
    edge.agent.load(edge.table(_entries(12, a), 7).manifest)
    _refused(edge, edge.table(_entries(180, b), 8).manifest, "refused: table 8 is 15.00x the live table 7's entries")
    edge.agent.load(edge.tables + "/table-6.manifest.json", allow_downgrade=6)
    assert edge.agent.status()["table"]["version"] == 6 and _cc_of(ls) == b


def test_deployment_writes_the_guards_caps(cfg):
    """rollout.load_fleet's agents carry export.guards' caps (the same settings the publishing
    guards read), and a node's own cap is kept; one above the agent's bound is an error."""
    g = cfg.settings.export.guards
    conf = caps_from_guards(EdgeConfig(), cfg)
    assert {k: getattr(conf, k) for k in CAP_KEYS} == {k: getattr(g, k) for k in CAP_KEYS}
    assert f"max_tree_nodes: {g.max_tree_nodes}\n" in conf.to_yaml()
    assert caps_from_guards(EdgeConfig(max_entries=7), cfg).max_entries == 7
    with pytest.raises(ValueError, match="max_tree_nodes 600 is not an integer in 2..512"):
        caps_from_guards(EdgeConfig(max_tree_nodes=600), cfg)
