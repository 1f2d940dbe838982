"""The handshake tree (issue 27): a small decision tree over what the kernel knows when a connection
is established — `ccselect.contract.HANDSHAKE_FEATURES`: the MSS, the client's window in the
handshake's last ACK and the SYN-ACK → ACK time — from which the edge decides per flow where the
prefix table does not (a miss, a mixed prefix) or always (export/edge/ccs_table.h, the flow modes).

Why a flow-level model beside the table: a prefix table knows a prefix's history, which lags
(ALICCS Observation IV: prefixes change type within hours); the handshake knows the flow. Disco
[47] decides from the handshake alone; ALICCS from the table alone; the edge uses both.

Trained, not distilled: the target is the client-reported network type of the window's labelled
connections (the labels the champion learns from, ALICCS §3.1), in their natural mix — not the
balanced training set — so that a leaf's share of Wi-Fi is the probability the kernel compares
with an entry's purity. The inputs are the raw integers the kernel reads (bytes, microseconds):
scikit-learn's thresholds lie between training values, and for integer inputs `x <= t` is
`x <= floor(t)`, so the integer tree (`HandshakeTree`) decides exactly as the fitted one.

The report (distill/jobs.py `handshake_report`) follows ALICCS §5.1: the tree is fitted on the training nodes and scored
on each held-out node; then each feature subset the same way (which features carry the signal),
and the deployed tree is fitted on every labelled node of the window.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ccselect.config import Config
from ccselect.contract import HANDSHAKE_FEATURES
from ccselect.hours import Window
from ccselect.lake import connections_in
from ccselect.settings import HandshakeSettings
from ccselect.distill.store import experiment_id, tracking
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn, pyspark, mlflow.

LEAF = -1


@dataclass(frozen=True)
class HandshakeTree:
    """A fitted tree in the kernel's terms: node i is a leaf when feature[i] == LEAF, else it sends
    a connection whose feature value is <= threshold[i] to left[i], otherwise to right[i]. A
    leaf's p_wifi is the share of Wi-Fi among its training rows, n its training rows."""
    features: tuple[str, ...]
    feature: tuple[int, ...]
    threshold: tuple[int, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    p_wifi: tuple[float, ...]
    n: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.feature)

    def depth(self) -> int:
        d = [0] * len(self)
        for i in range(len(self)):            # children come after their parent (from_sklearn)
            if self.feature[i] != LEAF:
                d[self.left[i]] = d[self.right[i]] = d[i] + 1
        return max(d) if d else 0

    def to_json(self) -> str:
        return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "HandshakeTree":
        d = json.loads(text)
        return cls(tuple(d["features"]), tuple(int(v) for v in d["feature"]), tuple(int(v) for v in d["threshold"]),
                   tuple(int(v) for v in d["left"]), tuple(int(v) for v in d["right"]),
                   tuple(float(v) for v in d["p_wifi"]), tuple(int(v) for v in d["n"]))


def from_sklearn(clf, features: Sequence[str]) -> HandshakeTree:
    """The integer tree of a fitted DecisionTreeClassifier (classes 0 = 4G/5G, 1 = Wi-Fi), renumbered
    breadth-first so that every child comes after its parent (the kernel's acyclicity rule)."""
    t = clf.tree_
    classes = list(clf.classes_)
    order, pos = [0], {0: 0}
    for node in order:                        # breadth-first
        if t.children_left[node] != -1:
            for child in (t.children_left[node], t.children_right[node]):
                pos[int(child)] = len(order)
                order.append(int(child))
    feature, threshold, left, right, p_wifi, n = [], [], [], [], [], []
    for node in order:
        counts = t.value[node][0] * t.weighted_n_node_samples[node]   # sklearn ≥ 1.4 keeps fractions
        total = float(counts.sum())
        p_wifi.append(float(counts[classes.index(1)] / total) if 1 in classes and total else float(classes == [1]))
        n.append(int(t.n_node_samples[node]))
        if t.children_left[node] == -1:
            feature.append(LEAF), threshold.append(0), left.append(0), right.append(0)
        else:
            feature.append(int(t.feature[node]))
            threshold.append(int(math.floor(t.threshold[node])))
            left.append(pos[int(t.children_left[node])])
            right.append(pos[int(t.children_right[node])])
    return HandshakeTree(tuple(features), tuple(feature), tuple(threshold), tuple(left), tuple(right),
                         tuple(p_wifi), tuple(n))


def fit(x: np.ndarray, y: np.ndarray, settings: HandshakeSettings, features: Sequence[str] = HANDSHAKE_FEATURES):
    """(the fitted DecisionTreeClassifier, its HandshakeTree) on integer rows x [N, len(features)]
    and labels y (1 = Wi-Fi, 0 = 4G/5G)."""
    from sklearn.tree import DecisionTreeClassifier

    clf = DecisionTreeClassifier(max_depth=settings.depth, min_samples_leaf=settings.min_leaf,
                                 random_state=settings.seed)
    clf.fit(np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64))
    return clf, from_sklearn(clf, features)


# ---- the window's rows and the report -----------------------------------------------------------

@dataclass
class HandshakeRows:
    x: np.ndarray        # [N, 3] int64, HANDSHAKE_FEATURES order
    y: np.ndarray        # 1 Wi-Fi, 0 4G/5G
    node: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def where(self, mask: np.ndarray) -> "HandshakeRows":
        return HandshakeRows(self.x[mask], self.y[mask], self.node[mask])


def window_rows(spark, cfg: Config, window: Window) -> HandshakeRows:
    """Every labelled connection of silver.connections in the window (natural mix) with a complete
    handshake (no imputed or missing feature)."""
    from pyspark.sql import functions as F

    df = connections_in(spark, cfg, window).where(F.col("label").isNotNull())
    for f in HANDSHAKE_FEATURES:
        df = df.where(F.col(f).isNotNull())
    if "imputed" in df.columns:
        df = df.where(F.size("imputed") == 0)
    t = df.select("node_id", F.col("label").cast("int").alias("label"), *[F.col(f).cast("long") for f in HANDSHAKE_FEATURES]) \
          .orderBy("node_id", *HANDSHAKE_FEATURES, "label").toArrow()
    x = np.stack([t.column(f).to_numpy() for f in HANDSHAKE_FEATURES], axis=1) if t.num_rows else \
        np.zeros((0, len(HANDSHAKE_FEATURES)), dtype=np.int64)
    return HandshakeRows(x.astype(np.int64), t.column("label").to_numpy().astype(np.int64),
                         np.asarray(t.column("node_id").to_pylist(), dtype=object))


def subsets(features: Sequence[str]) -> list[tuple[str, ...]]:
    """Every non-empty subset of the features, largest first."""
    out = []
    k = len(features)
    for mask in range(1, 2 ** k):
        out.append(tuple(f for i, f in enumerate(features) if mask >> i & 1))
    return sorted(out, key=lambda s: (-len(s), [features.index(f) for f in s]))


# ---- the registry: `<name>-handshake` ------------------------------------------------------------

#: what a DecisionTreeClassifier's skops file holds beyond builtins; skops refuses anything else
SKOPS_TRUSTED_TYPES = ["sklearn.tree._tree.Tree"]
HANDSHAKE_EXPERIMENT = "ccs-handshake"
HANDSHAKE_JSON = "handshake/tree.json"


def handshake_model_name(cfg: Config) -> str:
    return f"{cfg.settings.mlflow.model_name}-handshake"


def log_handshake(cfg: Config, hs, clf, tree, report: dict, full: dict, window: str, promote: bool) -> dict:
    """One MLflow run in experiment `ccs-handshake`: the settings, the held-out report as metrics
    and JSON, the integer tree (what ships in the table) as `handshake/tree.json`, and the fitted
    classifier (skops) registered as `<name>-handshake`; alias `champion` when `promote`.
    Returns {run_id, name, version, champion}."""
    import mlflow
    import mlflow.sklearn

    client = tracking(cfg)
    name = handshake_model_name(cfg)
    with mlflow.start_run(experiment_id=experiment_id(cfg, HANDSHAKE_EXPERIMENT), run_name=f"handshake {window}") as run:
        mlflow.log_params({"depth": hs.depth, "min_leaf": hs.min_leaf, "seed": hs.seed, "window": window,
                           "features": ",".join(hs.features), "target": "client-reported type, natural mix"})
        mlflow.log_metrics({f"heldout_{k}": float(v) for k, v in full.items() if isinstance(v, (int, float))})
        mlflow.log_metrics({"nodes": len(tree), "tree_depth": tree.depth(), "majority_accuracy": report["majority_accuracy"]})
        mlflow.log_dict(report, "handshake/report.json")
        mlflow.log_text(tree.to_json(), HANDSHAKE_JSON)
        info = mlflow.sklearn.log_model(clf, name="handshake", serialization_format="skops",
                                        skops_trusted_types=SKOPS_TRUSTED_TYPES, registered_model_name=name)
        version = str(info.registered_model_version)
        client.set_model_version_tag(name, version, "window", window)
        client.set_model_version_tag(name, version, "heldout_accuracy", f"{full['accuracy']:.4f}")
        if promote:
            client.set_registered_model_alias(name, "champion", version)
        return {"run_id": run.info.run_id, "name": name, "version": version, "champion": bool(promote)}


def load_handshake(cfg: Config):
    """(HandshakeTree, "<name>-handshake v<version>") of `<name>-handshake@champion`, or None when
    there is none."""
    import mlflow.artifacts

    client = tracking(cfg)
    name = handshake_model_name(cfg)
    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except Exception:  # noqa: BLE001 - MLflow raises its own RestException subtypes
        return None
    text = mlflow.artifacts.load_text(f"runs:/{mv.run_id}/{HANDSHAKE_JSON}")
    return HandshakeTree.from_json(text), f"{name} v{mv.version}"
