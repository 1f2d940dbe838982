"""`ccs run`: the main job on the embedded default (what `make run` calls). It grows as the
pipeline's stages land; today: simulate the fleet and summarize what it produced."""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from ccselect.config import load_config


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)


def run_cmd(config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG")) -> None:
    """Run the main job: simulate the configured fleet, then print a summary and where to look."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    from ccselect.sim.summary import summarize

    cfg = load_config(config)
    d = cfg.section("simulate")
    params = SimParams(nodes=int(d["nodes"]), hours=int(d["hours"]), start=str(d["start"]),
                       seed=int(d["seed"]), conns_per_node_hour=int(d["conns_per_node_hour"]))
    out = d["out"]
    manifest_path = os.path.join(out, "manifest.json")
    if os.path.exists(manifest_path) and json.load(open(manifest_path))["params"] == params.to_dict():
        typer.echo(f"reusing the simulated fleet in {out} (same parameters)")
        manifest = json.load(open(manifest_path))
    else:
        manifest = simulate(params, out)
    typer.echo(summarize(out, manifest))
