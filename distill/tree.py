"""Knowledge distillation of the classifier into a multi-output regression tree (ALICCS §3.2).

The DNN's two class probabilities (Y_0 = P(4G/5G), Y_1 = P(Wi-Fi)) on the training features
become the tree's regression targets: the distilled set {X^i, Y_0^i, Y_1^i}. The tree grows one
level at a time until its argmax agrees with the DNN's on a held-out share of the rows
(fidelity) at the configured threshold; then, as §3.2 does for "subsets with significant
prediction discrepancies", it keeps deepening while any /16 with enough held-out rows stays
below the subset threshold.

The tree reads the raw Table 4 features, not the standardized ones: log1p and standardization
are monotone per feature, so they cannot change which partitions a tree can make, and raw
thresholds ("mss_bytes <= 1420.0") are what an operator can check against domain knowledge.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.tree import DecisionTreeRegressor, export_text

from ccselect.contract import FEATURES
from ccselect.settings import DistillSettings


def fidelity(tree_probs: np.ndarray, dnn_probs: np.ndarray) -> float:
    """Share of rows where the tree's argmax class equals the DNN's ([N, 2] each)."""
    if len(dnn_probs) == 0:
        return float("nan")
    return float((np.argmax(tree_probs, 1) == np.argmax(dnn_probs, 1)).mean())


def agreement_by(keys: np.ndarray, tree_probs: np.ndarray, dnn_probs: np.ndarray) -> dict[str, tuple[int, float]]:
    """{key: (rows, fidelity)} per distinct key (e.g. /16)."""
    agree = np.argmax(tree_probs, 1) == np.argmax(dnn_probs, 1)
    out = {}
    uniq, inv = np.unique(keys.astype(str), return_inverse=True)
    n = np.bincount(inv, minlength=len(uniq))
    a = np.bincount(inv, weights=agree, minlength=len(uniq))
    for k, ni, ai in zip(uniq, n, a):
        out[str(k)] = (int(ni), float(ai / ni))
    return out


def holdout_split(n: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded row split → (train indices, held-out indices), both sorted."""
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(n * share))
    return np.sort(perm[k:]), np.sort(perm[:k])


def fit_tree(x: np.ndarray, targets: np.ndarray, depth: int, params: DistillSettings) -> DecisionTreeRegressor:
    """One multi-output tree on (X, [Y_0, Y_1]) — scikit-learn's native multi-output criterion."""
    tree = DecisionTreeRegressor(max_depth=depth, min_samples_leaf=params.min_samples_leaf,
                                 random_state=params.seed)
    return tree.fit(x, targets)


@dataclass
class SearchStep:
    depth: int
    fidelity: float
    leaves: int
    failing_subsets: list[str] = field(default_factory=list)


@dataclass
class SearchResult:
    tree: DecisionTreeRegressor
    depth: int
    passed: bool                 # global fidelity reached the threshold
    subsets_passed: bool         # no /16 below the subset threshold (or max depth reached: False)
    global_depth: int            # first depth that passed globally (max_depth when none did)
    steps: list[SearchStep]


def depth_search(x_train: np.ndarray, t_train: np.ndarray, x_test: np.ndarray, t_test: np.ndarray,
                 params: DistillSettings, subset_keys: np.ndarray | None = None) -> SearchResult:
    """Grow depth from `min_depth` until held-out fidelity ≥ `params.fidelity` (stop at the first
    depth that passes); then, with `subset_keys` (one per held-out row), keep deepening while a
    subset with ≥ `subset_min_rows` held-out rows agrees less than `subset_fidelity` (§3.2)."""
    steps: list[SearchStep] = []
    tree, passed, global_depth = None, False, params.max_depth
    depth = params.min_depth
    while depth <= params.max_depth:
        tree = fit_tree(x_train, t_train, depth, params)
        pred = tree.predict(x_test)
        fid = fidelity(pred, t_test)
        failing = _failing_subsets(subset_keys, pred, t_test, params) if subset_keys is not None else []
        steps.append(SearchStep(depth, fid, int(tree.get_n_leaves()), failing))
        if not passed and fid >= params.fidelity:
            passed, global_depth = True, depth
        if passed and not failing:
            return SearchResult(tree, depth, True, True, global_depth, steps)
        if passed and subset_keys is None:
            return SearchResult(tree, depth, True, True, global_depth, steps)
        depth += 1
    return SearchResult(tree, params.max_depth, passed, False, global_depth, steps)


def _failing_subsets(keys: np.ndarray, pred: np.ndarray, target: np.ndarray, params: DistillSettings) -> list[str]:
    per = agreement_by(keys, pred, target)
    return sorted(k for k, (n, f) in per.items() if k and n >= params.subset_min_rows and f < params.subset_fidelity)


def accuracy(probs: np.ndarray, label: np.ndarray) -> float:
    """Share of rows whose argmax class (0 4G/5G, 1 Wi-Fi) is the label."""
    return float((np.argmax(probs, 1) == np.asarray(label)).mean()) if len(label) else float("nan")


def rules_text(tree: DecisionTreeRegressor, max_depth: int | None = None) -> str:
    """The tree as readable if/else rules (scikit-learn export_text); leaves show [P(4G), P(Wi-Fi)]."""
    kw = {"max_depth": max_depth} if max_depth is not None else {"max_depth": 1000}
    return export_text(tree, feature_names=list(FEATURES), decimals=3, show_weights=False, **kw)


@dataclass
class Distilled:
    tree: DecisionTreeRegressor
    search: SearchResult
    metrics: dict
    subsets: dict[str, tuple[int, float]]   # /16 → (held-out rows, fidelity) of the final tree


def distill(raw: np.ndarray, dnn_probs: np.ndarray, label: np.ndarray, prefix16: np.ndarray,
            params: DistillSettings) -> Distilled:
    """The whole §3.2 distillation on aligned arrays: split, depth search, metrics."""
    train, test = holdout_split(len(raw), params.holdout, params.seed)
    search = depth_search(raw[train], dnn_probs[train], raw[test], dnn_probs[test], params,
                          subset_keys=prefix16[test])
    pred = search.tree.predict(raw[test])
    dnn_acc = accuracy(dnn_probs[test], label[test])
    tree_acc = accuracy(pred, label[test])
    metrics = {
        "rows": int(len(raw)), "train_rows": int(len(train)), "holdout_rows": int(len(test)),
        "depth": search.depth, "global_depth": search.global_depth, "leaves": int(search.tree.get_n_leaves()),
        "fidelity": fidelity(pred, dnn_probs[test]), "passed": search.passed,
        "subsets_passed": search.subsets_passed,
        "dnn_accuracy": dnn_acc, "tree_accuracy": tree_acc, "accuracy_drop": dnn_acc - tree_acc,
    }
    return Distilled(search.tree, search, metrics, agreement_by(prefix16[test], pred, dnn_probs[test]))
