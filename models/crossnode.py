"""The cross-node protocol of ALICCS §5.1 that training and evaluation share: split a window's
labelled nodes into training and held-out nodes, score each held-out node apart (accuracy, Wi-Fi
and 4G recall, 4G share), and summarize per variant (mean, worst, population std). Nodes where
either type makes up less than `model.evaluate.min_class_share` of the labelled rows stay in the
per-node table with `included = false` but out of the summary."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np
import pandas as pd

from ccselect.config import Config
from ccselect.hours import Window
from ccselect.models.dataset import Unlabelled, load_labelled, load_unlabelled, to_train_data, window_nodes
from ccselect.models.groups import compute_groups
from ccselect.models.train import TrainData, accuracy_report

PER_NODE_COLS = ("node_id", "n", "accuracy", "wifi_recall", "cell_recall", "share_cell")


def split_nodes(nodes: Iterable[str], share: float = 0.3, seed: int = 0,
                fleet: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """(training nodes, held-out nodes), both sorted: round(share · N) of the distinct labelled
    `nodes`, drawn with `seed`, at least one on each side when there are two or more. With
    `fleet` (every node of the window, labelled or not), N is the fleet's size: ALICCS §1/§5.1
    train on labelled data "from about 30% of the CDN nodes", and only some nodes carry labels."""
    uniq = sorted(set(nodes))
    if len(uniq) < 2:
        raise ValueError(f"need at least two nodes to hold some out, got {uniq}")
    n = len(set(fleet) | set(uniq)) if fleet is not None else len(uniq)
    k = min(len(uniq) - 1, max(1, int(round(share * n))))
    train = sorted(np.random.default_rng(seed).choice(uniq, size=k, replace=False).tolist())
    return train, sorted(set(uniq) - set(train))


def per_node(y: np.ndarray, p_wifi: np.ndarray, node: np.ndarray, threshold: float = 0.5) -> pd.DataFrame:
    """One row per node (sorted): n, accuracy, wifi_recall, cell_recall, share_cell; a recall is
    NaN on a node without rows of that type. Predicted Wi-Fi where p_wifi ≥ threshold."""
    y, node = np.asarray(y), np.asarray(node)
    pred = np.asarray(p_wifi) >= threshold
    rows = [{"node_id": str(n), **accuracy_report(y[node == n], pred[node == n])} for n in sorted(set(node.tolist()))]
    return pd.DataFrame(rows, columns=list(PER_NODE_COLS))


def summary(per_node_df: pd.DataFrame) -> dict:
    """mean, worst (minimum) and population standard deviation of the node accuracies; nodes."""
    acc = per_node_df["accuracy"].to_numpy(dtype=float)
    acc = acc[~np.isnan(acc)]
    if not len(acc):
        return {"mean": math.nan, "worst": math.nan, "std": math.nan, "nodes": 0}
    return {"mean": float(acc.mean()), "worst": float(acc.min()), "std": float(acc.std()), "nodes": int(len(acc))}


def seed_average(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per node, the mean over training seeds of accuracy and the recalls (n and share_cell are
    the node's, the same in every frame): each node's expected accuracy under training
    randomness, so the worst node and the spread compare nodes, not lucky or unlucky seeds."""
    if len(frames) == 1:
        return frames[0]
    cat = pd.concat(frames, ignore_index=True)
    out = cat.groupby("node_id", sort=True).agg(n=("n", "first"), accuracy=("accuracy", "mean"),
                                                wifi_recall=("wifi_recall", "mean"), cell_recall=("cell_recall", "mean"),
                                                share_cell=("share_cell", "first")).reset_index()
    return out[list(PER_NODE_COLS)]


@dataclass
class Split:
    """A window's labelled rows split by node (ALICCS §5.1), with the prefix groups fitted on the
    training nodes only and the training arrays built from them."""
    train: object
    test: object
    train_nodes: list
    test_nodes: list
    data: TrainData
    groups: pd.DataFrame
    groups_info: dict
    unlabelled: Unlabelled | None = None


def cross_node_split(spark, cfg: Config, window: Window, stats, share: float, seed: int, k: int | None = None,
                     unlabelled_per_node: int = 0) -> Split:
    """What `ccs evaluate` and `ccs train` share: labelled rows of the window standardized with
    `stats`, split into training and held-out nodes (`share` of the window's nodes, drawn from
    those with labels), prefix groups of the training nodes. Training rows come from the
    window's training set (gold.training_set, balanced as the paper trains); a held-out node is
    scored on all of its labelled connections, in its own mix of Wi-Fi and 4G/5G, as it would be
    served."""
    natural = load_labelled(spark, cfg, window, stats, balanced=False)
    if not len(natural):
        raise ValueError(f"no labelled rows in window {window.name}")
    train_nodes, test_nodes = split_nodes(natural.node, share, seed, fleet=window_nodes(spark, cfg, window))
    tr = load_labelled(spark, cfg, window, stats, nodes=train_nodes)
    te = natural.of_nodes(test_nodes)
    groups_pd, groups_info = compute_groups(spark, cfg, window, stats, k, nodes=train_nodes)
    data, _ = to_train_data(tr, groups_pd)
    unl = None
    if unlabelled_per_node > 0:
        # every node's traffic, held-out nodes' too (their labels are never read): the node
        # domains of the node-domain variants, and the per-node standardization's statistics
        unl = load_unlabelled(spark, cfg, window, stats, unlabelled_per_node)
        data = replace(data, x_unl=unl.x, node_unl=unl.node_index(unl.node), n_nodes=len(unl.nodes))
    return Split(tr, te, train_nodes, test_nodes, data, groups_pd, groups_info, unl)
