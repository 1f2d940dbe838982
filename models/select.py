"""Which variant ships, chosen away from the test (issue 55; ALICCS §5.1, Appendix D).

The candidates train on leave-node-out folds of the TRAINING nodes (models/grid.py's folds): each
fold of training nodes is held out once while the others train, so every training node is scored
once per candidate by a model that never saw it. The choice follows Appendix D's rule, as the λ
grid does: the least spread of per-node accuracy among the candidates whose mean is within
`tolerance` of the best mean. The held-out nodes of the window are not an argument here: nothing
of theirs, labelled or unlabelled, reaches the selection; they are scored once, afterwards, by the
caller.

A node-domain candidate learns from unlabelled rows; here only the training nodes' own.
A `<variant>_nodestd` candidate (e.g. `mlp_nodestd`) trains and is scored on the same rows
standardized per (node, hour) over each node's own recent traffic (`x_nodestd`,
features/node_stats.py: the statistics `ccs infer` applies), which needs no other node's rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np

from ccselect.models.grid import choose, node_folds, subset
from ccselect.models.train import NODE_DOMAIN_VARIANTS, VARIANTS, TrainData, TrainParams, fit

#: deployable variants `ccs infer` serves, the default candidates (model.select.candidates)
DEFAULT_CANDIDATES = ("mlp", "aliccs", "aliccs_nodes")
#: a candidate named `<variant>` + NODESTD is `<variant>` on per-node standardized features
NODESTD = "_nodestd"


def base_variant(candidate: str) -> tuple[str, bool]:
    """(the network variant, whether per-node standardized) of a candidate name; a node-domain
    variant cannot be per-node standardized here (its unlabelled rows are fleet-standardized)."""
    nodestd = candidate.endswith(NODESTD)
    base = candidate[:-len(NODESTD)] if nodestd else candidate
    if base not in VARIANTS or (nodestd and base in NODE_DOMAIN_VARIANTS):
        raise ValueError(f"unknown candidate {candidate!r}; one of {sorted(VARIANTS)}, or one of "
                         f"{sorted(v for v in VARIANTS if v not in NODE_DOMAIN_VARIANTS)} + {NODESTD!r}")
    return base, nodestd


@dataclass
class Selection:
    variant: str
    table: list[dict[str, object]]   # one row per candidate: variant, mean, worst, std, per_node
    folds: list[list[str]]
    rule: str

    def to_dict(self) -> dict[str, object]:
        return {"variant": self.variant, "rule": self.rule, "folds": self.folds, "table": self.table}


def training_nodes_only(data: TrainData, unl_node: np.ndarray | None, nodes: Iterable[str]) -> TrainData:
    """`data` with its unlabelled rows (node domains) cut to those of `nodes`."""
    if data.x_unl is None or unl_node is None:
        return data
    keep = np.isin(np.asarray(unl_node).astype(str), np.array(sorted(set(map(str, nodes)))))
    return replace(data, x_unl=data.x_unl[keep], node_unl=data.node_unl[keep])


def select_variant(params: TrainParams, data: TrainData, node: np.ndarray,
                   candidates: Iterable[str] = DEFAULT_CANDIDATES, unl_node: np.ndarray | None = None,
                   n_folds: int = 2, tolerance: float = 0.005, seed: int = 0,
                   log: Callable[[str], None] | None = None, x_nodestd: np.ndarray | None = None) -> Selection:
    """Score every candidate on leave-node-out folds of the training rows `data` (`node` [N] names
    each row's node; `unl_node` names each unlabelled row's) and choose one. `x_nodestd` [N, F]:
    the same rows standardized per node, which a `*_nodestd` candidate needs. `n_folds` 0: one
    fold per training node (leave-one-node-out)."""
    candidates = tuple(candidates)
    for v in candidates:
        if base_variant(v)[1] and x_nodestd is None:
            raise ValueError(f"candidate {v} needs the rows standardized per node (x_nodestd)")
    node = np.asarray(node).astype(str)
    if len(set(node.tolist())) < 2:
        # no fold can hold a training node out: nothing to choose on, and the caller says so
        rule = f"fewer than two training nodes: no leave-node-out fold, the first candidate ({candidates[0]})"
        if log:
            log(f"select: {rule}")
        return Selection(candidates[0], [], [], rule)
    # n_folds 0: one fold per training node (leave-one-node-out, as the held-out nodes are scored)
    folds = node_folds(node, n_folds or len(set(node.tolist())), seed)
    data = training_nodes_only(data, unl_node, node)
    table = []
    for v in candidates:
        base, nodestd = base_variant(v)
        p = replace(params, variant=base)
        vdata = replace(data, x=np.asarray(x_nodestd, dtype=np.float32)) if nodestd else data
        per_node: dict[str, float] = {}
        for val in folds:
            is_val = np.isin(node, val)
            trainer = fit(p, subset(vdata, np.flatnonzero(~is_val)))
            pred = trainer.predict_proba(vdata.x[is_val]) >= 0.5
            y_val, n_val = data.y[is_val], node[is_val]
            for n in val:
                m = n_val == n
                per_node[n] = float((pred[m] == y_val[m].astype(bool)).mean())
        acc = np.array(list(per_node.values()))
        row = {"variant": v, "mean": float(acc.mean()), "worst": float(acc.min()), "std": float(acc.std()),
               "per_node": per_node}
        table.append(row)
        if log:
            log(f"select {v:14s} mean {row['mean']:.4f} worst {row['worst']:.4f} std {row['std']:.4f} "
                f"on {len(per_node)} training nodes, {len(folds)} leave-node-out folds")
    best = choose(table, tolerance)
    rule = (f"least std of per-node accuracy among candidates within {tolerance} of the best mean "
            f"(ALICCS Appendix D), on {len(folds)} leave-node-out folds of the training nodes")
    return Selection(str(best["variant"]), table, folds, rule)
