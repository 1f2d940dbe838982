"""Shapley diagnostics on the distilled tree (ALICCS §3.2 "Using our decision tree in practice").

The paper's case: a /16 where the classifier's accuracy was low; Shapley values of the tree's
output on that /16's samples showed the model leaning on MSS far more there than elsewhere.
Here: SHAP TreeExplainer (exact for trees) on the whole window and on subsets — by default
every /16 whose DNN accuracy is below a threshold — and, per subset, the features ranked by
mean |SHAP| and those whose share of the attribution is far above their global share.

Attributions are those of the tree's P(Wi-Fi) output. The tree's two outputs are leaf means
of (P(4G), P(Wi-Fi)), which sum to 1, so the 4G output's attributions are exactly the negation:
|SHAP| and every share below are the same for either output.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ccselect.contract import FEATURES
from ccselect.settings import DiagnoseSettings
# Imported inside the functions that use them (heavy, not needed to import this module): shap.

WIFI = 1


def shap_values(tree, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TreeExplainer on the multi-output tree → (values [n, features, outputs], expected [outputs]).
    Additivity: values.sum(1) + expected == tree.predict(raw), per output."""
    import shap
    explainer = shap.TreeExplainer(tree)
    values = np.asarray(explainer.shap_values(raw, check_additivity=True))
    if values.ndim == 2:  # a single-output tree: add the outputs axis
        values = values[:, :, None]
    return values, np.atleast_1d(np.asarray(explainer.expected_value, dtype=float))


def shares(values_wifi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per feature: mean |SHAP| over the rows and its share of the sum over features."""
    mean_abs = np.abs(values_wifi).mean(0) if len(values_wifi) else np.zeros(values_wifi.shape[1])
    total = mean_abs.sum()
    return mean_abs, (mean_abs / total if total > 0 else np.zeros_like(mean_abs))


def profile(values_wifi: np.ndarray, global_share: np.ndarray, params: DiagnoseSettings) -> pd.DataFrame:
    """One row per feature (model order) with mean_abs_shap, share, global_share, lift (share /
    global share), excess (share − global share), rank (by mean |SHAP|, 1 = first) and
    over_relied; over-relied features come first ordered by excess, then the rest by rank."""
    mean_abs, share = shares(values_wifi)
    # a feature unused overall: lift is inf where the subset uses it, undefined (NaN) where not
    lift = np.divide(share, global_share, out=np.where(share > 0, np.inf, np.nan), where=global_share > 0)
    df = pd.DataFrame({"feature": list(FEATURES), "mean_abs_shap": mean_abs, "share": share,
                       "global_share": global_share, "lift": lift, "excess": share - global_share})
    df["rank"] = df["mean_abs_shap"].rank(ascending=False, method="first").astype(int)
    df["over_relied"] = (df["lift"] >= params.over_reliance) & (df["excess"] >= params.min_excess)
    return df


def over_relied(df: pd.DataFrame) -> list[str]:
    """The over-relied features of a profile, most excess share first."""
    return df[df["over_relied"]].sort_values("excess", ascending=False)["feature"].tolist()


def top_features(df: pd.DataFrame, k: int) -> list[str]:
    return df.sort_values("rank")["feature"].head(k).tolist()


def per_prefix16(prefix16: np.ndarray, label: np.ndarray, dnn_probs: np.ndarray,
                 tree_probs: np.ndarray) -> pd.DataFrame:
    """Per /16: rows, DNN accuracy vs labels, tree accuracy, tree–DNN agreement; worst first."""
    dnn = np.argmax(dnn_probs, 1)
    tree = np.argmax(tree_probs, 1)
    df = pd.DataFrame({"prefix16": prefix16.astype(str), "dnn_ok": dnn == label, "tree_ok": tree == label,
                       "agree": dnn == tree})
    df = df[df["prefix16"] != ""]
    g = df.groupby("prefix16").agg(rows=("dnn_ok", "size"), accuracy=("dnn_ok", "mean"),
                                   tree_accuracy=("tree_ok", "mean"), fidelity=("agree", "mean")).reset_index()
    return g.sort_values(["accuracy", "rows"], ascending=[True, False]).reset_index(drop=True)


@dataclass
class Subset:
    kind: str        # "prefix16" | "prefix" | "node"
    key: str
    mask: np.ndarray


def select_subsets(prefix16: np.ndarray, client_ip: np.ndarray, node: np.ndarray, by16: pd.DataFrame,
                   params: DiagnoseSettings, prefix: str | None = None, node_id: str | None = None,
                   worst: int | None = None) -> list[Subset]:
    """--prefix CIDR, --node ID, --worst K (lowest-accuracy /16s with ≥ min_rows rows), or by
    default every /16 with ≥ min_rows rows whose accuracy is below the threshold."""
    if prefix:
        net = ipaddress.ip_network(prefix, strict=False)
        uniq, inv = np.unique(client_ip.astype(str), return_inverse=True)
        inside = np.array([_in(net, ip) for ip in uniq], dtype=bool)
        return [Subset("prefix", str(net), inside[inv])]
    if node_id:
        return [Subset("node", node_id, node.astype(str) == node_id)]
    eligible = by16[by16["rows"] >= params.min_rows]
    chosen = eligible.head(worst) if worst else eligible[eligible["accuracy"] < params.accuracy_threshold]
    p16 = prefix16.astype(str)
    return [Subset("prefix16", k, p16 == k) for k in chosen["prefix16"]]


def _in(net, ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in net
    except ValueError:
        return False


def sample(n: int, k: int, seed: int) -> np.ndarray:
    """At most k of n row indices, seeded, sorted."""
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, k, replace=False))
