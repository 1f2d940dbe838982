"""bench/select_folds: how stable the selection protocol's pick is on 2 folds against leave-one-node-out (issue 55).

`model.select` (models/select.py) scores each candidate on leave-node-out folds of the TRAINING
nodes and picks by ALICCS Appendix D's rule. `make run`'s window (12 nodes × 9 h, training window
00..05) has few training nodes; on `model.select.folds` = 2 a fold assignment can split them by
their 4G share. Here, on that window's training nodes only (the same split as `ccs_train`'s:
models.crossnode.cross_node_split with model.evaluate's share and seed; the held-out nodes are
never read, not even their unlabelled rows), the selection runs:

- on 2 folds under `--fold-seeds` fold assignments (seed 0 is `ccs_train`'s own),
- on leave-one-node-out (as many folds as training nodes: one assignment),

each candidate trained with `ccs_train`'s parameters (TrainParams: training seed model.evaluate.seed,
pipeline.min_steps, pipeline.train_threads = 1 torch thread). Per run: the pick, each candidate's
mean / worst / std over the training nodes, its per-fold mean (the spread of its fold scores) and a
95% interval of its mean over resampled training nodes, the selection's wall time and the load
average around it. Across the 2-fold assignments: whether the pick changes and each candidate's
range of means.

The lake is `make run`'s (its data root: `--data-root`, or CCS_DATA_ROOT); Spark reads the
window once, then stops before any training.

    .venv/bin/python bench/select_folds.py --config infra/conf/local.yaml --data-root var [--fold-seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import result_file  # noqa: E402
from ccselect.hours import Window
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, torch, and our modules that load them.


def load() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())


def training_rows(cfg, say) -> dict:
    """`ccs_train`'s training rows of `make run`'s window, exactly as models/train_job.run builds
    them for the selection (the held-out nodes' rows are dropped here, before anything is fitted)."""
    from ccselect.spark import get_spark
    from ccselect.features import node_stats
    from ccselect.features.scaling import window_stats
    from ccselect.models.crossnode import cross_node_split
    from ccselect.models.select import base_variant
    from ccselect.models.train import NODE_DOMAIN_VARIANTS
    from ccselect.models.train_job import UNLABELLED_PER_NODE, node_standardized
    manifest = json.load(open(os.path.join(cfg.settings.simulate.out, "manifest.json")))
    start = datetime.fromisoformat(manifest["params"]["start"]).replace(tzinfo=timezone.utc)
    window_hours = int(manifest["params"]["hours"]) - 2 - 1      # make run: 2 hourly hours, 1 streamed
    lo, hi = start.strftime("%Y-%m-%dT%H"), (start + timedelta(hours=window_hours - 1)).strftime("%Y-%m-%dT%H")
    sel, ev = cfg.settings.model.select, cfg.settings.model.evaluate
    spark = get_spark(cfg, "bench-select-folds")
    try:
        stats, _, _ = window_stats(spark, cfg, Window.hours(lo, hi))
        domains = set(sel.candidates) & set(NODE_DOMAIN_VARIANTS)
        sp = cross_node_split(spark, cfg, Window.hours(lo, hi), stats, float(ev.share), int(ev.seed), None,
                              unlabelled_per_node=UNLABELLED_PER_NODE if domains else 0)
        nsd = None
        if any(base_variant(v)[1] for v in sel.candidates):
            ns = cfg.settings.model.node_stats
            nsd = node_standardized(spark, cfg, stats, node_stats.NodeStandardization(ns.hours, ns.min_conns),
                                    sp.train, sp.test)["train"]
    finally:
        spark.stop()
    say(f"window {lo}..{hi}: {len(sp.train):,} training rows on {len(sp.train_nodes)} nodes "
        f"({', '.join(sp.train_nodes)}); held out (not read further): {len(sp.test_nodes)} nodes")
    return {"window": f"{lo}..{hi}", "data": sp.data, "node": np.asarray(sp.train.node).astype(str),
            "unl_node": sp.unlabelled.node if sp.unlabelled is not None else None, "x_nodestd": nsd,
            "train_nodes": list(sp.train_nodes), "n_test_nodes": len(sp.test_nodes)}


def node_interval(per_node: dict[str, float], n: int = 2000, seed: int = 0) -> list[float]:
    nodes = sorted(per_node)
    v = np.array([per_node[x] for x in nodes])
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n, len(v)))].mean(axis=1)
    return [round(float(x), 4) for x in np.percentile(means, [2.5, 97.5])]


def one(rows: dict, params, cfg, n_folds: int, fold_seed: int, say) -> dict:
    from ccselect.models.select import select_variant
    sel = cfg.settings.model.select
    before = load()
    t0 = time.time()
    s = select_variant(params, rows["data"], rows["node"], sel.candidates, unl_node=rows["unl_node"],
                       n_folds=n_folds, tolerance=sel.tolerance, seed=fold_seed, log=say, x_nodestd=rows["x_nodestd"])
    seconds = time.time() - t0
    table = []
    for r in s.table:
        pn = r["per_node"]
        table.append({"variant": r["variant"], "mean": round(r["mean"], 4), "worst": round(r["worst"], 4),
                      "std": round(r["std"], 4), "mean_node_95": node_interval(pn),
                      "fold_means": [round(float(np.mean([pn[x] for x in f])), 4) for f in s.folds],
                      "per_node": {k: round(v, 4) for k, v in sorted(pn.items())}})
    return {"folds": s.folds, "n_folds": len(s.folds), "fold_seed": fold_seed, "pick": s.variant,
            "seconds": round(seconds, 1), "load_avg_before": before, "load_avg_after": load(), "table": table}


def page_markdown(r: dict) -> str:
    runs = r["runs"]
    names = [t["variant"] for t in runs[0]["table"]]
    head = "| candidate | " + " | ".join(f"{x['label']}" for x in runs) + " |"
    lines = [f"`make run`'s window {r['window']} ({r['config']}), its {len(r['train_nodes'])} training nodes only "
             f"({', '.join(r['train_nodes'])}; the {r['n_test_nodes']} held-out nodes are not read). Training seed "
             f"{r['train_seed']}, {r['torch_threads']} torch thread. Each cell: mean per-node accuracy over the "
             "training nodes [95% interval over resampled training nodes]; per-fold means in parentheses.", "",
             head, "|---|" + "---|" * len(runs)]
    for i, n in enumerate(names):
        cells = []
        for x in runs:
            t = x["table"][i]
            cells.append(f"{t['mean']:.3f} [{t['mean_node_95'][0]:.3f}, {t['mean_node_95'][1]:.3f}] "
                         f"({', '.join(f'{v:.3f}' for v in t['fold_means'])})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["| **pick** | " + " | ".join(f"**{x['pick']}**" for x in runs) + " |",
              "| selection time (s) | " + " | ".join(f"{x['seconds']:.0f}" for x in runs) + " |",
              "| load average before | " + " | ".join(f"{x['load_avg_before'][0]:.1f}" for x in runs) + " |", ""]
    st = r["stability"]
    lines += [f"Picks on 2 folds over {len(st['two_fold_picks'])} fold seeds ({st['two_fold_distinct_partitions']} distinct "
              f"partitions of the training nodes): {', '.join(st['two_fold_picks'])} "
              f"({'the same' if st['two_fold_pick_stable'] else 'not the same'}); leave-one-node-out: "
              f"{st['loo_pick']}. Range of each candidate's mean over the 2-fold assignments (points): "
              + ", ".join(f"{k} {v:.1f}" for k, v in st["two_fold_mean_range_points"].items()) + ". "
              f"Leave-one-node-out's selection took {st['loo_over_two_fold_time']:.1f}× the 2-fold one's "
              f"(median of the 2-fold runs; one torch thread, beside other work: see the load averages).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "infra" / "conf" / "local.yaml"))
    ap.add_argument("--data-root", default=None, help="make run's data root (default: CCS_DATA_ROOT or the config's)")
    ap.add_argument("--fold-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "select_folds.json"))
    ap.add_argument("--rows", default=None, help="a pickle of the training rows: read if it exists, else written "
                                                 "(so that Spark's read and the trainings can run apart)")
    ap.add_argument("--extract-only", action="store_true", help="read the training rows (--rows) and stop")
    a = ap.parse_args(argv)
    if a.data_root:
        os.environ["CCS_DATA_ROOT"] = a.data_root
    from ccselect.config import load_config
    from ccselect.models.train import TrainParams
    cfg = load_config(a.config)

    def say(m):
        print(f"[{datetime.now(timezone.utc).strftime('%H:%M:%S')}] {m}", flush=True)
    t0 = time.time()
    if a.rows and os.path.exists(a.rows):
        with open(a.rows, "rb") as f:
            rows = pickle.load(f)
        say(f"training rows of {rows['window']} from {a.rows}: {len(rows['node']):,} rows on {len(rows['train_nodes'])} nodes")
    else:
        rows = training_rows(cfg, say)
        if a.rows:
            with open(a.rows, "wb") as f:
                pickle.dump(rows, f)
    if a.extract_only:
        return 0
    pl = cfg.settings.pipeline
    params = TrainParams(min_steps=pl.min_steps, threads=pl.train_threads, seed=int(cfg.settings.model.evaluate.seed))
    n_nodes = len(rows["train_nodes"])
    runs = []
    # interleaved: a 2-fold assignment, then leave-one-node-out, then the other assignments
    plan = [(2, a.fold_seeds[0]), (n_nodes, a.fold_seeds[0])] + [(2, s) for s in a.fold_seeds[1:]]
    for k, s in plan:
        label = f"{k} folds (fold seed {s})" if k == 2 else f"leave-one-node-out ({k} folds)"
        say(f"--- {label}")
        runs.append({"label": label, **one(rows, params, cfg, k, s, say)})
    two = [x for x in runs if x["n_folds"] == 2 and n_nodes > 2]
    loo = next(x for x in runs if x["n_folds"] == n_nodes)
    names = [t["variant"] for t in runs[0]["table"]]
    res = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_avg": list(load()),
           "machine": f"{os.cpu_count()} cores", "config": a.config, "window": rows["window"],
           "train_nodes": rows["train_nodes"], "n_test_nodes": rows["n_test_nodes"],
           "train_seed": params.seed, "torch_threads": params.threads, "candidates": names,
           "tolerance": cfg.settings.model.select.tolerance, "runs": runs,
           "stability": {"two_fold_picks": [x["pick"] for x in two], "loo_pick": loo["pick"],
                         "two_fold_pick_stable": len({x["pick"] for x in two}) <= 1,
                         "two_fold_distinct_partitions": len({frozenset(frozenset(f) for f in x["folds"]) for x in two}),
                         "two_fold_mean_range_points": {
                             n: round(100 * (max(x["table"][i]["mean"] for x in two) - min(x["table"][i]["mean"] for x in two)), 2)
                             for i, n in enumerate(names)} if two else {},
                         "loo_over_two_fold_time": round(loo["seconds"] / float(np.median([x["seconds"] for x in two])), 2)
                         if two else None},
           "seconds": round(time.time() - t0, 1)}
    res["page_markdown"] = page_markdown(res)
    result_file.write(a.out, res, show=res["page_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
