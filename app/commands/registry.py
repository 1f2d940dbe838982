"""`ccs train`, `ccs promote`, `ccs models` (the MLflow model registry) and `ccs infer` (batch
inference with the champion into gold.predictions); heavy imports inside the commands."""
from __future__ import annotations

import json
from typing import Optional

import typer

from ccselect.config import load_config
from ccselect.hours import Window
from ccselect.spark import get_spark
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("promote")(promote_cmd)
    app.command("models")(models_cmd)
    app.command("infer")(infer_cmd)


def _emit(result, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
    elif isinstance(result, dict):
        for k, v in result.items():
            typer.echo(f"{k}: {json.dumps(v, sort_keys=True, default=str)}")
    else:
        typer.echo(str(result))


def train_cmd(
    hours: str = typer.Option(..., "--hours", help="training window FROM..TO (inclusive), e.g. 2026-11-01T00..2026-11-01T23"),
    variant: Optional[str] = typer.Option(None, "--variant", help="aliccs, no_gan, no_rsc, no_variance, mlp, aliccs_nodes, "
                                                                   "dann_nodes, or select: chosen among model.select.candidates "
                                                                   "on leave-node-out folds of the training nodes "
                                                                   "(default pipeline.variant)"),
    share: Optional[float] = typer.Option(None, "--share", help="share of nodes to train on (default model.evaluate.share)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the node split and the training"),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="training epochs (default: models.train.TrainParams)"),
    k: Optional[int] = typer.Option(None, "--k", help="prefix groups per network type (default model.groups)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Train on a window, evaluate per held-out node, log + register in MLflow, run the gate."""
    from ccselect.models import train_job
    cfg = load_config(config)
    spark = get_spark(cfg, "ccs-train")
    window = Window.parse(hours)
    result = train_job.run(spark, cfg, window, variant=variant or cfg.settings.pipeline.variant, share=share, seed=seed, epochs=epochs, k=k,
                           progress=lambda m: typer.echo(m, err=True))
    if not as_json:
        result = {k: v for k, v in result.items() if k not in ("per_node", "groups", "params")}
    _emit(result, as_json)


def promote_cmd(
    version: Optional[str] = typer.Option(None, "--version", help="version to promote (default: @challenger)"),
    as_json: bool = typer.Option(False, "--json"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Set the `champion` alias (only on a version that passed the gate)."""
    from ccselect.models import registry
    try:
        _emit(registry.promote(load_config(config), version), as_json)
    except registry.GateError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)


def models_cmd(
    as_json: bool = typer.Option(False, "--json"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """List the registered versions with their aliases, gate and held-out accuracy."""
    from ccselect.models import registry
    rows = registry.list_versions(load_config(config))
    if as_json:
        _emit(rows, True)
        return
    if not rows:
        typer.echo("no registered versions")
    for r in rows:
        typer.echo(f"v{r['version']:>3} {','.join(r['aliases']) or '-':20s} gate={r['gate'] or '-':7s} "
                   f"mean={r['mean']:.4f} worst={r['worst']:.4f} {r['variant']} {r['window']}"
                   + (f"  ({r['gate_reasons']})" if r["gate_reasons"] else ""))


def infer_cmd(
    hours: str = typer.Option(..., "--hours", help="HOUR or FROM..TO (inclusive) of silver.connections to score"),
    precision: Optional[str] = typer.Option(None, "--precision", help="fp32 or bf16 (default infer.precision)"),
    engine: Optional[str] = typer.Option(None, "--engine",
                                         help="auto, arrow (in this process) or spark (default infer.engine)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Score silver.connections with models:/<name>@champion into gold.predictions (per node-hour)."""
    from ccselect.models import infer
    from ccselect.models.registry import load_champion
    cfg = load_config(config)
    try:
        champion = load_champion(cfg)
    except LookupError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    from ccselect.settings import INFER_ENGINES
    if engine is not None and engine not in INFER_ENGINES:
        raise typer.BadParameter(f"one of {', '.join(INFER_ENGINES)}", param_hint="--engine")
    window = Window.parse(hours)
    # no Spark session here: infer.run starts one only when the Spark job runs
    _emit(infer.run(None, cfg, window, champion=champion, precision=precision, engine=engine), as_json)
