"""bench/rollout_loop: issue 58's rollout loop closed THROUGH THE STREAM, on the real components.

Real agents (one per node, each in a throwaway cgroup: bench/rollout_drill.Agents) hold the live
tables; `ccs simulate --follow` (a process of its own) writes each node's next simulated minutes as
the agents' one-minute segments, every connection given the CC its node's agent gives it under
the table live there; `ccs stream` (a process of its own: the file source, the real Spark
Structured Streaming query, `--no-deploy`) turns those segments into bronze and silver; the
rollout (export/delivery/rollout.deploy, cohorts canary → 50% → all) asks each cohort's gate, the
canary's always-valid A/B (gates.CanaryVerdict, export.canary's shipped settings) reading that
cohort's treatment and control arms from silver.connections as the stream ingests them, on the
loop's clock (flows/rollout_loop.StreamGate: the window counts minutes of ingested traffic since
the table went live in the simulation). Every decision goes to gold.rollout_decisions with its
evidence.

The drill: table 1 (good) on every node before the fleet starts; once the stream has put the
canary's first rows in silver, table 2 — table 1's rule with every decision inverted, the planted
bad table — is rolled out, then (the freeze lifted) table 3, a good one. Measured: each cohort's
decision; for the bad table the minutes of simulated traffic the canary ran it (the fleet's own
record of what was live where, follow.json) and the minutes the gate had in silver when it
decided, the wall seconds from the load to the decision, and whether it reached any non-canary
node (the agents' live versions after, and every version the simulation saw live on each node);
the stream's micro-batches (count, seconds). The nodes' default CC is bbr (the control arm's):
the inverted table puts cellular clients on cubic (ALICCS Observation III).

Writes bench/results/rollout_loop.json (docs/results/rollout-loop.md by bench/report.py).

    sudo .venv/bin/python bench/rollout_loop.py [--nodes 3] [--speed 20] [--conns 20000] [--no-good]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import result_file  # noqa: E402
from bench import rollout_drill  # noqa: E402
from bench.ingest import bench_config  # noqa: E402
from ccselect.config import load_config  # noqa: E402
from ccselect.export.artifact import signing  # noqa: E402
from ccselect.export.delivery import freeze, gates  # noqa: E402
from ccselect.export.delivery.rollout import Health, deploy, load_fleet  # noqa: E402
from ccselect.export.delivery.store import Store  # noqa: E402
from ccselect.lake import ROLLOUT_DECISIONS, table_path  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, and our modules that load it.

HEALTH = Health(wait_s=0.2, min_rate_ratio=0.5)
START = "2026-11-01T12:00:00"
MINUTE_MS = 60_000


def loop_config(root: Path, inflight_fleet: str | None = None, store_dir: str | None = None):
    """bench_config (local[2], 4 GB driver) with the stream triggering every 5 s (a micro-batch
    as soon as the last one ends and segments wait; the shipped 30 s would add up to 30 s of lag
    to every look). With `inflight_fleet` (the agents' fleet file) and `store_dir`: the stream
    deploys to that fleet from that store, gate canary, on the records' clock (`--inflight`)."""
    if not (root / "ccs.yaml").exists():
        bench_config(root)
    raw = yaml.safe_load((root / "ccs.yaml").read_text())
    raw.setdefault("stream", {})["trigger_seconds"] = 5
    if inflight_fleet:
        raw["stream"]["rollout_clock"] = "records"
        raw["export"]["rollout"].update(gate="canary", store=store_dir)
        raw.setdefault("pipeline", {}).update(fleet=inflight_fleet, deploy=True)
    (root / "ccs.yaml").write_text(yaml.safe_dump(raw))
    return load_config(root / "ccs.yaml"), str(root / "ccs.yaml")


def publish(store: Store, world, nodes: int, key, out: str, version: int, hour: int, invert: bool, rng,
            coverage: float = 0.9) -> int:
    """A table deciding as ALICCS's rule on the truth at simulated `hour` over a random `coverage`
    of each node's prefixes (flows/follow.dominance_entries; 90%, as bench/rollout_drill.py),
    `invert`: every decision the other way; signed and published."""
    from ccselect.flows.follow import dominance_entries
    entries = {str(e.prefix): e for i in range(nodes)
               for e in dominance_entries(world, i, hour, invert=invert, coverage=coverage, rng=rng)}
    now = int(time.time())
    store.publish(signing.write_table(list(entries.values()), version, f"loop-{version}", now + 48 * 3600, out, key,
                                      created=now, extra={"coverage": coverage}).manifest)
    return len(entries)


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> int | None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _batches(log_path: Path) -> list[dict]:
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("stream: {"):
            try:
                out.append(json.loads(line[len("stream: "):]))
            except ValueError:
                pass
    return out


def rollout_row(res: dict, version: int, wall_s: float, live_after: dict) -> dict:
    decs = [d for d in res["decisions"] if d["version"] == version]
    rows = []
    for d in decs:
        ev = json.loads(d["evidence"])
        ts = ev.get("through_stream") or {}
        if "inflight" in ev:      # the stream's own looks (--inflight): the records' clock
            fl = ev["inflight"]
            ts = {"live_from_ms": fl["loaded_ms"], "wall_s": fl["wall_s"], "wall_bound_hit": False,
                  "silver_through_ms": {n: fl["now_ms"] for n in d["node_ids"].split(",")}}
        rows.append({"cohort": d["cohort"], "decision": d["decision"], "minute": d["minute"], "reason": d["reason"],
                     "outcome_rows": ev.get("outcome_rows"), "looks": len(ev.get("looks", [])),
                     "metrics": {n: {m: {k: x.get(k) for k in ("rel_change", "cs", "clusters") if k in x}
                                     for m, x in e["metrics"].items()} for n, e in ev.get("nodes", {}).items()},
                     "live_from_ms": ts.get("live_from_ms"), "silver_through_ms": ts.get("silver_through_ms"),
                     "fleet_written_through_ms": ts.get("fleet_written_through_ms"),
                     "gate_wall_s": ts.get("wall_s"), "wall_bound_hit": ts.get("wall_bound_hit")})
    return {"version": version, "ok": res["ok"], "stopped": res.get("stopped"), "decisions": rows,
            "wall_s_load_to_end": round(wall_s, 1), "live_after": live_after, "frozen": bool(res.get("freeze"))}


def _lag(d: dict | None, node: str) -> float | None:
    """Minutes of the node's traffic the fleet had written and silver did not yet hold at a decision."""
    if not d or not d.get("silver_through_ms") or node not in d["silver_through_ms"] \
            or not d.get("fleet_written_through_ms"):
        return None
    return round((d["fleet_written_through_ms"][node] - d["silver_through_ms"][node]) / MINUTE_MS, 1)


def spans_of(follow: dict, node: str, version: int) -> list[tuple[int, int | None]]:
    """(from_ms, to_ms or None) of every span `version` was live on `node` in the simulation."""
    sp = follow["spans"][node]
    return [(s["from_ms"], sp[i + 1]["from_ms"] if i + 1 < len(sp) else None)
            for i, s in enumerate(sp) if s["version"] == version]


def _in_flight(fleet, store: Store, version: int, cfg, clock, decisions, procs: dict, logs: dict,
               max_wall_s: float) -> dict:
    """Begin `version`'s rollout in flight and wait while the stream's looks move it (it ends, or
    `max_wall_s` pass); → `deploy`'s result keys from the record and gold.rollout_decisions."""
    from ccselect.export.delivery import inflight
    from ccselect.flows.pipeline import rollout_lock
    with inflight.locked(rollout_lock(cfg)):
        began = inflight.begin(fleet, store, version, HEALTH, clock=clock, decisions=decisions, log=lambda m: None)
    if not began.get("inflight"):
        raise RuntimeError(f"table {version} did not begin: {began}")
    t0 = time.monotonic()
    while (inflight.current(store) or {}).get("version") == version:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} stopped ({p.returncode}): {logs[name].read_text()[-3000:]}")
        if time.monotonic() - t0 > max_wall_s:
            raise RuntimeError(f"table {version} still in flight after {max_wall_s:g} s: "
                               f"{json.dumps(inflight.current(store), default=str)[:3000]}")
        time.sleep(2)
    last = inflight.last(store) or {}
    rows = [r for r in gates.read_decisions(table_path(cfg, ROLLOUT_DECISIONS), 50)
            if r["version"] == version and r["rollout_id"] == last.get("rollout_id")]
    fr = freeze.current(store)
    return {"ok": bool(last.get("ok")), "stopped": last.get("stopped"), "decisions": rows,
            "freeze": fr if fr and fr.get("who") == "rollout" else None}


def loop(root: Path, binary: str, nodes: int = 3, conns: int = 20000, speed: float = 20.0, seed: int = 7,
         good: bool = True, minutes: int = 600, look_s: float = 1.0, look_minutes: float = 1.0, warm_timeout_s: float = 900.0,
         stream: bool = True, max_wall_s: float | None = None, coverage: float = 0.9, say=print,
         inflight: bool = False) -> dict:
    """The drill (module doc) under `root`; → its record. `coverage`: the tables' share of each
    node's prefixes. `stream=False` runs no `ccs stream` (the gate then has nothing in silver:
    the planted fault the test fails on). `inflight`: the production path instead of StreamGate:
    this process only begins each rollout (export/delivery/inflight.py, the records' clock) and
    `ccs stream`, deploying, takes every look after its micro-batches (flows/stream.py)."""
    from ccselect.app.commands.sim import FollowArgs, follow_params
    from ccselect.flows.stream import checkpoint_dir
    from ccselect.flows.rollout_loop import RecordsClock, StreamGate, silver_through_ms, written_through_ms
    from ccselect.sim.world import World
    from ccselect.spark import get_spark

    t_start = time.monotonic()
    cfg, cfg_path = loop_config(root / "lake")
    key = signing.generate_key()
    priv, pub = str(root / "priv.pem"), str(root / "pub.pem")   # not the lake's keys_dir: the stream signs nothing
    signing.save_keypair(key, priv, pub)
    rollout_drill.CFG = cfg           # Agents reads its fleet file with it
    agents = rollout_drill.Agents(nodes, binary, pub, root)
    raw, store_dir = root / "raw", str(root / "store")
    if inflight:
        cfg, cfg_path = loop_config(root / "lake", agents.path, store_dir)
        rollout_drill.CFG = cfg
    procs: dict[str, subprocess.Popen] = {}
    logs = {name: root / f"{name}.log" for name in ("follow", "stream")}
    rec: dict = {"nodes": nodes, "conns_per_node_hour": conns, "speed": speed, "seed": seed, "start": START,
                 "default_cc": "bbr", "look_s": look_s, "look_minutes": look_minutes, "coverage": coverage,
                 "stream": stream, "inflight": inflight, "rollouts": {}}
    try:
        fleet = load_fleet(agents.path, cfg)
        store = Store(store_dir)
        ids = [n.node_id for n in fleet.nodes]
        canary = fleet.canaries[0].node_id
        rec["cohorts"] = {c: [n.node_id for n in ns] for c, ns in fleet.cohorts}
        params, _, _ = follow_params(FollowArgs(str(raw), nodes, START, seed, conns, agents.path, store_dir, pub, 0,
                                                minutes, speed, "bbr", None, cfg_path, True), nodes, cfg)
        world = World(params)
        h0 = world.hour_start_ms(0)
        rng = np.random.default_rng(seed)
        out = str(root / "export")
        rec["entries"] = {1: publish(store, world, nodes, key, out, 1, 0, False, rng, coverage)}
        assert deploy(fleet, store, 1, HEALTH, log=lambda m: None)["ok"], "table 1 on every node"
        py = sys.executable
        raw.mkdir(parents=True)
        if stream:
            procs["stream"] = subprocess.Popen(
                [py, "-m", "ccselect.app.cli", "stream", "--input", str(raw), "--deploy" if inflight else "--no-deploy",
                 "--config", cfg_path],
                cwd=str(REPO), stdout=open(root / "stream.out", "w"), stderr=open(logs["stream"], "w"))
            # the query up before the fleet writes: its first micro-batch is a minute, not a backlog
            t_q = time.monotonic()
            while not os.path.exists(os.path.join(checkpoint_dir(cfg), "metadata")):
                if procs["stream"].poll() is not None or time.monotonic() - t_q > warm_timeout_s:
                    raise RuntimeError(f"ccs stream did not start: {logs['stream'].read_text()[-3000:]}")
                time.sleep(1)
            rec["wall_s_stream_start"] = round(time.monotonic() - t_q, 1)
        procs["follow"] = subprocess.Popen(
            [py, "-m", "ccselect.app.cli", "simulate", "--follow", "--out", str(raw), "--nodes", str(nodes),
             "--conns-per-node-hour", str(conns), "--seed", str(seed), "--start", START, "--minutes", str(minutes),
             "--speed", str(speed), "--default-cc", "bbr", "--fleet", agents.path, "--store", store_dir,
             "--public-key", pub, "--json", "--config", cfg_path],
            cwd=str(REPO), stdout=open(root / "follow.json.out", "w"), stderr=open(logs["follow"], "w"))
        spark = get_spark(cfg, "ccs-rollout-loop-gate", overrides={"spark.driver.memory": "2g"})
        say("waiting for the canary's first rows in silver" if stream else "no stream: waiting for segments")
        t_warm = time.monotonic()
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} stopped ({p.returncode}): {logs[name].read_text()[-3000:]}")
            if (silver_through_ms(spark, cfg, [canary], 0) if stream else written_through_ms(str(raw), canary)):
                break
            if time.monotonic() - t_warm > warm_timeout_s:
                raise RuntimeError(f"no silver rows of {canary} in {warm_timeout_s:g} s: "
                                   f"{logs['stream'].read_text()[-3000:]}")
            time.sleep(2)
        rec["wall_s_to_first_silver_rows"] = round(time.monotonic() - t_warm, 1)
        settings = cfg.settings.export.canary
        rec["canary_settings"] = {k: getattr(settings, k) for k in ("alpha", "tau", "harm_margin", "min_clusters",
                                                                    "max_minutes", "bake_minutes", "metrics", "primary")}
        gate = StreamGate(settings, spark, cfg, str(raw), look_s=look_s, look_minutes=look_minutes, speed=speed, max_wall_s=max_wall_s,
                          log=lambda m: None)
        rec["gate_max_wall_s"] = round(gate.max_wall_s, 1)
        decisions = gates.DecisionLog.for_config(cfg)
        plan = [(2, "bad", True)] + ([(3, "good", False)] if good else [])
        for version, kind, invert in plan:
            hour = (written_through_ms(str(raw), canary) - h0) // 3_600_000
            rec["entries"][version] = publish(store, world, nodes, key, out, version, int(hour), invert, rng, coverage)
            say(f"table {version} ({kind}) to the canary at simulated hour {hour}")
            t0 = time.monotonic()
            if inflight:
                res = _in_flight(fleet, store, version, cfg, RecordsClock(spark, cfg, str(raw), settings.max_minutes),
                                 decisions, procs, logs, gate.max_wall_s)
            else:
                res = deploy(fleet, store, version, HEALTH, gate=gate, decisions=decisions, log=lambda m: None)
            row = rollout_row(res, version, time.monotonic() - t0, rollout_drill.live_versions(fleet))
            row["kind"] = kind
            rec["rollouts"][kind] = row
            say(json.dumps({k: row[k] for k in ("version", "ok", "wall_s_load_to_end", "live_after")}
                           | {"decisions": [(d["cohort"], d["decision"], d["minute"]) for d in row["decisions"]]}))
            if freeze.current(store) is not None:
                freeze.unfreeze(store, "rollout loop drill: the next table", who="bench")
        rec["gold_rollout_decisions"] = [{k: r[k] for k in ("rollout_id", "cohort", "version", "decision", "minute")}
                                         for r in gates.read_decisions(table_path(cfg, ROLLOUT_DECISIONS), 50)]
    finally:
        if "follow" in procs:
            rec["follow_rc"] = _stop(procs["follow"], signal.SIGINT, 120)   # KeyboardInterrupt: follow.json written
        if "stream" in procs:
            rec["stream_rc"] = _stop(procs["stream"], signal.SIGTERM, 180)
        agents.cleanup()
    follow = json.loads((raw / "follow.json").read_text())
    batches = _batches(logs["stream"]) if stream else []
    secs = [b["seconds"] for b in batches if b.get("files")]
    rec["stream_batches"] = {"count": len(batches), "with_files": len(secs),
                             "median_s": round(statistics.median(secs), 1) if secs else None,
                             "max_s": max(secs) if secs else None,
                             "lines_read": sum(b.get("lines_read", 0) for b in batches)}
    rec["follow"] = {"simulated_minutes": round((follow["to_ms"] - follow["from_ms"]) / MINUTE_MS, 1),
                     "connections": follow["counts"]["transport"], "segments": follow["segments"],
                     "versions_seen": {n: [s["version"] for s in follow["spans"][n]] for n in ids}}
    bad = rec["rollouts"].get("bad")
    if bad:
        canary_dec = next((d for d in bad["decisions"] if d["cohort"] == "canary"), None)
        live = spans_of(follow, canary, 2)
        reached = sorted({n for n in ids if n != canary and (2 in rec["follow"]["versions_seen"][n]
                                                              or bad["live_after"].get(n) == 2)})
        ev = {"canary_decision": canary_dec and canary_dec["decision"],
              "gate_minutes_of_ingested_traffic": canary_dec and canary_dec["minute"],
              "simulated_minutes_live_on_canary": [round(((b or follow["to_ms"]) - a) / MINUTE_MS, 1) for a, b in live],
              "live_from_assumed_ms": canary_dec and canary_dec["live_from_ms"],
              "live_from_actual_ms": [a for a, _ in live],
              "wall_s_load_to_decision": canary_dec and canary_dec["gate_wall_s"],
              "wall_s_load_to_rolled_back": bad["wall_s_load_to_end"],
              "stream_lag_minutes_at_decision": _lag(canary_dec, canary),
              "canary_outcome_rows": canary_dec and canary_dec["outcome_rows"],
              "reached_non_canary_nodes": reached, "live_after": bad["live_after"], "frozen": bad["frozen"]}
        rec["bad_summary"] = ev
    g = rec["rollouts"].get("good")
    if g:
        rec["good_summary"] = {"decisions": [(d["cohort"], d["decision"], d["minute"]) for d in g["decisions"]],
                               "promoted_everywhere": g["ok"], "wall_s": g["wall_s_load_to_end"],
                               "live_after": g["live_after"]}
    rec["wall_s"] = round(time.monotonic() - t_start, 1)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--conns", type=int, default=20000, help="mean connections per node-hour")
    ap.add_argument("--speed", type=float, default=20.0, help="simulated seconds per wall second (ccs simulate --speed)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-good", action="store_true", help="only the bad table")
    ap.add_argument("--inflight", action="store_true", help="the rollout in flight: `ccs stream` (deploying) takes "
                    "the looks, on the records' clock (stream.rollout_clock: records)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    ap.add_argument("--out", default=None, help="default bench/results/rollout_loop.json (--inflight: "
                    "rollout_loop_inflight.json)")
    a = ap.parse_args(argv)
    a.out = a.out or str(REPO / "bench" / "results" / ("rollout_loop_inflight.json" if a.inflight else "rollout_loop.json"))
    binary = rollout_drill.edge_binary()
    res = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "load_avg_before": [round(x, 2) for x in os.getloadavg()],
           "command": "bench/rollout_loop.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    root = Path(tempfile.mkdtemp(prefix="ccs-loop-"))
    try:
        res.update(loop(root, binary, a.nodes, a.conns, a.speed, a.seed, good=not a.no_good, inflight=a.inflight))
    finally:
        res["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
        if a.keep:
            print(f"kept {root}")
    result_file.write(a.out, res, show=json.dumps({k: res.get(k) for k in ("bad_summary", "good_summary",
                                                                        "stream_batches", "wall_s")}, indent=1))
    if not a.keep:
        subprocess.run(["rm", "-rf", str(root)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
