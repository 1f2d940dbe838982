"""A probe of invariance (issue 28): how well a small classifier reads the node a connection came
from out of a representation — G's output for a network variant, or the standardized features
themselves as the reference. Domain-adversarial training (ALICCS §3.1's discriminators, or the
node-domain discriminator of models/train.py) is meant to make that hard; a probe trained after
the fact tells whether the discriminators were made blind or only beaten (a discriminator that
loses its game against G while a fresh probe still reads the node has not removed the node's
signature from z).

The probe: a multilayer perceptron (scikit-learn, one hidden layer of 64, early stopping) fitted
on half of the rows of each node (at most `per_node` rows a node, drawn with `seed`) and scored on
the other half by balanced accuracy (every node counts the same; chance is 1 / nodes).
"""
from __future__ import annotations

import numpy as np
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.


def node_probe(z: np.ndarray, node: np.ndarray, seed: int = 0, per_node: int = 1500) -> dict:
    """{balanced_accuracy, chance, nodes, rows} of a probe reading `node` from `z` [N, d]."""
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    z = np.asarray(z, dtype=np.float32)
    node = np.asarray(node).astype(str)
    rng = np.random.default_rng(seed)
    keep = np.concatenate([rng.permutation(np.flatnonzero(node == n))[:per_node] for n in sorted(set(node))]) \
        if len(node) else np.zeros(0, dtype=np.int64)
    names = sorted(set(node[keep].tolist()))
    if len(names) < 2:
        return {"balanced_accuracy": float("nan"), "chance": float("nan"), "nodes": len(names), "rows": int(len(keep))}
    zk, nk = z[keep], node[keep]
    z_tr, z_te, n_tr, n_te = train_test_split(zk, nk, test_size=0.5, random_state=seed, stratify=nk)
    sc = StandardScaler().fit(z_tr)
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, early_stopping=True, random_state=seed)
    clf.fit(sc.transform(z_tr), n_tr)
    acc = balanced_accuracy_score(n_te, clf.predict(sc.transform(z_te)))
    return {"balanced_accuracy": round(float(acc), 4), "chance": round(1.0 / len(names), 4),
            "nodes": len(names), "rows": int(len(keep))}
