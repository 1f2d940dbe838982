"""`ccs keys init`, `ccs export`, `ccs rollout`, `ccs rollback`: signed prefix tables to the edge.

The export and delivery modules pull in pyspark, so each command imports them when it runs (the
CLI's start stays quick)."""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from ccselect.config import load_config
from ccselect.hours import parse_hours
from ccselect.spark import get_spark
from export.artifact import signing
from export.delivery.rollout import deploy
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.

keys_app = typer.Typer(help="Ed25519 keys that sign exported tables.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("export")(export_cmd)
    app.command("rollout")(rollout_cmd)
    app.command("rollback")(rollback_cmd)
    app.command("undeploy")(undeploy_cmd)


@keys_app.command("init")
def keys_init_cmd(
    force: bool = typer.Option(False, "--force", help="replace an existing key pair"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Generate the table-signing key pair under export.keys_dir (private key mode 0600)."""
    from export.delivery.publish import PublishError, init_keys
    try:
        priv, pub = init_keys(load_config(config), force)
    except PublishError as exc:
        raise typer.BadParameter(str(exc))
    typer.echo(json.dumps({"private_key": priv, "public_key": pub}, indent=1))


@keys_app.command("epoch")
def keys_epoch_cmd(
    new: bool = typer.Option(False, "--new", help="open the next epoch (logged beside the key)"),
    reason: str = typer.Option("", "--reason", help="why: the new lake, store or key (required with --new)"),
    fleet_epoch: Optional[int] = typer.Option(None, "--fleet-epoch", help="with --new: the fleet's epoch (`ccs-edge floor`), when this keys dir is behind it"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """The deployment epoch tables are signed in; --new opens the next one (a new lake, store or
    key whose versions start again: docs/edge-versions.md). Agents take the next epoch's tables
    from then on and refuse the older epoch's."""
    from export.artifact import epoch
    cfg = load_config(config)
    try:
        if new:
            e = epoch.open_next(cfg, reason, fleet_epoch)
            typer.echo(f"epoch {e} opened: the next export signs its tables in it ({reason})", err=True)
        typer.echo(json.dumps({"epoch": epoch.current(cfg), "opened": epoch.history(cfg)}, indent=1))
    except epoch.EpochError as exc:
        raise typer.BadParameter(str(exc))


def export_cmd(
    hours: str = typer.Option(..., "--hours", help="HOUR or FROM..TO (inclusive) of gold.predictions"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Purity-aggregate the model's decisions (ALICCS Algorithm 1) into a signed prefix table,
    recorded in gold.cc_tables."""
    from export.delivery.publish import key_paths
    from export.tables import aggregate
    cfg = load_config(config)
    priv, _ = key_paths(cfg)
    if not os.path.exists(priv):
        raise typer.BadParameter(f"no signing key at {priv}: run `ccs keys init` first")
    lo, hi = parse_hours(hours)
    spark = get_spark(cfg, "ccs-export")
    man = aggregate.run_export(spark, cfg, lo, hi, signing.load_private_key(priv))
    typer.echo(json.dumps(man, indent=1))


def rollout_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, canaries)"),
    version: Optional[int] = typer.Option(None, "--version", help="exported version (default: latest)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Guards, publish to the artifact store, then canaries → health → the rest."""
    from export.delivery.guards import GuardRefused
    from export.delivery.publish import PublishError, fleet_and_store, publish
    cfg = load_config(config)
    fl, store = fleet_and_store(cfg, fleet, store_url)
    spark = get_spark(cfg, "ccs-rollout")
    try:
        pub = publish(spark, cfg, store, version, log=typer.echo)
    except PublishError as exc:
        raise typer.BadParameter(str(exc))
    except GuardRefused as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    res = deploy(fl, store, pub["version"], cfg.settings.export.rollout.health, log=typer.echo)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)


def rollback_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, canaries)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Republish the store's previous version to the fleet (canaries first, same health checks)."""
    from export.delivery.publish import fleet_and_store
    cfg = load_config(config)
    fl, store = fleet_and_store(cfg, fleet, store_url)
    prev = store.previous()
    if prev is None:
        typer.echo(f"no previous version in the store {store.url}", err=True)
        raise typer.Exit(2)
    res = deploy(fl, store, prev, cfg.settings.export.rollout.health, log=typer.echo)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)


def undeploy_cmd(
    fleet: Optional[str] = typer.Option(None, "--fleet", help="fleet file (default: pipeline.fleet, the one make run deploys to)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Take the fleet's enforcement off this machine: each node's sock_ops program detached, its
    pins and route CCs gone, its cgroup removed once empty (make clean runs this). Exits 1 when
    something is still there."""
    from export.delivery.rollout import load_fleet
    from export.edge.probe import undeploy
    cfg = load_config(config)
    res = undeploy(load_fleet(fleet or cfg.settings.pipeline.fleet, cfg), log=typer.echo)
    typer.echo(json.dumps(res, indent=1))
    if any(r["left"] for r in res.values()):
        raise typer.Exit(1)
