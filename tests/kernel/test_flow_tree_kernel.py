"""The flow tree in the kernel (issue 27), on real loopback connections in a throwaway cgroup.

Clients vary the handshake the program reads at PASSIVE_ESTABLISHED -- the MSS they advertise
(TCP_MAXSEG before connect) and their receive window (SO_RCVBUF before connect); the SYN-ACK ->
ACK time varies by itself on loopback, and the tree splits on it at the median of a calibration
round. Every accepted socket's getsockopt(TCP_CONGESTION), and the transport log's decision, are
checked against table_format.decide() on the features the kernel logged for that connection, in
each flow mode; the program's counters against the same decisions. Then: malformed trees refused
at load with their table (the live table stays), the other format version refused, and rollback
to a table without a tree stopping the tree's decisions at once."""
from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import socket
import struct
import time

import numpy as np
import pytest
from _edge_helpers import in_cgroup, listener, other_ccs, sock_cc, sysctl_cc, validate_transport_record

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.edge.agent import EdgeAgentError, Service

pytestmark = pytest.mark.kernel

MSS, WND, RTT = (tf.TREE_FEATURES.index(f) for f in ("mss_bytes", "init_snd_wnd_bytes", "connection_time_us"))
N = tf.TreeNode
#: (TCP_MAXSEG, SO_RCVBUF) of the clients; None: the kernel's default
VARIANTS = [(None, None), (536, None), (1400, None), (None, 4096), (536, 4096), (1400, 4096)]
#: the table's prefixes, by what the entry is for the flow modes (purity vs the tree's 900)
PREFIXES = {"confident_a": "127.90", "mixed_a": "127.91", "confident_b": "127.92", "keep": "127.93",
            "lowconf": "127.94", "miss": "127.95"}
MODES = tf.FLOW_MODES        # off, fill, combine, flow, prior


def _client(src, maxseg=None, rcvbuf=None):
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if maxseg:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, maxseg)
    if rcvbuf:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    c.bind((src, 0))
    return c


def _connect(ls, src, maxseg=None, rcvbuf=None):
    """One connection; returns (client port, the accepted socket's CC)."""
    c = _client(src, maxseg, rcvbuf)
    c.connect(ls.getsockname()[:2])
    a, peer = ls.accept()
    cc = sock_cc(a)
    a.close()
    c.close()
    return peer[1], cc


def _records(edge):
    edge.agent.log(edge.logs)
    return [json.loads(x) for f in glob.glob(os.path.join(edge.logs, "transport", "*", "*.jsonl"))
            for x in open(f)]


def _entries(a, b):
    return [tf.Entry(PREFIXES["confident_a"] + ".0.0/16", a, purity_permille=990),
            tf.Entry(PREFIXES["mixed_a"] + ".0.0/16", a, purity_permille=600),
            tf.Entry(PREFIXES["confident_b"] + ".0.0/16", b, purity_permille=960),
            tf.Entry(PREFIXES["keep"] + ".0.0/16", "keep"),
            tf.Entry(PREFIXES["lowconf"] + ".0.0/16", a, purity_permille=990, low_confidence=True)]


def _tree(a, b, rtt_split) -> tf.Tree:
    """mss <= 1000 -> b (conf 995, beats every entry's purity: combine overrides a's entries);
    else window <= 20000 -> a (conf 700); else rtt <= rtt_split -> b (980), else a (600).
    Leaves below 800 (700, 600) are unsure: in mode prior a confident entry decides there."""
    A, B = tf.CC_IDS[a], tf.CC_IDS[b]
    return tf.Tree((
        N(MSS, threshold=1000, left=1, right=2),
        N(tf.TREE_LEAF, cc=B, conf_permille=995),
        N(WND, threshold=20_000, left=3, right=4),
        N(tf.TREE_LEAF, cc=A, conf_permille=700),
        N(RTT, threshold=rtt_split, left=5, right=6),
        N(tf.TREE_LEAF, cc=B, conf_permille=980),
        N(tf.TREE_LEAF, cc=A, conf_permille=600),
    ), 900, 800)


def _counters(edge):
    return edge.agent.status()["counters"]


def test_kernel_decides_as_python_in_every_flow_mode(edge):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        lss = {m: edge.track(listener()) for m in MODES}
    port_mode = {ls.getsockname()[1]: m for m, ls in lss.items()}
    edge.configure([Service(ls.getsockname()[1], f"svc-{m}", flow_mode=m) for m, ls in lss.items()],
                   sample_rate=1.0)
    entries = _entries(a, b)

    # calibration: the loopback handshake's RTT, to split the tree where flows fall on both sides
    edge.agent.load(edge.table(entries, 1).manifest)
    for k, (maxseg, rcvbuf) in enumerate(VARIANTS * 3):
        _connect(lss["off"], f"127.95.200.{k + 1}", maxseg, rcvbuf)
    cal = _records(edge)
    assert len(cal) == len(VARIANTS) * 3, f"calibration records: {len(cal)}"
    rtt_split = int(np.median([r["connection_time_us"] for r in cal]))
    tree = _tree(a, b, rtt_split)
    out = edge.agent.load(edge.table(entries, 2, tree=tree, tree_model="test-handshake v1").manifest)
    assert out["tree_nodes"] == 7, f"load reports the tree: {out}"
    st = edge.agent.status()
    assert st["table"]["tree"] == {"model": "test-handshake v1", "nodes": 7, "min_purity_permille": 900,
                                   "min_leaf_permille": 800,
                                   "map_id": st["table"]["tree"]["map_id"]}, f"status names the tree: {st['table']}"
    before = _counters(edge)
    seen = {}
    for mode in MODES:
        for what, pre in PREFIXES.items():
            for k, (maxseg, rcvbuf) in enumerate(VARIANTS):
                src = f"{pre}.{MODES.index(mode)}.{k + 1}"
                port, cc = _connect(lss[mode], src, maxseg, rcvbuf)
                seen[(src, port)] = (mode, what, cc)
    recs = {(r["client_ip"], r["client_port"]): r for r in _records(edge) if r["table_version"] == "2"}
    assert set(recs) == set(seen), f"one transport record per connection: {len(recs)} of {len(seen)}"

    table = tf.Table(2, 0, 1, tuple(entries))
    want_src = collections.Counter()
    evals = 0
    leaves = collections.Counter()
    by_mode = collections.Counter()
    for (src, port), (mode, what, got) in seen.items():
        rec = recs[(src, port)]
        assert not validate_transport_record(rec), f"{src}: {validate_transport_record(rec)}"
        assert port_mode[rec["server_port"]] == mode, f"{src}: logged on its service's port"
        x = np.array([[rec[f] for f in tf.TREE_FEATURES]])
        e = tf.lookup(table, src)
        hit, ecc = e is not None, tf.CC_IDS[e.cc] if e else 0
        low, pur = bool(e and e.low_confidence), e.purity_permille if e else 0
        cc, dec = tf.decide(hit, ecc, low, pur, tree, x, mode)
        want = tf.CC_NAMES[int(cc[0])] if cc[0] else default
        assert got == want, f"{src} ({mode}, {what}, handshake {x[0].tolist()}): socket has {got}, " \
                            f"decide() says {want} ({dec[0]})"
        assert rec["decision"] == dec[0], f"{src} ({mode}, {what}): logged decision {rec['decision']}, " \
                                          f"decide() says {dec[0]}"
        assert rec["cc"] == got, f"{src}: logged cc {rec['cc']} vs socket {got}"
        want_src[dec[0]] += 1
        by_mode[mode, dec[0]] += 1
        confident = hit and 1 <= ecc and not low and pur >= tree.min_purity_permille
        if mode in ("combine", "flow", "prior") or (mode == "fill" and not confident):
            evals += 1
            leaves[int(tf.tree_leaves(tree, x)[0])] += 1
    # the handshakes exercised the tree: MSS and window leaves both ways, the RTT split too
    assert leaves[1] and leaves[3] and (leaves[5] + leaves[6]), f"leaves reached: {dict(leaves)}"
    assert want_src["flow"] and want_src["table+flow"] and want_src["table"], f"sources: {want_src}"
    assert by_mode["prior", "table"] and by_mode["prior", "flow"], \
        f"prior: a confident entry at an unsure leaf, and the leaf elsewhere: {dict(by_mode)}"

    cnt = {k: v - before.get(k, 0) for k, v in _counters(edge).items()}
    assert cnt["lookups"] == len(seen), f"lookups {cnt['lookups']} vs {len(seen)} connections"
    srcs = {"table": "src_table", "flow": "src_flow", "table+flow": "src_table_flow",
            "fallback": "src_fallback", "default": "src_default"}
    for dec, name in srcs.items():
        assert cnt[name] == want_src[dec], f"{name} {cnt[name]} vs decide() {want_src[dec]}"
    assert cnt["lookups"] == sum(cnt[n] for n in srcs.values()), f"lookups = sum of sources: {cnt}"
    assert cnt["established"] == cnt["no_table"] + cnt["expired"] + cnt["ab_control"] + cnt["lookups"], \
        f"established invariant: {cnt}"
    assert cnt["lookups"] == cnt["miss"] + cnt["hit_keep"] + cnt["hit_lowconf"] + \
        sum(cnt[f"hit_{c}"] for c in ("cubic", "bbr", "reno")), f"lookups invariant: {cnt}"
    assert cnt["tree_evals"] == evals and cnt["tree_no_leaf"] == 0, \
        f"tree_evals {cnt['tree_evals']} vs {evals}, no_leaf {cnt['tree_no_leaf']}"


def _raw_table(edge, version, nodes: list[tuple], min_purity=900, fmt=None, manifest_format=None, a="cubic"):
    """A signed table whose tree section is raw node tuples (feature, cc, conf, left, right,
    threshold): what a faulty exporter might write, bypassing table_format's checks."""
    now = int(time.time())
    blob = bytearray(tf.encode(tf.Table(version, now, now + 3600, (tf.Entry("127.60.0.0/16", a),))))
    struct.pack_into("<HHH", blob, 48, len(nodes), tf.NODE_SIZE if nodes else 0, min_purity if nodes else 0)
    if fmt is not None:
        struct.pack_into("<H", blob, 4, fmt)
    blob += b"".join(struct.pack(tf.NODE_FMT, *n, 0) for n in nodes)
    name = f"table-{version}.bin"
    with open(os.path.join(edge.tables, name), "wb") as f:
        f.write(blob)
    man = json.loads(signing.manifest_bytes(bytes(blob), name, version, "m", now, now + 3600, 1, 0,
                                            tree_nodes=len(nodes), tree_model="raw" if nodes else ""))
    if manifest_format is not None:
        man["format"] = manifest_format
    path = os.path.join(edge.tables, f"table-{version}.manifest.json")
    edge.resign(path, json.dumps(man, indent=2) + "\n")
    assert man["sha256"] == hashlib.sha256(bytes(blob)).hexdigest()
    return path


LEAF = tf.TREE_LEAF


def _chain(depth):
    """Splits in a chain (each one's left child a leaf) whose last split's leaves sit at `depth`."""
    nodes = []
    for d in range(depth):
        i = len(nodes)
        nodes += [(MSS, 0, 0, i + 1, i + 2, d), (LEAF, 1, 0, 0, 0, 0)]
    nodes.append((LEAF, 2, 0, 0, 0, 0))
    return nodes


@pytest.mark.parametrize("nodes,message", [
    ([(MSS, 0, 0, 1, 2, 100), (LEAF, 1, 0, 0, 0, 0), (MSS, 0, 0, 0, 1, 5)], "tree node 2: child 0 not after its parent"),
    (_chain(tf.TREE_MAX_DEPTH + 1), "depth 9 over the bound 8"),
    ([(5, 0, 0, 1, 2, 100), (LEAF, 1, 0, 0, 0, 0), (LEAF, 2, 0, 0, 0, 0)], "tree node 0: bad feature id 5"),
    ([(MSS, 0, 0, 1, 2, 100), (LEAF, 7, 0, 0, 0, 0), (LEAF, 2, 0, 0, 0, 0)], "tree node 1: leaf with unknown cc id 7"),
    ([(MSS, 0, 0, 1, 9, 100), (LEAF, 1, 0, 0, 0, 0), (LEAF, 2, 0, 0, 0, 0)], "tree node 0: child 9 out of range"),
])
def test_malformed_tree_refused_with_its_table(edge, nodes, message):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video", flow_mode="flow")])
    edge.agent.load(edge.table([tf.Entry("127.60.0.0/16", a)], 1).manifest)
    # the exporter's own check refuses it in the same words (table_format.validate_tree)
    with pytest.raises(tf.TableFormatError, match=message):
        tf.Tree(tuple(N(f, t, l, r, c, cf) for f, c, cf, l, r, t in nodes))
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(_raw_table(edge, 2, nodes, a=b))
    assert message in err.value.stderr, f"refusal names the problem: {err.value.stderr!r}"
    st = edge.agent.status()
    assert st["table"]["version"] == 1 and st["table"]["tree"] is None, f"live table stays: {st['table']}"
    assert _connect(ls, "127.60.0.1")[1] == a, "the live table still decides"


def test_other_format_version_refused(edge):
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    edge.agent.load(edge.table([tf.Entry("127.60.0.0/16", a)], 1).manifest)
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(_raw_table(edge, 2, [], manifest_format=1, fmt=1))
    assert 'unsupported format 1 (manifest field "format")' in err.value.stderr, err.value.stderr
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(_raw_table(edge, 3, [], fmt=1))
    assert "unsupported table format 1" in err.value.stderr, err.value.stderr
    assert edge.agent.status()["table"]["version"] == 1, "live table stays"
    assert _connect(ls, "127.60.0.1")[1] == a, "the live table still decides"


def test_rollback_to_a_table_without_tree_stops_the_tree(edge):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video", flow_mode="flow")])
    entries = [tf.Entry("127.61.0.0/16", a)]
    only_b = tf.Tree((N(tf.TREE_LEAF, cc=tf.CC_IDS[b], conf_permille=1000),), 900)
    edge.agent.load(edge.table(entries, 1).manifest)
    assert _connect(ls, "127.61.0.1")[1] == a, "table 1 (no tree): the entry decides"
    edge.agent.load(edge.table(entries, 2, tree=only_b, tree_model="t").manifest)
    assert _connect(ls, "127.61.0.2")[1] == b, "table 2: the tree decides (flow mode)"
    c0 = _counters(edge)
    edge.agent.rollback()
    st = edge.agent.status()
    assert st["table"]["version"] == 1 and st["table"]["tree"] is None, f"rolled back: {st['table']}"
    assert st["previous"]["tree"]["nodes"] == 1, f"table 2 keeps its tree in its slot: {st['previous']}"
    got = [_connect(ls, f"127.61.1.{k}")[1] for k in range(1, 6)]
    assert got == [a] * 5, f"right after the rollback, the table alone decides: {got}"
    c1 = _counters(edge)
    assert c1["src_flow"] == c0["src_flow"] and c1["tree_evals"] == c0["tree_evals"], \
        f"no tree decision after the rollback: {c0} -> {c1}"
    assert c1["src_table"] - c0["src_table"] == 5, "five table decisions"
    # and a new table without a tree over the slot that held one: the old tree does not come back
    edge.agent.load(edge.table(entries, 3).manifest)
    assert _connect(ls, "127.61.2.1")[1] == a, "table 3 (no tree, into table 2's slot): the entry decides"
    assert _counters(edge)["src_flow"] == c0["src_flow"], "table 2's tree is gone with its slot"
