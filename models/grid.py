"""The λ1, λ2 grid search of ALICCS Appendix D: "increasing λ1, λ2 encourages the model to extract
more uniform representations, thereby reducing the variability of prediction accuracy across CDN
nodes; strictly minimizing variability could hurt the overall average accuracy", so pick the
pair with the least spread of per-node accuracy among those whose mean accuracy stays within
`tolerance` of the best mean.

Validation is across nodes and uses the TRAINING nodes only: they are split into folds of nodes;
each fold is held out once while the others train, so every training node is scored once per
grid point (never the test nodes: tuning on them would be tuning the test).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ccselect.models.train import TrainData, TrainParams, fit

LAMBDA1_GRID = (0.1, 0.3, 1.0)
LAMBDA2_GRID = (0.05, 0.2)


@dataclass
class GridResult:
    lambda1: float
    lambda2: float
    table: list[dict[str, object]]  # one row per grid point: λ1, λ2, mean, worst, std, per_node


def subset(data: TrainData, rows: np.ndarray) -> TrainData:
    return replace(data, x=data.x[rows], y=data.y[rows], prefix=data.prefix[rows], group=data.group[rows])


def node_folds(nodes: np.ndarray, n_folds: int, seed: int) -> list[list[str]]:
    """The distinct training nodes, shuffled with `seed`, dealt into `n_folds` validation folds."""
    uniq = np.array(sorted(set(nodes.tolist())))
    if len(uniq) < 2:
        raise ValueError("the grid needs at least two training nodes (one to fit, one to validate)")
    order = np.random.default_rng(seed).permutation(uniq)
    n_folds = max(2, min(n_folds, len(uniq)))
    return [sorted(order[i::n_folds].tolist()) for i in range(n_folds)]


def choose(table: list[dict[str, object]], tolerance: float) -> dict[str, object]:
    """Least std among the rows whose mean is within `tolerance` of the best mean (Appendix D)."""
    best = max(float(r["mean"]) for r in table)
    ok = [r for r in table if float(r["mean"]) >= best - tolerance]
    return min(ok, key=lambda r: (float(r["std"]), -float(r["mean"])))


def grid_search(params: TrainParams, data: TrainData, node: np.ndarray,
                lambda1s: tuple[float, ...] = LAMBDA1_GRID, lambda2s: tuple[float, ...] = LAMBDA2_GRID,
                n_folds: int = 2, tolerance: float = 0.005, seed: int = 0,
                log: Callable[[str], None] | None = None) -> GridResult:
    """Grid over (λ1, λ2) for `params.variant` (aliccs by default). `node` [N] names each row's
    node. Returns the chosen pair and the whole table."""
    folds = node_folds(np.asarray(node), n_folds, seed)
    table = []
    for l1 in lambda1s:
        for l2 in lambda2s:
            p = replace(params, lambda1=l1, lambda2=l2)
            per_node: dict[str, float] = {}
            for val in folds:
                is_val = np.isin(node, val)
                trainer = fit(p, subset(data, np.flatnonzero(~is_val)))
                pred = trainer.predict_proba(data.x[is_val]) >= 0.5
                y_val, n_val = data.y[is_val], np.asarray(node)[is_val]
                for n in val:
                    m = n_val == n
                    per_node[n] = float((pred[m] == y_val[m].astype(bool)).mean())
            acc = np.array(list(per_node.values()))
            row = {"lambda1": l1, "lambda2": l2, "mean": float(acc.mean()), "worst": float(acc.min()),
                   "std": float(acc.std()), "per_node": per_node}
            table.append(row)
            if log:
                log(f"grid λ1={l1:<5} λ2={l2:<5} mean {row['mean']:.4f} worst {row['worst']:.4f} std {row['std']:.4f}")
    best = choose(table, tolerance)
    return GridResult(float(best["lambda1"]), float(best["lambda2"]), table)
