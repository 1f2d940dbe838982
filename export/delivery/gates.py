"""What decides, after a cohort loaded a table, whether the rollout goes on (issue 58), and the
record of every such decision, `gold.rollout_decisions`.

A gate is any callable `gate(ctx: GateContext) -> Decision`; `rollout.deploy` asks it once every
node of a cohort loaded the table and passed the health check (export/delivery/rollout.py), before
the next cohort. Its decision is one of

- `promote`: on to the next cohort (after the last, the store's current table becomes this one);
- `observe`: the gate could not decide within its bounded window (e.g. no outcomes arrived):
  the rollout stops without promoting, the cohorts loaded go back to their previous table, and
  the fleet is not frozen;
- `rollback`: the table is rolled back on every node that loaded it (the agent's `rollback`),
  the store's current table stays, and the fleet is frozen (export/delivery/freeze.py) until an
  operator lifts it.

Two gates:

- `health_gate` (the default, and the only gate before issue 58): every node passed the health
  check of `deploy_node` (table active, no setsockopt error, the connection rate above
  `min_rate_ratio` of the rate before): promote.
- `CanaryVerdict`: the cohort's A/B on outcomes, export/delivery/canary.py's always-valid mSPRT over
  the kernel's CRC32 arms, looked at every `look_s` seconds on each node's cumulative moments
  since the load (`silver_moments`: its silver.connections rows, so the stream must be ingesting
  the node's logs). Each node of the cohort is judged by its own test: any rollback rolls the
  cohort back; every node promoted promotes. A node promotes only on evidence of no harm
  beyond `export.canary.harm_margin` on its primary metrics (`export.canary.primary`: their
  always-valid intervals exclude it), and rolls back once any metric, primary or guardrail,
  shows harm; a guardrail's interval wider than the margin does not hold a table back. When the
  window (`export.canary.max_minutes`) ends without a promote or a rollback, the gate says
  `observe` with each primary metric's interval (not promoted: the cohort goes back to its
  previous table, nothing frozen), and a node with no outcome rows at all is named. So, per
  node and table, at any number of looks: a table that harms no metric is rolled back with
  probability at most `export.canary.alpha`, and one that harms a primary metric by more than
  the margin is promoted with probability at most `alpha` / number of metrics; a harm on a
  guardrail alone too small for its interval to show is not guarded against
  (export/delivery/canary.py, docs/rollouts.md).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from ccselect import delta_io
from ccselect.config import Config
from ccselect.hours import hour_of_ms
from ccselect.lake import CONNECTIONS, ROLLOUT_DECISIONS, table_path
from ccselect.export.delivery.canary import PROMOTE as C_PROMOTE, ROLLBACK as C_ROLLBACK, Canary, canary_moments
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, deltalake.

PROMOTE, OBSERVE, ROLLBACK = "promote", "observe", "rollback"
DECISIONS_TABLE = ROLLOUT_DECISIONS


@dataclass
class Decision:
    decision: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    minute: float = 0.0          # minutes since the cohort's load when decided


@dataclass
class GateContext:
    cohort: str
    index: int                   # the cohort's place in the fleet's order (0: the canary)
    nodes: list[str]
    version: int
    epoch: int
    loaded_ms: int               # wall clock, when the cohort's last node loaded the table
    reports: dict[str, dict]     # node_id → deploy_node's report
    log: Callable[[str], None] = print


def health_gate(ctx: GateContext) -> Decision:
    """Every node of the cohort passed `deploy_node`'s health check (deploy stops before the gate
    otherwise): promote."""
    rates = {n: [ctx.reports[n].get("rate_before"), ctx.reports[n].get("rate_after")] for n in ctx.nodes}
    return Decision(PROMOTE, "health: table active, no setsockopt error, connection rate held on "
                    + ", ".join(ctx.nodes), {"gate": "health", "rate_before_after": rates})


Moments = Callable[[str, int, int], dict]   # (node_id, from_ms, to_ms) → metric → arm → ArmMoments


def silver_moments(spark, cfg: Config) -> Moments:
    """A node's cumulative arm moments since the load, read again at each look from
    silver.connections (export.delivery.canary.canary_moments over the hours the interval spans:
    retransmission, rebuffer and delivery rate — silver's bytes_sent over request_time_ms)."""
    from pyspark.sql import functions as F

    path = table_path(cfg, CONNECTIONS)

    def moments(node_id: str, from_ms: int, to_ms: int) -> dict:
        if not delta_io.is_delta(spark, path):   # a fresh lake: no outcome rows yet (the gate observes)
            return {}
        conns = (spark.read.format("delta").load(path)
                 .where(F.col("hour").between(hour_of_ms(from_ms), hour_of_ms(to_ms))))
        return canary_moments(conns, node_id, from_ms, to_ms)
    return moments


def _outcome_rows(moments: dict) -> int:
    return max((sum(a.conns for a in arms.values()) for arms in moments.values()), default=0)


class CanaryVerdict:
    """The A/B on outcomes as a gate. `settings`: export.canary (CanarySettings); `moments`: where
    each look reads a node's cumulative moments (`silver_moments(spark, cfg)` in a deployment);
    `look_s`: seconds between looks. The window is bounded by `settings.max_minutes` of wall
    clock since the load. `clock` (ms) and `sleep` (s): another clock than the wall's, e.g. a
    simulated fleet's (flows/follow.py); with one, the load's time is the clock's when the gate is
    asked."""

    name = "canary"

    def __init__(self, settings, moments: Moments, look_s: float = 60.0,
                 clock: Callable[[], int] | None = None, sleep: Callable[[float], None] | None = None):
        self.settings, self.moments, self.look_s = settings, moments, look_s
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.sleep = sleep or time.sleep
        self.own_clock = clock is not None

    def __call__(self, ctx: GateContext) -> Decision:
        tests = {n: Canary(self.settings) for n in ctx.nodes}
        rows = {n: 0 for n in ctx.nodes}
        looks: list[dict] = []
        loaded_ms = self.clock() if self.own_clock else ctx.loaded_ms
        while True:
            self.sleep(self.look_s)
            now = self.clock()
            minute = round((now - loaded_ms) / 60_000, 4)
            looks.append(take_look(tests, rows, self.moments, loaded_ms, now, minute))
            d = judge(self.name, self.settings, tests, rows, looks, ctx.nodes, minute)
            if d is not None:
                return d
            ctx.log(f"cohort {ctx.cohort}: observing at {minute:g} min ({rows})")


def take_look(tests: dict[str, Canary], rows: dict[str, int], moments: Moments, from_ms: int, now_ms: int,
              minute: float) -> dict:
    """One look: each node still observing reads its cumulative moments over [from_ms, now_ms) and
    its test looks at them (`rows` gets its outcome rows); → the look's record."""
    for n, c in tests.items():
        if c.decision != "observe":
            continue
        m = moments(n, from_ms, now_ms)
        rows[n] = _outcome_rows(m)
        c.look(minute, m)
    return {"minute": minute, "rows": dict(rows), "decisions": {n: c.decision for n, c in tests.items()}}


def judge(name: str, settings, tests: dict[str, Canary], rows: dict[str, int], looks: list[dict],
          nodes: list[str], minute: float) -> Decision | None:
    """The cohort's decision after a look, from each node's test (`Canary`): any node's rollback
    rolls the cohort back; once no node is still observing, a node without outcome rows, or one
    not promoted (the window ended without evidence), makes it `observe` (not promoted); every
    node promoted promotes. None: keep observing. Shared by the blocking gate (`CanaryVerdict`)
    and the rollout in flight (export/delivery/inflight.py)."""
    evidence = {"gate": name, "looks": looks[-20:], "outcome_rows": dict(rows),
                "nodes": {n: c.evidence() for n, c in tests.items()}}
    bad = [n for n, c in tests.items() if c.decision == C_ROLLBACK]
    if bad:
        return Decision(ROLLBACK, "; ".join(f"{n}: {tests[n].reason}" for n in bad), evidence, minute)
    if any(c.decision == "observe" for c in tests.values()):
        return None
    empty = [n for n in nodes if rows[n] == 0]
    if empty:
        return Decision(OBSERVE, f"no outcome rows of {', '.join(empty)} in silver.connections "
                        f"within {minute:g} min of the load (export.canary.max_minutes "
                        f"{settings.max_minutes:g}): is the stream ingesting its logs? "
                        "Not promoted", evidence, minute)
    unjudged = [n for n, c in tests.items() if c.decision != C_PROMOTE]
    if unjudged:      # the window ended with no evidence either way: inconclusive, not promoted
        return Decision(OBSERVE, "; ".join(f"{n}: {tests[n].reason}" for n in unjudged), evidence, minute)
    return Decision(PROMOTE, "; ".join(f"{n}: {c.reason}" for n, c in tests.items()), evidence, minute)


class DecisionLog:
    """Every gate decision of the rollouts: kept in `rows` and, when `path` is given (the lake's
    gold.rollout_decisions, `for_config`), written there as a Delta table (delta-rs: no Spark in
    the rollout's process), one row per (rollout_id, cohort)."""

    COLUMNS = ("decided_at_ms", "rollout_id", "cohort", "node_ids", "epoch", "version", "minute",
               "decision", "reason", "evidence")

    def __init__(self, path: str | None = None):
        self.path, self.rows = path, []

    @classmethod
    def for_config(cls, cfg: Config) -> "DecisionLog":
        return cls(table_path(cfg, DECISIONS_TABLE))

    def record(self, rollout_id: str, ctx: GateContext, d: Decision) -> dict:
        row = {"decided_at_ms": int(time.time() * 1000), "rollout_id": rollout_id, "cohort": ctx.cohort,
               "node_ids": ",".join(ctx.nodes), "epoch": int(ctx.epoch), "version": int(ctx.version),
               "minute": float(d.minute), "decision": d.decision, "reason": d.reason,
               "evidence": json.dumps(d.evidence, default=str, sort_keys=True)}
        self.rows.append(row)
        if self.path:
            from deltalake import write_deltalake
            schema = pa.schema([("decided_at_ms", pa.int64()), ("rollout_id", pa.string()),
                                ("cohort", pa.string()), ("node_ids", pa.string()), ("epoch", pa.int64()),
                                ("version", pa.int64()), ("minute", pa.float64()), ("decision", pa.string()),
                                ("reason", pa.string()), ("evidence", pa.string())])
            data = pa.Table.from_pylist([row], schema=schema)
            if read_decisions(self.path, 1):
                # one row per (rollout, cohort): recording it again (a stream run judged again)
                # replaces it
                q = "rollout_id = '{}' AND cohort = '{}'".format(*(v.replace("'", "''") for v in (rollout_id, ctx.cohort)))
                write_deltalake(self.path, data, mode="overwrite", predicate=q)
            else:
                write_deltalake(self.path, data, mode="append")
        return row


def read_decisions(path: str, limit: int = 20) -> list[dict]:
    """The newest `limit` rows of gold.rollout_decisions at `path`, oldest first ([] when absent)."""
    if "://" not in path and not os.path.isdir(os.path.join(path, "_delta_log")):
        return []
    from deltalake import DeltaTable
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["decided_at_ms"])[-limit:]
