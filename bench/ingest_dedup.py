"""bench/ingest_dedup: the cost of deduplication by identity (issue 61) on the ingest bench — the
batch ingest (bench/ingest.py's Spark path: `jobs.ingest.run`, bronze then silver, local[2]) of
one existing folder of simulated logs, by the code before identity and by the code with it, each
from its own git worktree, interleaved in one sitting: before, after, before, after, ... Each run
is its own Python process and JVM (PYTHONPATH and the working directory are the worktree's, so the
worktree's modules and its own build of jvm/src are used; the child checks that) and writes a fresh
lake. The ratio is after's median over before's median. `--head` adds one run of a third worktree
(e.g. main's HEAD) at the end, reported on its own and never in the ratio. Writes
bench/results/ingest_dedup.json (after each run, so a stopped sitting keeps its runs); its page
is docs/results/ingest-dedup.md (`bench/report.py --only ingest-dedup`).

    .venv/bin/python bench/ingest_dedup.py --simulate --conns 5000000 --data /work/bench61/logs
    .venv/bin/python bench/ingest_dedup.py --data DIR --before WT_BEFORE --after WT_AFTER [--pairs 3] [--head WT]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

# Imported inside the functions that use them: our modules (a child imports its worktree's, not this checkout's).

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "ingest_dedup.json"
STREAMS = ("transport", "access", "qoe")


# ---- the child: one ingest with one worktree's code ---------------------------------------------

def child(data: str, work: str, out: str) -> int:
    """Run in a worktree (cwd and PYTHONPATH): bench/ingest.py's Spark ingest of `data` into a
    fresh lake under `work`, timed as bench/ingest.py times it (`ingest.run`, after the session
    started); writes the result to `out`."""
    wt = Path.cwd().resolve()
    from ccselect import jobs
    import ccselect
    from bench.ingest import bench_config
    import bench.ingest as bench_ingest
    for mod in (jobs, ccselect, bench_ingest):
        if not Path(mod.__file__).resolve().is_relative_to(wt):
            raise SystemExit(f"{mod.__name__} imported from {mod.__file__}, not from the worktree {wt}")
    from ccselect import spark as ccs_spark
    from ccselect.spark import get_spark
    from ccselect.jobs import ingest

    shutil.rmtree(work, ignore_errors=True)
    cfg = bench_config(Path(work), Path(work) / "root")
    spark = get_spark(cfg, "ccs-bench-ingest-dedup")
    t0 = time.perf_counter()
    result = ingest.run(spark, cfg, data)
    seconds = time.perf_counter() - t0
    spark.stop()
    Path(out).write_text(json.dumps({
        "seconds": round(seconds, 2), "silver_rows": result["silver_rows"], "files": result["files"],
        "partitions": result["partitions"], "skipped": len(result["skipped"]), "streams": result["streams"],
        "modules": {"jobs": jobs.__file__, "udf_jar": ccs_spark.JVM_JAR}}))
    return 0


# ---- the parent: the sitting --------------------------------------------------------------------

class LoadSampler:
    """The 1-minute load average every 5 s while a run lasts (other engineers' work included)."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()

    def __enter__(self):
        self.samples.append(os.getloadavg()[0])

        def loop():
            while not self._stop.wait(5):
                self.samples.append(os.getloadavg()[0])
        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.samples.append(os.getloadavg()[0])


def commit_of(wt: Path) -> dict:
    git = lambda *a: subprocess.run(["git", "-C", str(wt), *a], capture_output=True, text=True, check=True).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s")[:120],
            "worktree": str(wt)}


def run_side(side: str, wt: Path, data: str, work: Path) -> dict:
    res = work / f"child-{side}.json"
    res.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(wt)}
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    with LoadSampler() as load:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--data", data,
                               "--work", str(work / "lake"), "--result", str(res)],
                              cwd=wt, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    shutil.rmtree(work / "lake", ignore_errors=True)
    if done.returncode:
        raise RuntimeError(f"{side} ({wt}) failed, rc {done.returncode}:\n{done.stderr[-4000:]}")
    out = json.loads(res.read_text())
    res.unlink()
    return {"side": side, "started": started, **out, "process_seconds": round(wall, 1),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_1m": {"mean": round(statistics.fmean(load.samples), 2), "max": round(max(load.samples), 2),
                        "end": round(load.samples[-1], 2)}}


def quarantine(run: dict) -> dict:
    """Bronze quarantine per stream and reason (the audit's totals of that run)."""
    return {s: v.get("by_reason", {}) for s, v in sorted(run["streams"].items())}


def summarize(runs: list[dict], meta: dict) -> dict:
    out = dict(meta)
    out["runs"] = runs
    sides = {}
    # the ratio's sides hold complete pairs only: a before run whose after did not run (a sitting
    # stopped early) is kept in `runs` and left out here
    paired = min(sum(r["side"] == "before" for r in runs), sum(r["side"] == "after" for r in runs))
    for side in ("before", "after", "head"):
        rs = [r for r in runs if r["side"] == side]
        rs = rs if side == "head" else rs[:paired]
        if not rs:
            continue
        sides[side] = {"runs": len(rs), "seconds": [r["seconds"] for r in rs],
                       "median_seconds": round(statistics.median(r["seconds"] for r in rs), 2),
                       "silver_rows": sorted({r["silver_rows"] for r in rs}),
                       "quarantined_by_reason": quarantine(rs[-1]),
                       "lines_read": {s: v["lines_read"] for s, v in sorted(rs[-1]["streams"].items())},
                       "load_1m_mean": [r["load_1m"]["mean"] for r in rs]}
    out["sides"] = sides
    if "before" in sides and "after" in sides:
        b, a = sides["before"], sides["after"]
        out["pairs"] = paired
        out["unpaired_runs"] = len([r for r in runs if r["side"] != "head"]) - 2 * paired
        out["after_over_before"] = round(a["median_seconds"] / b["median_seconds"], 3)
        out["pair_ratios"] = [round(ra["seconds"] / rb["seconds"], 3) for rb, ra in
                              zip([r for r in runs if r["side"] == "before"], [r for r in runs if r["side"] == "after"])]
        newly = {}
        for s in STREAMS:
            qa, qb = a["quarantined_by_reason"].get(s, {}), b["quarantined_by_reason"].get(s, {})
            diff = {k: qa.get(k, 0) - qb.get(k, 0) for k in sorted(set(qa) | set(qb)) if qa.get(k, 0) != qb.get(k, 0)}
            if diff:
                newly[s] = diff
        out["quarantine_after_minus_before"] = newly
    if "head" in sides and "before" in sides:
        out["head_over_before"] = round(sides["head"]["median_seconds"] / sides["before"]["median_seconds"], 3)
    out["page_markdown"] = page(out)
    return out


def page(o: dict) -> str:
    lines = [f"The batch ingest (bench/ingest.py's Spark path, local[2]) of one folder of simulated logs: "
             f"{o['connections']:,} connections, {o['lines']:,} lines, {o['input_bytes'] / 1e9:.2f} GB, "
             f"at each commit from its own worktree, interleaved in one sitting; each run its own process and JVM "
             f"and a fresh lake. The ratio is the after side's median over the before side's."]
    sides = o["sides"]
    lines += ["", "| side | commit | runs | seconds | median s | silver rows | 1-min load (mean per run) |",
              "|---|---|---|---|---|---|---|"]
    for side, s in sides.items():
        c = o["commits"][side]
        lines.append(f"| {side} | `{c['commit'][:7]}` {c['subject'][:60]} | {s['runs']} | "
                     f"{', '.join(f'{x:.1f}' for x in s['seconds'])} | {s['median_seconds']:.1f} | "
                     f"{', '.join(f'{x:,}' for x in s['silver_rows'])} | {', '.join(f'{x:.1f}' for x in s['load_1m_mean'])} |")
    if "after_over_before" in o:
        pr = o["pair_ratios"]
        loads = [r["load_1m"]["mean"] for r in o["runs"] if r["side"] in ("before", "after")]
        lines += ["", f"**After/before, medians: {o['after_over_before']:.3f}** ({100 * (o['after_over_before'] - 1):+.1f}% "
                      f"of the batch ingest's time) over {o['pairs']} interleaved pair(s); the pairs' own ratios "
                      f"{', '.join(f'{x:.3f}' for x in pr)}, with the runs' mean 1-minute load from "
                      f"{min(loads):.1f} to {max(loads):.1f} on 2 cores."]
        if o.get("unpaired_runs"):
            lines += ["", f"{o['unpaired_runs']} run(s) without its pair (the sitting stopped) are in the JSON's "
                          f"`runs` and left out of the medians."]
        if min(pr) < 1 < max(pr):
            lines += ["", "The pairs disagree on the sign: at this load the cost is not resolved by this sitting; "
                          "it is smaller than the runs' spread."]
        elif len(pr) < 2:
            lines += ["", "One pair only: the ratio carries the two runs' difference in load, not only the code's."]
        lines += ["", "Bronze quarantine per stream and reason (the audit's totals):", "",
                  "| stream | reason | before | after |", "|---|---|---|---|"]
        qb, qa = sides["before"]["quarantined_by_reason"], sides["after"]["quarantined_by_reason"]
        for s in STREAMS:
            for k in sorted(set(qb.get(s, {})) | set(qa.get(s, {}))):
                lines.append(f"| {s} | {k} | {qb.get(s, {}).get(k, 0):,} | {qa.get(s, {}).get(k, 0):,} |")
        new = o["quarantine_after_minus_before"]
        said = "; ".join(f"{s} {k} {v:+,}" for s, d in new.items() for k, v in d.items()) or "none"
        lines += ["", f"Quarantined by the after side and not the before (after − before): {said}."]
        dups = {f"{st} {k}": v for st, d in qa.items() for k, v in d.items() if k.startswith("duplicate_")}
        if dups:
            lines += ["", "Duplicates the after side quarantined: " + "; ".join(f"{k} {v:,}" for k, v in dups.items()) + "."]
        else:
            lines += ["", "The after side quarantined no duplicate (no `duplicate_*` reason): these simulated logs "
                          "hold each identity once, so this is the cost of judging every line, with nothing to remove."]
    if "head" in sides:
        lines += ["", f"The head run (a later commit: its own changes besides identity, e.g. silver.node_stats) "
                      f"is shown apart and is not in the ratio: {sides['head']['median_seconds']:.1f} s, "
                      f"{o['head_over_before']:.3f} of the before side's median."]
    lines += ["", "Other engineers' work shared the 2 cores: the load averages are beside each run; interleaving "
                  "spreads that load over both sides."]
    return "\n".join(lines)


def simulate_data(data: str, conns: int, nodes: int, hours: int) -> None:
    """bench/ingest.py's own simulation (same seed, same sizing), written to `data`."""
    sys.path.insert(0, str(REPO))
    from bench.ingest import SIM_YIELD
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    per = max(1, round(conns / (nodes * hours * SIM_YIELD)))
    t0 = time.perf_counter()
    m = simulate(SimParams(nodes=nodes, hours=hours, conns_per_node_hour=per, seed=17), data, workers=2, progress=False)
    print(f"simulated {m['counts']} in {time.perf_counter() - t0:.0f} s under {data}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a folder of simulated logs (bench/ingest.py's simulation)")
    ap.add_argument("--simulate", action="store_true", help="write --data first (bench/ingest.py's simulation)")
    ap.add_argument("--conns", type=int, default=5_000_000)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--before", help="worktree of the commit before identity (5512210^)")
    ap.add_argument("--after", help="worktree of the commit with identity (5512210)")
    ap.add_argument("--head", help="worktree of a later commit, run once at the end, apart from the ratio")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/ccs-bench-ingest-dedup", help="the runs' lakes (removed after each)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--resummarize", action="store_true",
                    help="recompute the summary and page of --out from the runs it holds (no run)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.data, a.work, a.result)
    if a.resummarize:
        held = json.loads(Path(a.out).read_text())
        meta = {k: v for k, v in held.items() if k not in ("runs", "sides", "pairs", "after_over_before", "pair_ratios",
                                                           "quarantine_after_minus_before", "head_over_before",
                                                           "unpaired_runs",
                                                           "page_markdown")}
        Path(a.out).write_text(json.dumps(summarize(held["runs"], meta), indent=2) + "\n")
        return 0
    if a.simulate:
        simulate_data(a.data, a.conns, a.nodes, a.hours)
    if not (a.before and a.after):
        return 0 if a.simulate else ap.error("--before and --after are needed to measure")
    manifest = json.loads(Path(a.data, "manifest.json").read_text())
    wts = {"before": Path(a.before).resolve(), "after": Path(a.after).resolve()}
    if a.head:
        wts["head"] = Path(a.head).resolve()
    meta = {"bench": "ingest_dedup", "cores": os.cpu_count(), "data": a.data,
            "connections": manifest["counts"]["transport"], "lines": sum(manifest["counts"][s] for s in STREAMS),
            "input_bytes": sum(f.stat().st_size for s in STREAMS for f in Path(a.data, s).rglob("*.jsonl")),
            "commits": {k: commit_of(v) for k, v in wts.items()},
            "order": [], "load_average": [round(x, 2) for x in os.getloadavg()]}
    order = [s for _ in range(a.pairs) for s in ("before", "after")] + (["head"] if a.head else [])
    meta["order"] = order
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for i, side in enumerate(order):
        print(f"run {i + 1}/{len(order)}: {side} ({wts[side]}) ...", file=sys.stderr, flush=True)
        r = run_side(side, wts[side], a.data, work)
        runs.append(r)
        print(f"  {r['seconds']} s, silver {r['silver_rows']}, load {r['load_1m']}", file=sys.stderr, flush=True)
        Path(a.out).write_text(json.dumps(summarize(runs, meta), indent=2) + "\n")
    print(Path(a.out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
