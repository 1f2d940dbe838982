"""`ccs keys init`, `ccs export`, `ccs rollout`, `ccs rollback`: signed prefix tables to the edge."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Optional

import typer

PRIVATE_NAME = "table-signing.key.pem"
PUBLIC_NAME = "table-signing.pub.pem"

keys_app = typer.Typer(help="Ed25519 keys that sign exported tables.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("export")(export_cmd)
    app.command("rollout")(rollout_cmd)
    app.command("rollback")(rollback_cmd)


def key_paths(cfg) -> tuple[str, str]:
    d = cfg.get("export.keys_dir")
    return os.path.join(d, PRIVATE_NAME), os.path.join(d, PUBLIC_NAME)


def _inside_repo(path: str) -> bool:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = os.path.abspath(path)
    if not p.startswith(repo + os.sep):
        return False
    # inside the repo only ignored folders may hold a private key (var/ is ignored)
    import subprocess
    r = subprocess.run(["git", "-C", repo, "check-ignore", "-q", p], capture_output=True)
    return r.returncode != 0


def init_keys(cfg, force: bool = False) -> tuple[str, str]:
    from export import signing
    priv, pub = key_paths(cfg)
    if _inside_repo(priv):
        raise typer.BadParameter(f"{priv} is inside the repository and not git-ignored: "
                                 "a private key never goes into the repo (set export.keys_dir)")
    if os.path.exists(priv) and not force:
        raise typer.BadParameter(f"{priv} exists (use --force to replace it)")
    os.makedirs(os.path.dirname(priv), mode=0o700, exist_ok=True)
    signing.save_keypair(signing.generate_key(), priv, pub)
    return priv, pub


@keys_app.command("init")
def keys_init_cmd(
    force: bool = typer.Option(False, "--force", help="replace an existing key pair"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Generate the table-signing key pair under export.keys_dir (private key mode 0600)."""
    from ccselect.config import load_config
    priv, pub = init_keys(load_config(config), force)
    typer.echo(json.dumps({"private_key": priv, "public_key": pub}, indent=1))


def export_cmd(
    hours: str = typer.Option(..., "--hours", help="HOUR or FROM..TO (inclusive) of gold.predictions"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Purity-aggregate the model's decisions (ALICCS Algorithm 1) into a signed prefix table,
    recorded in gold.cc_tables."""
    from ccselect.config import load_config
    from ccselect.spark import get_spark
    from export import aggregate, signing
    from jobs.sources import parse_hours
    cfg = load_config(config)
    priv, _ = key_paths(cfg)
    if not os.path.exists(priv):
        raise typer.BadParameter(f"no signing key at {priv}: run `ccs keys init` first")
    lo, hi = parse_hours(hours)
    spark = get_spark(cfg, "ccs-export")
    man = aggregate.run_export(spark, cfg, lo, hi, signing.load_private_key(priv))
    typer.echo(json.dumps(man, indent=1))


def publish(spark, cfg, store, version: int | None = None, log=print) -> dict:
    """Guards on an exported version (latest in gold.cc_tables by default), then upload it to the
    store. Raises guards.GuardRefused with every reason when a guard fails."""
    from export import aggregate, guards, signing
    from export.rollout import live_table
    _, pub = key_paths(cfg)
    rows = aggregate.history(spark, cfg)
    if not rows:
        raise typer.BadParameter("gold.cc_tables is empty: run `ccs export` first")
    row = rows[-1] if version is None else next((r for r in rows if r["version"] == version), None)
    if row is None:
        raise typer.BadParameter(f"version {version} is not in gold.cc_tables")
    man, table = signing.read_manifest(row["manifest_path"], signing.load_public_key(pub))
    with tempfile.TemporaryDirectory(prefix="ccs-live-") as scratch:
        live = live_table(store, pub, scratch)
    hours = man["source_hours"]
    preds = aggregate.extract(spark, cfg, hours["from"], hours["to"]) if live is not None else None
    report = guards.run_all(cfg, man, table.entries, preds, live)
    for name, c in report.checks.items():
        log(f"guard {name}: {'ok' if c['ok'] else 'REFUSED'} — {c['detail']}")
    report.raise_if_refused()
    store.publish(row["manifest_path"])
    return {"version": man["version"], "guards": report.checks}


def _fleet_and_store(cfg, fleet_path: str, store_url: Optional[str]):
    from export.rollout import load_fleet
    from export.store import Store
    _, pub = key_paths(cfg)
    return load_fleet(fleet_path, cfg, public_key=pub), Store(store_url or cfg.get("export.rollout.store"))


def rollout_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, canaries)"),
    version: Optional[int] = typer.Option(None, "--version", help="exported version (default: latest)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Guards, publish to the artifact store, then canaries → health → the rest."""
    from ccselect.config import load_config
    from ccselect.spark import get_spark
    from export import guards
    from export.rollout import Health, deploy
    cfg = load_config(config)
    fl, store = _fleet_and_store(cfg, fleet, store_url)
    spark = get_spark(cfg, "ccs-rollout")
    try:
        pub = publish(spark, cfg, store, version, log=typer.echo)
    except guards.GuardRefused as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    res = deploy(fl, store, pub["version"], Health.from_config(cfg), log=typer.echo)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)


def rollback_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, canaries)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Republish the store's previous version to the fleet (canaries first, same health checks)."""
    from ccselect.config import load_config
    from export.rollout import Health, deploy
    cfg = load_config(config)
    fl, store = _fleet_and_store(cfg, fleet, store_url)
    prev = store.previous()
    if prev is None:
        typer.echo(f"no previous version in the store {store.url}", err=True)
        raise typer.Exit(2)
    res = deploy(fl, store, prev, Health.from_config(cfg), log=typer.echo)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)
