"""The flow tree in the table (format 2, issue 27): encode/decode, the refusals the agent shares
(table_format.validate_tree ~ table.c check_tree), the manifest naming it, and decide() per flow
mode on hand-worked flows. The kernel's side of the same decisions: tests/kernel/test_flow_tree_kernel.py."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ccselect.export.artifact import signing, table_format as tf

MSS, WND, RTT = (tf.TREE_FEATURES.index(f) for f in ("mss_bytes", "init_snd_wnd_bytes", "connection_time_us"))
CUBIC, BBR = tf.CC_IDS["cubic"], tf.CC_IDS["bbr"]
N = tf.TreeNode


def small_tree(min_purity=900, min_leaf=0) -> tf.Tree:
    """mss <= 1400 -> bbr (conf 700); else rtt <= 20 ms -> cubic (conf 980), else bbr (conf 600)."""
    return tf.Tree((
        N(MSS, threshold=1400, left=1, right=2),
        N(tf.TREE_LEAF, cc=BBR, conf_permille=700),
        N(RTT, threshold=20_000, left=3, right=4),
        N(tf.TREE_LEAF, cc=CUBIC, conf_permille=980),
        N(tf.TREE_LEAF, cc=BBR, conf_permille=600),
    ), min_purity, min_leaf)


def _table(tree):
    return tf.Table(7, 1_700_000_000, 1_700_003_600, (tf.Entry("10.0.0.0/8", "cubic", 950),), tree)


def test_tree_roundtrip_and_layout():
    t = _table(small_tree(870, 640))
    blob = tf.encode(t)
    assert len(blob) == tf.HEADER_SIZE + tf.ENTRY_SIZE + 5 * tf.NODE_SIZE, "nodes after the entries"
    assert struct.unpack_from("<HHHH", blob, 48) == (5, tf.NODE_SIZE, 870, 640), \
        "tree_nodes, node size, min purity, min leaf confidence"
    node0 = blob[tf.HEADER_SIZE + tf.ENTRY_SIZE:][:tf.NODE_SIZE]
    assert node0 == bytes([MSS, 0]) + (0).to_bytes(2, "little") + (1).to_bytes(2, "little") + \
        (2).to_bytes(2, "little") + (1400).to_bytes(4, "little") + bytes(4), "root node bytes"
    back = tf.decode(blob)
    assert back.tree == t.tree, "tree round-trips"
    assert tf.decode(tf.encode(_table(None))).tree is None, "a table without a tree"
    assert struct.unpack_from("<HHHH", tf.encode(_table(None)), 48) == (0, 0, 0, 0), "no tree: zeros"
    with pytest.raises(tf.TableFormatError, match="min_leaf_permille 1001"):
        small_tree(900, 1001)


def test_format_1_refused():
    blob = bytearray(tf.encode(_table(None)))
    blob[4:6] = (1).to_bytes(2, "little")
    with pytest.raises(tf.TableFormatError, match="unsupported format 1"):
        tf.decode(bytes(blob))


@pytest.mark.parametrize("nodes,msg", [
    ((N(MSS, 1, 0, 1), N(tf.TREE_LEAF, cc=1)), "not after its parent"),                 # a cycle to itself
    ((N(MSS, 1, 1, 2), N(RTT, 1, 0, 2), N(tf.TREE_LEAF, cc=1)), "not after its parent"),  # back edge
    ((N(MSS, 1, 1, 5), N(tf.TREE_LEAF, cc=1)), "out of range"),
    ((N(7, 1, 1, 2), N(tf.TREE_LEAF, cc=1), N(tf.TREE_LEAF, cc=1)), "bad feature id 7"),
    ((N(MSS, 1, 1, 2), N(tf.TREE_LEAF, cc=9), N(tf.TREE_LEAF, cc=1)), "unknown cc id 9"),
    ((N(MSS, 1, 1, 2), N(tf.TREE_LEAF, cc=0), N(tf.TREE_LEAF, cc=1)), "unknown cc id 0"),
    ((N(MSS, 1, 1, 1), N(tf.TREE_LEAF, cc=1)), "parents"),                              # shared child
    ((N(MSS, 1, 1, 2), N(tf.TREE_LEAF, cc=1), N(tf.TREE_LEAF, cc=1), N(tf.TREE_LEAF, cc=1)), "0 parents"),
    ((N(tf.TREE_LEAF, cc=1, conf_permille=1001),), "confidence"),
    ((), "0 nodes"),
])
def test_malformed_tree_refused(nodes, msg):
    with pytest.raises(tf.TableFormatError, match=msg):
        tf.Tree(nodes, 900)


def _chain(depth):
    """A left-leaning chain whose deepest leaves sit at `depth`."""
    nodes = []
    for d in range(depth):
        i = len(nodes)
        nodes += [N(MSS, d, i + 2 if d < depth - 1 else i + 1, i + 1 if d < depth - 1 else i + 2)]
        nodes += [N(tf.TREE_LEAF, cc=1)] if d < depth - 1 else [N(tf.TREE_LEAF, cc=1), N(tf.TREE_LEAF, cc=2)]
    return tuple(nodes)


def test_depth_bound():
    t = tf.Tree(_chain(tf.TREE_MAX_DEPTH))
    assert t.depth() == tf.TREE_MAX_DEPTH, "a chain of the bound's depth is accepted"
    with pytest.raises(tf.TableFormatError, match="over the bound 8"):
        tf.Tree(_chain(tf.TREE_MAX_DEPTH + 1))


def test_decode_refuses_a_malformed_tree_in_the_bytes():
    blob = bytearray(tf.encode(_table(small_tree())))
    at = tf.HEADER_SIZE + tf.ENTRY_SIZE + 2 * tf.NODE_SIZE     # node 2's left -> 0 (a cycle to the root)
    blob[at + 4:at + 6] = (0).to_bytes(2, "little")
    with pytest.raises(tf.TableFormatError, match="tree node 2: child 0 not after its parent"):
        tf.decode(bytes(blob))


FLOWS = np.array([
    [1200, 65535, 50_000],    # mss <= 1400           -> leaf 1: bbr 700
    [1460, 65535, 5_000],     # mss > 1400, rtt <= 20 -> leaf 3: cubic 980
    [1460, 65535, 20_000],    # rtt == threshold goes left -> cubic 980
    [1460, 65535, 20_001],    # -> leaf 4: bbr 600
])


@pytest.mark.parametrize("mode,hit,ecc,low,pur,want_cc,want_src", [
    # a confident cubic entry (purity 950 >= 900)
    ("off", 1, CUBIC, 0, 950, [1, 1, 1, 1], ["table"] * 4),
    ("fill", 1, CUBIC, 0, 950, [1, 1, 1, 1], ["table"] * 4),
    ("combine", 1, CUBIC, 0, 950, [1, 1, 1, 1], ["table"] * 4),        # leaf bbr 700/600 < 950
    ("flow", 1, CUBIC, 0, 950, [2, 1, 1, 2], ["flow"] * 4),
    # a confident bbr entry of purity 960: the cubic leaf (980) overrides it in combine only
    ("combine", 1, BBR, 0, 960, [2, 1, 1, 2], ["table", "table+flow", "table+flow", "table"]),
    ("fill", 1, BBR, 0, 960, [2, 2, 2, 2], ["table"] * 4),
    # a mixed entry (purity 899 < 900): the tree in fill and combine
    ("off", 1, CUBIC, 0, 899, [1, 1, 1, 1], ["table"] * 4),
    ("fill", 1, CUBIC, 0, 899, [2, 1, 1, 2], ["flow"] * 4),
    ("combine", 1, CUBIC, 0, 899, [2, 1, 1, 2], ["flow"] * 4),
    # a miss, a keep entry, a low-confidence entry
    ("off", 0, 0, 0, 0, [0] * 4, ["default"] * 4),
    ("fill", 0, 0, 0, 0, [2, 1, 1, 2], ["flow"] * 4),
    ("off", 1, 0, 0, 1000, [0] * 4, ["fallback"] * 4),
    ("combine", 1, 0, 0, 1000, [2, 1, 1, 2], ["flow"] * 4),
    ("off", 1, CUBIC, 1, 1000, [0] * 4, ["fallback"] * 4),
    ("fill", 1, CUBIC, 1, 1000, [2, 1, 1, 2], ["flow"] * 4),
    # prior (leaves below 750 are unsure: 700 and 600): the leaf, but a confident entry at an
    # unsure leaf; a mixed entry or a miss: the leaf always
    ("prior", 1, CUBIC, 0, 950, [1, 1, 1, 1], ["table", "flow", "flow", "table"]),
    ("prior", 1, BBR, 0, 960, [2, 1, 1, 2], ["table", "flow", "flow", "table"]),
    ("prior", 1, CUBIC, 0, 899, [2, 1, 1, 2], ["flow"] * 4),
    ("prior", 0, 0, 0, 0, [2, 1, 1, 2], ["flow"] * 4),
    ("prior", 1, CUBIC, 1, 1000, [2, 1, 1, 2], ["flow"] * 4),
])
def test_decide_modes(mode, hit, ecc, low, pur, want_cc, want_src):
    cc, src = tf.decide(hit, ecc, low, pur, small_tree(900, 750), FLOWS, mode)
    assert cc.tolist() == want_cc, f"{mode}: cc {cc.tolist()}"
    assert src.tolist() == want_src, f"{mode}: sources {src.tolist()}"


def test_decide_without_tree_is_the_table():
    cc, src = tf.decide([1, 0, 1], [2, 0, 1], [0, 0, 1], [500, 0, 1000], None, np.zeros((3, 3)), "combine")
    assert cc.tolist() == [2, 0, 0] and src.tolist() == ["table", "default", "fallback"], (cc, src)
    with pytest.raises(ValueError, match="flow mode"):
        tf.decide(1, 1, 0, 1000, None, np.zeros((1, 3)), "always")
    with pytest.raises(ValueError, match="u32"):
        tf.decide(1, 1, 0, 1000, small_tree(), [[-1, 0, 0]], "flow")


def _walk(tree, x):
    """The tree walked one flow at a time, as the kernel's loop does."""
    i = 0
    for _ in range(tf.TREE_MAX_DEPTH + 1):
        nd = tree.nodes[i]
        if nd.is_leaf:
            return nd
        i = nd.left if x[nd.feature] <= nd.threshold else nd.right
    raise AssertionError("no leaf within the bound")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3000)), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000), st.integers(0, 3000)), min_size=1, max_size=30),
       st.integers(0, 1000), st.data())
def test_vectorised_walk_matches_per_flow_walk(splits, flows, min_purity, data):
    # a random valid tree: grow breadth-first from the root, splitting leaves while splits remain
    nodes = [None]
    frontier = [(0, 0)]
    for feat, thr in splits:
        if not frontier:
            break
        i, d = frontier.pop(0)
        if d >= tf.TREE_MAX_DEPTH:
            continue
        nodes[i] = N(feat, thr, len(nodes), len(nodes) + 1)
        nodes += [None, None]
        frontier += [(len(nodes) - 2, d + 1), (len(nodes) - 1, d + 1)]
    nodes = [nd or N(tf.TREE_LEAF, cc=data.draw(st.integers(1, 3)), conf_permille=data.draw(st.integers(0, 1000)))
             for nd in nodes]
    tree = tf.Tree(tuple(nodes), min_purity)
    x = np.array(flows)
    leaves = tf.tree_leaves(tree, x)
    assert [tree.nodes[i] for i in leaves] == [_walk(tree, f) for f in flows], "leaf per flow"
    ecc = data.draw(st.integers(0, 3))
    pur = data.draw(st.integers(0, 1000))
    cc, src = tf.decide(True, ecc, False, pur, tree, x, "combine")
    for f, c, s in zip(flows, cc, src):
        leaf = _walk(tree, f)
        confident = ecc >= 1 and pur >= min_purity
        if not confident:
            assert (c, s) == (leaf.cc, "flow"), "not confident: the leaf"
        elif leaf.cc != ecc and leaf.conf_permille > pur:
            assert (c, s) == (leaf.cc, "table+flow"), "a more confident leaf overrides"
        else:
            assert (c, s) == (ecc, "table"), "the entry stands"


def test_write_table_names_the_tree(tmp_path):
    key = signing.generate_key()
    pub = tmp_path / "pub.pem"
    signing.save_keypair(key, str(tmp_path / "priv.pem"), str(pub))
    entries = [tf.Entry("10.0.0.0/8", "cubic", 950)]
    p = signing.write_table(entries, 9, "m1", 2_000, str(tmp_path), key, created=1_000,
                            tree=small_tree(), tree_model="ccs-handshake v3")
    man, table = signing.read_manifest(p.manifest, signing.load_public_key(str(pub)))
    assert man["format"] == 2 and man["tree"] == {"model": "ccs-handshake v3", "nodes": 5}, man
    assert table.tree == small_tree(), "the tree in the signed .bin"
    # the signature covers the tree's name: change it and verification fails
    text = open(p.manifest).read().replace("ccs-handshake v3", "ccs-handshake v4")
    open(p.manifest, "w").write(text)
    with pytest.raises(signing.SignatureError, match="signature"):
        signing.read_manifest(p.manifest, signing.load_public_key(str(pub)))
    p = signing.write_table(entries, 10, "m1", 2_000, str(tmp_path), key, created=1_000)
    assert json.load(open(p.manifest))["tree"] == {"model": "", "nodes": 0}, "no tree"
    with pytest.raises(ValueError, match="no[n]e"):
        signing.write_table(entries, 11, "m1", 2_000, str(tmp_path), key, created=1_000, tree_model="x")


def test_handshake_tree_in_the_table_decides_as_the_fitted_classifier():
    """distill.handshake → export.tables.flow.table_tree → decide(mode flow) gives, for every
    flow, the CC of the fitted DecisionTreeClassifier's prediction (the tree the export ships is
    the tree that was trained; integer thresholds, distill/handshake.py)."""
    from ccselect.settings import HandshakeSettings, InferSettings
    from ccselect.distill.handshake import fit
    from ccselect.export.tables.flow import table_tree

    rng = np.random.default_rng(7)
    n = 4000
    wifi = rng.random(n) < 0.4
    x = np.stack([np.where(wifi, 1448, rng.choice([1388, 1400, 1440], n)) + rng.integers(-30, 30, n),
                  np.where(wifi, rng.integers(40_000, 90_000, n), rng.integers(20_000, 70_000, n)),
                  np.where(wifi, rng.integers(2_000, 40_000, n), rng.integers(25_000, 120_000, n))], axis=1)
    clf, ht = fit(x, wifi.astype(int), HandshakeSettings(depth=6, min_leaf=20))
    infer = InferSettings()
    tree = table_tree(ht, infer, 950)
    assert tree.depth() == ht.depth() <= 6 and len(tree.nodes) == len(ht), "same shape"
    probe = np.concatenate([x, rng.integers(0, 200_000, (500, 3))])
    cc, src = tf.decide(False, 0, False, 0, tree, probe, "flow")
    want = np.where(clf.predict(probe) == 1, tf.CC_IDS[infer.wifi_cc], tf.CC_IDS[infer.cell_cc])
    assert (cc == want).all(), f"{int((cc != want).sum())} flows differ from the classifier"
    assert set(src) == {"flow"}
    assert len(set(cc.tolist())) == 2, "both CCs chosen"
