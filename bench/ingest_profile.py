"""bench/ingest_profile: where batch ingest's time goes (issue 62). One Spark ingest (local[2], the
benches' configuration) of a simulated fleet's logs, with Spark's event log and Java's Flight
Recorder on: the wall time of bronze (parse, validate, the duplicate rule, bronze/quarantine/audit
Delta writes) and of silver; from the event log, every job and stage (its call site, wall time,
task time, CPU time, GC, bytes read, shuffled, spilled and written), summed by call site; from
the recording, the JVM's execution samples by top frame (self time) and by what the stack was
doing (inclusive, by the first category found walking down from the top frame).
Writes bench/results/ingest_profile.json.

    .venv/bin/python bench/ingest_profile.py [--conns 500000] [--workdir /tmp/ccs-ingest-profile] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import SIM_YIELD, bench_config  # noqa: E402
from bench import result_file  # noqa: E402
from ccselect.config import load_config  # noqa: E402
from ccselect.sim.params import SimParams  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, and our modules that load them.

#: what a JVM stack is doing, by the first frame (from the top) whose class name starts with one
#: of these: the order decides for a stack that has several
CATEGORIES = [
    ("our JSON scanner (JsonRecord/JsonPlain)", ("ccselect.udf.JsonRecord", "ccselect.udf.JsonPlain")),
    ("our line splitter (SplitLines)", ("ccselect.udf.SplitLines",)),
    ("our address parser (IpAddress)", ("ccselect.udf.IpAddress", "ccselect.udf.IsIp")),
    ("Jackson / from_json", ("com.fasterxml.jackson", "org.apache.spark.sql.catalyst.json")),
    ("compression (snappy/zstd/lz4)", ("org.xerial.snappy", "com.github.luben.zstd", "net.jpountz",
                                       "io.airlift.compress", "org.apache.parquet.hadoop.codec")),
    ("Parquet write", ("org.apache.parquet.column", "org.apache.parquet.hadoop.InternalParquetRecordWriter",
                       "org.apache.parquet.io", "org.apache.spark.sql.execution.datasources.parquet.ParquetWriteSupport")),
    ("Parquet read", ("org.apache.parquet", "org.apache.spark.sql.execution.datasources.parquet")),
    ("sort / spill", ("org.apache.spark.util.collection.unsafe.sort", "org.apache.spark.sql.execution.UnsafeExternalRowSorter",
                      "org.apache.spark.shuffle.sort")),
    ("shuffle", ("org.apache.spark.shuffle", "org.apache.spark.storage", "org.apache.spark.network")),
    ("UTF-8 / strings", ("org.apache.spark.unsafe.types.UTF8String", "java.lang.String", "java.lang.StringLatin1",
                         "java.lang.StringUTF16", "sun.nio.cs")),
    ("generated code (whole-stage codegen)", ("org.apache.spark.sql.catalyst.expressions.GeneratedClass",)),
    ("Spark SQL operators", ("org.apache.spark.sql",)),
    ("Delta", ("io.delta", "org.apache.spark.sql.delta")),
    ("file I/O", ("java.io", "sun.nio.ch", "java.nio", "org.apache.hadoop")),
]


def categorize(frames: list[str]) -> str:
    for frame in frames:
        for name, prefixes in CATEGORIES:
            if frame.startswith(prefixes):
                return name
    return "other"


def jfr_samples(jfr: Path) -> tuple[Counter, Counter, int]:
    """(self samples by top frame, inclusive samples by category, samples) of jdk.ExecutionSample."""
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64", str(jfr)],
                          capture_output=True, text=True, check=True).stdout
    top, cats, n = Counter(), Counter(), 0
    for event in text.split("jdk.ExecutionSample")[1:]:
        m = re.search(r"stackTrace = \[(.*?)\n\s*\]", event, re.S)
        if not m:
            continue
        frames = [re.sub(r"\s+line:.*$", "", f.strip()) for f in m.group(1).strip().splitlines()]
        frames = [f for f in frames if f and f != "..."]
        if not frames:
            continue
        n += 1
        top[frames[0].split("(")[0]] += 1
        cats[categorize(frames)] += 1
    return top, cats, n


def jfr_interpreted(jfr: Path) -> dict:
    """Of the execution samples' top frames: the share run by the interpreter (not JIT-compiled),
    and the interpreted methods with the most samples (a generated method over the JVM's
    HugeMethodLimit, 8000 bytes of bytecode, is never compiled while DontCompileHugeMethods is on)."""
    doc = json.loads(subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", "--stack-depth", "1",
                                     str(jfr)], capture_output=True, text=True, check=True).stdout)
    kinds, methods = Counter(), Counter()
    for e in doc["recording"]["events"]:
        frames = e["values"]["stackTrace"]["frames"] if e["values"].get("stackTrace") else []
        if not frames:
            continue
        f = frames[0]
        kinds[f["type"]] += 1
        if f["type"] == "Interpreted":
            methods[f["method"]["type"]["name"].replace("/", ".") + "." + f["method"]["name"]] += 1
    n = sum(kinds.values())
    return {"top_frame_kinds_share": {k: round(v / n, 3) for k, v in kinds.most_common()} if n else {},
            "interpreted_methods_share": {k: round(v / n, 3) for k, v in methods.most_common(5)} if n else {}}


def _event_lines(path: Path) -> list[str]:
    """The lines of an event log: a file, or Spark 4's rolling directory of (zstd-compressed) parts."""
    parts = sorted(p for p in path.rglob("events_*")) if path.is_dir() else [path]
    out = []
    for p in parts:
        text = (subprocess.run(["zstd", "-dc", str(p)], capture_output=True, text=True, check=True).stdout
                if p.suffix == ".zstd" else p.read_text())
        out += text.splitlines()
    return out


def _kind(description: str) -> str:
    d = description or ""
    if d.startswith("save at") or d.startswith("count at") or d.startswith("collect at"):
        return d.split(" at ")[0]
    if d.startswith("Delta: Compute snapshot"):
        return "Delta: compute snapshot"
    if "recordDeltaOperation" in d:
        return "Delta: operation bookkeeping"
    if "DeltaTableBuilder" in d:
        return "Delta: create table"
    return d.split(" at ")[0][:60]


def event_log(path: Path) -> dict:
    """Jobs and stages of a Spark event log, summed by what they were for: the root SQL execution's
    kind (save, count, a Delta snapshot, ...) and the lake table its plan names."""
    execs, jobs, stage_job, stages = {}, {}, {}, {}
    for line in _event_lines(path):
        e = json.loads(line)
        kind = e.get("Event", "")
        if kind.endswith("SQLExecutionStart"):
            tables = re.findall(r"lake/(\w+/\w+)", e.get("physicalPlanDescription", ""))
            execs[e["executionId"]] = {"root": e.get("rootExecutionId", e["executionId"]),
                                       "kind": _kind(e.get("description")), "table": tables[0].replace("/", ".") if tables else None}
        elif kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            eid = props.get("spark.sql.execution.id")
            infos = e.get("Stage Infos") or [{}]
            label = props.get("callSite.short") or infos[0].get("Stage Name", "?")
            if eid is not None and int(eid) in execs:
                ex = execs[int(eid)]
                root = execs.get(ex["root"], ex)
                label = f"{root['kind']} {root['table'] or ex['table'] or ''}".strip()
            jobs[e["Job ID"]] = {"start": e["Submission Time"], "label": label}
            for st in e.get("Stage IDs", []):
                stage_job[st] = e["Job ID"]
        elif kind == "SparkListenerJobEnd":
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", []) if "Name" in a}

            def num(key):
                try:
                    return int(acc.get(key) or 0)
                except (TypeError, ValueError):
                    return 0
            stages[(info["Stage ID"], info.get("Stage Attempt ID", 0))] = {
                "job": stage_job.get(info["Stage ID"]), "tasks": info["Number of Tasks"],
                "task_s": num("internal.metrics.executorRunTime") / 1000,
                "cpu_s": num("internal.metrics.executorCpuTime") / 1e9,
                "gc_s": num("internal.metrics.jvmGCTime") / 1000,
                "input_mb": num("internal.metrics.input.bytesRead") / 2 ** 20,
                "shuffle_write_mb": num("internal.metrics.shuffle.write.bytesWritten") / 2 ** 20,
                "spill_disk_mb": num("internal.metrics.diskBytesSpilled") / 2 ** 20,
                "output_mb": num("internal.metrics.output.bytesWritten") / 2 ** 20}
    by = defaultdict(lambda: defaultdict(float))
    for j in jobs.values():
        row = by[j["label"]]
        row["jobs"] += 1
        row["job_wall_s"] += (j.get("end", j["start"]) - j["start"]) / 1000
    for st in stages.values():
        row = by[jobs[st["job"]]["label"]] if st["job"] in jobs else by["?"]
        row["stages"] += 1
        row["tasks"] += st["tasks"]
        for k in ("task_s", "cpu_s", "gc_s", "input_mb", "shuffle_write_mb", "spill_disk_mb", "output_mb"):
            row[k] += st[k]
    starts = [j["start"] for j in jobs.values()]
    ends = [j.get("end", j["start"]) for j in jobs.values()]
    ranked = sorted(by.items(), key=lambda kv: -kv[1]["job_wall_s"])
    total = {k: round(sum(s[k] for s in stages.values()), 1) for k in ("task_s", "cpu_s", "gc_s", "spill_disk_mb")}
    return {"jobs": len(jobs), "stages": len(stages),
            "jobs_wall_s": round(sum((e - s) for s, e in zip(starts, ends)) / 1000, 1),
            "first_job_to_last_end_s": round((max(ends) - min(starts)) / 1000, 1) if jobs else 0, **total,
            "by_purpose": [{"what": k, **{m: round(v, 1) for m, v in row.items()}} for k, row in ranked[:20]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=500_000)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--workdir", default="/tmp/ccs-ingest-profile")
    ap.add_argument("--keep", action="store_true", help="keep the simulated logs (reused by the next run)")
    ap.add_argument("--java-opts", default="", help="more options for the driver's JVM (e.g. -XX:-DontCompileHugeMethods)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting for this run")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "ingest_profile.json"))
    args = ap.parse_args(argv)

    from ccselect.spark import get_spark
    from ccselect.jobs import ingest, silver as silver_job
    from ccselect.jobs.sources import discover_all
    from ccselect.sim.fleet import simulate

    work = Path(args.workdir)
    data = work / "logs"
    per = max(1, round(args.conns / (args.nodes * args.hours * SIM_YIELD)))
    params = SimParams(nodes=args.nodes, hours=args.hours, conns_per_node_hour=per, seed=17)
    marker = work / "logs.json"
    if not (marker.exists() and json.loads(marker.read_text()) == params.to_dict()):
        shutil.rmtree(work, ignore_errors=True)
        simulate(params, str(data), workers=2, progress=False)
        marker.write_text(json.dumps(params.to_dict(), default=str))
    for d in ("root", "events", "jfr"):
        shutil.rmtree(work / d, ignore_errors=True)
        (work / d).mkdir(parents=True)
    input_bytes = sum(f.stat().st_size for s in ("transport", "access", "qoe") for f in (data / s).rglob("*.jsonl"))
    lines = sum(sum(1 for _ in f.open("rb")) for s in ("transport", "access", "qoe") for f in (data / s).rglob("*.jsonl"))

    cfg = bench_config(work / "root")
    raw = yaml.safe_load((work / "root" / "ccs.yaml").read_text())
    jfr = work / "jfr" / "ingest.jfr"
    raw["spark"]["conf"].update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{work / 'events'}",
                                 "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
                                 "spark.driver.extraJavaOptions":
                                     " ".join([raw["spark"]["conf"].get("spark.driver.extraJavaOptions", ""),
                                               "-XX:StartFlightRecording=name=ingest,settings=profile", args.java_opts]).strip(),
                                 **dict(kv.split("=", 1) for kv in args.conf)})
    (work / "root" / "ccs.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(work / "root" / "ccs.yaml")

    load = {"start": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    spark = get_spark(cfg, "ccs-ingest-profile")
    session_s = time.perf_counter() - t0
    files, _ = discover_all(str(data), None, cfg=cfg)
    load["bronze_start"] = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    streams = ingest.ingest_bronze(spark, cfg, files)
    bronze_s = time.perf_counter() - t0
    load["silver_start"] = round(os.getloadavg()[0], 2)
    keys = {(f.node_id, f.hour) for f in files if f.stream == "transport"}
    t0 = time.perf_counter()
    silver_rows = silver_job.run(spark, cfg, keys, str(data))
    silver_s = time.perf_counter() - t0
    load["end"] = round(os.getloadavg()[0], 2)
    # the recording, dumped from the running JVM (the driver's JVM lives as long as this process)
    for child in psutil.Process().children(recursive=True):
        if "java" in child.name():
            subprocess.run(["jcmd", str(child.pid), "JFR.dump", "name=ingest", f"filename={jfr}"], capture_output=True)
    spark.stop()
    logs = sorted((work / "events").iterdir())
    ev = event_log(logs[0]) if logs else {}
    top, cats, n = jfr_samples(jfr) if jfr.exists() else (Counter(), Counter(), 0)
    conns = sum(1 for f in (data / "transport").rglob("*.jsonl") for _ in f.open("rb"))
    out = {
        "bench": "ingest_profile", "cores": 2, "master": "local[2]", "connections": conns, "lines": lines,
        "driver_java_options": raw["spark"]["conf"]["spark.driver.extraJavaOptions"], "conf": args.conf,
        "input_mb": round(input_bytes / 2 ** 20, 1), "files": len(files),
        "seconds": {"session": round(session_s, 1), "bronze": round(bronze_s, 1), "silver": round(silver_s, 1),
                    "ingest": round(bronze_s + silver_s, 1)},
        "lines_per_s": round(lines / (bronze_s + silver_s)), "silver_rows": silver_rows,
        "streams": {s: {k: v for k, v in d.items() if k != "by_reason"} for s, d in streams.items()},
        "event_log": ev,
        "jfr": {"samples": n,
                "inclusive_share": {k: round(v / n, 3) for k, v in cats.most_common()} if n else {},
                "top_frames_share": {k: round(v / n, 3) for k, v in top.most_common(15)} if n else {},
                **(jfr_interpreted(jfr) if n else {})},
        # Other engineers' work shares the 2 cores: the 1-minute load average at each point
        "load_average_1m": load,
    }
    return result_file.finish(args.out, out, work, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
