"""`ccs freeze` / `ccs unfreeze`: the operator's kill switch (issue 58).

A freeze is a record in the artifact store (`freeze.json`): who froze, when, why, and the table
it pins — the store's current table at that moment, the last one every cohort passed. While it
holds, the store refuses to publish a table or to make any other table current, and
`rollout.deploy` refuses every rollout except the pinned table's own (which `ccs freeze --fleet`
uses to put every node back on it); each refusal names the freeze. A rollout whose gate rolls a
table back freezes the fleet the same way (who: `rollout`), so no later rollout goes out before
an operator has looked. `ccs unfreeze` lifts it; every freeze and unfreeze is appended to
`freeze-log.json` in the store, which `ccs rollout status` shows.

The record is logged, not signed: whoever can write the store can also lift it, as they could
replace its tables' state; the agents never read it (they keep their own version floor).
"""
from __future__ import annotations

import getpass
import socket
import time
from datetime import datetime, timezone

from ccselect.export.delivery.store import FREEZE_KEY, Frozen, Store, StoreError, describe_freeze  # noqa: F401  (Frozen: callers catch freeze.Frozen)

LOG_KEY = "freeze-log.json"


def operator() -> str:
    """Who runs this command: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _now() -> tuple[int, str]:
    ms = int(time.time() * 1000)
    return ms, datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def current(store: Store) -> dict | None:
    """The freeze holding now, or None."""
    rec = store.read_json(FREEZE_KEY)
    return rec if rec and rec.get("frozen") else None


def history(store: Store) -> list[dict]:
    return store.read_json(LOG_KEY) or []


def describe(rec: dict) -> str:
    return describe_freeze(rec)


def refuse_if_frozen(store: Store, what: str, version: int | None = None) -> None:
    """Raise Frozen naming the freeze, unless none holds or `version` is the pinned table."""
    store._refuse_if_frozen(what, version)


def _log(store: Store, rec: dict) -> None:
    store.write_json(LOG_KEY, history(store) + [rec])


def freeze(store: Store, why: str, who: str | None = None, evidence: dict | None = None) -> dict:
    """Freeze the fleet on the store's current table; → the record. A second freeze while one
    holds is refused (it names the first)."""
    if not why.strip():
        raise ValueError("a freeze needs a reason (--reason)")
    held = current(store)
    if held is not None:
        raise Frozen(f"already frozen: {describe(held)}")
    ms, at = _now()
    pinned = store.current()
    rec = {"frozen": True, "action": "freeze", "who": who or operator(), "why": why, "at": at, "at_ms": ms,
           "pinned": pinned, "pinned_epoch": store.serial(pinned)[0] if pinned is not None else None}
    if evidence:
        rec["evidence"] = evidence
    store.write_json(FREEZE_KEY, rec)
    _log(store, rec)
    return rec


def unfreeze(store: Store, why: str, who: str | None = None) -> dict:
    """Lift the freeze; → the unfreeze record (with the freeze it lifted)."""
    if not why.strip():
        raise ValueError("an unfreeze needs a reason (--reason)")
    held = current(store)
    if held is None:
        raise StoreError(f"the store {store.url} is not frozen")
    ms, at = _now()
    rec = {"frozen": False, "action": "unfreeze", "who": who or operator(), "why": why, "at": at, "at_ms": ms,
           "lifted": {k: held[k] for k in ("who", "why", "at", "pinned")}}
    store.write_json(FREEZE_KEY, rec)
    _log(store, rec)
    return rec
