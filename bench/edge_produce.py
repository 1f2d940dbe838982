"""The edge's cost per transport record (issue 60): the agent writing its segment files, against the
agent producing the same records to Kafka itself (librdkafka from Debian, in-process), against the
Python shipper beside the agent (export/edge/shipper.py) reading the rotated segments and producing
them. Writes bench/results/edge_produce.json (docs/results/edge-produce.md by bench/report.py).

- The records: a simulated fleet's transport stream (default: the default emulation fleet's rate,
  12 nodes x 1,500 connections a node-hour, seed 7, `--hours`), cut into the agent's one-minute
  segments (sim/replay.py, as the agent names and fills them). The same bytes go to every mode.
- (a) `write`: bench/edge_produce.c replays export/edge/translog.c's write path on those bytes (the
  same calls in the same order: a 64 KiB buffer per file, pwrite, fdatasync after each drain of
  the ring, fsync + rename + folder fsync at the segment's end). Twice: one drain per segment (the
  fewest syncs) and one drain per record (the agent at a fleet's real rate: a 200 ms drain holds
  at most one of a node's records, 1,500 a node-hour being one every 2.4 s).
- (b) `produce`: bench/edge_produce.c with librdkafka producing every record in-process:
  idempotent, acks=all, the shipper's settings, key and headers; until every record is acknowledged.
- (c) the shipper: `Shipper.ship()` over each node's folder of segments (an edge's shipper sees its
  own node's files only; a fresh state: it sends all) in this process, then its flush; CPU of the
  process (librdkafka's threads included) around it. Also over the same records as hourly files
  (one a node-hour: the layout of the shipper's first measurement, bench/kafka_transport.py).
- Paced (`--pace-ms`, `--paced-records`): (a) with a drain per record and (b), a record every
  200 ms: the cost of a record arriving alone. The shipper has no paced mode here (it reads
  files a pass at a time).

CPU time per record = (user + sys) of the process over the mode / records (getrusage; the C
program takes off what reading its input cost); wall too. `--rounds` rounds, the modes interleaved
in each; medians. One broker (topology/kafka.py) for the whole run, started and stopped here.

Run (root not needed): .venv/bin/python bench/edge_produce.py [--rounds 3] [--fleet DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import result_file  # noqa: E402
# Imported inside the functions that use them: topology.kafka and export.edge.shipper (confluent_kafka).

BINARY = REPO / "export" / "build" / "edge-produce"


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO), str(BINARY.relative_to(REPO))], check=True)


def fleet_hours(fleet: str, n: int | None) -> list[str]:
    from ccselect.jobs.sources import discover
    hours = sorted({f.hour for f in discover(fleet, streams=("transport",))})
    return hours[:n] if n else hours


def segments(fleet: str, hours: list[str], work: Path) -> tuple[Path, int]:
    """The fleet's transport records as the agent's segments, each node's under
    work/nodes/<node_id> (an edge's folder: the shipper's root there), and a manifest of them for
    the C program; → (manifest, records)."""
    from ccselect.sim import replay
    root = work / "nodes"
    shutil.rmtree(root, ignore_errors=True)
    rows, n = [], 0
    for s in replay.segments(fleet, hours):
        if s.stream != "transport":
            continue
        path = replay.write(s, str(root / s.node_id))
        rows.append(f"{s.node_id}\t{s.name}\t{path}\n")
        n += len(s.lines)
    manifest = work / "manifest.tsv"
    manifest.write_text("".join(rows))
    return manifest, n


def paced_manifest(manifest: Path, records: int, work: Path) -> tuple[Path, int]:
    """The first segments of the manifest, cut to `records` records in all (one segment file of
    that many lines at most)."""
    out_dir = work / "paced"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    rows, n = [], 0
    for line in manifest.read_text().splitlines():
        node, name, path = line.split("\t")
        lines = Path(path).read_text().splitlines(keepends=True)[:records - n]
        p = out_dir / f"{node}-{name}"
        p.write_text("".join(lines))
        rows.append(f"{node}\t{name}\t{p}\n")
        n += len(lines)
        if n >= records:
            break
    m = work / "paced.tsv"
    m.write_text("".join(rows))
    return m, n


def run_c(*args: str) -> dict:
    r = subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"edge-produce {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def per_record(got: dict) -> dict:
    n = got["records"]
    got["cpu_us_per_record"] = round((got["user_s"] + got["sys_s"]) / n * 1e6, 3)
    got["wall_us_per_record"] = round(got["wall_s"] / n * 1e6, 3)
    if "setup_user_s" in got:    # a producer: without its setup (paid once by a long-running agent or shipper)
        got["cpu_us_per_record_after_setup"] = round(
            (got["user_s"] + got["sys_s"] - got["setup_user_s"] - got["setup_sys_s"]) / n * 1e6, 3)
    return got


def shipper(roots: list[Path], bootstrap: str, state: Path, mode: str) -> dict:
    """The Python shipper in this process, one pass over each root (each with a fresh state, as
    one edge's shipper over its folder); (user, sys) of the process summed over the roots, and
    the producers' setup (created and connected) apart."""
    from ccselect.export.edge.shipper import Shipper
    tot = {"mode": mode, "roots": len(roots), "records": 0, "user_s": 0.0, "sys_s": 0.0, "wall_s": 0.0,
           "setup_user_s": 0.0, "setup_sys_s": 0.0, "setup_wall_s": 0.0}
    for i, root in enumerate(roots):
        st = state.with_name(f"{state.stem}-{i}.json")
        st.unlink(missing_ok=True)
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        sh = Shipper(str(root), bootstrap, state=str(st), streams=("transport",))
        sh.producer.list_topics(timeout=30)         # connected: as the C producer's setup
        rs, ws = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        tot["records"] += sh.ship()["sent"]
        sh.close()
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        tot["user_s"] += r1.ru_utime - r0.ru_utime
        tot["sys_s"] += r1.ru_stime - r0.ru_stime
        tot["wall_s"] += w1 - w0
        tot["setup_user_s"] += rs.ru_utime - r0.ru_utime
        tot["setup_sys_s"] += rs.ru_stime - r0.ru_stime
        tot["setup_wall_s"] += ws - w0
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in tot.items()}


def hourly_root(fleet: str, hours: list[str], work: Path) -> Path:
    """The same records as the fleet's hourly transport files (one a node-hour), the layout the
    shipper's first measurement shipped (bench/kafka_transport.py)."""
    root = work / "hourly"
    for h in hours:
        for src in Path(fleet, "transport").glob(f"*/{h}.jsonl"):
            dst = root / "transport" / src.parent.name / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--conns-per-node-hour", type=int, default=1500)
    ap.add_argument("--hours", type=int, default=2)
    ap.add_argument("--fleet", help="an already simulated fleet's folder (its transport stream)")
    ap.add_argument("--fleet-hours", type=int, help="only the first N hours of --fleet (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pace-ms", type=int, default=200)
    ap.add_argument("--paced-records", type=int, default=50)
    ap.add_argument("--workdir", default="/tmp/ccs-bench-edge-produce")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "edge_produce.json"))
    args = ap.parse_args(argv)
    from ccselect.topology.kafka import Broker
    build()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fleet = args.fleet
    if not fleet:
        from ccselect.sim.fleet import simulate
        from ccselect.sim.params import SimParams
        fleet = str(work / "fleet")
        simulate(SimParams(nodes=args.nodes, hours=args.hours, conns_per_node_hour=args.conns_per_node_hour, seed=7),
                 fleet, workers=2, progress=False)
    hours = fleet_hours(fleet, args.fleet_hours)
    manifest, records = segments(fleet, hours, work)
    nodes = sorted(p for p in (work / "nodes").iterdir())
    hourly = hourly_root(fleet, hours, work)
    paced, paced_n = paced_manifest(manifest, args.paced_records, work)
    broker = Broker(work / "kafka")
    broker.up(log=lambda m: print(m, file=sys.stderr))
    bs = broker.bootstrap()
    result = {"bench": "edge_produce", "command": " ".join(["python", "bench/edge_produce.py", *sys.argv[1:]]),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_start": load_avg(),
              "fleet": {"folder": fleet if args.fleet else None, "nodes": len(nodes),
                        "conns_per_node_hour": None if args.fleet else args.conns_per_node_hour, "hours": hours,
                        "seed": None if args.fleet else 7},
              "records": records, "segments": len(manifest.read_text().splitlines()),
              "librdkafka_python": confluent_kafka.libversion()[0], "rounds": []}
    modes = {
        "write_drain_per_segment": lambda r: run_c("write", str(manifest), str(work / f"out-seg-{r}"), "--drain", "0"),
        "write_drain_per_record": lambda r: run_c("write", str(manifest), str(work / f"out-rec-{r}"), "--drain", "1"),
        "librdkafka_produce": lambda r: run_c("produce", str(manifest), bs),
        "python_shipper": lambda r: shipper(nodes, bs, work / f"state-{r}.json", "shipper"),
        "python_shipper_hourly_files": lambda r: shipper([hourly], bs, work / f"state-hourly-{r}.json",
                                                         "shipper_hourly"),
        "paced_write_drain_per_record": lambda r: run_c("write", str(paced), str(work / f"out-paced-{r}"),
                                                        "--drain", "1", "--pace-ms", str(args.pace_ms)),
        "paced_librdkafka_produce": lambda r: run_c("produce", str(paced), bs, "--pace-ms", str(args.pace_ms)),
    }
    try:
        for r in range(args.rounds):
            names = list(modes)
            names = names[r % len(names):] + names[:r % len(names)]     # a different mode first each round
            got = {"round": r, "order": names, "load_avg": load_avg()}
            for name in names:
                got[name] = per_record(modes[name](r))
                print(json.dumps({name: got[name]}), file=sys.stderr, flush=True)
                shutil.rmtree(work / f"out-seg-{r}", ignore_errors=True)
                shutil.rmtree(work / f"out-rec-{r}", ignore_errors=True)
            got["load_avg_end"] = load_avg()
            result["rounds"].append(got)
    finally:
        broker.down()
    med = {name: {k: statistics.median(g[name][k] for g in result["rounds"])
                  for k in ("cpu_us_per_record", "cpu_us_per_record_after_setup", "wall_us_per_record")
                  if k in result["rounds"][0][name]} for name in modes}
    for name in modes:
        med[name]["records"] = result["rounds"][0][name]["records"]
    result["median"] = med
    result["librdkafka_c"] = result["rounds"][0]["librdkafka_produce"].get("librdkafka")
    base = med["write_drain_per_segment"]["cpu_us_per_record"]
    result["shipper_over_librdkafka_cpu"] = round(med["python_shipper"]["cpu_us_per_record"] /
                                                  med["librdkafka_produce"]["cpu_us_per_record"], 2)
    result["over_writing_the_segment_cpu"] = {
        "librdkafka_produce": round(med["librdkafka_produce"]["cpu_us_per_record"] / base, 2),
        "python_shipper": round(med["python_shipper"]["cpu_us_per_record"] / base, 2)}
    result["paced_records"] = paced_n
    result["pace_ms"] = args.pace_ms
    result["load_avg_end"] = load_avg()
    result["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["page_markdown"] = page(result, list(modes))
    return result_file.finish(args.out, result, work, args.keep)


def page(result: dict, names: list[str]) -> str:
    """The summary the results page shows first: per mode, each round and the median."""
    rounds = result["rounds"]
    out = [f"{result['records']:,} transport records in {result['segments']:,} one-minute segments "
           f"(paced modes: {result['paced_records']} records, one every {result['pace_ms']} ms). "
           f"librdkafka {result['librdkafka_c']} (Debian) in the C producer, "
           f"{result['librdkafka_python']} (confluent-kafka's wheel) in the shipper. "
           f"Load average at each round's start: "
           + "; ".join(f"round {g['round']}: {g['load_avg']}" for g in rounds) + ".", "",
           "| mode | CPU µs/record, per round | median | median without the producer's setup | wall µs/record (median) |",
           "|---|---|---|---|---|"]
    for n in names:
        m = result["median"][n]
        per = " / ".join(f"{g[n]['cpu_us_per_record']:.2f}" for g in rounds)
        after = f"{m['cpu_us_per_record_after_setup']:.2f}" if "cpu_us_per_record_after_setup" in m else ""
        out.append(f"| {n} | {per} | {m['cpu_us_per_record']:.2f} | {after} | {m['wall_us_per_record']:.1f} |")
    out += ["", f"CPU per record, Python shipper / librdkafka in the agent: {result['shipper_over_librdkafka_cpu']}x; "
            f"against writing the segment (one drain per segment): librdkafka "
            f"{result['over_writing_the_segment_cpu']['librdkafka_produce']}x, shipper "
            f"{result['over_writing_the_segment_cpu']['python_shipper']}x."]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
