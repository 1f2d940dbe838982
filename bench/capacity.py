"""bench/capacity: issue 31's goals side by side, and a capacity plan from the measured rates.

Reads what the other benches of `make bench` wrote (bench/results/{ingest,autoplex,export,infer,
kernel}.json; run them first) and writes bench/results/capacity.json, printed and rendered as
docs/results/capacity.md. It measures nothing itself.

- **Goals.** Each stage's figure next to its goal: the Spark-over-DuckDB ratios (ingest ≤ 2×,
  AutoPlex ≤ 3×, export ≤ 2×), `ccs infer` Delta to Delta (≥ 3 M rows/s) and the model alone (≥ 10 M
  rows/s), with the load average at the start of the bench that measured it and its peak memory.
- **Capacity plan.** Each stage's per-core rate (its rows/s on the bench's 2 cores, halved) and its
  memory per core (its peak resident memory over 2 cores). From these come the cores and memory each
  stage needs for a fleet the size ALICCS reports (§1 and §5: about 400 nodes; Table 3: 18.4 k
  requests/s the most one node serves) and for ten times that:
  - *hourly*: an hour of the fleet at its peak rate through the stage within `--hourly-minutes`
    (15 by default, so a table built from an hour reaches the edge within the next quarter hour);
  - *streaming*: the peak rate, sustained.
  The stage that needs the most cores bounds the pipeline. Per-core rates are assumed to scale
  linearly with cores, which holds for scans and per-partition work and not for shuffles; the
  plan is an estimate, not a measurement. Every connection is taken to carry one request
  (`--requests-per-connection` 1), so the plan errs on the large side.
  The edge's own cost, per node, comes from bench/kernel.py's nanoseconds per connection.

    .venv/bin/python bench/capacity.py [--nodes 400] [--node-rps 18400] [--hourly-minutes 15]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CORES = 2  # the benches run local[2] / 2 threads


def _load(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def stages() -> tuple[list[dict], list[dict]]:
    """(goal rows, per-stage rates) from the benches' JSON; a bench not run yet is listed as such."""
    goals, rates = [], []
    def ratio_stage(stage: str, rate_name: str, unit: str, size: str, ratio: float, goal: float, spark_s, duck_s,
                    load, peak, rows_per_s) -> None:
        goals.append({"stage": stage, "size": size, "figure": ratio, "unit": "× DuckDB", "goal": goal,
                      "met": ratio <= goal, "detail": f"Spark {spark_s} s, DuckDB {duck_s} s",
                      "load_average_start": load, "peak_rss_mb": peak})
        rates.append({"stage": rate_name, "unit": unit, "rows_per_s": rows_per_s, "peak_rss_mb": peak})

    ing = _load("ingest")
    if ing:
        ratio_stage("ingest, files → silver", "ingest", "connections", f"{ing['connections']:,} connections",
                    ing["spark_over_duckdb"], ing.get("goal_ratio", 2.0), ing["spark"]["seconds"], ing["duckdb"]["seconds"],
                    ing.get("load_average_start", [ing["load_average_1m"]["spark_start"]])[0],
                    ing["spark"].get("peak_driver_rss_mb"), ing["spark"]["connections_per_s"])
    else:
        goals.append({"stage": "ingest, files → silver", "missing": "python bench/ingest.py"})
    apx = _load("autoplex")
    if apx and "arrow" in apx:     # (older JSON, without the Arrow engine: run the bench again)
        # the goal row: `ccs autoplex`'s default engine (Arrow, in-process) against DuckDB, the Spark
        # job's figure beside it; the plan's rate: the Spark job's, the path that scales out
        a, sp, goal = apx["arrow"], apx["spark"], apx.get("goal_ratio", 3.0)
        goals.append({"stage": "AutoPlex, one day", "size": f"{apx['rows_in_window']:,} connections, {apx['nodes']} nodes",
                      "figure": apx["arrow_over_duckdb"], "unit": "× DuckDB", "goal": goal,
                      "met": apx["arrow_over_duckdb"] <= goal,
                      "detail": (f"Arrow engine (the default) {a['seconds']} s, DuckDB {apx['duckdb']['seconds']} s; "
                                 f"the Spark job {sp['seconds']} s ({apx['spark_over_duckdb']}×)"),
                      "load_average_start": apx["load_average_1m"]["start"], "peak_rss_mb": a.get("peak_rss_mb")})
        rates.append({"stage": "autoplex", "unit": "connections", "rows_per_s": sp["rows_per_s"],
                      "peak_rss_mb": sp.get("peak_driver_rss_mb")})
    else:
        goals.append({"stage": "AutoPlex, one day", "missing": "python bench/autoplex.py"})
    exp = _load("export")
    if exp and "rows" in exp:
        r = exp["rows"]
        peak = r.get("peak_rss_mb")
        ratio_stage("export, predictions → signed table", "export", "predictions", f"{r['predictions']:,} predictions",
                    r["spark_over_duckdb"], exp.get("goal_ratio", 2.0), r["spark_seconds"], r["duckdb_seconds"],
                    r["load_average"]["spark_start"][0], peak["spark"]["total"] if isinstance(peak, dict) else peak,
                    round(r["predictions"] / r["spark_seconds"]))
    else:
        goals.append({"stage": "export, predictions → signed table", "missing": "python bench/export.py"})
    inf = _load("infer")
    if inf and "arrow" in inf:
        a, g = inf["arrow"], inf["goals"]
        goals.append({"stage": "ccs infer, silver → gold.predictions (Delta to Delta)",
                      "size": f"{a['silver_rows']:,} rows", "figure": g["infer_fp32_rows_per_s"], "unit": "rows/s",
                      "goal": g["infer_rows_per_s"], "met": g["infer_met"],
                      "detail": (f"Arrow engine fp32; decisions identical to the Spark job: "
                                 f"{a['vs_spark_fp32']['decisions_identical']}; the Spark job "
                                 f"{g['spark_job_rows_per_s']:,} rows/s"),
                      "load_average_start": inf["load_average"].get("arrow_start", inf["load_average"]["start"]),
                      "peak_rss_mb": a["peak_rss_mb"]["python_driver"]})
        mo = inf["model_only"]
        eager = {prec: v["best_rows_per_s"] for prec, v in mo["precisions"].items()}
        compiled = mo.get("compiled_fp32", {}).get("best_rows_per_s", 0)
        best_eager = max(eager, key=eager.get)
        # fp32 (eager or compiled: the same weights and arithmetic, probabilities within
        # max_abs_p_diff_vs_eager) keeps the accuracy; bf16 counts when its change is within 0.1 point
        candidates = {"fp32, torch.compile": compiled, "fp32, eager": eager.get("fp32", 0)}
        if g.get("bf16_met"):
            candidates["bf16, eager"] = eager.get("bf16", 0)
        how = max(candidates, key=candidates.get)
        goals.append({"stage": "the model alone", "size": f"{mo['rows']:,} rows",
                      "figure": candidates[how], "unit": "rows/s", "goal": g["model_rows_per_s"],
                      "met": candidates[how] >= g["model_rows_per_s"],
                      "detail": (f"{how}; eager best {eager[best_eager]:,} ({best_eager}); bf16 accuracy change "
                                 f"{mo['accuracy']['change_points']} points (goal ≤ 0.1); compiled fp32 differs from "
                                 f"eager by at most {mo.get('compiled_fp32', {}).get('max_abs_p_diff_vs_eager')} in P(Wi-Fi)"),
                      "load_average_start": inf["load_average"]["start"],
                      "peak_rss_mb": mo.get("peak_rss_mb")})
        rates.append({"stage": "infer", "unit": "connections", "rows_per_s": g["infer_fp32_rows_per_s"],
                      "peak_rss_mb": a["peak_rss_mb"]["python_driver"]})
    else:
        goals.append({"stage": "ccs infer", "missing": "python bench/infer.py"})
    return goals, rates


def plan(rates: list[dict], nodes: int, node_rps: float, req_per_conn: float, hourly_minutes: float,
         kernel: dict | None) -> dict:
    conns_per_s = nodes * node_rps / req_per_conn
    per_hour = conns_per_s * 3600
    out: dict = {"nodes": nodes, "requests_per_s": round(nodes * node_rps), "connections_per_s": round(conns_per_s),
                 "connections_per_hour": round(per_hour), "stages": []}
    for r in rates:
        per_core = r["rows_per_s"] / CORES
        mem_core = (r["peak_rss_mb"] or 0) / CORES / 1024
        hourly = math.ceil(per_hour / (per_core * hourly_minutes * 60))
        stream = math.ceil(conns_per_s / per_core)
        out["stages"].append({"stage": r["stage"], "rows_per_s_per_core": round(per_core),
                              "memory_gb_per_core": round(mem_core, 2),
                              "hourly_cores": hourly, "hourly_memory_gb": round(hourly * mem_core, 1),
                              "streaming_cores": stream, "streaming_memory_gb": round(stream * mem_core, 1)})
    if out["stages"]:
        out["bound_by"] = max(out["stages"], key=lambda s: s["streaming_cores"])["stage"]
        out["hourly_cores_total"] = sum(s["hourly_cores"] for s in out["stages"])
        out["streaming_cores_total"] = sum(s["streaming_cores"] for s in out["stages"])
    if kernel:
        ns = kernel["median"]["route_ccs"]["net_ns_per_connection"]
        log_ns = kernel["median"]["logging"]["net_ns_per_connection"]
        out["edge_per_node"] = {"connections_per_s": round(node_rps / req_per_conn),
                                "sock_ops_core_share": round(node_rps / req_per_conn * ns * 1e-9, 5),
                                "sock_ops_core_share_full_logging": round(node_rps / req_per_conn * log_ns * 1e-9, 5)}
    return out


def markdown(goals: list[dict], plans: list[dict], args) -> str:
    lines = ["## Goals (issue 31)", "", "| stage | size | figure | goal | met | detail | load at start | peak MB |",
             "|---|---|---|---|---|---|---|---|"]
    for g in goals:
        if "missing" in g:
            lines.append(f"| {g['stage']} | | not measured: run `{g['missing']}` | | | | | |")
            continue
        fig = f"{g['figure']:,} {g['unit']}" if g["unit"] == "rows/s" else f"{g['figure']}{g['unit']}"
        goal = f"≥ {g['goal']:,} rows/s" if g["unit"] == "rows/s" else f"≤ {g['goal']}×"
        lines.append(f"| {g['stage']} | {g['size']} | {fig} | {goal} | {'yes' if g['met'] else '**no**'} | "
                     f"{g['detail']} | {g['load_average_start']} | {g['peak_rss_mb']} |")
    lines += ["", "## Capacity plan", "",
              f"From the per-core rates above (2 cores each, assumed linear in cores); one request per "
              f"connection ({args.requests_per_connection}); hourly: an hour of peak traffic within "
              f"{args.hourly_minutes:g} minutes; streaming: the peak rate sustained. Memory per core is a bench's "
              f"peak resident memory over its 2 cores, fixed JVM and Python footprints included, so it "
              f"overstates what many cores need.", ""]
    for p in plans:
        lines += [f"### {p['nodes']:,} nodes × {args.node_rps:,.0f} requests/s ({p['connections_per_s']:,} connections/s)", "",
                  "| stage | rows/s per core | GB per core | hourly cores | hourly GB | streaming cores | streaming GB |",
                  "|---|---|---|---|---|---|---|"]
        for s in p["stages"]:
            lines.append(f"| {s['stage']} | {s['rows_per_s_per_core']:,} | {s['memory_gb_per_core']} | {s['hourly_cores']:,} | "
                         f"{s['hourly_memory_gb']:,} | {s['streaming_cores']:,} | {s['streaming_memory_gb']:,} |")
        if p.get("bound_by"):
            lines += ["", f"Bound by **{p['bound_by']}**; in all {p['hourly_cores_total']:,} cores hourly, "
                          f"{p['streaming_cores_total']:,} streaming."]
        if "edge_per_node" in p:
            e = p["edge_per_node"]
            lines += [f"At the edge, per node: the sock_ops program takes {e['sock_ops_core_share']:.4f} of a core "
                      f"({e['sock_ops_core_share_full_logging']:.4f} with every connection logged)."]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=400, help="fleet size (ALICCS: about 400 nodes)")
    ap.add_argument("--node-rps", type=float, default=18_400.0, help="requests/s per node (ALICCS Table 3: 18.4 k)")
    ap.add_argument("--requests-per-connection", type=float, default=1.0)
    ap.add_argument("--hourly-minutes", type=float, default=15.0)
    ap.add_argument("--out", default=str(RESULTS / "capacity.json"))
    args = ap.parse_args(argv)
    goals, rates = stages()
    kernel = _load("kernel")
    plans = [plan(rates, n, args.node_rps, args.requests_per_connection, args.hourly_minutes, kernel)
             for n in (args.nodes, args.nodes * 10)]
    out = {"bench": "capacity", "goals": goals, "plans": plans,
           "assumptions": {"cores_per_bench": CORES, "requests_per_connection": args.requests_per_connection,
                           "hourly_minutes": args.hourly_minutes, "node_requests_per_s": args.node_rps,
                           "source": "ALICCS §1/§5 (about 400 nodes), Table 3 (18.4 k requests/s per node)"},
           "page_markdown": markdown(goals, plans, args)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(out["page_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
