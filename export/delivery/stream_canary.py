"""The canary's A/B verdict on each table a stream run emitted (issue 58; `make run`'s summary).

A live rollout looks at the canary's silver.connections rows as they arrive after the load
(export/delivery/gates.py, `CanaryVerdict`). A run over logs that are already written — `make
run` streams simulated hours through `ccs stream --once` — can judge each table once the stream is
done: for a table built at boundary `b` (the end of its window, simulated time), the canary's
rows that ended in [b, b + m minutes) for m = 1, 2, … up to `export.canary.max_minutes` (or the
last minute the lake has), each minute a look of export/delivery/canary.py's always-valid test,
exactly as the live gate looks every minute.

Which node is the canary: the simulated fleet's nodes are not the edge fleet's, so the node of
the simulated traffic with the most connections after the boundary stands for it (named in the
verdict). `make run`'s simulated hours are written before the stream runs, so each connection's
CC is fixed in advance: the table deployed changes nothing in the simulated arms, and the verdict
is on the simulated arms, not on the table's own effect (the reacting fleet, flows/follow.py, is
not behind `make run`; docs/rollouts.md); the summary line says so.

The verdict is the live gate's: `promote` only once every primary metric's always-valid
interval (`export.canary.primary`) excludes a harm beyond `export.canary.harm_margin`,
`rollback` once any metric (primary or guardrail) shows harm, else `observe` (not promoted)
when the window or the lake's minutes end: no harm shown is not taken as safety, so a table
whose primary intervals are still wider than the margin reads `observe` in the summary.

One Spark job per table: per (metric, arm, client address, minute since the boundary) sums of
the canary's ratio metrics (`metric_rows` over CANARY_METRICS, segment `all`); the looks' cumulative
cluster moments are then summed in Python.
"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from ccselect.config import Config
from ccselect.hours import hour_of_ms
from ccselect.lake import CONNECTIONS, table_path
from ccselect.export.delivery.canary import INCONCLUSIVE, OBSERVE, Canary
from ccselect.export.delivery.gates import Decision, DecisionLog, GateContext
from ccselect.export.delivery.store import StoreError
from ccselect.features.ab_moments import CANARY_METRICS, ArmMoments, metric_rows
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark.

COHORT = "canary (simulated arms)"


def canary_node(conns, from_ms: int, to_ms: int) -> str | None:
    """The node with the most connections ending in [from_ms, to_ms) (a Spark DataFrame)."""
    from pyspark.sql import functions as F
    r = (conns.where(F.col("ts_end_ms").between(from_ms, to_ms - 1)).groupBy("node_id").count()
         .orderBy(F.desc("count"), "node_id").limit(1).collect())
    return r[0]["node_id"] if r else None


def minute_sums(conns, node_id: str, from_ms: int, minutes: int) -> list[dict]:
    """Rows (metric, arm, client, minute, y, x, conns) of `node_id`'s connections ending in
    [from_ms, from_ms + minutes); `minute` counts from 0."""
    from pyspark.sql import functions as F

    mine = (conns.where((F.col("node_id") == node_id)
                        & F.col("ts_end_ms").between(from_ms, from_ms + minutes * 60_000 - 1))
            .withColumn("client_ip", F.concat_ws("|", F.col("client_ip").cast("string"),
                                                 F.floor((F.col("ts_end_ms") - from_ms) / 60_000).cast("string"))))
    rows = (metric_rows(mine, CANARY_METRICS).where(F.col("segment_kind") == "all")
            .groupBy("metric", "arm", "client_ip")
            .agg(F.sum("y").alias("y"), F.sum("x").alias("x"), F.count(F.lit(1)).alias("conns")).collect())
    out = []
    for r in rows:
        client, _, minute = r["client_ip"].rpartition("|")
        out.append({"metric": r["metric"], "arm": r["arm"], "client": client, "minute": int(minute),
                    "y": float(r["y"]), "x": float(r["x"]), "conns": int(r["conns"])})
    return out


def cumulative(rows: list[dict], minutes: int) -> dict[str, dict[str, Any]]:
    """metric → arm → ArmMoments of `rows` (`minute_sums`) in their first `minutes` minutes: the
    moments export.delivery.canary.canary_moments gives over the same interval."""
    cum: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(dict)   # (metric, arm) → client → [y, x, n]
    for r in rows:
        if r["minute"] < minutes:
            s = cum[(r["metric"], r["arm"])].setdefault(r["client"], [0.0, 0.0, 0])
            s[0] += r["y"]
            s[1] += r["x"]
            s[2] += r["conns"]
    moments: dict[str, dict[str, Any]] = defaultdict(dict)
    for (metric, arm), clients in cum.items():
        v = np.array(list(clients.values()), dtype=float).reshape(-1, 3)
        moments[metric][arm] = ArmMoments.of_clusters(v[:, 0], v[:, 1], int(v[:, 2].sum()))
    return dict(moments)


def looks(rows: list[dict], minutes: int, settings) -> Decision:
    """export/delivery/canary.py's test looked at after each minute 1..`minutes` on the cumulative
    moments of `rows` (`minute_sums`); → the decision, with the minute it was taken."""
    c = Canary(settings)
    conns, m = 0, 0
    for m in range(1, minutes + 1):
        moments = cumulative(rows, m)
        conns = max((sum(a.conns for a in arms.values()) for arms in moments.values()), default=0)
        if c.look(m, moments) != OBSERVE:
            break
    d, reason = c.decision, c.reason
    if d == INCONCLUSIVE:       # recorded as the gates record it: not promoted, with the test's reason
        d = OBSERVE
    if conns == 0:
        d, reason = OBSERVE, f"no outcome rows in {minutes} min after the table: not promoted"
    elif d == OBSERVE:
        reason = f"{reason}: only {minutes} min of outcomes in the lake after the table"
    return Decision(d, reason, {"gate": "canary", "outcome_rows": conns, **c.evidence()}, float(m))


def verdicts(spark, cfg: Config, tables: list[dict], decisions: DecisionLog | None = None, store=None,
             conns=None, settings=None) -> list[dict]:
    """The canary verdict of each emitted table of a stream run (`tables`: flows/stream.py's
    `tables`, with `version` and `boundary`); each recorded to `decisions` (default
    gold.rollout_decisions), with the table's epoch from `store` when given. `conns`: the
    connections (default silver.connections); `settings`: default export.canary."""
    from pyspark.sql import functions as F

    s = settings or cfg.settings.export.canary
    decisions = decisions if decisions is not None else DecisionLog.for_config(cfg)
    if conns is None:
        conns = spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
    last = conns.agg(F.max("ts_end_ms")).first()[0]
    out = []
    for t in tables:
        if "version" not in t or "boundary" not in t:
            continue
        b = int(t["boundary"])
        span = max(0, min(int(s.max_minutes), int(((last or b) - b) // 60_000)))
        window = conns.where(F.col("hour").between(hour_of_ms(b), hour_of_ms(b + int(s.max_minutes) * 60_000)))
        node = canary_node(window, b, b + span * 60_000) if span else None
        if node is None:
            d = Decision("observe", f"no outcome rows after the table in silver.connections (window {span} min): "
                         "not promoted", {"gate": "canary"}, 0.0)
        else:
            d = looks(minute_sums(window, node, b, span), span, s)
        epoch = 0
        if store is not None:
            try:
                epoch = store.serial(int(t["version"]))[0]
            except (StoreError, OSError, ValueError):
                pass
        ctx = GateContext(COHORT, 0, [node or "-"], int(t["version"]), epoch, b, {})
        row = decisions.record(f"stream:{epoch}:{t['version']}@{b}", ctx, d)
        ev = json.loads(row["evidence"])
        out.append({"version": int(t["version"]), "node_id": node, "decision": d.decision, "reason": d.reason,
                    "minute": d.minute, "metrics": {m: {k: v for k, v in x.items() if k in ("rel_change", "cs", "clusters")}
                                                    for m, x in (ev.get("metrics") or {}).items()}})
    return out


def summary_line(v: dict) -> str:
    """One line of `make run`'s summary for a table's verdict."""
    parts = []
    for m, x in sorted(v["metrics"].items()):
        if "rel_change" in x:
            parts.append(f"{m} {x['rel_change']:+.1%} [{x['cs'][0]:+.1%}, {x['cs'][1]:+.1%}]")
        else:
            parts.append(f"{m} {x.get('clusters', [0, 0])} clients/arm")
    return (f"    canary A/B on the simulated arms (its CCs fixed in advance: not this table's effect), "
            f"node {v['node_id'] or '-'}: {v['decision']} at {v['minute']:g} min — {v['reason']}"
            + (f"; {'; '.join(parts)}" if parts else ""))
