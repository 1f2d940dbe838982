"""`ccs simulate --follow` (issue 58): the reacting fleet's traffic written as the edge agents'
rotated segments, minute by minute on a simulated clock, so that `ccs stream` ingests it as it
ingests the agents' own logs and the loop (stream → table → rollout → the agents → the clients'
outcomes → stream) runs through the stream.

Each simulated minute: every node's live table is read from its agent (`FollowFleet.now`: the
agent's `status`, the table from the store, verified), the minute passes (`speed` simulated
seconds per wall second; 0: no waiting), and the records of that minute — transport by
ts_end_ms, access and QoE by ts_ms, as sim/replay.py cuts hourly files — are written under
`<out>/<stream>/<node_id>/<YYYY-MM-DDTHHMM>.jsonl`, hidden as `.<name>.part` until complete, one
segment per `rotate_minutes` once its last minute is over. A table loaded while a minute passes
is live in the simulation from the next minute on (the clock reads the agents at each minute's
start), and a connection keeps the decision it was given at its accept (sim/follow.py), so a
segment once written never changes.

Records carry the fleet file's node id (the agent's), not the simulated node's: the stream's
silver and the canary's gate key on it. The truth of the written connections goes to
`<out>/_truth/connections/<node_id>/<hour>.parquet` at the end, kept apart as `ccs simulate`
keeps it; `<out>/follow.json` records the run: the parameters, which simulated node each fleet
node serves, every table span each node had (simulated time, version), and per node-hour the
connections logged with a decision made on another generation's accept time (`generation`:
sim/follow.py's `decided_off_start`, near a swap; never hidden)."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import polars as pl

from ccselect.contract import ROTATE_MINUTES, STREAMS, hour_file_name, segment_file_name, stream_dir
from ccselect.flows.follow import FollowFleet
from ccselect.sim.fleet import atomic_write, write_reference

#: the record time a stream's segment is chosen by (sim/replay.py, sim/fleet.py)
TIME_FIELD = {"transport": "ts_end_ms", "access": "ts_ms", "qoe": "ts_ms"}
MINUTE_MS = 60_000


def minute_records(ff: FollowFleet, node_id: str, from_ms: int, to_ms: int) -> dict[str, pl.DataFrame]:
    """stream → the node's records whose time lies in [from_ms, to_ms), with the fleet's node id."""
    out: dict[str, list[pl.DataFrame]] = {s: [] for s in STREAMS}
    for h in ff.hours_between(from_ms, to_ms):
        nh = ff.hour(node_id, h)
        for s in STREAMS:
            out[s].append(getattr(nh, s).filter(pl.col(TIME_FIELD[s]).is_between(from_ms, to_ms - 1)))
    return {s: pl.concat(v).with_columns(pl.lit(node_id).alias("node_id")) for s, v in out.items()}


def run(ff: FollowFleet, out: str, minutes: int, speed: float = 60.0, rotate_minutes: int = 1,
        log: Callable[[str], None] = print, progress: Callable[[int], None] | None = None) -> dict:
    """`minutes` simulated minutes of every node's traffic from the fleet's clock (module doc);
    returns (and writes as follow.json) the run's record."""
    if rotate_minutes not in ROTATE_MINUTES:
        raise ValueError(f"rotate_minutes must divide the hour: one of {ROTATE_MINUTES}")
    write_reference(ff.world, out)
    t0, wall0 = ff.now(), time.monotonic()
    if (t0 - ff.world.hour_start_ms(0)) % (rotate_minutes * MINUTE_MS):
        raise ValueError("the simulated clock must start on a segment boundary")
    pending: dict[tuple[str, str], list[pl.DataFrame]] = {}
    counts = {s: 0 for s in STREAMS}
    written: dict[tuple[str, int], list[pl.Series]] = {}    # (node, hour) → conn ids written
    record = {"out": out, "minutes": minutes, "speed": speed, "rotate_minutes": rotate_minutes,
              "params": asdict(ff.world.p), "default_cc": ff.default_cc,
              "nodes": {n: {"sim_node": ff.world.nodes[fn.sim_idx].node_id} for n, fn in ff.nodes.items()},
              "from_ms": t0, "segments": 0}
    try:
        for i in range(minutes):
            t = ff.now()                               # every agent's live table, read now
            if speed > 0:
                time.sleep(max(0.0, wall0 + (i + 1) * 60.0 / speed - time.monotonic()))
            ff.sleep(60)
            for node_id in ff.nodes:
                for s, df in minute_records(ff, node_id, t, t + MINUTE_MS).items():
                    if df.height:
                        pending.setdefault((s, node_id), []).append(df)
                    if s == "transport" and df.height:
                        h = (t - ff.world.hour_start_ms(0)) // 3_600_000
                        written.setdefault((node_id, h), []).append(df["conn_id"])
            if (t + MINUTE_MS - ff.world.hour_start_ms(0)) % (rotate_minutes * MINUTE_MS) == 0 or i == minutes - 1:
                seg = segment_file_name(t, rotate_minutes)
                for (s, node_id), parts in sorted(pending.items()):
                    df = pl.concat(parts)
                    atomic_write(os.path.join(stream_dir(out, s, node_id), seg), df.write_ndjson)
                    counts[s] += df.height
                    record["segments"] += 1
                pending = {}
            if progress:
                progress(i + 1)
    finally:
        record["to_ms"] = ff.t
        record["counts"] = counts
        record["spans"] = {n: [{"from_ms": s.from_ms, "version": s.version} for s in fn.spans]
                           for n, fn in ff.nodes.items()}
        # per node-hour written: the generations its last version took and the connections logged
        # with a decision made on another pass's accept time (sim/follow.py: a swap between two)
        record["generation"] = {n: {} for n in ff.nodes}
        for (node_id, h), ids in written.items():
            record["generation"][node_id][hour_file_name(ff.world.hour_start_ms(h))[:-6]] = ff.hour(node_id, h).follow
            truth = ff.hour(node_id, h).truth.filter(pl.col("conn_id").is_in(pl.concat(ids).implode()))
            atomic_write(os.path.join(out, "_truth", "connections", node_id,
                                 hour_file_name(ff.world.hour_start_ms(h)).replace(".jsonl", ".parquet")),
                    truth.with_columns(pl.lit(node_id).alias("node_id")).write_parquet)
        atomic_write(os.path.join(out, "follow.json"), lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))
    log(f"follow: {minutes} simulated minutes, {counts['transport']:,} connections of {len(ff.nodes)} nodes "
        f"as {record['segments']} segments in {out}")
    return record
