"""Evaluation across nodes (ALICCS §5.1, Fig. 9 right, Fig. 10): train on a share of the nodes
(30% of the window's nodes by default, drawn from those with labels), score every held-out node
apart.

Per held-out node and variant: n, accuracy, Wi-Fi recall, 4G recall and the node's 4G share
(Fig. 9 right plots accuracy against it); per variant: mean, worst and standard deviation
(population) of the node accuracies. As §5.1, nodes where either type makes up less than
`model.evaluate.min_class_share` (5%) of the labelled rows stay in the per-node table with
`included = false` but out of the summary.

Tables (both replaced per (window, variant), so re-running a variant is idempotent and other
variants' rows stay):
- gold.model_eval: window, variant, node_id, n, accuracy, wifi_recall, cell_recall, share_cell,
  included, seed, share, evaluated_at — one row per held-out node (accuracy and recalls averaged
  over the training seeds when `train_seeds` > 1);
- gold.model_eval_summary: window, variant, mean, worst, std, nodes, acc_share_cell_corr,
  n_train, n_test, train_nodes, test_nodes, seed, share, params (JSON), seconds, evaluated_at,
  train_seeds, mean_sd, worst_sd, std_sd (the spread of those over training seeds; null with one).

The training nodes are `share` (30%) of the window's nodes — the whole fleet's, as the paper's
labels come "from about 30% of the CDN nodes" — drawn from the nodes that carry labels; every
other labelled node is held out. Every variant trains on the same rows: the window's
gold.training_set (balanced, ALICCS trains on 50% 4G) restricted to the training nodes,
standardized with the window's feature statistics (fitted on silver, unlabelled); the prefix
groups are fitted on the training nodes only. A held-out node is scored on all of its labelled
connections, in its own Wi-Fi/4G mix.

The `*_nodestd` variants (and `gbdt_nodestd`) see every row, training and held-out, standardized
per (node, hour) as the edge would (`deployed_node_standardization`: features/node_stats.py, the
statistics `ccs train` and `ccs infer` apply): the node's trailing `model.node_stats.hours` of
silver.node_stats, or the fleet's statistics where it has fewer than `min_conns` connections
there. The result's `node_std` says how many (node, hour) partitions fell back and which, and
each such variant's per-node rows carry `fleet_fallback_share` (the share of the node's scored
rows standardized with the fleet's statistics).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from ccselect import delta_io
from ccselect.config import Config
from ccselect.hours import Window
from ccselect.lake import MODEL_EVAL, MODEL_EVAL_SUMMARY, NODE_STATS, table_path
from ccselect.features import node_stats
from ccselect.features.scaling import window_stats
from ccselect.models import configanator, gbdt
from ccselect.models.crossnode import cross_node_split, per_node, seed_average, summary
from ccselect.models.grid import grid_search
from ccselect.models.invariance import node_probe
from ccselect.models.train import NODE_DOMAIN_VARIANTS, VARIANTS, TrainParams, fit

log = logging.getLogger(__name__)

CONFIGANATOR = "configanator"
#: the skeptic's baselines (issue 28): a network variant on features standardized per (node, hour)
#: as deployed (features/node_stats.py: silver.node_stats over the node's trailing
#: `model.node_stats.hours`, the fleet's statistics below `min_conns`; what `ccs train` and
#: `ccs infer` apply); and node domains on such features (aliccs_nodes_nodestd: its discriminator
#: reads the unlabelled rows standardized the same way)
NODESTD = ("mlp_nodestd", "aliccs_nodestd", "aliccs_nodes_nodestd")
#: gradient-boosted trees on the same features, and on features standardized per node (issue 55)
GBDT, GBDT_NODESTD = "gbdt", "gbdt_nodestd"
ALL_VARIANTS = (*VARIANTS, *NODESTD, CONFIGANATOR, GBDT, GBDT_NODESTD)
#: rows a node of the window lends to the node-domain discriminator and to the invariance probe
UNLABELLED_PER_NODE = 2000


def deployed_node_standardization(spark, cfg: Config, stats, ns: node_stats.NodeStandardization, tr, te, unl=None) -> dict:
    """The training, held-out and (with `unl`) unlabelled rows, fleet-standardized with `stats`,
    standardized per (node, hour) as `ccs train` and `ccs infer` do (node_stats.lookup, then
    from_fleet_z: the node's trailing `ns.hours` of silver.node_stats, the fleet's statistics
    below `ns.min_conns`), with node_stats.summary's report of the partitions per source."""
    parts = [(tr.node, tr.hour), (te.node, te.hour)] + ([(unl.node, unl.hour)] if unl is not None else [])
    keys = {(str(n), str(h)) for node, hour in parts for n, h in zip(node, hour)}
    table = node_stats.lookup(cfg, keys, stats, ns, spark)
    scored = {(str(n), str(h)) for node, hour in parts[:2] for n, h in zip(node, hour)}
    return {"train": node_stats.from_fleet_z(tr.x, tr.node, tr.hour, table, stats),
            "test": node_stats.from_fleet_z(te.x, te.node, te.hour, table, stats),
            "unlabelled": (node_stats.from_fleet_z(unl.x, unl.node, unl.hour, table, stats)
                           if unl is not None else None),
            # the report covers the labelled rows' partitions (those trained on or scored)
            "report": node_stats.summary({k: v for k, v in table.items() if k in scored})}


def _deployed(out: dict) -> str:
    ns = out["node_std"]
    return (f"per (node, hour) from {ns['table']}, trailing {ns['hours']} h, the fleet's statistics "
            f"below {ns['min_conns']} connections")


def _corr(a: pd.Series, b: pd.Series) -> float:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def run_evaluation(spark, cfg: Config, window: Window, variants: Iterable[str] | None = None,
                   share: float | None = None, seed: int | None = None, epochs: int | None = None,
                   k: int | None = None, grid: bool = False, params: TrainParams | None = None,
                   write: bool = True, progress: Callable[[str], None] | None = None,
                   train_seeds: int | None = None) -> dict:
    """Train every variant (and the Configanator and boosted-tree baselines) on the training nodes of the
    window, score each held-out node, write gold.model_eval(+_summary); returns
    {window, train_nodes, test_nodes, groups, variants: {v: {summary..., per_node: [...]}}}.

    With `train_seeds` N > 1 (model.evaluate.train_seeds) every network variant trains N times on
    the same split, with training seeds seed … seed + N − 1: the per-node table holds each node's
    accuracy averaged over them, the summary (mean, worst, std) is taken over those averages, and
    `seeds` lists each seed's own mean, worst and std (their spread: `mean_sd`, `worst_sd`,
    `std_sd`). One seed's worst node moves by a point or more with the last epoch's noise, as much
    as the variants differ. Configanator (a seeded K-means and tree, no stochastic training) and
    the boosted trees (seeded, no early stopping) run once."""

    say = progress or log.info
    s = cfg.settings.model.evaluate
    share = s.share if share is None else share
    seed = s.seed if seed is None else seed
    train_seeds = max(1, int(s.train_seeds if train_seeds is None else train_seeds))
    variants = tuple(variants or ALL_VARIANTS)
    unknown = set(variants) - set(ALL_VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {ALL_VARIANTS}")
    t0 = time.time()
    stats, stats_path, _ = window_stats(spark, cfg, window)
    # the unlabelled rows serve the networks' node domains and probe
    networks = [v for v in variants if v not in (CONFIGANATOR, GBDT, GBDT_NODESTD)]
    sp = cross_node_split(spark, cfg, window, stats, share, seed, k,
                          unlabelled_per_node=UNLABELLED_PER_NODE if networks else 0)
    tr, te, train_nodes, test_nodes = sp.train, sp.test, sp.train_nodes, sp.test_nodes
    data, groups_info, unl = sp.data, sp.groups_info, sp.unlabelled
    say(f"{window.name}: {len(tr):,} training rows on {len(train_nodes)} nodes, {len(te):,} held-out rows on "
        f"{len(test_nodes)} nodes; prefix groups K(4G, Wi-Fi) = {data.n_groups}")

    params = params or TrainParams(seed=seed, min_steps=cfg.settings.pipeline.min_steps,
                                   threads=cfg.settings.pipeline.train_threads)
    if epochs is not None:
        params = replace(params, epochs=epochs)
    out: dict = {"window": window.name, "seed": seed, "share": share, "train_nodes": train_nodes,
                 "test_nodes": test_nodes, "n_train": int(len(tr)), "n_test": int(len(te)),
                 "stats": stats_path, "groups": groups_info, "train_seeds": train_seeds, "variants": {}}
    if grid and any(v in VARIANTS for v in variants):
        g = grid_search(params, data, tr.node, seed=seed, log=say)
        params = replace(params, lambda1=g.lambda1, lambda2=g.lambda2)
        out["grid"] = {"lambda1": g.lambda1, "lambda2": g.lambda2}
    out["params"] = params.to_dict()
    # per-node standardization as deployed: every row of (node, hour) standardized with the
    # node's trailing statistics from silver.node_stats, or the fleet's (fleet_fallback) where
    # the node has fewer than min_conns there; training and held-out rows alike
    nsd, x_unl_nodestd, fallback_share = None, None, {}
    if unl is not None or any(v in (*NODESTD, GBDT_NODESTD) for v in variants):
        ns_cfg = cfg.settings.model.node_stats
        ns = node_stats.NodeStandardization(ns_cfg.hours, ns_cfg.min_conns)
        nsd = deployed_node_standardization(spark, cfg, stats, ns, tr, te, unl)
        x_unl_nodestd = nsd["unlabelled"]
        # per held-out node: the share of its scored rows standardized with the fleet's statistics
        back = {tuple(p.split("/", 1)) for p in nsd["report"]["fallback_partitions"]}
        on_fleet = np.array([(str(n), str(h)) in back for n, h in zip(te.node, te.hour)], dtype=bool)
        fallback_share = pd.Series(on_fleet).groupby(np.asarray(te.node).astype(str)).mean().to_dict()
        out["node_std"] = {"hours": ns.hours, "min_conns": ns.min_conns, "table": NODE_STATS,
                           **nsd["report"]}
        say(f"per-node standardization as deployed ({ns.hours} h trailing, min {ns.min_conns} connections): "
            f"{nsd['report']['node']} (node, hour) partitions on their node's statistics, "
            f"{nsd['report']['fleet_fallback']} on the fleet's (fleet_fallback)")
    if unl is not None:
        # the probe's reference: the node read from the features themselves (every node's rows)
        out["probe"] = {"features": node_probe(unl.x, unl.node, seed),
                        "features_nodestd": node_probe(x_unl_nodestd, unl.node, seed)}
        say(f"probe (node from the features): {out['probe']['features']['balanced_accuracy']:.3f}, per-node "
            f"standardized {out['probe']['features_nodestd']['balanced_accuracy']:.3f} "
            f"(chance {out['probe']['features']['chance']:.3f}, {out['probe']['features']['nodes']} nodes)")
    # §5.1: nodes with < min_class_share of 4G or Wi-Fi rows are not scored in the summary
    cell_share = pd.Series(te.y == 0).groupby(te.node).mean()
    mcs = s.min_class_share
    included = {str(n): bool(mcs <= c <= 1 - mcs) for n, c in cell_share.items()}
    out["excluded_nodes"] = sorted(n for n, ok in included.items() if not ok)

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    node_frames, summary_rows = [], []
    for v in variants:
        t1 = time.time()
        probe = None
        if v == CONFIGANATOR:
            cp = cfg.settings.model.configanator
            model, info = configanator.fit(cp, tr.x, tr.y, tr.node, tr.prefix24)
            frames = [per_node(te.y, configanator.predict_proba(model, te.x, te.node, te.prefix24), te.node)]
            vparams = {**cp.__dict__, **info}
        elif v in (GBDT, GBDT_NODESTD):
            x_tr, x_te = tr.x, te.x
            if v == GBDT_NODESTD:
                x_tr, x_te = nsd["train"], nsd["test"]
            model = gbdt.fit(x_tr, tr.y, seed)
            frames = [per_node(te.y, gbdt.predict_proba(model, x_te), te.node)]
            vparams = {"model": "HistGradientBoostingClassifier", "seed": seed,
                       **({"standardized": _deployed(out)} if v == GBDT_NODESTD else {})}
        else:
            base = v[:-len("_nodestd")] if v in NODESTD else v
            vdata, x_te, x_probe = data, te.x, (unl.x if unl is not None else None)
            if v in NODESTD:
                vdata = replace(data, x=nsd["train"],
                                x_unl=x_unl_nodestd if data.x_unl is not None else None)
                x_te = nsd["test"]
                x_probe = x_unl_nodestd
            frames = []
            for i in range(train_seeds):
                trainer = fit(replace(params, variant=base, seed=params.seed + i), vdata)
                frames.append(per_node(te.y, trainer.predict_proba(x_te), te.node))
                if i == 0 and x_probe is not None:  # G's output of the first seed's model
                    probe = node_probe(trainer.represent(x_probe), unl.node, seed)
            vparams = {**replace(params, variant=base).to_dict(), "train_seeds": train_seeds,
                       **({"standardized": _deployed(out)} if v in NODESTD else {})}
        per_seed = [summary(f[f["node_id"].map(included).astype(bool)]) for f in frames]
        pn = seed_average(frames)
        pn["included"] = pn["node_id"].map(included).astype(bool)
        if v in (*NODESTD, GBDT_NODESTD):
            pn["fleet_fallback_share"] = pn["node_id"].map(fallback_share).astype(float)
        summ = summary(pn[pn["included"]])
        summ["train_seeds"] = len(frames)
        for m in ("mean", "worst", "std"):
            summ[f"{m}_sd"] = float(np.std([x[m] for x in per_seed])) if len(frames) > 1 else math.nan
        if len(frames) > 1:
            summ["seeds"] = [{"seed": params.seed + i, **{m: x[m] for m in ("mean", "worst", "std")}}
                             for i, x in enumerate(per_seed)]
        inc = pn[pn["included"]]
        summ["acc_share_cell_corr"] = _corr(inc["accuracy"], inc["share_cell"])
        summ["probe"] = probe
        summ["probe_node"] = probe["balanced_accuracy"] if probe else math.nan
        summ["seconds"] = round(time.time() - t1, 1)
        out["variants"][v] = {**summ, "params": vparams, "per_node": pn.to_dict(orient="records")}
        sd = (f" (seed sd {summ['mean_sd']:.4f} / {summ['worst_sd']:.4f} / {summ['std_sd']:.4f} over "
              f"{summ['train_seeds']} seeds)" if summ["train_seeds"] > 1 else "")
        pr = f", probe {probe['balanced_accuracy']:.3f}" if probe else ""
        say(f"{v:14s} mean {summ['mean']:.4f} worst {summ['worst']:.4f} std {summ['std']:.4f}{sd} "
            f"over {summ['nodes']} nodes{pr} ({summ['seconds']:.0f}s)")
        node_frames.append(pn.assign(window=window.name, variant=v, seed=seed, share=float(share), evaluated_at=now))
        summary_rows.append({"window": window.name, "variant": v, "mean": summ["mean"], "worst": summ["worst"],
                             "std": summ["std"], "nodes": summ["nodes"],
                             "acc_share_cell_corr": summ["acc_share_cell_corr"],
                             "n_train": int(len(tr)), "n_test": int(len(te)),
                             "train_nodes": ",".join(train_nodes), "test_nodes": ",".join(test_nodes),
                             "seed": seed, "share": float(share), "params": json.dumps(vparams, default=str),
                             "seconds": summ["seconds"], "evaluated_at": now, "train_seeds": summ["train_seeds"],
                             "mean_sd": summ["mean_sd"], "worst_sd": summ["worst_sd"], "std_sd": summ["std_sd"],
                             "probe_node": summ["probe_node"],
                             "probe_chance": probe["chance"] if probe else math.nan})
    if write:
        out["tables"] = write_tables(spark, cfg, window.name, variants, pd.concat(node_frames, ignore_index=True),
                                     pd.DataFrame(summary_rows))
    out["seconds"] = round(time.time() - t0, 1)
    return out


EVAL_SCHEMA = ("window string, variant string, node_id string, n long, accuracy double, wifi_recall double, "
               "cell_recall double, share_cell double, included boolean, seed long, share double, "
               "evaluated_at string")
SUMMARY_SCHEMA = ("window string, variant string, mean double, worst double, std double, nodes long, "
                  "acc_share_cell_corr double, n_train long, n_test long, train_nodes string, "
                  "test_nodes string, seed long, share double, params string, seconds double, "
                  "evaluated_at string, train_seeds long, mean_sd double, worst_sd double, std_sd double, "
                  "probe_node double, probe_chance double")


def _frame(spark, pdf: pd.DataFrame, schema: str):
    cols = [c.strip().split(" ")[0] for c in schema.split(",")]
    def plain(v):
        v = v.item() if isinstance(v, np.generic) else v
        return None if isinstance(v, float) and math.isnan(v) else v
    rows = [tuple(plain(v) for v in r) for r in pdf[cols].itertuples(index=False, name=None)]
    return spark.createDataFrame(rows, schema)


def write_tables(spark, cfg: Config, window: str, variants, per_node_pd: pd.DataFrame, summary_pd: pd.DataFrame) -> dict:
    """Replace the (window, variant) partitions of gold.model_eval and gold.model_eval_summary."""
    keys = {(window, v) for v in variants}
    out = {}
    for table, pdf, schema in ((MODEL_EVAL, per_node_pd, EVAL_SCHEMA),
                               (MODEL_EVAL_SUMMARY, summary_pd, SUMMARY_SCHEMA)):
        path = table_path(cfg, table)
        # add_columns: summary tables written before train_seeds existed gain its columns (null there)
        delta_io.replace_partitions(_frame(spark, pdf, schema), path, keys, ("window", "variant"), add_columns=True)
        out[table] = path
    return out
