"""`ccs run`: the main job on the embedded default (what `make run` calls). It grows as the
pipeline's stages land; today: simulate the fleet, ingest its last hours into the lakehouse
(bronze, quarantine, audit, silver), and summarize what it produced."""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from ccselect.config import load_config


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)


def run_cmd(config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
            ingest_hours: int = typer.Option(2, help="ingest the fleet's last N hours into Delta (0: none)")) -> None:
    """Run the main job: simulate the configured fleet, ingest its last hours into the Delta
    lakehouse, then print a summary and where to look."""
    from ccselect.sim.fleet import code_version, simulate
    from ccselect.sim.params import SimParams
    from ccselect.sim.summary import summarize

    cfg = load_config(config)
    d = cfg.section("simulate")
    params = SimParams(nodes=int(d["nodes"]), hours=int(d["hours"]), start=str(d["start"]),
                       seed=int(d["seed"]), conns_per_node_hour=int(d["conns_per_node_hour"]))
    out = d["out"]
    manifest_path = os.path.join(out, "manifest.json")
    old = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    if old.get("params") == json.loads(json.dumps(params.to_dict())) and old.get("code_version") == code_version():
        typer.echo(f"reusing the simulated fleet in {out} (same parameters, same simulator)")
        manifest = json.load(open(manifest_path))
    else:
        manifest = simulate(params, out)
    typer.echo(summarize(out, manifest))
    if ingest_hours > 0:
        typer.echo(_ingest_summary(cfg, out, manifest, ingest_hours))


def _ingest_summary(cfg, out: str, manifest: dict, n_hours: int) -> str:
    from datetime import datetime, timedelta

    from ccselect.lake import table_path
    from ccselect.spark import get_spark
    from jobs import ingest
    start = datetime.fromisoformat(manifest["params"]["start"])
    hours = manifest["params"]["hours"]
    lo = (start + timedelta(hours=max(0, hours - n_hours))).strftime("%Y-%m-%dT%H")
    hi = (start + timedelta(hours=hours - 1)).strftime("%Y-%m-%dT%H")
    spark = get_spark(cfg, "ccs-run")
    res = ingest.run(spark, cfg, out, (lo, hi))
    lines = ["", f"lakehouse       : ingested hours {lo}..{hi} of {len(manifest['nodes'])} nodes"]
    for stream, t in sorted(res["streams"].items()):
        lines.append(f"  {stream:10s}: {t['lines_read']:,} lines = {t['accepted']:,} accepted + "
                     f"{t['quarantined']:,} quarantined")
    lines.append(f"  silver.connections rows for those hours: {res.get('silver_rows', 0):,}")
    lines.append(f"  Delta tables under {cfg.get('lake.root')} (e.g. {table_path(cfg, 'silver.connections')})")
    return "\n".join(lines)
