"""bench/champion_bf16: bf16 judged on the champion over held-out nodes (issue 55).

The check bench/infer.py keeps (a 4-epoch MLP scored on its own training rows) says nothing of
the model that ships. Here the model is the champion as the protocol makes it: the variant
`model.select` picks on leave-node-out folds of the training nodes (models/select.py, the
configuration's candidates, the `*_nodestd` ones standardized per (node, hour) from
silver.node_stats as deployed), trained on every training node, and scored on the HELD-OUT nodes
in fp32 and in bf16 (`models.infer.predict_wifi`, the weights and activations cast as `ccs infer
--precision bf16` does). Per held-out node: accuracy in each precision; over the nodes: mean and
worst of each and their change, with node-bootstrap intervals of the change; and the share of
rows whose predicted type, and whose CC decision (§4.2's thresholds, InferSettings), differ.

The fleet: `ccs simulate`'s default knobs, `--nodes` × `--hours` (8 × 6 by default, the issue's
kept-aside size), ingested into a lake of its own (reused when the workdir holds the same fleet).
Writes bench/results/champion_bf16.json and prints it.

    .venv/bin/python bench/champion_bf16.py [--nodes 8] [--hours 6] [--conns-per-node-hour 600] [--share 0.25]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import bench_config, simulated_lake  # noqa: E402
from ccselect.hours import Window
from ccselect.sim.params import SimParams  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, torch, and our modules that load them.


def lake(root: Path, params: SimParams, say) -> tuple:
    """(cfg, lo, hi, the fleet's info) of a lake holding the fleet `params` simulates
    (bench.ingest.simulated_lake)."""
    return simulated_lake(root, params, say, app="bench-heldout")


def select_champion(spark, cfg, lo: str, hi: str, share: float, seed: int, k: int | None, say,
                    fit_pick: bool = True) -> dict:
    """The protocol's champion of window lo..hi: the split of `ccs evaluate` (`share` of the
    nodes to train on), the variant `model.select` picks on leave-node-out folds of the training
    nodes, trained on all of them; with the held-out rows it is scored on (per-node standardized
    as deployed when the pick is a `*_nodestd` variant). Held-out nodes are not read before the
    pick. `fit_pick` False: the pick is named, not trained (bench/shift_sweep.py trains it through
    `ccs evaluate` over several training seeds)."""
    from ccselect.evaluation.evaluate import UNLABELLED_PER_NODE, deployed_node_standardization
    from ccselect.features import node_stats
    from ccselect.features.scaling import window_stats
    from ccselect.models.crossnode import cross_node_split
    from ccselect.models.select import base_variant, select_variant
    from ccselect.models.train import NODE_DOMAIN_VARIANTS, TrainParams, fit
    sel = cfg.settings.model.select
    stats, _, _ = window_stats(spark, cfg, Window.hours(lo, hi))
    domains = set(sel.candidates) & set(NODE_DOMAIN_VARIANTS)
    sp = cross_node_split(spark, cfg, Window.hours(lo, hi), stats, share, seed, k,
                          unlabelled_per_node=UNLABELLED_PER_NODE if domains else 0)
    ns = cfg.settings.model.node_stats
    nsd = deployed_node_standardization(spark, cfg, stats, node_stats.NodeStandardization(ns.hours, ns.min_conns),
                                        sp.train, sp.test)
    params = TrainParams(seed=seed, min_steps=cfg.settings.pipeline.min_steps)
    t0 = time.time()
    selection = select_variant(params, sp.data, sp.train.node, sel.candidates,
                               unl_node=sp.unlabelled.node if sp.unlabelled is not None else None,
                               n_folds=sel.folds, tolerance=sel.tolerance, seed=seed, log=say,
                               x_nodestd=nsd["train"])
    select_s = time.time() - t0
    base, per_node_std = base_variant(selection.variant)
    picked = {"variant": selection.variant, "selection": selection, "test": sp.test,
              "train_nodes": sp.train_nodes, "test_nodes": sp.test_nodes, "select_s": round(select_s, 1)}
    if not fit_pick:
        return picked
    data, x_te = sp.data, sp.test.x
    if per_node_std:
        data, x_te = replace(data, x=nsd["train"]), nsd["test"]
    t0 = time.time()
    trainer = fit(replace(params, variant=base), data)
    return {**picked, "trainer": trainer, "x_test": x_te,
            "node_std": {"hours": ns.hours, "min_conns": ns.min_conns, **nsd["report"]} if per_node_std else None,
            "train_s": round(time.time() - t0, 1)}


def node_bootstrap(per_node: dict[str, dict[str, float]], stat, n: int = 2000, seed: int = 0) -> list[float]:
    """95% interval of `stat`({node: figures}) over `n` resamples of the nodes with replacement."""
    nodes = sorted(per_node)
    rng = np.random.default_rng(seed)
    draws = [stat([per_node[nodes[i]] for i in rng.integers(0, len(nodes), len(nodes))]) for _ in range(n)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return [round(float(lo), 6), round(float(hi), 6)]


def bf16_on_heldout(champ: dict, infer_settings, min_class_share: float) -> dict:
    """fp32 against bf16 of the champion's model on its held-out nodes."""
    import torch

    from ccselect.models.infer import predict_wifi
    te, x = champ["test"], np.ascontiguousarray(champ["x_test"], dtype=np.float32)
    model = champ["trainer"].model.cpu().float().eval()
    p = {"fp32": predict_wifi(model, x, "fp32"),
         "bf16": predict_wifi(copy.deepcopy(model).to(torch.bfloat16).eval(), x, "bf16")}
    y = np.asarray(te.y).astype(bool)
    node = np.asarray(te.node).astype(str)
    ip = infer_settings

    def cc(pw):
        wifi = pw >= 0.5
        trusted = np.where(wifi, pw >= ip.wifi_threshold, 1 - pw >= ip.cell_threshold)
        return np.where(trusted, np.where(wifi, ip.wifi_cc, ip.cell_cc), ip.default_cc)
    pred = {k: v >= 0.5 for k, v in p.items()}
    ccs = {k: cc(v) for k, v in p.items()}
    per_node = {}
    for n in sorted(set(node.tolist())):
        m = node == n
        share_cell = float((~y[m]).mean())
        per_node[n] = {"n": int(m.sum()), "share_cell": round(share_cell, 4),
                       "included": bool(min_class_share <= share_cell <= 1 - min_class_share),
                       "fp32": float((pred["fp32"][m] == y[m]).mean()), "bf16": float((pred["bf16"][m] == y[m]).mean()),
                       "type_differs": float((pred["fp32"][m] != pred["bf16"][m]).mean()),
                       "cc_differs": float((ccs["fp32"][m] != ccs["bf16"][m]).mean())}
    inc = {n: r for n, r in per_node.items() if r["included"]}

    def mean(prec):
        return lambda rs: float(np.mean([r[prec] for r in rs]))

    def worst(prec):
        return lambda rs: float(np.min([r[prec] for r in rs]))
    out = {"rows": int(len(y)), "nodes": len(inc), "per_node": per_node,
           "max_abs_p_wifi_diff": float(np.abs(p["fp32"] - p["bf16"]).max()) if len(y) else 0.0,
           "type_differs_share": float((pred["fp32"] != pred["bf16"]).mean()),
           "cc_decision_differs_share": float((ccs["fp32"] != ccs["bf16"]).mean())}
    for prec in ("fp32", "bf16"):
        out[prec] = {"mean": mean(prec)(inc.values()), "worst": worst(prec)(inc.values()),
                     "mean_ci95": node_bootstrap(inc, mean(prec)), "worst_ci95": node_bootstrap(inc, worst(prec))}
    out["change_points"] = {
        "mean": round(100 * (out["bf16"]["mean"] - out["fp32"]["mean"]), 4),
        "worst": round(100 * (out["bf16"]["worst"] - out["fp32"]["worst"]), 4),
        "mean_ci95": [round(100 * v, 4) for v in node_bootstrap(inc, lambda rs: mean("bf16")(rs) - mean("fp32")(rs))],
        "worst_ci95": [round(100 * v, 4) for v in node_bootstrap(inc, lambda rs: worst("bf16")(rs) - worst("fp32")(rs))]}
    return out


def page(out: dict) -> str:
    """The page's summary: the champion, then fp32 against bf16 per held-out node and overall."""
    h, c = out["heldout"], out["champion"]
    pct = lambda v: f"{100 * v:.2f}"  # noqa: E731
    ci = lambda v: f"[{pct(v[0])}, {pct(v[1])}]"  # noqa: E731
    lines = [f"Champion: **{c['variant']}**, chosen by {c['rule']}; trained on {', '.join(c['train_nodes'])}, "
             f"scored on the held-out {', '.join(c['test_nodes'])} ({h['rows']:,} labelled rows, "
             f"{h['nodes']} nodes in the summary). Fleet: {out['fleet']['nodes']} nodes × {out['fleet']['hours']} h, "
             f"{out['fleet']['conns_per_node_hour']} connections a node-hour, simulator seed {out['fleet']['seed']}.", "",
             "| held-out node | rows | 4G share | fp32 accuracy | bf16 accuracy | type differs | CC decision differs |",
             "|---|---|---|---|---|---|---|"]
    for n, r in h["per_node"].items():
        lines.append(f"| {n}{'' if r['included'] else ' (out of the summary: §5.1)'} | {r['n']:,} | {r['share_cell']:.3f} | "
                     f"{pct(r['fp32'])} | {pct(r['bf16'])} | {100 * r['type_differs']:.3f}% | {100 * r['cc_differs']:.3f}% |")
    ch = h["change_points"]
    lines += ["", "| | fp32 | bf16 | bf16 − fp32 (points) |", "|---|---|---|---|",
              f"| mean node accuracy (95% node bootstrap) | {pct(h['fp32']['mean'])} {ci(h['fp32']['mean_ci95'])} | "
              f"{pct(h['bf16']['mean'])} {ci(h['bf16']['mean_ci95'])} | {ch['mean']:+.3f} [{ch['mean_ci95'][0]:+.3f}, {ch['mean_ci95'][1]:+.3f}] |",
              f"| worst node accuracy | {pct(h['fp32']['worst'])} {ci(h['fp32']['worst_ci95'])} | "
              f"{pct(h['bf16']['worst'])} {ci(h['bf16']['worst_ci95'])} | {ch['worst']:+.3f} [{ch['worst_ci95'][0]:+.3f}, {ch['worst_ci95'][1]:+.3f}] |",
              "", f"Rows whose predicted type differs: {100 * h['type_differs_share']:.3f}%; whose CC decision "
              f"(§4.2 thresholds) differs: {100 * h['cc_decision_differs_share']:.3f}%; largest |ΔP(Wi-Fi)| "
              f"{h['max_abs_p_wifi_diff']:.4f}. Goal ({out['goal']}): {'met' if out['goal_met'] else 'not met'}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=int, default=6)
    ap.add_argument("--conns-per-node-hour", type=int, default=600)
    ap.add_argument("--sim-seed", type=int, default=7)
    ap.add_argument("--share", type=float, default=0.25, help="share of the fleet's nodes to train on (8 × 0.25: 2)")
    ap.add_argument("--seed", type=int, default=0, help="the split's and training's seed")
    ap.add_argument("--k", type=int, default=None, help="prefix groups per type (default: as configured)")
    ap.add_argument("--workdir", default="/tmp/ccs-bench-champion-bf16")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "champion_bf16.json"))
    a = ap.parse_args(argv)
    import torch

    from ccselect.spark import get_spark
    torch.set_num_threads(2)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t_all = time.time()
    root = Path(a.workdir)
    cfg0 = bench_config(root)
    params = replace(SimParams.from_settings(cfg0.settings.simulate), nodes=a.nodes, hours=a.hours,
                     conns_per_node_hour=a.conns_per_node_hour, seed=a.sim_seed, start="2026-11-01T00:00:00")
    cfg, lo, hi, info = lake(root, params, say)
    spark = get_spark(cfg, "bench-champion-bf16")
    champ = select_champion(spark, cfg, lo, hi, a.share, a.seed, a.k, say)
    say(f"champion {champ['variant']} (select {champ['select_s']} s, train {champ['train_s']} s); "
        f"held out: {', '.join(champ['test_nodes'])}")
    res = bf16_on_heldout(champ, cfg.settings.infer, cfg.settings.model.evaluate.min_class_share)
    out = {"bench": "champion_bf16", "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{os.uname().nodename}, {os.cpu_count()} cores", "load_average_start": list(os.getloadavg()),
           "command": "python bench/champion_bf16.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "fleet": info, "window": f"{lo}..{hi}", "share": a.share, "seed": a.seed,
           "champion": {"variant": champ["variant"], "rule": champ["selection"].rule,
                        "candidates": [{k: r[k] for k in ("variant", "mean", "worst", "std")} for r in champ["selection"].table],
                        "train_nodes": champ["train_nodes"], "test_nodes": champ["test_nodes"],
                        "node_std": champ["node_std"], "select_s": champ["select_s"], "train_s": champ["train_s"]},
           "heldout": res,
           "goal": "bf16 changes the champion's held-out mean and worst node accuracy by at most 0.1 point",
           "goal_met": abs(res["change_points"]["mean"]) <= 0.1 and abs(res["change_points"]["worst"]) <= 0.1}
    out["seconds"] = round(time.time() - t_all, 1)
    out["page_markdown"] = page(out)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True, default=str))
    print(json.dumps({k: out[k] for k in ("champion", "goal_met", "seconds")}, indent=1, default=str))
    print(json.dumps({k: v for k, v in res.items() if k != "per_node"}, indent=1))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
