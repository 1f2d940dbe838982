"""A rollout in flight (issue 58): the canary's gate on outcomes without a process blocked on it.

`rollout.deploy` asks its gate and waits for the answer: with the A/B on outcomes
(`gates.CanaryVerdict`) that is up to `export.canary.max_minutes` per cohort, while the outcomes
it waits for are ingested by the stream. A stream, or an hourly DAG task, cannot block on a verdict
that needs its own next batches, so here the rollout is a record in the artifact store
(`rollout-inflight.json`) moved on by whoever looks next:

- `begin` loads the first cohort (the canary), each node health checked as in `deploy`, and
  writes the record: the table, the cohort, when it loaded (`clock`), the nodes loaded so far
  with their reports (what a rollback needs), and each node's sequential test state
  (`canary.Canary.to_doc`). The store's current table does not move. A table that arrives while
  another is in flight waits as `next` (the newest one wins): one rollout at a time, so a canary's
  arms always compare one table with the control arm's default CC.
- `advance` takes one look: each node of the cohort reads its cumulative moments since the load
  (`gates.silver_moments` in a deployment: what the stream has ingested by then), its test goes
  on from the state it had (the always-valid intervals narrow over the looks, whoever took them),
  and the cohort is judged as the blocking gate judges it (`gates.judge`). No decision: the record
  is written back and the rollout waits for the next look. `promote`: the next cohort loads
  (health checked), or after the last the store's current table becomes this one. `rollback`:
  every node loaded goes back to its previous table (the agent's own slot) and the fleet is
  frozen (export/delivery/freeze.py), the table waiting as `next` with it. `observe` (the window
  ended without evidence either way, or no outcome rows): the nodes go back, nothing is frozen,
  and `next` begins. Every decision goes to gold.rollout_decisions as `deploy`'s do.
- A freeze set by an operator while a rollout is in flight stops it at the next look: its nodes
  go back and the decision says who froze.

Which process looks: the stream after each micro-batch (flows/stream.py: silver then holds the
batch's outcomes), the hourly DAG's rollout before it begins the hour's table (flows/pipeline.py),
and `ccs rollout advance` (an operator, or a timer).

The clock (`Clock`): the wall's by default, the records' clock too in a deployment. A fleet whose
logs run on another clock — a simulated one at `--speed`, or a stream far behind — takes the
stream's `stream.rollout_clock: records` (flows/rollout_loop.RecordsClock): the cohort's load at
the end of the newest segment its nodes had written, plus a minute, and a look at the newest
minute silver holds for every node of the cohort. That clock steps (`step_ms`): an advance takes a
look at every minute of traffic since the last look, as the drill that measured the gate did
(bench/rollout_drill.py, a look a simulated minute), not one look for however many minutes a
micro-batch brought. They may race: each step holds an exclusive
lock on a file of the control host (`locked`), so the lookers must share one host's file system
(the one-machine topology does; several control hosts would need the store's own conditional
writes, which this does not use).

The promise of the test is the blocking gate's (export/delivery/canary.py): the confidence
sequences are valid at any number and timing of looks, so looking once a micro-batch, or once an
hour, changes how soon a decision comes, not how often it is wrong. The window
(`export.canary.max_minutes`) runs on `clock` from the cohort's load: the wall clock in a
deployment, where the records' times are the wall's too.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Any, Callable, Iterator

from ccselect.export.delivery import freeze
from ccselect.export.delivery.canary import Canary
from ccselect.export.delivery.gates import (OBSERVE, PROMOTE, ROLLBACK, Decision, DecisionLog, GateContext, Moments,
                                            judge, take_look)
from ccselect.export.delivery.rollout import (Fleet, Health, Node, freeze_on_rollback, load_cohort, rollback_node,
                                              store_goes_back)
from ccselect.export.delivery.store import Store

KEY = "rollout-inflight.json"
GATE = "canary"
#: the rollout's clock: a callable → ms (the wall's, `wall_ms`), or an object with
#: `loaded(nodes) -> ms` (when a table loaded now is live on every one of `nodes`) and
#: `now(nodes, loaded_ms) -> ms` (a look's time), e.g. flows/rollout_loop.RecordsClock
Clock = Any
FRESH = {"decision": OBSERVE, "reason": "no look yet", "states": {}}   # a test before its first look


def wall_ms() -> int:
    return int(time.time() * 1000)


def _loaded_ms(clock: Clock, nodes: list[str]) -> int:
    return int(clock.loaded(nodes)) if hasattr(clock, "loaded") else int(clock())


def _now_ms(clock: Clock, nodes: list[str], loaded_ms: int) -> int:
    return int(clock.now(nodes, loaded_ms)) if hasattr(clock, "now") else int(clock())


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on `path` (created) for one step of the rollout in flight."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def current(store: Store) -> dict | None:
    """The rollout in flight, or None."""
    rec = store.read_json(KEY)
    return rec if rec and rec.get("version") is not None else None


def idle(store: Store) -> bool:
    """Nothing in flight and no table waiting (one read of the record): nothing to look at."""
    rec = store.read_json(KEY) or {}
    return rec.get("version") is None and rec.get("next") is None


def last(store: Store) -> dict | None:
    """How the last rollout in flight ended (None before any ended)."""
    rec = store.read_json(KEY)
    return (rec or {}).get("last")


def _end(store: Store, st: dict, outcome: dict) -> None:
    """No rollout in flight any more; the record keeps how this one ended, and the table waiting."""
    store.write_json(KEY, {"version": None, "next": st.get("next"),
                           "last": {"rollout_id": st["rollout_id"], "version": st["version"], **outcome}})


def begin(fleet: Fleet, store: Store, version: int, health: Health, *, clock: Clock = wall_ms,
          log: Callable[[str], None] = print, decisions: DecisionLog | None = None) -> dict:
    """Start rolling `version` out: its canary cohort loads and the rollout is left in flight. With
    another in flight, `version` waits as its `next` (→ `queued_behind`). Refused while frozen
    (freeze.Frozen)."""
    freeze.refuse_if_frozen(store, f"rolling out table {version}", version)
    held = current(store)
    if held is not None:
        if held["version"] == version:
            return {"version": version, "inflight": held, "already": True}
        nxt = held.get("next")
        if nxt is None or store.serial(version) > store.serial(nxt):
            held["next"] = version
            store.write_json(KEY, held)
        log(f"table {version} waits: table {held['version']} is in flight on cohort {held['cohort']}")
        return {"version": version, "queued_behind": held["version"], "next": held["next"]}
    epoch = store.serial(version)[0]
    st = {"rollout_id": f"{epoch}:{version}@{wall_ms()}", "version": version, "epoch": epoch, "gate": GATE,
          "allow_older": store_goes_back(store, version), "started_ms": wall_ms(), "loaded": [], "decisions": [],
          "next": None}
    return _load(fleet, store, st, 0, health, clock, log, decisions or DecisionLog())


def _load(fleet: Fleet, store: Store, st: dict, index: int, health: Health, clock: Clock,
          log: Callable[[str], None], decisions: DecisionLog) -> dict:
    """Load the cohort at `index` and leave the rollout in flight on it (or, failed health: back)."""
    cohort, nodes = fleet.cohorts[index]
    reports: dict[str, dict] = {}
    loaded: list[tuple[Node, dict]] = []
    stopped = load_cohort(cohort, nodes, store, st["version"], health, log, st["allow_older"], reports, loaded)
    st["loaded"] += [{"node_id": n.node_id, "report": r} for n, r in loaded]
    if stopped:
        rolled = _back(fleet, st, log)
        _end(store, st, {"ok": False, "stopped": stopped, "rolled_back": rolled})
        out = {"version": st["version"], "ok": False, "stopped": stopped, "rolled_back": rolled, "nodes": reports}
        return _then_next(fleet, store, st, out, health, clock, log, decisions)
    st.update(index=index, cohort=cohort, nodes=[n.node_id for n in nodes],
              loaded_ms=_loaded_ms(clock, [n.node_id for n in nodes]), loaded_wall_ms=wall_ms(),
              tests={n.node_id: dict(FRESH) for n in nodes}, rows={n.node_id: 0 for n in nodes},
              looks=[])
    store.write_json(KEY, st)
    log(f"table {st['version']} in flight on cohort {cohort} ({', '.join(st['nodes'])})")
    return {"version": st["version"], "inflight": True, "cohort": cohort, "nodes": reports}


def _back(fleet: Fleet, st: dict, log: Callable[[str], None]) -> dict:
    """Every node the rollout loaded goes back to the table it had before (`rollback_node`)."""
    by_id = {n.node_id: n for n in fleet.nodes}
    out = {}
    for e in st["loaded"]:
        node = by_id.get(e["node_id"])
        out[e["node_id"]] = (rollback_node(node, e["report"], log) if node is not None else
                             {"node_id": e["node_id"], "rolled_back": False,
                              "detail": "not in the fleet file any more: not rolled back"})
    return out


def _then_next(fleet: Fleet, store: Store, st: dict, out: dict, health: Health, clock: Clock,
               log: Callable[[str], None], decisions: DecisionLog) -> dict:
    """The rollout ended: the table waiting as `next` begins, unless the fleet is frozen."""
    nxt = st.get("next")
    if nxt is None:
        return out
    if freeze.current(store) is not None:
        out["next_held"] = f"table {nxt} waits: the fleet is frozen"
        return out
    out["next"] = begin(fleet, store, nxt, health, clock=clock, log=log, decisions=decisions)
    return out


def _look_times(clock: Clock, st: dict, now: int) -> list[int]:
    """The times of this advance's looks: `now`, or with a clock that steps (`step_ms`, the
    records' clock: a look every minute of traffic) each step after the last look up to `now`,
    so the looks fall as often in the traffic however much of it a micro-batch brought (the
    cadence bench/rollout_drill.py measured the gate at); none when the clock has not moved."""
    step = getattr(clock, "step_ms", None)
    if not step:
        return [now]
    last = int(st.get("last_look_ms") or st["loaded_ms"])
    return list(range(last + step, now + 1, step))


def advance(fleet: Fleet, store: Store, health: Health, settings, moments: Moments, *, clock: Clock = wall_ms,
            log: Callable[[str], None] = print, decisions: DecisionLog | None = None) -> dict:
    """One look at the rollout in flight (module doc); → what happened (`observing`, or the
    decision and what followed). Nothing in flight: {"inflight": None}."""
    decisions = decisions or DecisionLog()
    rec = store.read_json(KEY) or {}
    st = rec if rec.get("version") is not None else None
    if st is None:
        nxt = rec.get("next")
        if nxt is not None and freeze.current(store) is None:   # held by a freeze since lifted
            return {"inflight": None, "next": begin(fleet, store, nxt, health, clock=clock, log=log,
                                                    decisions=decisions)}
        return {"inflight": None}
    nodes, cohort = st["nodes"], st["cohort"]
    ctx = GateContext(cohort, st["index"], nodes, st["version"], st["epoch"], st["loaded_ms"],
                      {e["node_id"]: e["report"] for e in st["loaded"] if e["node_id"] in nodes}, log)
    now = _now_ms(clock, nodes, st["loaded_ms"])
    minute = round((now - st["loaded_ms"]) / 60_000, 4)
    fr = freeze.current(store)
    if fr is not None:
        d = Decision(OBSERVE, f"stopped by a freeze: {freeze.describe(fr)}", {"gate": GATE, "freeze": fr}, minute)
    else:
        tests = {n: Canary.from_doc(settings, st["tests"][n]) for n in nodes}
        rows = {n: int(st["rows"][n]) for n in nodes}
        d = None
        for t in _look_times(clock, st, now):
            minute = round((t - st["loaded_ms"]) / 60_000, 4)
            st["looks"] = (st["looks"] + [take_look(tests, rows, moments, st["loaded_ms"], t, minute)])[-20:]
            st["last_look_ms"] = now = t
            d = judge(GATE, settings, tests, rows, st["looks"], nodes, minute)
            if d is not None:
                break
        st["tests"], st["rows"] = {n: c.to_doc() for n, c in tests.items()}, rows
        if d is None:
            store.write_json(KEY, st)
            log(f"table {st['version']} on cohort {cohort}: observing at {minute:g} min ({rows})")
            return {"version": st["version"], "cohort": cohort, "observing": True, "minute": minute, "rows": rows}
    d.evidence["inflight"] = {"loaded_ms": st["loaded_ms"], "now_ms": now, "loaded_wall_ms": st.get("loaded_wall_ms"),
                              "wall_s": round((wall_ms() - (st.get("loaded_wall_ms") or wall_ms())) / 1000, 1)}
    decisions.record(st["rollout_id"], ctx, d)
    st["decisions"].append({"cohort": cohort, "decision": d.decision, "minute": d.minute})
    log(f"cohort {cohort}: {d.decision} — {d.reason}")
    out = {"version": st["version"], "cohort": cohort, "decision": d.decision, "reason": d.reason,
           "minute": d.minute}
    if d.decision == PROMOTE:
        if st["index"] + 1 < len(fleet.cohorts):
            out["then"] = _load(fleet, store, st, st["index"] + 1, health, clock, log, decisions)
            return out
        store.set_current(st["version"])
        _end(store, st, {"ok": True, "decisions": st["decisions"]})
        out["ok"] = True
        return _then_next(fleet, store, st, out, health, clock, log, decisions)
    out["rolled_back"] = _back(fleet, st, log)
    if d.decision == ROLLBACK:
        fr = freeze_on_rollback(store, st["epoch"], st["version"], cohort, d.reason, st["rollout_id"], nodes, log)
        if fr is not None:
            out["freeze"] = fr
    _end(store, st, {"ok": False, "decisions": st["decisions"], "stopped": f"cohort {cohort}: {d.decision}"})
    return _then_next(fleet, store, st, out, health, clock, log, decisions)
