"""bench/window_before_after: the grounded client window against the old per-type window tables (issue 55).

Issue 55 asks for before/after tables: the handshake tree's accuracy, the emulation's shares of the
true type's gain (aliccs, aliccs_prior, aliccs_stream_prior, disco on its own label and on the type
label, gbdt) and the tail contrasts against Disco, on the grounded simulator (the default since
2026-11-28) and on the per-type window tables it replaced ("before").

Both arms are `make run`'s own job (`python -m ccselect.app.cli run`, which `make run` calls) on its default
fleet (12 nodes × 9 h, seed 7, 600 connections a node-hour; its emulation is the last hourly hour,
every policy, with the simulator's truth), each in a data root of its own, the configuration
infra/conf/local.yaml with two changes: `pipeline.deploy: false` (no kernel rollout: the
emulation does not read it) and, for "before" only, `simulate.client_window: per_type_tables`
(the simulator's stress knob that reproduces the pre-2026-11-28 window exactly; docs/simulator.md
"The client's first window"). Everything else — code, seeds, every other draw of the fleet — is
the same, so the difference is the window's.

Every figure carries a 95% interval from a bootstrap over nodes (the emulation's
`share_of_true_type_gain_node_95` and its tail contrasts; bench/handshake_window.py's
`node_bootstrap_95` for the tree). The handshake tree's accuracy is read from that bench's
functions (its fleet: 20 nodes × 48 h, four hours a node), run here on both windows of the simulator
(that bench's own per-type arm redraws the old tables with its own generator and a fixed 70% Android
share, an approximation of the knob's exact draw).

    .venv/bin/python bench/window_before_after.py --after DATA_ROOT --before DATA_ROOT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import result_file  # noqa: E402

# Imported inside the functions that use them (heavy, not needed to import this module): sklearn, through bench.handshake_window, and the simulator.

POLICIES = ("true_type", "aliccs", "aliccs_prior", "aliccs_flow", "aliccs_stream_prior", "disco", "disco_type", "gbdt",
            "configanator", "bbr", "oracle")
#: the per-flow references whose tails are contrasted with Disco's (the emulation's "truth, <ref>")
REFS = ("aliccs", "aliccs_prior", "aliccs_flow", "aliccs_stream_prior")
AGAINST = ("disco", "disco_type")
TREE_ROWS = ("window", "mss", "mss+window", "mss+window+connection_time", "mss+connection_time")


def tree_accuracy(splits: int) -> dict:
    """bench/handshake_window.py's measure (its fleet: 20 nodes × 48 h, seed 7, four hours a node;
    its depth-6 tree on halvings of the nodes, node-bootstrap intervals) on the simulator's two
    windows: the knob's exact per-type draw, not that bench's approximation."""
    sys.path.insert(0, str(REPO))
    from bench.handshake_window import fleet, scores
    from ccselect.sim.params import SimParams
    out = {}
    for name, window in (("per_type_tables", "per_type_tables"), ("grounded", "stacks")):
        out[name] = scores(fleet(SimParams(nodes=20, hours=48, seed=7, client_window=window)), splits)
    return out


def arm(root: Path) -> dict:
    """The figures of one `make run` (its results/main_job.json)."""
    src = root / "results" / "main_job.json"
    d = json.loads(src.read_text())
    e = d["emulation"]
    pols = {}
    for name in POLICIES:
        p = e["policies"].get(name)
        if not p:
            continue
        t = p.get("truth") or {}
        pols[name] = {"share_of_true_type_gain": t.get("share_of_true_type_gain"),
                      "share_node_95": t.get("share_of_true_type_gain_node_95"),
                      "truth_gain_vs_cubic": t.get("exp_qoe_gain_vs_cubic"),
                      "truth_gain_node_95": t.get("exp_qoe_gain_vs_cubic_node_95"),
                      "truth_rebuffer_pct": t.get("exp_rebuffer_pct"), "share_bbr": p.get("share_bbr")}
    tails = {}
    for ref in REFS:
        c = e["tail_contrasts"].get("truth" if ref == "aliccs" else f"truth, {ref}") or {}
        tails[ref] = {x: c["vs"][x] for x in AGAINST if x in c.get("vs", {})}
        tails[ref]["nodes"] = c.get("nodes")
        tails[ref]["cells"] = c.get("cells")
    summary = d.get("summary", "")
    held = next((ln.strip() for ln in summary.splitlines() if ln.strip().startswith("mean ") and "worst" in ln), None)
    pick = next((ln.strip() for ln in summary.splitlines() if ln.strip().startswith("variant ")), None)
    return {"source": str(src), "measured_at": d.get("measured_at"), "load_avg": d.get("load_avg"), "ok": d.get("ok"),
            "config": d.get("config"), "range": e["range"], "sessions": e["sessions"],
            "tail_nodes": tails[REFS[0]].get("nodes"), "policies": pols, "tail_contrasts_truth_rebuffer": tails,
            "heldout": held, "selection": pick, "flow_tree": (e.get("baselines") or {}).get("flow_tree")}


def _ci(v, ci, f="{:.2f}", scale=1.0) -> str:
    if v is None:
        return "–"
    s = f.format(v * scale)
    return s + (f" [{f.format(ci[0] * scale)}, {f.format(ci[1] * scale)}]" if ci else "")


def page_markdown(r: dict) -> str:
    b, a, hw = r["before"], r["after"], r["handshake_tree"]
    lines = ["Before: the per-type window tables (the simulator before 2026-11-28, `simulate.client_window: "
             "per_type_tables`). After: the grounded window (`stacks`, today's default). Both: `make run`'s job on "
             f"its default fleet, emulation of hour {a['range'][:13]} ({a['sessions']:,} playback sessions after, "
             f"{b['sessions']:,} before), intervals 95% over resampled nodes ({a['tail_nodes']} nodes).", "",
             "### The handshake tree's balanced accuracy (Wi-Fi against cellular, held-out nodes)", "",
             f"`bench/handshake_window.py`'s measure on the simulator's two windows ({hw['fleet']}, {hw['splits']} "
             "halvings of the nodes, the simulator's truth; the per-type arm is the knob's exact draw, where "
             "handshake-window.md redraws it approximately: "
             f"{hw['handshake_window_json_per_type_approximation_adds_points']:+.1f} points there).", "",
             "| features | before (per-type tables) | after (grounded) |", "|---|---|---|"]
    for k in TREE_ROWS:
        x, y = hw["per_type_tables"][k], hw["grounded"][k]
        lines.append(f"| {k} | {_ci(x['balanced_accuracy'], x['node_bootstrap_95'], '{:.3f}')} | "
                     f"{_ci(y['balanced_accuracy'], y['node_bootstrap_95'], '{:.3f}')} |")
    lines += [f"| window adds over MSS (points) | {hw['per_type_tables']['window_adds_over_mss_points']:+.1f} | "
              f"{hw['grounded']['window_adds_over_mss_points']:+.1f} |", "",
              "### The emulation: share of the true type's truth gain (%)", "",
              "The simulator's expected QoE of each policy's choices minus all-CUBIC's, as a share of `true_type`'s "
              "(Wi-Fi → CUBIC, 4G/5G → BBR by the true type); `true_type`'s own gain in QoE × 10⁴.", "",
              "| policy | before | after |", "|---|---|---|"]
    for name in POLICIES:
        x, y = b["policies"].get(name), a["policies"].get(name)
        if not x or not y:
            continue
        if name == "true_type":
            lines.append(f"| true_type gain (QoE × 10⁴) | {_ci(x['truth_gain_vs_cubic'], x['truth_gain_node_95'], scale=1e4)} | "
                         f"{_ci(y['truth_gain_vs_cubic'], y['truth_gain_node_95'], scale=1e4)} |")
            continue
        lines.append(f"| {name} | {_ci(x['share_of_true_type_gain'], x['share_node_95'], '{:.0f}', 100)} | "
                     f"{_ci(y['share_of_true_type_gain'], y['share_node_95'], '{:.0f}', 100)} |")
    lines += ["", "### Tail contrasts against Disco (rebuffer rate in truth, per-cell percentiles)", "",
              "Reference − Disco at each percentile of the cells' expected rebuffer rate (× 10⁴; negative: the "
              "reference's tail is lower, better), [95% interval over resampled nodes], and the share of resamples "
              "in which the reference is lower.", "",
              "| reference | vs | pct | before | after |", "|---|---|---|---|---|"]
    for ref in REFS:
        for vs in AGAINST:
            for pct in ("p90", "p95", "p99"):
                cells = []
                for x in (b, a):
                    c = x["tail_contrasts_truth_rebuffer"].get(ref, {}).get(vs, {}).get(pct)
                    cells.append("–" if not c else f"{c['diff'] * 1e4:+.1f} [{c['lo'] * 1e4:+.1f}, {c['hi'] * 1e4:+.1f}] "
                                 f"p_lower {c['p_lower']:.2f}")
                lines.append(f"| {ref} | {vs} | {pct} | {cells[0]} | {cells[1]} |")
    lines += ["", "### The two runs", "",
              f"- before: {b['selection']}; held out: {b['heldout']} (ok {b['ok']}, load {b['load_avg']})",
              f"- after: {a['selection']}; held out: {a['heldout']} (ok {a['ok']}, load {a['load_avg']})", ""]
    if r.get("verdict"):
        lines += ["### Per-flow against Disco", "", r["verdict"], ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--after", required=True, help="data root of make run on the grounded window")
    ap.add_argument("--before", required=True, help="data root of make run on simulate.client_window: per_type_tables")
    ap.add_argument("--handshake", default=str(REPO / "docs" / "results" / "data" / "handshake-window.json"))
    ap.add_argument("--splits", type=int, default=5, help="halvings of the nodes for the handshake tree")
    ap.add_argument("--tree", default=None, help="the handshake tree's figures as `--tree-only` wrote them")
    ap.add_argument("--tree-only", default=None, help="compute the handshake tree's figures, write them here, stop")
    ap.add_argument("--verdict", default=None, help="a file holding the paragraph on per-flow against Disco")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "window_before_after.json"))
    a = ap.parse_args(argv)
    hw = json.loads(Path(a.handshake).read_text())
    if a.tree_only:
        t0, load0 = time.time(), [round(x, 2) for x in os.getloadavg()]
        tree = tree_accuracy(a.splits)
        tree.update({"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_avg_before": load0,
                     "load_avg_after_tree": [round(x, 2) for x in os.getloadavg()], "seconds_tree": round(time.time() - t0, 1)})
        Path(a.tree_only).write_text(json.dumps(tree, indent=1))
        return 0
    t0, load0 = time.time(), [round(x, 2) for x in os.getloadavg()]
    if a.tree:          # tree_accuracy's output written earlier (the same function, `--tree-only`)
        tree = json.loads(Path(a.tree).read_text())
    else:
        tree = tree_accuracy(a.splits)
    res = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_avg": load0,
           "fleet": "make run's: 12 nodes x 9 h, seed 7, 600 connections a node-hour; emulation of its last hourly hour",
           "handshake_tree": {"fleet": hw["fleet"], "splits": a.splits, "tree": hw["tree"],
                              "how": "bench/handshake_window.py's fleet() and scores() on the simulator's two windows "
                                     "(client_window per_type_tables | stacks)",
                              "seconds": round(time.time() - t0, 1), "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                              **tree,
                              "handshake_window_json_per_type_approximation_adds_points":
                                  hw["per_type_tables"]["window_adds_over_mss_points"]},
           "before": arm(Path(a.before)), "after": arm(Path(a.after))}
    if a.verdict:
        res["verdict"] = Path(a.verdict).read_text().strip()
    res["page_markdown"] = page_markdown(res)
    result_file.write(a.out, res, show=res["page_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
