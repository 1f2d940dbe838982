"""`ccs distill` and `ccs diagnose` (ALICCS §3.2); heavy imports inside the commands."""
from __future__ import annotations

import json
from typing import Optional

import typer

from ccselect.hours import Window
from ccselect.spark import session_for
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("distill")(distill_cmd)
    app.command("diagnose")(diagnose_cmd)
    app.command("handshake")(handshake_cmd)


def _session(config: Optional[str], app_name: str):
    return session_for(config, app_name)


def distill_cmd(
    hours: str = typer.Option(..., "--hours", help="training window FROM..TO (inclusive), e.g. 2026-11-01T00..2026-11-01T05"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Distill models:/<name>@champion into a multi-output decision tree; register it as <name>-tree."""
    from ccselect.distill.jobs import run_distill
    cfg, spark = _session(config, "ccs-distill")
    window = Window.parse(hours)
    result = run_distill(spark, cfg, window)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    m = result
    typer.echo(f"tree {m['tree']} distilled from {m['dnn']} over {m['window']}: depth {m['depth']} "
               f"(first passing depth {m['global_depth']}), {m['leaves']} leaves")
    typer.echo(f"fidelity {m['fidelity']:.4f} on {m['holdout_rows']} held-out rows (passed: {m['passed']}); "
               f"accuracy DNN {m['dnn_accuracy']:.4f}, tree {m['tree_accuracy']:.4f}, drop {m['accuracy_drop']:+.4f}")
    typer.echo("depth search (depth, fidelity, /16s below the subset threshold): " + str(m["search"]))
    if m["failing_subsets"]:
        typer.echo(f"/16s still below the subset threshold at max depth: {', '.join(m['failing_subsets'])}")
    typer.echo(f"mlflow run {m['run_id']}")


def handshake_cmd(
    hours: str = typer.Option(..., "--hours", help="training window FROM..TO (inclusive), e.g. 2026-11-01T00..2026-11-01T05"),
    features: Optional[str] = typer.Option(None, "--features", help="comma-separated subset of the handshake "
                                           "features (default handshake.features), e.g. mss_bytes,connection_time_us"),
    no_promote: bool = typer.Option(False, "--no-promote", help="register without the champion alias"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Fit the handshake tree (MSS, client window, SYN-ACK→ACK time → network type) on the window's
    labelled connections; register it as <name>-handshake (it ships in the next exported table)."""
    from ccselect.distill.jobs import run_handshake
    cfg, spark = _session(config, "ccs-handshake")
    window = Window.parse(hours)
    m = run_handshake(spark, cfg, window, promote=not no_promote,
                      features=[f.strip() for f in features.split(",")] if features else None)
    if as_json:
        typer.echo(json.dumps(m, indent=2, default=str))
        return
    h, reg = m["heldout"], m["registered"]
    typer.echo(f"{reg['name']} v{reg['version']}{' @champion' if reg['champion'] else ''}: {m['nodes']} nodes, "
               f"depth {m['depth']} over {', '.join(m['features'])}, from {m['rows']:,} labelled connections of {m['window']}")
    typer.echo(f"held-out nodes: accuracy {h['accuracy']:.4f} (majority type {m['majority_accuracy']:.4f}), "
               f"node mean {h['node_mean']:.4f} worst {h['node_worst']:.4f}, 4G recall {h['cell_recall']:.4f}")
    typer.echo("by feature subset (held-out accuracy): " + ", ".join(
        f"{k} {v['accuracy']:.4f}" for k, v in m["subsets"].items()))


def diagnose_cmd(
    prefix: Optional[str] = typer.Option(None, "--prefix", help="diagnose the rows inside this CIDR"),
    node: Optional[str] = typer.Option(None, "--node", help="diagnose the rows of this edge node"),
    worst: Optional[int] = typer.Option(None, "--worst", help="diagnose the K /16s with the lowest accuracy"),
    hours: Optional[str] = typer.Option(None, "--hours", help="window FROM..TO (default: the tree's training window)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """SHAP diagnostics on the champion's distilled tree: by default every /16 whose accuracy is
    below diagnose.accuracy_threshold. Writes an HTML report, gold.diagnostics and MLflow artifacts."""
    if sum(x is not None for x in (prefix, node, worst)) > 1:
        raise typer.BadParameter("give at most one of --prefix, --node, --worst")
    from ccselect.distill.jobs import run_diagnose
    cfg, spark = _session(config, "ccs-diagnose")
    result = run_diagnose(spark, cfg, Window.parse(hours), prefix, node, worst)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    typer.echo(f"{result['dnn']} / {result['tree']} over {result['window']}: {result['rows']} rows, "
               f"accuracy {result['accuracy']:.4f} (tree {result['tree_accuracy']:.4f}); "
               f"global top features: {', '.join(result['global_top'])}")
    if not result["subsets"]:
        typer.echo("no subset selected")
    for s in result["subsets"]:
        typer.echo(f"{s['kind']} {s['key']}: {s['rows']} rows, accuracy {s['accuracy']:.3f} "
                   f"(tree {s['tree_accuracy']:.3f}, agreement {s['fidelity']:.3f}); "
                   f"top: {', '.join(s['top'])}; over-relied: {', '.join(s['over_relied']) or 'none'}")
    typer.echo(f"report: {result['report']}")
