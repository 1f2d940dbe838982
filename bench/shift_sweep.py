"""bench/shift_sweep: the strong-shift preset as a sweep of its stress knob (issue 55).

`sim.params.shift_knobs(severity)` moves every knob of the strong-shift preset from the default
fleet's value (severity 0) to the preset's (severity 1) along one line (docs/simulator.md
"Presets": most of those knobs are our picks, so the severity is a declared stress knob, swept,
not tuned to a bar). For each severity: a small fleet (`--nodes` × `--hours`, 8 × 6 by default,
the issue's kept-aside size; 2 training nodes: `--share` 0.25 of 8) is simulated and ingested
into a lake of its own, then

- `ccs evaluate`'s Python API (evaluation.evaluate.run_evaluation) scores `--variants` (mlp,
  gbdt, gbdt_nodestd, mlp_nodestd, aliccs_nodes) on the held-out nodes, the `*_nodestd` ones
  standardized per (node, hour) as deployed;
- the selection protocol (models/select.py, the configuration's candidates, leave-node-out folds
  of the training nodes only) picks a variant, which is trained on the training nodes and scored
  on the same held-out nodes (`select`, with the pick named).

Per severity and variant: mean and worst held-out node accuracy with 95% node-bootstrap intervals,
the gain over the MLP in mean and worst (paired: the same resampled nodes), and the MLP's
worst-node gap (mean − worst) the severity actually reached. Writes bench/results/shift_sweep.json
(with the page's tables) and prints the tables.

    .venv/bin/python bench/shift_sweep.py [--severities 0,0.5,1,1.5] [--train-seeds 1] [--workdir /tmp/ccs-bench-shift-sweep]
"""
from __future__ import annotations

import argparse
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

from bench.champion_bf16 import lake, node_bootstrap, select_champion  # noqa: E402
from bench.ingest import bench_config  # noqa: E402
from sim.params import SimParams, shift_knobs  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, torch, and our modules that load them.

VARIANTS = ("mlp", "gbdt", "gbdt_nodestd", "mlp_nodestd", "aliccs_nodes")


def figures(per_node: dict[str, float], mlp: dict[str, float]) -> dict:
    """mean and worst of the node accuracies `per_node` with node-bootstrap intervals, and the
    gains over the MLP's (`mlp`, the same nodes) with paired intervals; in points."""
    nodes = sorted(per_node)
    pair = {n: {"v": per_node[n], "mlp": mlp[n]} for n in nodes}
    mean = lambda rs: float(np.mean([r["v"] for r in rs]))  # noqa: E731
    worst = lambda rs: float(np.min([r["v"] for r in rs]))  # noqa: E731
    mlp_mean = lambda rs: float(np.mean([r["mlp"] for r in rs]))  # noqa: E731
    mlp_worst = lambda rs: float(np.min([r["mlp"] for r in rs]))  # noqa: E731
    pts = lambda v: round(100 * v, 2)  # noqa: E731
    return {"mean": pts(mean(pair.values())), "mean_ci95": [pts(v) for v in node_bootstrap(pair, mean)],
            "worst": pts(worst(pair.values())), "worst_ci95": [pts(v) for v in node_bootstrap(pair, worst)],
            "mean_gain": pts(mean(pair.values()) - mlp_mean(pair.values())),
            "mean_gain_ci95": [pts(v) for v in node_bootstrap(pair, lambda rs: mean(rs) - mlp_mean(rs))],
            "worst_gain": pts(worst(pair.values()) - mlp_worst(pair.values())),
            "worst_gain_ci95": [pts(v) for v in node_bootstrap(pair, lambda rs: worst(rs) - mlp_worst(rs))],
            "per_node": {n: round(per_node[n], 4) for n in nodes}}


def one_severity(severity: float, a, say) -> dict:
    from ccselect.spark import get_spark
    from evaluation.evaluate import run_evaluation
    from models.crossnode import per_node
    root = Path(a.workdir) / f"severity-{severity:g}"
    cfg0 = bench_config(root)
    params = replace(SimParams.from_settings(cfg0.settings.simulate, shift_severity=severity), nodes=a.nodes,
                     hours=a.hours, conns_per_node_hour=a.conns_per_node_hour, seed=a.sim_seed,
                     start="2026-11-01T00:00:00")
    cfg, lo, hi, info = lake(root, params, say)
    spark = get_spark(cfg, "bench-shift-sweep")
    t0 = time.time()
    ev = run_evaluation(spark, cfg, lo, hi, variants=a.variants.split(","), share=a.share, seed=a.seed,
                        train_seeds=a.train_seeds, write=False, progress=say)
    eval_s = time.time() - t0
    champ = select_champion(spark, cfg, lo, hi, a.share, a.seed, None, say)
    assert champ["test_nodes"] == ev["test_nodes"], (champ["test_nodes"], ev["test_nodes"])
    te = champ["test"]
    pick = per_node(te.y, champ["trainer"].predict_proba(champ["x_test"]), te.node)
    excluded = set(ev["excluded_nodes"])
    acc = {v: {r["node_id"]: r["accuracy"] for r in res["per_node"] if r["node_id"] not in excluded}
           for v, res in ev["variants"].items()}
    acc["select"] = {r.node_id: r.accuracy for r in pick.itertuples() if r.node_id not in excluded}
    out = {"severity": severity, "knobs": shift_knobs(severity), "fleet": info, "window": f"{lo}..{hi}",
           "train_nodes": ev["train_nodes"], "test_nodes": ev["test_nodes"], "excluded_nodes": sorted(excluded),
           "n_train": ev["n_train"], "n_test": ev["n_test"], "node_std": ev.get("node_std"),
           "selected": champ["variant"],
           "selection": [{k: r[k] for k in ("variant", "mean", "worst", "std")} for r in champ["selection"].table],
           "evaluate_s": round(eval_s, 1), "select_s": champ["select_s"], "select_train_s": champ["train_s"],
           "variants": {v: figures(acc[v], acc["mlp"]) for v in acc}}
    m = out["variants"]["mlp"]
    out["mlp_worst_gap_points"] = round(m["mean"] - m["worst"], 2)
    say(f"severity {severity:g}: MLP mean {m['mean']:.2f} worst {m['worst']:.2f} (gap {out['mlp_worst_gap_points']:.2f}); "
        f"selected {champ['variant']}")
    return out


def page(out: dict) -> str:
    rows = sorted(out["severities"], key=lambda r: r["severity"])
    variants = list(rows[0]["variants"]) if rows else []
    ci = lambda v: f"[{v[0]:.1f}, {v[1]:.1f}]"  # noqa: E731
    lines = [f"Fleet per severity: {out['nodes']} nodes × {out['hours']} h, {out['conns_per_node_hour']} connections "
             f"a node-hour, simulator seed {out['sim_seed']}; {out['share']:.0%} of the nodes to train on "
             f"(split seed {out['seed']}), every other labelled node held out; {out['train_seeds']} training seed(s). "
             "Accuracies in points; intervals: 95% over resampled held-out nodes. `select` is the variant the "
             "selection protocol picked on the training nodes' folds, named in the first table.", "",
             "| severity | MLP worst-node gap (mean − worst) | selected | held-out nodes | training nodes |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['severity']:g} | {r['mlp_worst_gap_points']:.2f} | {r['selected']} | "
                     f"{len(r['test_nodes']) - len(r['excluded_nodes'])} | {', '.join(r['train_nodes'])} |")
    for what in ("mean", "worst"):
        lines += ["", f"**{what.capitalize()} held-out node accuracy, and its gain over the MLP**", "",
                  "| variant | " + " | ".join(f"severity {r['severity']:g}" for r in rows) + " |",
                  "|---|" + "---|" * len(rows)]
        for v in variants:
            cells = []
            for r in rows:
                f = r["variants"][v]
                gain = "" if v == "mlp" else f"; {f[what + '_gain']:+.1f} {ci(f[what + '_gain_ci95'])}"
                cells.append(f"{f[what]:.1f} {ci(f[what + '_ci95'])}{gain}")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--severities", default="0,0.5,1,1.5")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=int, default=6)
    ap.add_argument("--conns-per-node-hour", type=int, default=600)
    ap.add_argument("--sim-seed", type=int, default=7)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0, help="the split's and training's seed")
    ap.add_argument("--train-seeds", type=int, default=1, help="training seeds per network variant (the issue: 5)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workdir", default="/tmp/ccs-bench-shift-sweep")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "shift_sweep.json"))
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(2)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    out = {"bench": "shift_sweep", "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{os.uname().nodename}, {os.cpu_count()} cores", "load_average_start": list(os.getloadavg()),
           "command": "python bench/shift_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "nodes": a.nodes, "hours": a.hours, "conns_per_node_hour": a.conns_per_node_hour, "sim_seed": a.sim_seed,
           "share": a.share, "seed": a.seed, "train_seeds": a.train_seeds,
           "goal": "issue 55: the MLP's worst-node gap at about 4, 8, 12 and 16 points, each variant's gain along it",
           "severities": []}
    for s in (float(x) for x in a.severities.split(",")):
        out["severities"].append(one_severity(s, a, say))
        out["seconds"] = round(time.time() - t0, 1)
        out["page_markdown"] = page(out)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))   # after each severity: a partial run keeps what it measured
    print(out["page_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
