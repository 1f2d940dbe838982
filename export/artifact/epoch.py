"""The deployment epoch tables are signed in (issue 56, item 3; docs/edge-versions.md).

The edge agent orders tables by (epoch, version) and keeps that floor on disk. A version number
belongs to a lake (gold.cc_tables numbers from 1): a new lake, a new store that starts its
numbering again, or a new key with a fresh lake, signs in the next epoch, and only this module
opens one -- by an operator's explicit command (`ccs keys epoch --new --reason ...`), one step at a
time, each opening appended to a log beside the signing key. The epoch lives beside the key
(export.keys_dir), not in the lake: a new lake keeps the signer's epoch, and the operator decides
when its numbering starts again.

  <keys_dir>/epoch.json   {"epoch": E}
  <keys_dir>/epochs.log   one JSON line per opened epoch: epoch, at (unix s), reason, user, host
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import time

from ccselect.config import Config
from ccselect.export.artifact.signing import SERIAL_MAX

STATE_NAME = "epoch.json"
LOG_NAME = "epochs.log"


class EpochError(ValueError):
    """An epoch file that cannot be read, or an opening without a reason."""


def _dir(cfg: Config) -> str:
    return cfg.settings.export.keys_dir


def current(cfg: Config) -> int:
    """The epoch new tables are signed in: 0 until an operator opened one."""
    path = os.path.join(_dir(cfg), STATE_NAME)
    try:
        with open(path) as f:
            e = json.load(f)["epoch"]
    except FileNotFoundError:
        return 0
    except (ValueError, KeyError, TypeError) as exc:
        raise EpochError(f"{path}: not an epoch file ({exc}); put it right before exporting") from None
    if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e <= SERIAL_MAX:
        raise EpochError(f"{path}: epoch {e!r} is not an integer in 0..2^53-1")
    return e


def history(cfg: Config) -> list[dict]:
    """The epochs opened, oldest first (the log's lines)."""
    path = os.path.join(_dir(cfg), LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def open_next(cfg: Config, reason: str, fleet_epoch: int | None = None, now: int | None = None) -> int:
    """Open the next epoch: current + 1, or `fleet_epoch` + 1 when the fleet is further on (a new
    keys dir starts at 0: the operator reads the fleet's epoch with `ccs-edge floor` and names
    it). Logged (who, when, why, from which epoch), then made current. → the new epoch."""
    reason = (reason or "").strip()
    if not reason:
        raise EpochError("an epoch is opened with a reason (a new lake, store or key: say which)")
    d = _dir(cfg)
    os.makedirs(d, mode=0o700, exist_ok=True)
    cur = current(cfg)
    if fleet_epoch is not None and not 0 <= int(fleet_epoch) < SERIAL_MAX:
        raise EpochError(f"fleet epoch {fleet_epoch} is not in 0..2^53-2")
    base = max(cur, int(fleet_epoch)) if fleet_epoch is not None else cur
    e = base + 1
    if e > SERIAL_MAX:
        raise EpochError("no epoch left")
    rec = {"epoch": e, "from": base, "signer_epoch": cur, "at": int(time.time() if now is None else now),
           "reason": reason, "user": getpass.getuser(), "host": socket.gethostname()}
    # the log line first: an epoch in use always has its line
    with open(os.path.join(d, LOG_NAME), "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp = os.path.join(d, STATE_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"epoch": e}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, STATE_NAME))
    return e
