"""`ccs cluster up|down|status|env`: the production topology on one machine (topology/)."""
from __future__ import annotations

import json
import shlex
from typing import Optional

import typer

from ccselect.config import load_config, project_root

import ccselect.topology as cluster

DEFAULT = "infra/conf/cluster-local.yaml"


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="the production topology on one machine: Spark standalone, s3proxy, "
                           "Postgres, the MLflow server, Airflow's scheduler", no_args_is_help=True)
    sub.command("up")(up_cmd)
    sub.command("down")(down_cmd)
    sub.command("status")(status_cmd)
    sub.command("env")(env_cmd)
    app.add_typer(sub, name="cluster")


def _cfg(config: Optional[str]):
    return load_config(config or str(project_root() / DEFAULT))


CONFIG = typer.Option(None, "--config", help=f"the topology's configuration (default {DEFAULT}; "
                                              "not CCS_CONFIG, which points the jobs at it)")


def up_cmd(config: Optional[str] = CONFIG,
           parts: Optional[str] = typer.Option(None, "--parts", help="comma-separated subset of "
                                                                      + ",".join(cluster.PARTS))):
    """Start every part that is not running (each waits until it serves), then print the status."""
    cfg = _cfg(config)
    chosen = tuple(p.strip() for p in parts.split(",")) if parts else cluster.PARTS
    unknown = set(chosen) - set(cluster.PARTS)
    if unknown:
        raise typer.BadParameter(f"unknown parts {sorted(unknown)}; the parts: {', '.join(cluster.PARTS)}")
    try:
        st = cluster.up(cfg, chosen, log=typer.echo)
    except cluster.ClusterError as e:
        typer.echo(f"cluster up failed: {e}", err=True)
        raise typer.Exit(1)
    _print(st)
    typer.echo(f"jobs on this topology: export CCS_CONFIG={cfg.path} (and `ccs cluster env` for the store's keys)")


def down_cmd(config: Optional[str] = CONFIG):
    """Stop every server of the topology (the data stays under cluster.home)."""
    st = cluster.down(_cfg(config), log=typer.echo)
    left = [n for n, s in st.items() if s["running"]]
    if left:
        typer.echo(f"still running: {', '.join(left)}", err=True)
        raise typer.Exit(1)


def status_cmd(config: Optional[str] = CONFIG, as_json: bool = typer.Option(False, "--json")):
    """What runs, where it listens, its log."""
    st = cluster.status(_cfg(config))
    if as_json:
        typer.echo(json.dumps(st, indent=2))
    else:
        _print(st)
    raise typer.Exit(0 if all(s["running"] for s in st.values()) else 3)


def env_cmd(config: Optional[str] = CONFIG):
    """The environment a client of the topology needs (`eval "$(ccs cluster env)"`)."""
    cfg = _cfg(config)
    for k, v in sorted(cluster.env(cfg, {}).items()):
        typer.echo(f"export {k}={shlex.quote(v)}")


def _print(st: dict) -> None:
    for name, s in st.items():
        state = ("listening on " + s["address"] if s["listening"] else "running") if s["running"] else "stopped"
        typer.echo(f"{name:16s} {state:32s} pid {s['pid'] or '-':<8} {s['log']}")
