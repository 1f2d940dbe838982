"""The rollout loop through the stream (issue 58): the canary's gate reading the arms its fleet's
traffic puts in silver.connections, when that traffic is a reacting fleet on a simulated clock
(`ccs simulate --follow`, flows/follow_stream.py) ingested by `ccs stream`.

`gates.CanaryVerdict` reads each look's cumulative moments from silver (`gates.silver_moments`)
over [load, now). In a deployment `now` is the wall clock and so are the records' times. Behind a
simulated fleet the records carry the simulated clock, which runs `--speed` times faster than the
wall and ahead of what the stream has ingested, so `StreamGate` gives the verdict another clock:

- the load's time is when the table became live in the simulation: the follow fleet reads every
  agent at the start of each simulated minute (flows/follow_stream.py), so a table loaded while
  the fleet has written a node's segments through time E is live there from E + 1 minute (the
  next minute's read; `live_after_ms`). Taking the later minute when the load raced a read keeps
  the previous table's traffic out of the treatment arm at the cost of one minute of the new one;
  bench/rollout_loop.py checks it against the spans the fleet recorded;
- `now` is silver's: the end of the minute of the newest `ts_end_ms` of the cohort's rows there
  (the least over its nodes; the stream ingests whole one-minute segments), so a look judges
  exactly the traffic since the load that the stream has ingested, and the window
  (`export.canary.max_minutes`) and the bake are minutes of ingested traffic, as in the in-memory
  drill (bench/rollout_drill.py), however far the stream lags. A micro-batch brings many
  simulated minutes at once (the fleet runs `--speed` times the wall clock; a batch took 60-116 s
  on the shared 2 cores), so the clock moves at most `look_minutes` a look towards silver's: the
  looks fall every `look_minutes` of traffic, as the in-memory drill's every simulated minute,
  and the window ends at `max_minutes` of traffic, not at whatever a batch brought past it;
- the window is also bounded on the wall clock (`max_wall_s`): if the stream stops ingesting
  (silver's clock stands still), the clock jumps to the window's end and the verdict says
  `observe` (no outcome rows, or no evidence either way), never waiting forever.

Everything else — the test, its looks, the decisions, gold.rollout_decisions — is the gate's own;
the evidence gets a `through_stream` entry: the live-from time, silver's and the fleet's clocks at
the decision, the wall seconds from the ask, and whether the wall bound ended the window.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import Callable

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import FILE_NAME
from ccselect.hours import hour_of_ms
from ccselect.lake import CONNECTIONS, table_path
from ccselect.export.delivery.gates import CanaryVerdict, Decision, GateContext, silver_moments
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark.

MINUTE_MS = 60_000


def written_through_ms(raw_dir: str, node_id: str, stream: str = "transport") -> int | None:
    """The simulated ms through which the follow fleet has written `node_id`'s `stream`: the end of
    its newest complete one-minute segment (hidden `.part` files not counted); None before any."""
    d = os.path.join(raw_dir, stream, node_id)
    newest = None
    for name in os.listdir(d) if os.path.isdir(d) else []:
        m = FILE_NAME.match(name)
        if not m or m.group(2) is None:
            continue
        t = datetime.strptime(m.group(1) + m.group(2), "%Y-%m-%dT%H%M").replace(tzinfo=timezone.utc)
        end = int(t.timestamp() * 1000) + MINUTE_MS
        newest = end if newest is None else max(newest, end)
    return newest


def live_from_ms(raw_dir: str, nodes: list[str], live_after_ms: int = MINUTE_MS) -> int:
    """When a table loaded now is live on every one of `nodes`: the end of the newest one-minute
    segment any of them had written under `raw_dir` (the latest over them), plus `live_after_ms`
    (module doc). A node with no segment yet is an error naming it."""
    written = [written_through_ms(raw_dir, n) for n in nodes]
    if any(w is None for w in written):
        raise RuntimeError(f"no segment of {[n for n, w in zip(nodes, written) if w is None]} under {raw_dir}: "
                           "is the fleet writing (ccs simulate --follow, the agents' segments)?")
    return max(written) + live_after_ms


def silver_through_ms(spark, cfg: Config, nodes: list[str], from_ms: int) -> dict[str, int]:
    """node → the newest ts_end_ms of its silver.connections rows at or after `from_ms` (nodes
    with none are absent)."""
    from pyspark.sql import functions as F
    path = table_path(cfg, CONNECTIONS)
    if not delta_io.is_delta(spark, path):      # no silver yet (the stream's first batch not committed)
        return {}
    conns = spark.read.format("delta").load(path)
    rows = (conns.where((F.col("hour") >= hour_of_ms(from_ms)) & F.col("node_id").isin(nodes)
                        & (F.col("ts_end_ms") >= from_ms))
            .groupBy("node_id").agg(F.max("ts_end_ms").alias("t")).collect())
    return {r["node_id"]: int(r["t"]) for r in rows}


class RecordsClock:
    """The clock of the records the stream reads, for the rollout in flight
    (export/delivery/inflight.py, `stream.rollout_clock: records`): StreamGate's clock without
    the blocking. A cohort's load is live from the end of the newest one-minute segment its nodes
    had written under `raw_dir` (the latest over the cohort) plus `live_after_ms`; a look's time
    is the end of the newest minute silver.connections holds for every node of the cohort (the
    least over them), never past the window (`max_minutes` after the load); silver only grows, so
    it never goes back."""

    step_ms = MINUTE_MS    # a look at every minute of ingested traffic (inflight._look_times)

    def __init__(self, spark, cfg: Config, raw_dir: str, max_minutes: float, live_after_ms: int = MINUTE_MS):
        self.spark, self.cfg, self.raw_dir = spark, cfg, raw_dir
        self.max_ms, self.live_after_ms = int(max_minutes * MINUTE_MS), live_after_ms

    def loaded(self, nodes: list[str]) -> int:
        return live_from_ms(self.raw_dir, nodes, self.live_after_ms)

    def now(self, nodes: list[str], loaded_ms: int) -> int:
        have = silver_through_ms(self.spark, self.cfg, nodes, loaded_ms)
        if not set(nodes) <= set(have):
            return loaded_ms
        t = (min(have[n] for n in nodes) // MINUTE_MS + 1) * MINUTE_MS
        return max(loaded_ms, min(t, loaded_ms + self.max_ms))


class StreamGate:
    """`gates.CanaryVerdict` on silver.connections with the loop's clock (module doc). `raw_dir`:
    the follow fleet's segments (what `ccs stream` reads); `look_s`: wall seconds between looks;
    `look_minutes`: the most simulated minutes of traffic the clock moves in one look;
    `max_wall_s`: the window's bound on the wall clock (default: three times the window at the
    fleet's `speed`, plus ten minutes for the stream)."""

    name = "canary-through-stream"

    def __init__(self, settings, spark, cfg: Config, raw_dir: str, look_s: float = 1.0, look_minutes: float = 1.0,
                 speed: float = 60.0,
                 max_wall_s: float | None = None, live_after_ms: int = MINUTE_MS,
                 log: Callable[[str], None] = print):
        self.settings, self.spark, self.cfg, self.raw_dir = settings, spark, cfg, raw_dir
        self.live_after_ms, self.log = live_after_ms, log
        self.look_ms = int(look_minutes * MINUTE_MS)
        self.max_wall_s = max_wall_s if max_wall_s is not None else \
            3 * settings.max_minutes * 60 / max(speed, 1e-9) + 600
        self.verdict = CanaryVerdict(settings, silver_moments(spark, cfg), look_s=look_s, clock=self._clock,
                                     sleep=time.sleep)
        self.nodes: list[str] = []
        self.live_from = self.last = 0
        self.asked = 0.0
        self.wall_bound_hit = False
        self.silver: dict[str, int] = {}

    def live_from_ms(self, nodes: list[str]) -> int:
        """When a table loaded now is live in the simulation on every one of `nodes` (module doc)."""
        return live_from_ms(self.raw_dir, nodes, self.live_after_ms)

    def _clock(self) -> int:
        have = min(self.silver.values()) if set(self.nodes) <= set(self.silver) else None
        if have is None or (have // MINUTE_MS + 1) * MINUTE_MS < self.last + self.look_ms:   # read only when short
            self.silver = silver_through_ms(self.spark, self.cfg, self.nodes, self.live_from)
        # the stream ingests whole one-minute segments: a row of minute M in silver means M is there
        t = ((min(self.silver[n] for n in self.nodes) // MINUTE_MS + 1) * MINUTE_MS
             if set(self.nodes) <= set(self.silver) else self.live_from)
        t = min(max(self.last, t), self.last + self.look_ms)
        if time.monotonic() - self.asked > self.max_wall_s:
            self.wall_bound_hit = True
            t = max(t, self.live_from + int(self.settings.max_minutes * MINUTE_MS))
        self.last = t
        return t

    def __call__(self, ctx: GateContext) -> Decision:
        self.nodes, self.asked, self.wall_bound_hit = list(ctx.nodes), time.monotonic(), False
        self.live_from = self.last = self.live_from_ms(self.nodes)
        self.silver = {}
        d = self.verdict(ctx)
        d.evidence["through_stream"] = {
            "live_from_ms": self.live_from, "silver_through_ms": dict(self.silver),
            "fleet_written_through_ms": {n: written_through_ms(self.raw_dir, n) for n in self.nodes},
            "wall_s": round(time.monotonic() - self.asked, 1), "wall_bound_hit": self.wall_bound_hit}
        return d
