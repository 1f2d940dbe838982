"""`ccs simulate`: the fleet simulator's command."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Optional

import typer
from tqdm import tqdm

from ccselect.config import Config, load_config
from ccselect.contract import ROTATE_MINUTES
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


@dataclass(frozen=True)
class FollowArgs:
    """`ccs simulate --follow`'s options, checked by `follow_params`."""
    out: Optional[str]
    nodes: Optional[int]
    start: Optional[str]
    seed: Optional[int]
    conns: Optional[int]
    fleet: Optional[str]
    store: Optional[str]
    public_key: Optional[str]
    start_hour: int
    minutes: int
    speed: float
    default_cc: str
    rotate_minutes: Optional[int]
    config: Optional[str]
    as_json: bool


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
    follow: bool = typer.Option(False, "--follow", help="the fleet that reacts (issue 58): each node's clients get "
                                "the CC its real agent gives them under the table live there, written minute by "
                                "minute as the agents' segments for ccs stream (docs/rollouts.md)"),
    fleet: Optional[str] = typer.Option(None, help="with --follow: the fleet file whose agents decide (default: pipeline.fleet)"),
    store: Optional[str] = typer.Option(None, help="with --follow: the artifact store the live tables are read from "
                                                   "(default: export.rollout.store)"),
    public_key: Optional[str] = typer.Option(None, help="with --follow: the key the tables are verified with "
                                                        "(default: the configuration's keys_dir)"),
    start_hour: int = typer.Option(0, help="with --follow: the simulated fleet's hour (0-based) the clock starts at"),
    minutes: int = typer.Option(60, help="with --follow: simulated minutes to run"),
    speed: float = typer.Option(60.0, help="with --follow: simulated seconds per wall-clock second (60: a minute a "
                                           "second; 0: as fast as it computes)"),
    default_cc: str = typer.Option("cubic", help="with --follow: the nodes' default CC (the control arm's)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG", help="configuration file"),
    as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON"),
) -> None:
    """Simulate a CDN edge fleet: transport log, access log and QoE beacons per node-hour,
    the IP→ASN/region reference table, and the ground truth in OUT/_truth (never for training).
    With --follow, the fleet that reacts to the tables its real agents load, as their segments."""
    from ccselect.sim.fleet import simulate

    if follow:
        args = FollowArgs(out, nodes, start, seed, conns, fleet, store, public_key, start_hour, minutes, speed,
                          default_cc, rotate_minutes, config, as_json)
        _follow(args)
        return
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


def follow_params(a: FollowArgs, fleet_nodes: int, cfg: Config) -> tuple[SimParams, str, int]:
    """The simulated fleet behind the fleet file's `fleet_nodes` (fleet node i serves simulated
    node i; `--nodes` may simulate more), long enough for the clock's `minutes` from `start_hour`;
    the output folder (default: <data_root>/stream/raw, where make run's stream reads the agents'
    segments) and the rotation (default: simulate.rotate_minutes, else 1: the agent's)."""
    s = cfg.settings.simulate
    if a.minutes < 1:
        raise typer.BadParameter("at least 1", param_hint="--minutes")
    if a.speed < 0:
        raise typer.BadParameter("0 (no waiting) or more simulated seconds per second", param_hint="--speed")
    if a.start_hour < 0:
        raise typer.BadParameter("an hour of the simulated fleet, 0-based", param_hint="--start-hour")
    if a.default_cc not in ("cubic", "bbr"):
        raise typer.BadParameter("the simulator models cubic and bbr", param_hint="--default-cc")
    nodes = fleet_nodes if a.nodes is None else a.nodes
    if nodes < fleet_nodes:
        raise typer.BadParameter(f"the fleet file has {fleet_nodes} nodes, each serving a simulated one: "
                                 f"--nodes {nodes} is too few", param_hint="--nodes")
    rotate = a.rotate_minutes if a.rotate_minutes is not None else (s.rotate_minutes or 1)
    if rotate not in ROTATE_MINUTES:
        raise typer.BadParameter(f"{rotate}: --follow writes segments, one of {ROTATE_MINUTES}",
                                 param_hint="--rotate-minutes")
    hours = a.start_hour + (a.minutes + 59) // 60 + 1
    given = {"start": a.start, "seed": a.seed, "conns_per_node_hour": a.conns}
    params = SimParams.from_settings(s, None, **{k: v for k, v in given.items() if v is not None},
                                     nodes=nodes, hours=hours, cc_mode="default")
    return params, a.out or os.path.join(cfg.data_root, "stream", "raw"), rotate


def _follow(a: FollowArgs) -> None:
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.delivery.rollout import load_fleet
    from ccselect.export.delivery.store import store_for
    from ccselect.flows import follow_stream
    from ccselect.flows.follow import FollowFleet

    cfg = load_config(a.config)
    fleet = load_fleet(a.fleet or cfg.settings.pipeline.fleet, cfg)
    params, out, rotate = follow_params(a, len(fleet.nodes), cfg)
    with tempfile.TemporaryDirectory(prefix="ccs-follow-") as scratch:
        ff = FollowFleet(params, fleet, store_for(cfg, a.store), a.public_key or key_paths(cfg)[1], scratch,
                         start_hour=a.start_hour, default_cc=a.default_cc)
        bar = tqdm(total=a.minutes, unit="simulated min", disable=a.as_json)
        rec = follow_stream.run(ff, out, a.minutes, a.speed, rotate, log=(lambda m: None) if a.as_json else typer.echo,
                                progress=lambda i: bar.update(1))
        bar.close()
    if a.as_json:
        typer.echo(json.dumps(rec, indent=1))
