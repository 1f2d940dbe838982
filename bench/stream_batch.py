"""bench/stream_batch: the stream's warm micro-batch fixed cost (issue 62). A small simulated fleet's
first hour is batch-ingested (the lake the stream finds: bronze, quarantine, audit and silver
exist); then minute after minute of the second hour, as the agent's one-minute segments (a
handful of records per node and stream), is handed to the stream's own micro-batch function
(`flows.stream.StreamJob.process`, what `foreachBatch` calls, with a checkpoint's query id), one
minute a batch, in one warm session. Per batch: its wall time and stages (bronze, silver,
predictions, table, as the stream logs them), the Spark jobs it ran (by job group) and their wall
time, the driver's time outside jobs, and in = accepted + quarantined. No champion is registered
(predictions are skipped) and no signing key exists (the table step stops after reading the last
table): what is measured is the ingest side of a batch, bronze and silver. Each batch's Delta commits
are counted per table (from the tables' `_delta_log`); after the batches, in the same warm session,
`--commit-floor` one-row commits to a table of its own give what one commit costs with nothing else
in it (a plain append, and a partition replaced the way every ingest write is).
Writes bench/results/stream_batch.json (or --out).

    .venv/bin/python bench/stream_batch.py [--batches 6] [--nodes 2] [--out JSON]

Before/after in one sitting: run the bench from each tree (a `git archive` of each commit, this
file copied in) alternately, each with its own --out, then combine the runs into one result
(per run: the warm medians and the load beside them):

    .venv/bin/python bench/stream_batch.py --combine before_1=B1.json after_1=A1.json ... \
        --code before="commit X" --code after="commit Y"
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import bench_config  # noqa: E402
from bench.ingest_profile import _event_lines  # noqa: E402
from bench import result_file  # noqa: E402
from ccselect.config import load_config  # noqa: E402
from ccselect.sim.params import SimParams  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, and our modules that load it.


def jobs_by_group(events: Path) -> dict[str, dict]:
    """Per job group (one per batch): the jobs, their summed wall time, and the jobs per kind
    (the first stage's name, e.g. `save at ...`, `collect at ...`, Delta's own)."""
    jobs, out = {}, {}
    for line in _event_lines(events):
        e = json.loads(line)
        if e.get("Event") == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            infos = e.get("Stage Infos") or [{}]
            desc = props.get("spark.job.description") or ""
            # Delta's own jobs say what they are in their description (after the group's); others by call site
            what = infos[0].get("Stage Name", "?").split(" at ")[0]
            for kind in ("Filtering files", "Compute snapshot", "Finding files to rewrite", "getHistory"):
                if kind in desc or kind in what:
                    what = f"Delta: {kind}"
            if what == "$anonfun$withThreadLocalCaptured$1":
                what = "a query stage or broadcast (adaptive execution)"
            jobs[e["Job ID"]] = {"group": props.get("spark.jobGroup.id"), "start": e["Submission Time"],
                                 "what": what}
        elif e.get("Event") == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
    for j in jobs.values():
        g = out.setdefault(j["group"], {"jobs": 0, "jobs_wall_s": 0.0, "kinds": Counter()})
        g["jobs"] += 1
        g["jobs_wall_s"] += (j.get("end", j["start"]) - j["start"]) / 1000
        g["kinds"][j["what"][:50]] += 1
    return out


def delta_versions(root: Path) -> dict[str, int]:
    """Each Delta table under `root` (its path from there) and its latest version, read from the
    commit files in its `_delta_log` (no Spark job)."""
    out = {}
    for log in root.rglob("_delta_log"):
        versions = [int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()]
        if versions:
            out[str(log.parent.relative_to(root))] = max(versions)
    return out


def commit_floor(spark, path: Path, n: int) -> dict:
    """What one Delta commit costs in this warm session, nothing else in it: `n` one-row appends to
    a table partitioned by (node_id, hour) like the lake's, then `n` one-row replacements of one
    partition the way every ingest write is made (delta_io.replace_partitions: a replaceWhere on
    the partition). Medians in seconds; each call is one commit."""
    from ccselect import delta_io
    def rows(i: int):
        return spark.createDataFrame([("n1", f"2026-01-01T{i % 24:02d}", i)], "node_id string, hour string, v bigint")
    rows(0).write.format("delta").partitionBy("node_id", "hour").save(str(path))
    appends, replaces = [], []
    for i in range(n):
        t0 = time.perf_counter()
        rows(i).write.format("delta").mode("append").save(str(path))
        appends.append(time.perf_counter() - t0)
    for i in range(n):
        t0 = time.perf_counter()
        delta_io.replace_partitions(rows(i), str(path), {("n1", f"2026-01-01T{i % 24:02d}")})
        replaces.append(time.perf_counter() - t0)
    return {"commits_each": n, "append_median_s": round(median(appends), 3),
            "replace_partition_median_s": round(median(replaces), 3),
            "append_s": [round(x, 3) for x in appends], "replace_partition_s": [round(x, 3) for x in replaces]}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else round((xs[n // 2 - 1] + xs[n // 2]) / 2, 3)


def combine(runs: list[str], code: list[str], out: str) -> int:
    """One result from several runs (LABEL=JSON each, in the order they ran): per run its warm
    medians (seconds, Spark jobs, their wall time, the 1-minute load as the warm batches started)."""
    loaded = {label: json.loads(Path(path).read_text()) for label, path in (r.split("=", 1) for r in runs)}
    res = {"bench": "stream_batch", "cores": 2, "goal_s": 3.0, "code": dict(c.split("=", 1) for c in code),
           "warm_median_s": {k: r["warm"]["median_s"] for k, r in loaded.items()},
           "warm_median_spark_jobs": {k: r["warm"]["median_spark_jobs"] for k, r in loaded.items()},
           "warm_median_jobs_wall_s": {k: r["warm"]["median_jobs_wall_s"] for k, r in loaded.items()},
           "warm_median_load_1m": {k: median(r["load_average_1m"][1:]) for k, r in loaded.items()},
           "runs": loaded}
    result_file.write(out, res)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=6, help="micro-batches, one minute of segments each; the first is cold")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--conns", type=int, default=600, help="connections per node-hour")
    ap.add_argument("--workdir", default="/tmp/ccs-stream-batch")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "stream_batch.json"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--commit-floor", type=int, default=10, metavar="N",
                    help="after the batches, N one-row Delta appends and N partition replacements timed (0: none)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the session (to measure a setting's effect)")
    ap.add_argument("--combine", nargs="+", metavar="LABEL=JSON", help="combine runs into --out (no bench is run)")
    ap.add_argument("--code", action="append", default=[], metavar="SIDE=WHAT", help="with --combine: what each side ran")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.code, args.out)

    from pyspark.sql import functions as F

    from ccselect.spark import get_spark
    from ccselect.flows.stream import StreamJob
    from ccselect.jobs import ingest
    from ccselect.sim import replay
    from ccselect.sim.fleet import simulate
    from ccselect.hours import Window

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    fleet, seg = work / "fleet", work / "segments"
    params = SimParams(nodes=args.nodes, hours=2, conns_per_node_hour=args.conns, seed=7)
    simulate(params, str(fleet), workers=1, progress=False)
    hours = sorted(p.stem for p in (fleet / "transport").iterdir().__next__().glob("*.jsonl"))
    cfg = bench_config(work / "root")
    raw = yaml.safe_load((work / "root" / "ccs.yaml").read_text())
    (work / "events").mkdir(parents=True)
    raw["spark"]["conf"].update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{work / 'events'}",
                                 "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                                 **dict(kv.split("=", 1) for kv in args.conf)})
    raw.setdefault("pipeline", {})["deploy"] = False
    (work / "root" / "ccs.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(work / "root" / "ccs.yaml")
    lake = Path(cfg.settings.lake.root)
    spark = get_spark(cfg, "ccs-bench-stream-batch")
    sc = spark.sparkContext
    sc.setJobGroup("setup", "batch ingest of the first hour")
    ingest.run(spark, cfg, str(fleet), Window.hours(hours[0], hours[0]))
    segs = replay.segments(str(fleet), [hours[1]], minutes=args.batches)
    shutil.copytree(fleet / "reference", seg / "reference")
    ckpt = work / "checkpoint"
    ckpt.mkdir()
    (ckpt / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    job = StreamJob(spark, cfg, str(seg), str(ckpt), deploy=False, log=lambda m: None)
    by_minute: dict[int, list] = {}
    for s in segs:
        by_minute.setdefault(s.due_ms, []).append(s)
    batches = []
    for i, due in enumerate(sorted(by_minute)[: args.batches]):
        paths = [replay.write(s, str(seg)) for s in by_minute[due]]
        df = (spark.read.text(paths, wholetext=True)
              .select(F.regexp_replace("_metadata.file_path", "^file:(//)?", "").alias("uri"), "value"))
        sc.setJobGroup(f"batch-{i}", f"micro-batch {i}")
        load = round(os.getloadavg()[0], 2)
        before = delta_versions(lake)
        t0 = time.perf_counter()
        job.process(df, i)
        secs = time.perf_counter() - t0
        after = delta_versions(lake)
        info = job.batches[-1]
        batches.append({"batch": i, "files": len(paths), "lines": sum(len(s.lines) for s in by_minute[due]),
                        "seconds": round(secs, 3), "stages_s": info.get("stages_s"),
                        "lines_read": info.get("lines_read"), "accepted": info.get("accepted"),
                        "quarantined": info.get("quarantined"), "load_1m": load,
                        "delta_commits": {t: after[t] - before.get(t, -1) for t in sorted(after)
                                          if after[t] != before.get(t, -1)}})
    sc.setJobGroup("floor", "the commit floor")
    floor = commit_floor(spark, work / "floor", args.commit_floor) if args.commit_floor else None
    sc.setJobGroup("end", "")
    spark.stop()
    time.sleep(1)
    logs = sorted((work / "events").iterdir())
    groups = jobs_by_group(logs[0]) if logs else {}
    for b in batches:
        g = groups.get(f"batch-{b['batch']}", {})
        b["spark_jobs"] = g.get("jobs")
        b["jobs_wall_s"] = round(g.get("jobs_wall_s", 0.0), 3)
        b["driver_outside_jobs_s"] = round(b["seconds"] - b["jobs_wall_s"], 3)
        b["jobs_by_kind"] = dict(g.get("kinds", Counter()).most_common())
    warm = batches[1:]
    commits = median([sum(b["delta_commits"].values()) for b in warm])
    out = {"bench": "stream_batch", "cores": 2, "master": "local[2]", "nodes": args.nodes, "conf": args.conf,
           "conns_per_node_hour": args.conns, "batches": batches,
           "warm": {"batches": len(warm), "median_s": median([b["seconds"] for b in warm]),
                    "median_spark_jobs": median([b["spark_jobs"] or 0 for b in warm]),
                    "median_jobs_wall_s": median([b["jobs_wall_s"] for b in warm]),
                    "median_stages_s": {k: median([b["stages_s"][k] for b in warm if b["stages_s"] and k in b["stages_s"]])
                                        for k in ("bronze", "silver", "predictions", "table")},
                    "median_delta_commits": commits,
                    "balanced": all(b["lines_read"] == (b["accepted"] or 0) + (b["quarantined"] or 0) for b in warm)},
           # other engineers share the 2 cores: the 1-minute load average as each batch started
           "load_average_1m": [b["load_1m"] for b in batches]}
    if floor:
        out["commit_floor"] = {**floor, "warm_batch_commits": commits,
                               "commits_times_floor_s": round(commits * floor["replace_partition_median_s"], 2)}
    return result_file.finish(args.out, out, work, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
