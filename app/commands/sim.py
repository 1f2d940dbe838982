"""`ccs simulate`: the fleet simulator's command."""
from __future__ import annotations

import json
from typing import Optional

import typer

from ccselect.config import load_config
from ccselect.contract import ROTATE_MINUTES
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)


def simulate_cmd(
    out: Optional[str] = typer.Option(None, help="output folder (default: simulate.out of the config)"),
    nodes: Optional[int] = typer.Option(None, help="edge nodes"),
    hours: Optional[int] = typer.Option(None, help="hours to simulate"),
    start: Optional[str] = typer.Option(None, help="first hour, ISO 8601 UTC, e.g. 2026-11-01T00:00:00"),
    seed: Optional[int] = typer.Option(None, help="random seed (same seed, same files)"),
    conns: Optional[int] = typer.Option(None, "--conns-per-node-hour", help="mean connections per node-hour"),
    cc_mode: str = typer.Option("ab", help="ab (CRC32 parity: odd→bbr), default (all cubic) or table"),
    table: Optional[str] = typer.Option(None, help="prefix→CC table CSV (cidr,cc) for --cc-mode table"),
    table_ab: bool = typer.Option(False, help="with a table: even CRC32 stays on the default as control"),
    fault_mss_prefix16: Optional[str] = typer.Option(None, help="plant an MSS anomaly in this /16 ('auto' picks one)"),
    fault_mss_bytes: int = typer.Option(536, help="with --fault-mss-prefix16: the anomalous MSS its IPv4 clients announce"),
    fault_start_hour: int = typer.Option(0, help="with --fault-mss-prefix16: the fleet hour (0-based) the fault starts"),
    rotate_minutes: Optional[int] = typer.Option(
        None, help="write the streams as the edge agent's rotated segments <YYYY-MM-DDTHHMM>.jsonl every N "
                   "minutes (1,2,3,4,5,6,10,12,15,20,30); 0: hourly files (default: simulate.rotate_minutes, 0)"),
    preset: Optional[str] = typer.Option(None, help="a named set of knobs (sim/params.PRESETS, docs/simulator.md "
                                                    "\"Presets\"), e.g. strong_shift; other options still apply"),
    workers: Optional[int] = typer.Option(None, help="worker processes (default: all cores)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG", help="configuration file"),
    as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON"),
) -> None:
    """Simulate a CDN edge fleet: transport log, access log and QoE beacons per node-hour,
    the IP→ASN/region reference table, and the ground truth in OUT/_truth (never for training)."""
    from ccselect.sim.fleet import simulate

    s = load_config(config).settings.simulate
    given = {"nodes": nodes, "hours": hours, "start": start, "seed": seed, "conns_per_node_hour": conns}
    try:
        params = SimParams.from_settings(
            s, preset, **{k: v for k, v in given.items() if v is not None},
            cc_mode=cc_mode, table_path=table, table_ab=table_ab, fault_mss_prefix16=fault_mss_prefix16,
            fault_mss_bytes=fault_mss_bytes, fault_start_hour=fault_start_hour)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--preset") from exc
    out = out or s.out
    rotate = s.rotate_minutes if rotate_minutes is None else rotate_minutes
    if rotate and rotate not in ROTATE_MINUTES:
        raise typer.BadParameter(f"{rotate} does not divide the hour: one of {ROTATE_MINUTES}, or 0 for hourly files",
                                 param_hint="--rotate-minutes")
    manifest = simulate(params, out, workers=workers, progress=not as_json, rotate_minutes=rotate)
    if as_json:
        typer.echo(json.dumps(manifest, indent=1))
    else:
        c = manifest["counts"]
        typer.echo(f"wrote {c['transport']:,} connections, {c['access']:,} requests "
                   f"({c['labelled'] / max(1, c['access']):.1%} labelled), {c['qoe']:,} playback sessions "
                   f"in {manifest['seconds']}s → {out}")
