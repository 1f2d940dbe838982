"""The handshake tree (distill/handshake.py, issue 27) without Spark: the held-out report over
feature subsets (ALICCS §5.1's cross-node evaluation), and the MLflow round trip the export and the
emulation load it through (`<name>-handshake@champion`, a real SQLite registry)."""
from __future__ import annotations

import numpy as np

from ccselect.contract import HANDSHAKE_FEATURES
from ccselect.settings import HandshakeSettings
from ccselect.distill import handshake
from ccselect.distill.jobs import handshake_report
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables.flow import table_tree


def _rows(seed=7, per_node=600, nodes=("n1", "n2", "n3", "n4", "n5")):
    """Wi-Fi flows: MSS 1448 and short RTTs; 4G: MSS 1388-1440 and longer RTTs; the window
    carries no signal here (the same draw for both types)."""
    rng = np.random.default_rng(seed)
    xs, ys, ns = [], [], []
    for node in nodes:
        wifi = rng.random(per_node) < 0.5
        mss = np.where(wifi, 1448, rng.choice([1388, 1400, 1440], per_node))
        wnd = rng.integers(20_000, 90_000, per_node)
        rtt = np.where(wifi, rng.integers(2_000, 30_000, per_node), rng.integers(20_000, 120_000, per_node))
        xs.append(np.stack([mss, wnd, rtt], axis=1))
        ys.append(wifi.astype(np.int64))
        ns.append(np.array([node] * per_node, dtype=object))
    return handshake.HandshakeRows(np.concatenate(xs).astype(np.int64), np.concatenate(ys), np.concatenate(ns))


def test_report_scores_every_feature_subset_on_held_out_nodes():
    rows = _rows()
    rep = handshake_report(rows, HandshakeSettings(depth=4, min_leaf=20), share=0.6, seed=1)
    assert not set(rep["train_nodes"]) & set(rep["test_nodes"]), "held-out nodes are not trained on"
    assert len(rep["subsets"]) == 7, f"every non-empty subset of 3 features: {list(rep['subsets'])}"
    full = rep["subsets"][",".join(HANDSHAKE_FEATURES)]
    window_only = rep["subsets"]["init_snd_wnd_bytes"]
    assert full["accuracy"] > 0.9, f"MSS and RTT separate the types: {full}"
    assert window_only["accuracy"] < 0.65, f"the window carries no signal in these rows: {window_only}"
    assert full["depth"] <= 4 and full["node_worst"] <= full["node_mean"]


def test_registry_round_trip_and_the_table_tree(cfg):
    rows = _rows(per_node=300)
    hs = HandshakeSettings(depth=3, min_leaf=20)
    clf, tree = handshake.fit(rows.x, rows.y, hs)
    assert handshake.load_handshake(cfg) is None, "no champion yet"
    reg = handshake.log_handshake(cfg, hs, clf, tree, {"majority_accuracy": 0.5}, {"accuracy": 0.9},
                                  "w", promote=True)
    assert reg["name"] == handshake.handshake_model_name(cfg) and reg["champion"], reg
    loaded, model = handshake.load_handshake(cfg)
    assert loaded == tree, "the integer tree round-trips through MLflow"
    assert model == f"{reg['name']} v{reg['version']}"
    flow = table_tree(loaded, cfg.settings.infer, 950)
    cc, _ = tf.decide(False, 0, False, 0, flow, rows.x, "flow")
    want = np.where(clf.predict(rows.x) == 1, tf.CC_IDS[cfg.settings.infer.wifi_cc], tf.CC_IDS[cfg.settings.infer.cell_cc])
    assert (cc == want).all(), "the table's tree decides as the registered classifier"
