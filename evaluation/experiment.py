"""A fast research harness for the cross-node experiment of ALICCS §5.1 (Fig. 10), straight
from a simulated fleet's files: no Spark, no lake. The lake pipeline (models/dataset.py,
models/groups.py, evaluation/evaluate.py) reproduces the same numbers at scale.

What it does, in order:
1. reads the transport log (the twelve Table 4 features per connection) and the access log, whose
   client-reported `net_type` is the only label (as silver does; `_truth/` is never read);
2. splits the nodes that carry labels into training nodes (`train_share` of all nodes, seeded) and
   held-out nodes;
3. `log1p`, then standardizes with statistics fitted on the training nodes only (§4.2);
4. per network type, K-means over the per-/24 means of the standardized features → the
   discriminators' prefix groups (§3.1 "domain knowledge-assisted clustering");
5. optionally picks (λ1, λ2) by the Appendix D grid over validation nodes drawn from the training
   nodes (models/grid.py);
6. trains every variant of models/train.py and the Configanator-style baseline (K-means network
   classes + decision tree, Configanator §3.2) and reports, per variant, the accuracy of every
   held-out node and their mean, worst and standard deviation.

    .venv/bin/python -m ccselect.evaluation.experiment --fleet DIR --json
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from ccselect.contract import FEATURES
from ccselect.features.prefixes import prefix_means
from ccselect.models.grid import grid_search
from ccselect.models.train import VARIANTS, TrainData, TrainParams, accuracy_report, fit
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn, torch.


# -- reading the fleet ---------------------------------------------------------------------------
def _prefix24(ip: str) -> str:
    """The /24 of an IPv4 client, the /48 of an IPv6 one (the path unit of §3.1)."""
    if ":" in ip:
        return str(ipaddress.IPv6Network(f"{ip}/48", strict=False).network_address) + "/48"
    return ip.rsplit(".", 1)[0] + ".0/24"


def load_labelled(fleet: str) -> pl.DataFrame:
    """One row per labelled connection: node_id, prefix, y (1 = Wi-Fi, 0 = 4G/5G), features.
    A connection's label is its access log's `net_type` (any labelled request of it)."""
    labels = (pl.scan_ndjson(os.path.join(fleet, "access", "*", "*.jsonl"))
              .filter(pl.col("net_type").is_not_null())
              .group_by("conn_id").agg(pl.col("net_type").first()))
    tr = (pl.scan_ndjson(os.path.join(fleet, "transport", "*", "*.jsonl"))
          .select("conn_id", "node_id", "client_ip", *FEATURES))
    df = tr.join(labels, on="conn_id", how="inner").collect()
    ips = df["client_ip"].unique()
    pfx = pl.DataFrame({"client_ip": ips, "prefix": [_prefix24(i) for i in ips.to_list()]})
    return (df.join(pfx, on="client_ip", how="left")
            .with_columns(y=(pl.col("net_type") == "wifi").cast(pl.Int64))
            .sort("conn_id"))


def all_nodes(fleet: str) -> list[str]:
    return sorted(d for d in os.listdir(os.path.join(fleet, "transport")))


def split_nodes(nodes: list[str], labelled: list[str], train_share: float, seed: int) -> tuple[list[str], list[str]]:
    """`round(train_share · len(nodes))` training nodes drawn from the labelled ones; every other
    labelled node is held out (a node without labels cannot be scored)."""
    rng = np.random.default_rng(seed)
    k = min(len(labelled) - 1, max(1, int(round(train_share * len(nodes)))))
    train = sorted(rng.choice(sorted(labelled), size=k, replace=False).tolist())
    return train, sorted(set(labelled) - set(train))


# -- features and groups -------------------------------------------------------------------------
@dataclass
class Scaler:
    """log1p then standardize; statistics from the training nodes only (ALICCS §4.2)."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, raw: np.ndarray) -> "Scaler":
        z = np.log1p(np.maximum(raw, 0.0))
        return cls(z.mean(0), np.maximum(z.std(0), 1e-6))

    def transform(self, raw: np.ndarray) -> np.ndarray:
        return ((np.log1p(np.maximum(raw, 0.0)) - self.mean) / self.std).astype(np.float32)


def prefix_groups(x: np.ndarray, y: np.ndarray, prefix: np.ndarray, k: int, seed: int
                  ) -> tuple[np.ndarray, tuple[int, int]]:
    """Per network type, K-means (Euclidean) over the per-/24 means → each row's group index
    within its own type (ALICCS §3.1 "Scalability with domain knowledge-assisted clustering")."""
    from sklearn.cluster import KMeans

    group = np.zeros(len(y), dtype=np.int64)
    ks = []
    for t in (0, 1):
        m = y == t
        pm = prefix_means(x[m], prefix[m])
        means, inv = pm.means, pm.inverse
        kt = max(1, min(k, len(means)))
        km = KMeans(kt, n_init=4, random_state=seed).fit(means)
        group[m] = km.labels_[inv]
        ks.append(kt)
    return group, (ks[0], ks[1])


# -- baselines and evaluation --------------------------------------------------------------------
def configanator_predict(x_tr: np.ndarray, y_tr: np.ndarray, pfx_tr: np.ndarray,
                         x_te: np.ndarray, pfx_te: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Configanator §3.2: K-means "network classes" over per-/24 means (labels unused), then one
    decision tree over {the connection's features, its /24's network class}. A held-out /24 gets
    the class nearest to its own mean features, measured on its node's unlabelled traffic."""
    from sklearn.cluster import KMeans
    from sklearn.tree import DecisionTreeClassifier

    pm = prefix_means(x_tr, pfx_tr)
    means, inv = pm.means, pm.inverse
    km = KMeans(k, n_init=4, random_state=seed).fit(means)
    nc_tr = np.eye(k)[km.labels_[inv]]
    tree = DecisionTreeClassifier(min_samples_leaf=20, random_state=seed)
    tree.fit(np.hstack([x_tr, nc_tr]), y_tr)
    pm_te = prefix_means(x_te, pfx_te)
    means_te, inv_te = pm_te.means, pm_te.inverse
    nc_te = np.eye(k)[km.predict(means_te)[inv_te]]
    return tree.predict(np.hstack([x_te, nc_te]))


def summarize(node: np.ndarray, y: np.ndarray, pred: np.ndarray) -> dict[str, object]:
    """Per held-out node: accuracy, Wi-Fi and 4G recall; then mean, worst and std of accuracy."""
    per_node = {str(n): accuracy_report(y[node == n], pred[node == n]) for n in np.unique(node)}
    acc = np.array([r["accuracy"] for r in per_node.values()])
    return {"mean": float(acc.mean()), "worst": float(acc.min()), "std": float(acc.std()),
            "per_node": per_node}


@dataclass
class Prepared:
    train: TrainData
    train_node: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    node_test: np.ndarray
    prefix_test: np.ndarray
    train_nodes: list[str]
    test_nodes: list[str]


def prepare(df: pl.DataFrame, nodes: list[str], train_share: float, seed: int, k: int) -> Prepared:
    labelled = sorted(df["node_id"].unique().to_list())
    train_nodes, test_nodes = split_nodes(nodes, labelled, train_share, seed)
    is_tr = df["node_id"].is_in(train_nodes).to_numpy()
    raw = df.select(FEATURES).to_numpy().astype(np.float64)
    scaler = Scaler.fit(raw[is_tr])
    x = scaler.transform(raw)
    y = df["y"].to_numpy()
    # node and /24 as integer codes: the same /24 on two nodes is two paths (§3.1)
    node = df["node_id"].to_numpy()
    pfx_code = pl.Series(df["node_id"] + "|" + df["prefix"]).cast(pl.Categorical).to_physical().to_numpy().astype(np.int64)
    group, n_groups = prefix_groups(x[is_tr], y[is_tr], pfx_code[is_tr], k, seed)
    data = TrainData(x[is_tr], y[is_tr], pfx_code[is_tr], group, n_groups)
    te = ~is_tr
    return Prepared(data, node[is_tr], x[te], y[te], node[te], pfx_code[te], train_nodes, test_nodes)


def run(fleet: str, train_share: float = 0.3, seed: int = 0, k: int = 8,
        variants: tuple[str, ...] = (*VARIANTS, "configanator"), params: TrainParams | None = None,
        grid: bool = False, log=print) -> dict[str, object]:
    t0 = time.time()
    df = load_labelled(fleet)
    prep = prepare(df, all_nodes(fleet), train_share, seed, k)
    params = params or TrainParams(seed=seed)
    log(f"{df.height:,} labelled connections; training nodes {prep.train_nodes} "
        f"({len(prep.train.y):,} rows), held out {len(prep.test_nodes)}; groups {prep.train.n_groups}")
    out: dict[str, object] = {"fleet": fleet, "seed": seed, "train_share": train_share, "k": k,
                              "train_nodes": prep.train_nodes, "test_nodes": prep.test_nodes,
                              "n_train": int(len(prep.train.y)), "n_test": int(len(prep.y_test))}
    if grid:
        g = grid_search(params, prep.train, prep.train_node, seed=seed, log=log)
        params = replace(params, lambda1=g.lambda1, lambda2=g.lambda2)
        out["grid"] = {"lambda1": g.lambda1, "lambda2": g.lambda2, "table": g.table}
    out["params"] = params.to_dict()
    results = {}
    for v in variants:
        t1 = time.time()
        if v == "configanator":
            pred = configanator_predict(prep.train.x, prep.train.y, prep.train.prefix, prep.x_test,
                                        prep.prefix_test, k, seed)
        else:
            trainer = fit(replace(params, variant=v), prep.train)
            pred = trainer.predict_proba(prep.x_test) >= 0.5
        results[v] = summarize(prep.node_test, prep.y_test, pred)
        r = results[v]
        log(f"{v:13s} mean {r['mean']:.4f} worst {r['worst']:.4f} std {r['std']:.4f} ({time.time() - t1:.0f}s)")
    out["variants"] = results
    out["seconds"] = round(time.time() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", required=True, help="a `ccs simulate` output folder")
    ap.add_argument("--train-share", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=8, help="prefix groups per network type")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--lambda1", type=float, default=None)
    ap.add_argument("--lambda2", type=float, default=None)
    ap.add_argument("--variants", default=",".join((*VARIANTS, "configanator")))
    ap.add_argument("--grid", action="store_true", help="choose λ1, λ2 by the Appendix D grid first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(a.threads)  # tiny networks: more threads only contend on a busy machine
    params = TrainParams(seed=a.seed)
    for name in ("epochs", "lambda1", "lambda2"):
        if getattr(a, name) is not None:
            params = replace(params, **{name: getattr(a, name)})
    log = (lambda *s: print(*s, file=sys.stderr)) if a.json else print
    res = run(a.fleet, a.train_share, a.seed, a.k, tuple(a.variants.split(",")), params, a.grid, log)
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
