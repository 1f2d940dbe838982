"""The Configanator-style baseline (Configanator, NSDI'22, §3.2 "Discovering Network Classes" and
§3.1's exploitation arm), as ALICCS §5.1 compares it (Fig. 10):

1. Network classes (NC): K-means over the per-path (node, /24) archive of network
   characteristics — here the mean of each /24's standardized Table 4 features (latency, windows,
   MSS...) over its connections, labels unused. K is the smallest in `k_range` that bounds the
   spread inside every class (RMS distance of member /24s to their centroid ≤ `nc_spread`), as
   Configanator "empirically selects the smallest K that bounds the spread of performance within
   each NC by a predefined limit"; or fixed by configuration.
2. One decision tree (the "D-Tree" exploitation arm) over {the connection's features, its /24's
   NC (one-hot)} → network type; P(Wi-Fi) is the Wi-Fi share of the leaf.

A /24 at prediction time gets the NC whose centroid is nearest to its own mean over the rows
being scored (its node's traffic in the window; labels are not used), the historical per-/24
archive of Configanator's workflow.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ccselect.settings import ConfiganatorSettings
from ccselect.features.prefixes import prefix_means
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.


@dataclass
class Configanator:
    centroids: np.ndarray       # [K, F] network-class centroids
    tree: object                # sklearn DecisionTreeClassifier over [features, one-hot NC]

    @property
    def k(self) -> int:
        return len(self.centroids)


def network_class(centroids: np.ndarray, means: np.ndarray) -> np.ndarray:
    return ((means[:, None, :] - centroids[None, :, :]) ** 2).sum(-1).argmin(1)


def _spread(km, means: np.ndarray) -> float:
    """The largest per-class RMS distance of member paths to their centroid."""
    d2 = ((means - km.cluster_centers_[km.labels_]) ** 2).sum(1)
    return float(max(np.sqrt(d2[km.labels_ == c].mean()) for c in np.unique(km.labels_)))


def choose_classes(p: ConfiganatorSettings, means: np.ndarray) -> tuple[object, dict]:
    from sklearn.cluster import KMeans
    n = len(means)
    if p.k is not None:
        k = max(1, min(int(p.k), n))
        return KMeans(k, n_init=4, random_state=p.seed).fit(means), {"k": k, "chosen_by": "config"}
    spreads = {}
    km = None
    for k in range(max(1, p.k_range[0]), min(p.k_range[1], n) + 1):
        km = KMeans(k, n_init=4, random_state=p.seed).fit(means)
        spreads[k] = round(_spread(km, means), 4)
        if spreads[k] <= p.nc_spread:
            return km, {"k": k, "chosen_by": f"smallest K with spread <= {p.nc_spread}", "spread": spreads}
    return km, {"k": km.n_clusters, "chosen_by": f"k_range max (no K bounds spread {p.nc_spread})", "spread": spreads}


def _design(x: np.ndarray, nc: np.ndarray, k: int) -> np.ndarray:
    return np.hstack([x, np.eye(k, dtype=np.float32)[nc]])


def fit(p: ConfiganatorSettings, x: np.ndarray, y: np.ndarray, node: np.ndarray, prefix: np.ndarray
        ) -> tuple[Configanator, dict]:
    """Network classes over the training paths' means, then the decision tree on training rows."""
    from sklearn.tree import DecisionTreeClassifier
    pm = prefix_means(x, node, prefix)       # per (node, prefix) path
    means, ids = pm.means, pm.inverse
    km, info = choose_classes(p, means)
    nc = km.labels_[ids]
    tree = DecisionTreeClassifier(min_samples_leaf=p.min_samples_leaf, random_state=p.seed)
    tree.fit(_design(x, nc, km.n_clusters), y)
    info.update(paths=int(len(means)), tree_leaves=int(tree.get_n_leaves()), tree_depth=int(tree.get_depth()))
    return Configanator(np.asarray(km.cluster_centers_), tree), info


def predict_proba(model: Configanator, x: np.ndarray, node: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """P(Wi-Fi) per row."""
    if not len(x):
        return np.zeros(0)
    pm = prefix_means(x, node, prefix)       # per (node, prefix) path
    means, ids = pm.means, pm.inverse
    nc = network_class(model.centroids, means)[ids]
    proba = model.tree.predict_proba(_design(x, nc, model.k))
    classes = list(model.tree.classes_)
    return proba[:, classes.index(1)] if 1 in classes else np.zeros(len(x))
