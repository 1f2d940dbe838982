"""`ccs train`: train one variant of the network-type classifier on a window, evaluate it per
held-out node, log and register it in MLflow, and run the validation gate (issue 4 item 5).

Same data and evaluation as `ccs evaluate` (models/crossnode.py, ALICCS §5.1): the window's
labelled rows standardized with the window's feature statistics, nodes split into training
(`share`, 30% by default) and held-out, prefix groups (the discriminators' targets) clustered on
the training nodes only, per-node accuracy on the held-out nodes with the §5.1 exclusion of
nodes where either type has less than `model.evaluate.min_class_share` of the rows.
The groups are computed for this run (not written): gold.prefix_groups is keyed by window, and
groups of a node subset under that key would pass for the whole window's.

With the model go (models/ood.py, registered in the same MLflow model): the out-of-domain guard,
fitted on every training row (standardized), and the temperature (`infer.calibration_on`):
- `heldout_nodes` (default): fitted on half of the held-out nodes (`heldout_calibration`), so
  that confidence means on a node the model never saw what it says; the other half reports the
  calibration error left and how often the §4.2 thresholds' trusted rows are right. Temperature
  keeps every argmax, so the per-node accuracy of the held-out nodes is untouched.
- `training_paths`: fitted on `infer.calibration_share` of the training rows' (node, /24) paths,
  held out of the fit (`calibration_split`).

A `*_nodestd` variant (`mlp_nodestd`, `aliccs_nodestd`, trained or chosen by the selection) sees
every row standardized per (node, hour) over the node's own trailing traffic
(features/node_stats.py, `model.node_stats`: the statistics `ccs infer` and `ccs stream` apply),
a node with too little traffic falling back to the window's fleet statistics; the guard and the
temperature are fitted on those same rows, and the model records the settings (`node_std`).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from ccselect.config import Config
from ccselect.features import node_stats
from ccselect.features.scaling import window_stats
from ccselect.hours import Window
from ccselect.models import registry
from ccselect.models.crossnode import cross_node_split, per_node, summary
from ccselect.models.ood import fit_calibration, fit_guard, report
from ccselect.models.select import base_variant, select_variant
from ccselect.models.train import NODE_DOMAIN_VARIANTS, TrainData, TrainParams, effective_epochs, fit
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow.

log = logging.getLogger(__name__)


#: rows a node of the window lends to a node-domain variant's discriminator (as `ccs evaluate`)
UNLABELLED_PER_NODE = 2000


def calibration_split(data: TrainData, share: float, seed: int) -> tuple[TrainData, np.ndarray]:
    """(the rows to train on, the mask of the rows held out for calibration): `share` of the
    (node, /24) paths (`data.prefix`), drawn with `seed` — whole paths, so the temperature is
    fitted on prefixes the model has not seen. share 0, or fewer than two paths: nothing held out."""
    paths = np.unique(data.prefix)
    k = int(round(share * len(paths)))
    if k <= 0 or len(paths) < 2:
        return data, np.zeros(len(data.y), dtype=bool)
    held = np.random.default_rng(seed + 7919).choice(paths, size=min(k, len(paths) - 1), replace=False)
    mask = np.isin(data.prefix, held)
    keep = ~mask
    return replace(data, x=data.x[keep], y=data.y[keep], prefix=data.prefix[keep], group=data.group[keep]), mask


def heldout_calibration(p_wifi: np.ndarray, y: np.ndarray, node: np.ndarray, seed: int, ip):
    """The temperature fitted on half of the held-out nodes (drawn with `seed`; all of them when
    there is only one), with a `report` of its effect on the other half. None without nodes."""
    nodes = np.array(sorted({str(n) for n in node}), dtype=object)
    if not len(nodes):
        return None
    order = np.random.default_rng(seed + 7919).permutation(nodes)
    fit_nodes = order[:max(1, len(nodes) // 2)]
    fit_rows, other = np.isin(node, fit_nodes), ~np.isin(node, fit_nodes)
    c = fit_calibration(p_wifi[fit_rows], y[fit_rows],
                        rows=f"{int(fit_rows.sum())} rows of {len(fit_nodes)} held-out nodes ({', '.join(fit_nodes)})")
    if not other.any():
        return c
    rest = [n for n in nodes if n not in set(fit_nodes)]
    return replace(c, report=report(p_wifi[other], y[other], c.temperature,
                                     f"{int(other.sum())} rows of the other {len(rest)} held-out nodes",
                                     ip.wifi_threshold, ip.cell_threshold))


def node_standardized(spark, cfg: Config, stats, ns: "node_stats.NodeStandardization", tr, te) -> dict:
    """The training and held-out rows (`Labelled`, fleet-standardized with `stats`) standardized
    per (node, hour) from silver.node_stats, as `ccs infer` will; with the job's report of which
    partitions fell back to the fleet's statistics."""
    keys = set(zip(map(str, tr.node), map(str, tr.hour))) | set(zip(map(str, te.node), map(str, te.hour)))
    table = node_stats.lookup(cfg, keys, stats, ns, spark)
    return {"train": node_stats.from_fleet_z(tr.x, tr.node, tr.hour, table, stats),
            "test": node_stats.from_fleet_z(te.x, te.node, te.hour, table, stats),
            "report": node_stats.summary(table)}


def run(spark, cfg: Config, window: Window, variant: str = "aliccs", share: float | None = None,
        seed: int | None = None, epochs: int | None = None, k: int | None = None, gate: bool = True,
        params=None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train, evaluate, log, register and gate; returns what happened (version, gate verdict).
    `variant="select"`: the variant is chosen first, on leave-node-out folds of the training nodes
    among `model.select.candidates` (models/select.py); the held-out nodes are scored once, after."""

    say = progress or log.info
    selecting = variant == "select"
    sel = cfg.settings.model.select
    if not selecting:
        base_variant(variant)   # raises naming the variants it can be
    s = cfg.settings.model.evaluate
    share = float(s.share if share is None else share)
    seed = int(s.seed if seed is None else seed)
    t0 = time.time()

    stats, stats_path, fitted = window_stats(spark, cfg, window, save_fitted=True)
    # a node-domain variant learns from every node's unlabelled rows too (models/train.py)
    node_domains = set(sel.candidates if selecting else (variant,)) & set(NODE_DOMAIN_VARIANTS)
    sp = cross_node_split(spark, cfg, window, stats, share, seed, k,
                          unlabelled_per_node=UNLABELLED_PER_NODE if node_domains else 0)
    tr, te, train_nodes, test_nodes = sp.train, sp.test, sp.train_nodes, sp.test_nodes
    data, groups_pd, groups_info = sp.data, sp.groups, sp.groups_info
    params = params or TrainParams(min_steps=cfg.settings.pipeline.min_steps, threads=cfg.settings.pipeline.train_threads)
    params = replace(params, seed=seed, **({"epochs": int(epochs)} if epochs is not None else {}))
    # per-node standardized copies of the rows, from silver.node_stats, when a candidate needs them
    ns = cfg.settings.model.node_stats
    node_std = node_stats.NodeStandardization(ns.hours, ns.min_conns)
    wanted = sel.candidates if selecting else (variant,)
    nodestd = None
    if any(base_variant(v)[1] for v in wanted):
        nodestd = node_standardized(spark, cfg, stats, node_std, tr, te)
        say(f"per-node standardization over {ns.hours} h (min {ns.min_conns} connections): "
            f"{nodestd['report']['node']} (node, hour) partitions on their node's statistics, "
            f"{nodestd['report']['fleet_fallback']} on the fleet's (fleet_fallback)")
    selection = None
    if selecting:
        selection = select_variant(params, data, tr.node, sel.candidates,
                                   unl_node=sp.unlabelled.node if sp.unlabelled is not None else None,
                                   n_folds=sel.folds, tolerance=sel.tolerance, seed=seed, log=say,
                                   x_nodestd=nodestd["train"] if nodestd else None)
        variant = selection.variant
        say(f"selected {variant}: {selection.rule}")
    base, per_node_std = base_variant(variant)
    if per_node_std:
        # from here on the model's rows are the per-node standardized ones: training, guard, calibration
        tr, te = replace(tr, x=nodestd["train"]), replace(te, x=nodestd["test"])
        data = replace(data, x=nodestd["train"])
    params = replace(params, variant=base)
    say(f"{window.name}: {len(tr):,} training rows on {len(train_nodes)} nodes, {len(te):,} held-out rows on "
        f"{len(test_nodes)} nodes; prefix groups K(4G, Wi-Fi) = {data.n_groups}; {variant}, "
        f"{effective_epochs(params, len(data.y))} epochs (at least {params.min_steps} steps)")

    # §5.1: nodes with too few rows of either type stay in the table but out of the summary
    mcs = s.min_class_share
    cell_share = pd.Series(te.y == 0).groupby(te.node).mean()
    included = {str(n): bool(mcs <= c <= 1 - mcs) for n, c in cell_share.items()}

    ip = cfg.settings.infer
    on_paths = ip.calibrate and ip.calibration_on == "training_paths"
    fit_data, calib_mask = calibration_split(data, ip.calibration_share if on_paths else 0.0, seed)
    with registry.training_run(cfg, run_name=f"{variant} {window.name}"):
        t1 = time.time()
        trainer = fit(params, fit_data, on_epoch=registry.epoch_logger())
        train_s = time.time() - t1
        guard = fit_guard(tr.x, stats.features, ip.ood_quantile, ip.ood_method, ip.ood_margin)
        p_te = trainer.predict_proba(te.x)
        if on_paths:
            calibration = (fit_calibration(trainer.predict_proba(data.x[calib_mask]), data.y[calib_mask],
                                           rows=f"{int(calib_mask.sum())} training rows on {ip.calibration_share:.0%} "
                                                "of the training nodes' (node, /24) paths, not trained on",
                                           min_temperature=ip.calibration_min_temperature)
                           if calib_mask.any() else None)
        else:
            calibration = heldout_calibration(p_te, te.y, te.node, seed, ip) if ip.calibrate else None
        pn = per_node(te.y, p_te, te.node)
        pn["included"] = pn["node_id"].map(included).fillna(False).astype(bool)
        summ = summary(pn[pn["included"]])
        train_acc = float(((trainer.predict_proba(tr.x) >= 0.5) == tr.y.astype(bool)).mean())
        run_id, version = registry.log_training(
            cfg, trainer.p, trainer, stats, pn, summ, window=window.name, train_nodes=train_nodes,
            test_nodes=test_nodes, input_example=te.x[:5] if len(te) else None,
            guard=guard, calibration=calibration, node_std=node_std if per_node_std else None,
            extra_params={"share": share, "n_train": len(tr), "n_test": len(te), "n_calibration": calibration.n if calibration else 0,
                          "calibration_on": ip.calibration_on,
                          "ood_method": guard.method, "ood_margin": guard.margin,
                          "k_4g": data.n_groups[0], "k_wifi": data.n_groups[1],
                          "groups_chosen_by": ",".join(sorted({str(i.get("chosen_by")) for i in
                                                                groups_info["types"].values()}))},
            extra_metrics={"train_accuracy": train_acc, "train_seconds": train_s,
                           "heldout_excluded_nodes": int(sum(not v for v in included.values()))})
        import mlflow
        if selection is not None:
            mlflow.log_dict(selection.to_dict(), "selection/table.json")
            mlflow.set_tag("selected_by", selection.rule)
        mlflow.log_dict(groups_info, "prefix_groups/summary.json")
        mlflow.log_text(groups_pd.to_csv(index=False), "prefix_groups/groups.csv")
    say(f"{registry.model_name(cfg)} v{version} (run {run_id}): held-out mean {summ['mean']:.4f} "
        f"worst {summ['worst']:.4f} std {summ['std']:.4f} over {summ['nodes']} nodes")
    out: dict[str, Any] = {
        "window": window.name, "variant": variant, "run_id": run_id, "model_name": registry.model_name(cfg),
        "version": version, "summary": summ, "train_accuracy": train_acc,
        "train_nodes": train_nodes, "test_nodes": test_nodes, "n_train": int(len(tr)), "n_test": int(len(te)),
        "excluded_nodes": sorted(n for n, ok in included.items() if not ok),
        "feature_stats": {"path": stats_path, "fitted_now": fitted}, "groups": groups_info,
        "params": trainer.p.to_dict(), "per_node": pn.replace({np.nan: None}).to_dict(orient="records"),
        "train_seconds": round(train_s, 1), "ood_threshold": guard.threshold,
        "temperature": calibration.temperature if calibration else 1.0,
        "calibration": json.loads(calibration.to_json()) if calibration else None,
        "selection": selection.to_dict() if selection is not None else None,
        "node_std": ({"hours": node_std.hours, "min_conns": node_std.min_conns, **nodestd["report"]}
                     if per_node_std else None)}
    if gate:
        out["gate"] = registry.gate(cfg, version, summ)
        say(f"gate: {'passed → @challenger' if out['gate']['passed'] else 'failed: ' + '; '.join(out['gate']['reasons'])}")
    out["seconds"] = round(time.time() - t0, 1)
    return out
