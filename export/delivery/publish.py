"""From an exported table to the fleet's store: the signing keys' place, the guards that stand
between an exported version and the store, and the fleet with its store as the configuration
names them."""
from __future__ import annotations

import os
import subprocess
import tempfile

from ccselect.config import Config, project_root
from ccselect.hours import Window
from ccselect.export.artifact import signing
from ccselect.export.delivery import guards
from ccselect.export.delivery.rollout import Fleet, live_table, load_fleet
from ccselect.export.delivery.store import Store, store_for
from ccselect.export.tables import aggregate

PRIVATE_NAME = "table-signing.key.pem"
PUBLIC_NAME = "table-signing.pub.pem"


class PublishError(ValueError):
    """A request the keys or gold.cc_tables cannot satisfy (no version, a key already there)."""


def key_paths(cfg: Config) -> tuple[str, str]:
    d = cfg.settings.export.keys_dir
    return os.path.join(d, PRIVATE_NAME), os.path.join(d, PUBLIC_NAME)


def _inside_repo(path: str) -> bool:
    repo = str(project_root())
    p = os.path.abspath(path)
    if not p.startswith(repo + os.sep):
        return False
    # inside the repo only ignored folders may hold a private key (var/ is ignored)
    r = subprocess.run(["git", "-C", repo, "check-ignore", "-q", p], capture_output=True)
    return r.returncode != 0


def init_keys(cfg: Config, force: bool = False) -> tuple[str, str]:
    priv, pub = key_paths(cfg)
    if _inside_repo(priv):
        raise PublishError(f"{priv} is inside the repository and not git-ignored: "
                           "a private key never goes into the repo (set export.keys_dir)")
    if os.path.exists(priv) and not force:
        raise PublishError(f"{priv} exists (use --force to replace it)")
    os.makedirs(os.path.dirname(priv), mode=0o700, exist_ok=True)
    signing.save_keypair(signing.generate_key(), priv, pub)
    return priv, pub


def publish(spark, cfg: Config, store: Store, version: int | None = None, log=print) -> dict:
    """Guards on an exported version (latest in gold.cc_tables by default), then upload it to the
    store. Raises guards.GuardRefused with every reason when a guard fails."""
    _, pub = key_paths(cfg)
    rows = aggregate.history(spark, cfg)
    if not rows:
        raise PublishError("gold.cc_tables is empty: run `ccs export` first")
    row = rows[-1] if version is None else next((r for r in rows if r["version"] == version), None)
    if row is None:
        raise PublishError(f"version {version} is not in gold.cc_tables")
    man, table = signing.read_manifest(row["manifest_path"], signing.load_public_key(pub))
    with tempfile.TemporaryDirectory(prefix="ccs-live-") as scratch:
        live = live_table(store, pub, scratch)
        prev = store.previous() if live is not None else None
        previous = (signing.read_manifest(store.fetch(prev, scratch), signing.load_public_key(pub))[1]
                    if prev is not None else None)
    hours = man["source_hours"]
    if live is None:
        preds = None
    elif "from_ms" in hours:      # a table of the stream: its sliding window (flows/stream.py)
        preds = aggregate.window_predictions(spark, cfg, hours["from_ms"], hours["to_ms"])
    else:
        preds = aggregate.extract(spark, cfg, Window.hours(hours["from"], hours["to"]))
    report = guards.run_all(cfg, man, table.entries, preds, live, table=table, previous=previous)
    for name, c in report.checks.items():
        log(f"guard {name}: {'ok' if c['ok'] else 'REFUSED'} — {c['detail']}")
    report.raise_if_refused()
    store.publish(row["manifest_path"])
    return {"version": man["version"], "guards": report.checks}


def fleet_and_store(cfg: Config, fleet_path: str, store_url: str | None = None) -> tuple[Fleet, Store]:
    _, pub = key_paths(cfg)
    return load_fleet(fleet_path, cfg, public_key=pub), store_for(cfg, store_url)
