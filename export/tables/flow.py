"""The handshake tree as the table carries it (issue 27): `distill.handshake.HandshakeTree` (leaves
with P(Wi-Fi)) → `table_format.Tree` (leaves with a CC and its confidence), the one conversion
the export (the tree in the signed table) and the emulation (`aliccs_flow`, evaluation/emulate.py)
share, so that both decide as the kernel does (table_format.decide, ccs.bpf.c).

A leaf names Wi-Fi's CC (`infer.wifi_cc`) when more than half of its training rows were Wi-Fi,
else 4G/5G's (`infer.cell_cc`) — the DecisionTreeClassifier's own argmax, ties to 4G/5G — and its
confidence is that share, in permille rounded down. A feature of the fitted tree becomes the
kernel's feature id of the same name (ccs_table.h CCS_FEAT_*, contract.HANDSHAKE_FEATURES).
"""
from __future__ import annotations

from ccselect.settings import InferSettings
from ccselect.distill.handshake import LEAF, HandshakeTree
from ccselect.export.artifact import table_format as tf


def table_tree(ht: HandshakeTree, infer: InferSettings, min_purity_permille: int,
               min_leaf_permille: int = 0) -> tf.Tree:
    """The flow tree of a table from a fitted handshake tree."""
    nodes = []
    for i in range(len(ht)):
        if ht.feature[i] == LEAF:
            p = ht.p_wifi[i]
            wifi = p > 0.5
            nodes.append(tf.TreeNode(tf.TREE_LEAF, cc=tf.CC_IDS[infer.wifi_cc if wifi else infer.cell_cc],
                                     conf_permille=int((p if wifi else 1.0 - p) * 1000)))
        else:
            if ht.threshold[i] < 0:
                raise ValueError(f"handshake tree node {i}: negative threshold {ht.threshold[i]} "
                                 "(the kernel compares unsigned values)")
            nodes.append(tf.TreeNode(tf.TREE_FEATURES.index(ht.features[ht.feature[i]]),
                                     threshold=min(ht.threshold[i], tf.U32_MAX),
                                     left=ht.left[i], right=ht.right[i]))
    return tf.Tree(tuple(nodes), int(min_purity_permille), int(min_leaf_permille))
