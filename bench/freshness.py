"""Freshness and throughput of the stream on the real path (issue 26): writes
bench/results/freshness.json and prints it.

A simulated fleet (default: the default emulation fleet's rate, 12 nodes × 1,500 connections an
hour, seed 7) is simulated for `--hours`; all but the last hour are batch-ingested, a champion is
trained on them (flows.pipeline: training set, train, promote) and they are scored, as the hourly
DAG would have left the lake. Then the last hour is replayed into the agent's rotated layout
(one-minute segments, renamed into place when their minute is over) at `--speed` × real time,
while `ccs stream` runs as a service (its own process) deploying every table it emits to a real
enforcer (a one-node fleet: ccs-edge attached to its own cgroup; needs root and BPF). A thread
polls the enforcer (`ccs-edge status`) and notes when each version became live in the kernel.

Freshness of a connection: from the moment its record was logged (its close, on the replay's
clock) to the moment the first table built from a window holding it, with an entry covering its
address, was live in the kernel; p50/p90/p99 over the connections of `--minutes` of traffic
(those closing after the last boundary the stream could still build are counted as censored).
The goal scales with the replay: p99 ≤ 2 × trigger + 60 s, the trigger being `stream.table_minutes`
of traffic, i.e. table_minutes × 60 / speed seconds of wall time.

Throughput: a second replay at `--throughput-speed` (default 10× real time): rows a second the
stream ingested, scored and aggregated, and each micro-batch's lag (segment written → its rows
in the lake), from the stream's own per-batch log.

`--source kafka` (issue 60), or `--source both` (the two sources interleaved, `--rounds` times, in
one sitting; bench/results/freshness_kafka.json): the same replay, but the shipper
(export/edge/shipper.py `--follow`, beside the agent's segments as on an edge) publishes the
segments to a broker this bench starts and stops (topology/kafka.py, one per phase: its topics
start empty), and `ccs stream --source kafka` reads the broker. The freshness is measured the same
way (record logged -> an entry covering it live in the kernel); after the replay the stream runs on
until it has caught up (every record offered read, and the table of the last boundary the records
allow live in the kernel, or none to wait for), at most `--tail-cap` seconds (the result's `tail`
says which ended it), and each node's version floor is removed between phases (`forget_floor`).
The sustained rate: a backlog of
`--backlog-minutes` of the replayed hour made available at once (every segment written; for
Kafka, shipped to the broker before the stream starts), then the time until the stream's batches
have read every record, against the fleet's real-time rate (the same records over their minutes).

Run (root): .venv/bin/python bench/freshness.py [--speed 3 --minutes 30] [--source both --rounds 1]
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, and our modules that load it, torch or mlflow.



def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return round(xs[i], 3)


def replay_segments(segs, out: str, t0_ms: int, speed: float, start: float, stop: threading.Event) -> None:
    """Write each segment when its minute is over on the replay's clock, as the agent does."""
    from ccselect.sim import replay
    for seg in segs:
        due = start + (seg.due_ms - t0_ms) / 1000 / speed
        while not stop.is_set() and time.time() < due:
            time.sleep(min(0.05, max(0.0, due - time.time())))
        if stop.is_set():
            return
        replay.write(seg, out)


def poll_live(agent, seen: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            t = (agent.status().get("table") or {})
            v = t.get("version")
            if v is not None and v not in seen:
                seen[int(v)] = time.time()
        except Exception:  # noqa: BLE001 — not attached yet
            pass
        stop.wait(0.25)


_INDEX: dict[int, dict] = {}


def covers(table, ip: str) -> bool:
    """Has `table` an entry covering `ip` (longest-prefix match finds one)? By the ladder's few
    prefix lengths, indexed once per table."""
    idx = _INDEX.get(id(table))
    if idx is None:
        idx = _INDEX[id(table)] = {}
        for e in table.entries:
            idx.setdefault((e.family, e.prefix.prefixlen), set()).add(int(e.prefix.network_address))
    a = ipaddress.ip_address(ip)
    if a.version == 6 and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    bits = 32 if a.version == 4 else 128
    n = int(a)
    return any(n >> (bits - plen) << (bits - plen) in nets for (fam, plen), nets in idx.items() if fam == a.version)


def start_stream(config: str, input_dir: str, log_path: str, bootstrap: str | None = None) -> subprocess.Popen:
    """`ccs stream` as a service (its own process), deploying to the fleet; stderr is its log.
    With `bootstrap`, `--source kafka` from that broker (`input_dir` then only holds the reference)."""
    err = open(log_path, "w")
    kafka = ["--source", "kafka", "--bootstrap", bootstrap] if bootstrap else []
    return subprocess.Popen([sys.executable, "-m", "ccselect.app.cli", "stream", "--input", input_dir, "--deploy", *kafka],
                            cwd=REPO, env={**os.environ, "CCS_CONFIG": config}, stdout=subprocess.DEVNULL,
                            stderr=err)


def shipper_cmd(root: str, bootstrap: str, follow: float | None) -> list[str]:
    return [sys.executable, "-m", "ccselect.export.edge.shipper", "--root", root, "--bootstrap", bootstrap,
            *(["--follow", str(follow)] if follow else [])]


def reap(proc: subprocess.Popen, timeout: float = 180) -> dict:
    """Wait for `proc` (SIGKILL after `timeout`); → its exit status and CPU seconds (os.wait4's
    rusage: its own, with the threads of librdkafka inside it)."""
    deadline = time.time() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.time() > deadline:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "cpu_user_s": round(ru.ru_utime, 3), "cpu_sys_s": round(ru.ru_stime, 3)}


def batches_of(log_path: str) -> list[dict]:
    out = []
    for line in open(log_path):
        if line.startswith("stream: {"):
            out.append(json.loads(line[len("stream: "):]))
    return out


#: flows/stream.py table_step's reason for building no table at a boundary already built
NOT_PAST = "not past the last table's boundary"


def last_boundary(segs, step_ms: int) -> int | None:
    """The last table boundary the replayed records let the stream build (flows/stream.py
    table_step: the newest accepted transport record's close, down to its `table_minutes`)."""
    newest = None
    for sg in segs:
        if sg.stream != "transport":
            continue
        for line in sg.lines:
            try:
                ts = int(json.loads(line)["ts_end_ms"])
            except (ValueError, KeyError, TypeError):
                continue
            newest = ts if newest is None else max(newest, ts)
    return None if newest is None else newest // step_ms * step_ms


def caught_up(batches: list[dict], records: int, boundary: int | None, live: dict) -> dict:
    """Has the stream read every record offered (its batches' lines_read) and has the table step
    of the last boundary (`last_boundary`) finished: a table built for it live in the kernel
    (`live`: versions the poller saw), or none to wait for (not built: under stream.min_change;
    its rollout refused or failed)? → {"drained", "last_table"} with the reason."""
    read = sum(b.get("lines_read", 0) for b in batches)
    out = {"lines_read": read, "drained": read >= records, "last_table": None}
    if boundary is None:
        out["last_table"] = "no transport record"
        return out
    for b in batches:
        t = b.get("table") or {}
        if t.get("boundary") is None or t["boundary"] < boundary or t.get("why") == NOT_PAST:
            continue        # (NOT_PAST: an earlier batch's table step built this boundary's)
        if not t.get("built"):
            out["last_table"] = f"not built: {t.get('why')}"
        elif int(t["version"]) in live:
            out["last_table"] = f"version {t['version']} live"
        elif "refused" in (t.get("rollout") or {}) or "failed" in (t.get("rollout") or {}):
            out["last_table"] = f"version {t['version']} not rolled out"
    return out


def phase(name: str, cfg_path: str, cfg, fleet: str, hour: str, minutes: int, speed: float, work: Path,
          agent, fresh: bool, bootstrap: str | None = None, ship_every: float = 1.0,
          tail_cap_s: float | None = None) -> dict:
    """One replay. After it the stream runs on until it has caught up (`caught_up`: every record
    offered read, the last boundary's table live in the kernel), at most `tail_cap_s` after the
    replay's end (None: a fixed tail of one trigger + 90 s, as before issue 60's Kafka runs)."""
    from ccselect.export.artifact import signing
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.tables import aggregate
    from ccselect.hours import hour_start_ms
    from ccselect.spark import get_spark
    from pyspark.sql import functions as F

    inp = work / f"replay-{name}"
    shutil.rmtree(inp, ignore_errors=True)
    (inp).mkdir(parents=True)
    shutil.copytree(os.path.join(fleet, "reference"), inp / "reference")
    from ccselect.sim import replay
    segs = replay.segments(fleet, [hour], minutes=minutes)
    t0_ms = hour_start_ms(hour)
    table_s = cfg.settings.stream.table_minutes * 60 / speed
    tail_s = table_s + 90             # the last boundary's table: built, signed, rolled out
    log_path = str(work / f"stream-{name}.log")
    load_start = load_avg()
    proc = start_stream(cfg_path, str(inp), log_path, bootstrap)
    shipper = None
    if bootstrap:                     # the edge's shipper beside the agent's segments
        shipper = subprocess.Popen(shipper_cmd(str(inp), bootstrap, ship_every), cwd=REPO,
                                   stdout=open(work / f"shipper-{name}.log", "w"), stderr=subprocess.STDOUT)
    time.sleep(25)                    # the service's Spark session starts before the traffic does
    stop = threading.Event()
    live: dict[int, float] = {}
    poller = threading.Thread(target=poll_live, args=(agent, live, stop), daemon=True)
    poller.start()
    start = time.time() + 1
    writer = threading.Thread(target=replay_segments, args=(segs, str(inp), t0_ms, speed, start, stop), daemon=True)
    writer.start()
    writer.join()
    replay_end = time.time()
    tail = {"cap_s": tail_cap_s}
    if tail_cap_s is None:
        time.sleep(tail_s)
    else:
        records = sum(len(sg.lines) for sg in segs)
        boundary = last_boundary(segs, cfg.settings.stream.table_minutes * 60_000)
        tail.update({"records": records, "last_boundary_ms": boundary})
        while True:
            got = caught_up(batches_of(log_path), records, boundary, live)
            if (got["drained"] and got["last_table"]) or time.time() - replay_end > tail_cap_s or proc.poll() is not None:
                break
            time.sleep(2)
        tail.update(got)
        tail["capped"] = not (got["drained"] and got["last_table"])
    tail["waited_s"] = round(time.time() - replay_end, 1)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
    stop.set()
    poller.join()
    shipped = None
    if shipper is not None:
        shipper.send_signal(signal.SIGTERM)
        shipped = reap(shipper, 30)
    batches = batches_of(log_path)
    rows = sum(b.get("lines_read", 0) for b in batches)
    busy = sum(b.get("seconds", 0) for b in batches if b.get("files"))
    lags = [b["lag_s"]["oldest"] for b in batches if "lag_s" in b]
    # the service's first micro-batch with data pays for its JVM's warm-up (JIT, first Delta
    # snapshots); a long-lived service pays it once
    data = [b for b in batches if b.get("files")]
    warm_rows = sum(b.get("lines_read", 0) for b in data[1:])
    warm_busy = sum(b.get("seconds", 0) for b in data[1:])
    warm_since = data[0]["ended_unix"] if data else None
    out = {"speed": speed, "minutes": minutes, "segments": len(segs), "batches": len(batches),
           "lines": rows, "busy_s": round(busy, 1),
           "rows_per_s_busy": round(rows / busy) if busy else None,
           "rows_per_s_busy_after_first_batch": round(warm_rows / warm_busy) if warm_busy else None,
           "first_batch_s": data[0]["seconds"] if data else None,
           "per_batch": [{k: b.get(k) for k in ("batch", "files", "lines_read", "seconds", "stages_s", "lag_s")}
                         for b in data],
           "offered_rows_per_s": round(sum(len(x.lines) for x in segs) / (minutes * 60 / speed)),
           "lag_s": {"p50": pct(lags, 50), "p99": pct(lags, 99), "max": max(lags) if lags else None},
           "load_avg_start": load_start, "load_avg_end": load_avg(), "tail": tail}
    if shipper is not None:
        out["source"] = "kafka"
        out["shipper"] = {"follow_s": ship_every, **shipped}
    else:
        out["source"] = "file"
    if not fresh:
        return out
    # freshness per connection: first live version whose window holds it and covers its address
    spark = get_spark(cfg, "bench-freshness")
    _, pub = key_paths(cfg)
    tables = []
    for r in aggregate.history(spark, cfg):
        h = json.loads(r["hours"])
        if "to_ms" in h and r["version"] in live:
            _, t = signing.read_manifest(r["manifest_path"], signing.load_public_key(pub))
            tables.append((h["to_ms"], live[r["version"]], t))
    tables.sort(key=lambda x: x[0])
    conns = (spark.read.format("delta").load(os.path.join(cfg.settings.lake.root, "silver", "connections"))
             .where((F.col("hour") == hour) & (F.col("ts_end_ms") < t0_ms + minutes * 60_000))
             .select("client_ip", "ts_end_ms").toPandas())
    lat, lat_warm, censored, uncovered = [], [], 0, 0
    for ip, ts in zip(conns["client_ip"], conns["ts_end_ms"]):
        logged = start + (int(ts) - t0_ms) / 1000 / speed
        cands = [(live_t, t) for to_ms, live_t, t in tables if to_ms >= ts]
        if not cands:
            censored += 1
            continue
        hit = next((live_t for live_t, t in cands if covers(t, ip)), None)
        if hit is None:
            uncovered += 1
            continue
        lat.append(hit - logged)
        if warm_since is not None and logged >= warm_since:
            lat_warm.append(hit - logged)
    goal = 2 * table_s + 60
    out.update({"connections": len(conns), "measured": len(lat), "censored_after_last_table": censored,
                "never_covered": uncovered, "tables_live": len(tables),
                "trigger_wall_s": round(table_s, 1),
                "freshness_s": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "max": pct(lat, 100)},
                "freshness_s_after_first_batch": {"connections": len(lat_warm), "p50": pct(lat_warm, 50),
                                                  "p99": pct(lat_warm, 99)},
                "goal_p99_s": round(goal, 1), "meets_goal": bool(lat) and pct(lat, 99) <= goal,
                "live_since_replay_start_s": {str(v): round(t - start, 1) for v, t in sorted(live.items())}})
    return out


def backlog(name: str, cfg_path: str, fleet: str, hour: str, minutes: int, work: Path,
            bootstrap: str | None, timeout_s: float) -> dict:
    """The sustained rate: `minutes` of the hour's records made available at once (every segment
    written; with `bootstrap`, shipped to the broker too, before the stream starts), then `ccs
    stream` started, and timed until its batches have read every record (lines_read summed)."""
    from ccselect.sim import replay
    inp = work / f"backlog-{name}"
    shutil.rmtree(inp, ignore_errors=True)
    inp.mkdir(parents=True)
    shutil.copytree(os.path.join(fleet, "reference"), inp / "reference")
    segs = replay.segments(fleet, [hour], minutes=minutes)
    records = sum(len(s.lines) for s in segs)
    by_stream: dict[str, int] = {}
    for sg in segs:
        by_stream[sg.stream] = by_stream.get(sg.stream, 0) + len(sg.lines)
    t0 = time.time()
    for sg in segs:
        replay.write(sg, str(inp))
    out = {"source": "kafka" if bootstrap else "file", "minutes": minutes, "segments": len(segs),
           "records": records, "records_by_stream": by_stream, "write_s": round(time.time() - t0, 2),
           "load_avg_start": load_avg()}
    if bootstrap:
        t = time.time()
        sh = subprocess.Popen(shipper_cmd(str(inp), bootstrap, None), cwd=REPO,
                              stdout=open(work / f"shipper-{name}.log", "w"), stderr=subprocess.STDOUT)
        out["shipper"] = {**reap(sh, 900), "wall_s": round(time.time() - t, 2)}
        out["shipper"]["cpu_us_per_record"] = round(
            (out["shipper"]["cpu_user_s"] + out["shipper"]["cpu_sys_s"]) / records * 1e6, 2)
        if out["shipper"]["rc"] != 0:
            raise RuntimeError(f"the shipper failed: {(work / f'shipper-{name}.log').read_text()[-2000:]}")
    log_path = str(work / f"stream-{name}.log")
    started = time.time()
    proc = start_stream(cfg_path, str(inp), log_path, bootstrap)
    read, batches = 0, []
    try:
        while time.time() - started < timeout_s and proc.poll() is None:
            time.sleep(2)
            batches = batches_of(log_path)
            read = sum(b.get("lines_read", 0) for b in batches)
            if read >= records:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
    batches = batches_of(log_path)
    data = [b for b in batches if b.get("files")]
    read = sum(b.get("lines_read", 0) for b in batches)
    realtime = records / (minutes * 60)
    out.update({"batches": len(data), "lines_read": read, "drained": read >= records,
                "per_batch": [{k: b.get(k) for k in ("batch", "files", "lines_read", "seconds", "stages_s", "lag_s")}
                              for b in data],
                "fleet_realtime_records_per_s": round(realtime, 2), "load_avg_end": load_avg()})
    if data and read >= records:
        end = data[-1]["ended_unix"]
        first_start = data[0]["ended_unix"] - data[0]["seconds"]
        # from the stream's launch (its JVM and Spark session included), and from its first
        # micro-batch's start (a long-lived service has its session already)
        for key, since in (("from_launch", started), ("from_first_batch", first_start)):
            drain = end - since
            out[f"drain_s_{key}"] = round(drain, 1)
            out[f"records_per_s_{key}"] = round(records / drain, 1)
            out[f"x_realtime_{key}"] = round(records / drain / realtime, 1)
        out["meets_goal_10x_from_first_batch"] = records / (end - first_start) / realtime >= 10
    return out


def forget_floor(fleet) -> None:
    """Remove each node's version floor (`<state_dir>/version-floor.json`, export/edge/floor.c).
    Every phase replays table versions from a copy of the same lake (1, 2, ... again, other bytes),
    which the version rule refuses as replays (export/edge/table_rule.c: "older than", "loaded here
    before with another sha256") on an enforcer that keeps its floor through `detach --purge`:
    this bench's one-node enforcer is a throwaway one, started afresh per phase."""
    for node in fleet.nodes:
        if node.config.state_dir:
            path = os.path.join(node.config.state_dir, "version-floor.json")
            if os.path.exists(path):
                os.remove(path)


def measure_sources(args, work: Path, fleet: str, setup: dict) -> int:
    """--source kafka|both: per round, the freshness replay for each source (interleaved), then
    the backlog for each; every phase on its own copy of the lake, checkpoint, table store and
    (Kafka) broker, with the enforcer detached and attached again between phases (its live
    table gone: table versions start again from the same lake)."""
    from ccselect.flows.pipeline import fleet_and_store_for
    from ccselect.config import load_config
    from ccselect.export.edge.probe import ensure_attached, teardown
    from ccselect.topology.kafka import Broker
    sources = ["kafka", "file"] if args.source == "both" else [args.source]
    replay_hour = setup["replay_hour"]
    base = work / "root"
    result = {"bench": "freshness_kafka", "load_avg_start": load_avg(), "setup_s": setup["setup_s"],
              "command": " ".join(["python", "bench/freshness.py", *sys.argv[1:]]),
              "fleet": {"nodes": args.nodes, "conns_per_node_hour": args.conns_per_node_hour, "seed": 7,
                        "replayed_hour": replay_hour, "trained_on": setup["trained_on"],
                        "model_version": setup["model_version"]},
              "sources": sources, "rounds": args.rounds, "freshness": [], "backlog": []}

    def fresh_cfg(name: str):
        raw = json.loads(json.dumps(setup["raw"]))
        for sub in (f"lake-{name}", f"export-{name}"):
            shutil.rmtree(base / sub, ignore_errors=True)
        shutil.copytree(base / "lake", base / f"lake-{name}")
        raw["lake"] = {"root": str(base / f"lake-{name}")}
        raw["export"] = {**raw["export"], "out": str(base / f"export-{name}" / "tables"),
                         "rollout": {**raw["export"]["rollout"], "store": str(base / f"export-{name}" / "store")}}
        raw["stream"] = {**raw.get("stream", {}), **table_minutes(args),
                         "checkpoint": str(base / "stream" / f"checkpoint-{name}")}
        shutil.rmtree(base / "stream" / f"checkpoint-{name}", ignore_errors=True)
        path = work / f"ccs-{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return str(path), load_config(str(path))

    def with_source(source: str, name: str, fn):
        if source != "kafka":
            return fn(None)
        home = work / f"kafka-{name}"
        shutil.rmtree(home, ignore_errors=True)
        broker = Broker(home)
        t = time.time()
        broker.up(log=lambda m: print(m, file=sys.stderr))
        up_s = round(time.time() - t, 1)
        try:
            got = fn(broker.bootstrap())
        finally:
            broker.down()
        got["broker_up_s"] = up_s
        return got

    cfg = load_config(str(work / "ccs.yaml"))     # the setup's: its one-node fleet
    fl, _ = fleet_and_store_for(cfg)
    result["stream"] = cfg.settings.stream.to_dict()
    try:
        for r in range(args.rounds):
            for source in sources:
                name = f"fresh-{source}-{r}"
                cfg_path, cfg = fresh_cfg(name)
                teardown(fl, log=lambda m: None)
                forget_floor(fl)
                ensure_attached(fl, log=lambda m: None)
                agent = fl.nodes[0].agent()
                print(f"freshness: {name} at {time.strftime('%H:%M:%S')} load {load_avg()}", file=sys.stderr)
                got = with_source(source, name, lambda bs: phase(
                    name, cfg_path, cfg, fleet, replay_hour, args.minutes, args.speed, work, agent, fresh=True,
                    bootstrap=bs, ship_every=args.ship_every, tail_cap_s=args.tail_cap))
                got["round"] = r
                result["freshness"].append(got)
                _write(args.out, result)
            for source in sources if args.backlog_minutes else ():
                name = f"backlog-{source}-{r}"
                cfg_path, cfg = fresh_cfg(name)
                teardown(fl, log=lambda m: None)
                forget_floor(fl)
                ensure_attached(fl, log=lambda m: None)
                print(f"freshness: {name} at {time.strftime('%H:%M:%S')} load {load_avg()}", file=sys.stderr)
                got = with_source(source, name, lambda bs: backlog(
                    name, cfg_path, fleet, replay_hour, args.backlog_minutes, work, bs, args.backlog_timeout))
                got["round"] = r
                result["backlog"].append(got)
                _write(args.out, result)
    finally:
        teardown(fl)
    result["load_avg_end"] = load_avg()
    _write(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


def page_sources(result: dict) -> str:
    """The summary the results page shows first: the sources side by side, phase by phase."""
    f = result["fleet"]
    out = [f"Fleet: {f['nodes']} nodes x {f['conns_per_node_hour']:,} connections a node-hour (seed {f['seed']}), "
           f"hour {f['replayed_hour']} replayed; the champion trained on {f['trained_on']}. Phases in the order run "
           "(each on its own copy of the lake; Kafka: a fresh broker each).", "",
           "| phase | source | load avg at start | end | batches | p50 s | p90 s | p99 s | p99 after the first batch s "
           "| connections measured | censored | tail s (caught up) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in result["freshness"]:
        fr, fw = x.get("freshness_s", {}), x.get("freshness_s_after_first_batch", {})
        out.append(f"| freshness round {x['round']} | {x['source']} | {x.get('load_avg_start')} | {x['load_avg_end']} "
                   f"| {x['batches']} | {fr.get('p50')} | {fr.get('p90')} | {fr.get('p99')} | {fw.get('p99')} "
                   f"| {x.get('measured')} | {x.get('censored_after_last_table')} "
                   f"| {_tail_cell(x.get('tail') or {})} |")
    if result["freshness"]:
        x = result["freshness"][0]
        out += ["", f"Replay at {x['speed']}x real time, {x['minutes']} minutes; goal p99 <= {x.get('goal_p99_s')} s "
                "(2 x trigger + 60 s)."]
    if result["backlog"]:
        out += ["", "Sustained rate: a backlog made available at once, drained by the stream "
                "(records/s against the same records' real-time rate).", "",
                "| backlog | source | load avg at start | records | batches | drained | drain s from launch "
                "| from first batch | records/s from first batch | x real time | real-time records/s |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in result["backlog"]:
            out.append(f"| {x['minutes']} min, round {x['round']} | {x['source']} | {x['load_avg_start']} "
                       f"| {x['records']:,} | {x['batches']} | {x['drained']} | {x.get('drain_s_from_launch')} "
                       f"| {x.get('drain_s_from_first_batch')} | {x.get('records_per_s_from_first_batch')} "
                       f"| {x.get('x_realtime_from_first_batch')} | {x['fleet_realtime_records_per_s']} |")
    return "\n".join(out)


def _tail_cell(t: dict) -> str:
    if "capped" not in t:
        return f"{t.get('waited_s')} (fixed)" if t else ""
    return f"{t['waited_s']} ({'capped at ' + str(t['cap_s']) if t['capped'] else t.get('last_table')})"


def _write(path: str, result: dict) -> None:
    """The result so far (a phase at a time: a run cut short keeps what it measured)."""
    result["page_markdown"] = page_sources(result)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")


def table_minutes(args) -> dict:
    """The stream section's table_minutes when --table-minutes asks for one (else the default's)."""
    return {"table_minutes": args.table_minutes} if args.table_minutes else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--conns-per-node-hour", type=int, default=1500)
    ap.add_argument("--hours", type=int, default=3, help="simulated hours; the last one is replayed")
    ap.add_argument("--minutes", type=int, default=30, help="minutes of the last hour replayed")
    ap.add_argument("--speed", type=float, default=4.0)
    ap.add_argument("--throughput-speed", type=float, default=10.0)
    ap.add_argument("--throughput-minutes", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/ccs-bench-freshness")
    ap.add_argument("--out", help="default bench/results/freshness.json; with --source kafka|both "
                    "bench/results/freshness_kafka.json")
    ap.add_argument("--source", choices=("file", "kafka", "both"), default="file",
                    help="file: the replay and the 10x throughput run as before; kafka or both: see the module note")
    ap.add_argument("--rounds", type=int, default=1, help="--source kafka|both: rounds of the interleaved phases")
    ap.add_argument("--ship-every", type=float, default=1.0, help="the shipper's --follow (seconds between passes)")
    ap.add_argument("--backlog-minutes", type=int, default=60,
                    help="--source kafka|both: minutes of the hour in the backlog (0: no backlog phase)")
    ap.add_argument("--backlog-timeout", type=float, default=1200)
    ap.add_argument("--tail-cap", type=float, default=600,
                    help="--source kafka|both: after the replay, wait until the stream has read every record and "
                         "the last boundary's table is live in the kernel, at most this many seconds")
    ap.add_argument("--table-minutes", type=int,
                    help="stream.table_minutes for the replays (default: the configuration's, 5): a table per this many minutes")
    ap.add_argument("--reuse", action="store_true", help="measure again on the workdir's fleet, lake and champion")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(REPO / "bench" / "results" / ("freshness.json" if args.source == "file" else
                                                     "freshness_kafka.json"))
    if os.geteuid() != 0:
        print("bench/freshness.py needs root (the enforcer is eBPF)", file=sys.stderr)
        return 2
    from ccselect.flows import pipeline
    from ccselect.config import load_config
    from ccselect.export.delivery.publish import init_keys
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams

    work = Path(args.workdir)
    fleet = str(work / "fleet")
    t = time.time()
    done = work / "setup.json"
    if args.reuse and done.exists():
        setup = json.loads(done.read_text())
        return (measure if args.source == "file" else measure_sources)(args, work, fleet, setup)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    simulate(SimParams(nodes=args.nodes, hours=args.hours, conns_per_node_hour=args.conns_per_node_hour,
                                  seed=7), fleet, workers=2, progress=False)
    raw = yaml.safe_load((REPO / "infra" / "conf" / "local.yaml").read_text())
    raw["data_root"] = str(work / "root")
    tag = str(os.getpid())
    fleet_path = work / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump({"nodes": [{
        "node_id": f"fresh-{tag}", "canary": True,
        "agent": {"cgroup": f"/sys/fs/cgroup/unified/ccs-fresh-{tag}", "pin_dir": f"/sys/fs/bpf/ccs-fresh-{tag}",
                  "sample_rate": 0.0, "services": [{"port": 443, "name": "video"}]}}]}))
    raw["pipeline"].update({"raw_dir": fleet, "fleet": str(fleet_path), "deploy": True, "auto_promote": True,
                            "epochs": args.epochs})
    raw["model"]["gate"].update({"min_mean_accuracy": 0.0, "min_worst_accuracy": 0.0})
    raw["export"]["rollout"] = {**raw["export"]["rollout"], "health_wait_s": 0.3}
    raw["stream"] = {"trigger_seconds": 5}
    cfg_path = work / "ccs.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(cfg_path))
    init_keys(cfg)
    from ccselect.jobs.sources import discover
    hours = sorted({f.hour for f in discover(fleet, streams=("transport",))})
    train_lo, train_hi, replay_hour = hours[0], hours[-2], hours[-1]
    from ccselect.jobs import ingest
    from ccselect.spark import get_spark
    spark = get_spark(cfg, "bench-freshness")
    from ccselect.hours import Window
    ingest.run(spark, cfg, fleet, Window.hours(train_lo, train_hi))
    pipeline.training_set(Window.hours(train_lo, train_hi), cfg)
    trained = pipeline.train(Window.hours(train_lo, train_hi), cfg)
    pipeline.promote_if_configured(trained["version"], cfg, auto=True)
    from ccselect.models import infer
    infer.run(spark, cfg, Window.hours(train_lo, train_hi))
    spark.stop()
    setup = {"setup_s": round(time.time() - t, 1), "replay_hour": replay_hour, "trained_on": f"{train_lo}..{train_hi}",
             "model_version": trained["version"], "raw": raw}
    done.write_text(json.dumps(setup))
    return (measure if args.source == "file" else measure_sources)(args, work, fleet, setup)


def measure(args, work: Path, fleet: str, setup: dict) -> int:
    """The two replays on the lake `main` set up (the freshness replay's lake is copied first, so
    that --reuse measures again from the same state)."""
    from ccselect.flows.pipeline import fleet_and_store_for
    from ccselect.config import load_config
    from ccselect.export.edge.probe import ensure_attached, teardown
    raw = setup["raw"]
    replay_hour = setup["replay_hour"]
    base = work / "root"
    for name in ("lake-freshness", "lake-throughput", "stream", "export", "fleet"):
        shutil.rmtree(base / name, ignore_errors=True)
    shutil.copytree(base / "lake", base / "lake-freshness")
    raw = json.loads(json.dumps(raw))
    raw["lake"] = {"root": str(base / "lake-freshness")}
    raw["stream"] = {**raw.get("stream", {}), **table_minutes(args)}
    raw["export"] = {**raw["export"], "out": str(base / "export" / "tables"),
                     "rollout": {**raw["export"]["rollout"], "store": str(base / "export" / "store")}}
    cfg_path = work / "ccs-measure.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(cfg_path))
    fl, _ = fleet_and_store_for(cfg)
    teardown(fl, log=lambda m: None)
    ensure_attached(fl, log=lambda m: None)   # as the agents' own service does on an edge
    agent = fl.nodes[0].agent()
    result = {"bench": "freshness", "load_avg_start": load_avg(), "setup_s": setup["setup_s"],
              "command": " ".join(["python", "bench/freshness.py", *sys.argv[1:]]),
              "fleet": {"nodes": args.nodes, "conns_per_node_hour": args.conns_per_node_hour, "seed": 7,
                        "replayed_hour": replay_hour, "trained_on": setup["trained_on"],
                        "model_version": setup["model_version"]},
              "stream": cfg.settings.stream.to_dict()}
    try:
        result["freshness"] = phase("freshness", str(cfg_path), cfg, fleet, replay_hour, args.minutes, args.speed,
                                    work, agent, fresh=True)
        # the throughput run: the same hour again into a lake and checkpoint of its own (the same
        # champion: MLflow stays where it is)
        raw["lake"] = {"root": str(base / "lake-throughput")}
        raw["stream"] = {**raw["stream"], "checkpoint": str(base / "stream" / "checkpoint-throughput")}
        cfg_path.write_text(yaml.safe_dump(raw))
        cfg = load_config(str(cfg_path))
        result["throughput"] = phase("throughput", str(cfg_path), cfg, fleet, replay_hour, args.throughput_minutes,
                                     args.throughput_speed, work, agent, fresh=False)
        real_rate = args.nodes * args.conns_per_node_hour / 3600
        result["throughput"]["fleet_realtime_conns_per_s"] = round(real_rate, 2)
    finally:
        teardown(fl)
    result["load_avg_end"] = load_avg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result, indent=2))
    return 0

if __name__ == "__main__":
    sys.exit(main())
