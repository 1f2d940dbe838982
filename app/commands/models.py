"""`ccs groups` and `ccs evaluate`: prefix groups and the cross-node evaluation (heavy imports
inside the commands). `ccs train` / `ccs promote` live in app/commands/registry.py."""
from __future__ import annotations

import json
import math
import sys
from typing import Optional

import typer

from ccselect.app import results
from ccselect.hours import Window
from ccselect.spark import session_for
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("groups")(groups_cmd)
    app.command("evaluate")(evaluate_cmd)


def _session(config: Optional[str], app_name: str):
    return session_for(config, app_name)


def _clean(o):
    """JSON without NaN (null instead), so `--json` output parses everywhere."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def groups_cmd(
    hours: str = typer.Option(..., "--hours", help="training window FROM..TO (inclusive)"),
    k: Optional[int] = typer.Option(None, "--k", help="groups per network type (default: model.groups.k; null → silhouette over k_range)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """K-means prefix groups per network type over the window's labelled /24s → gold.prefix_groups."""
    from ccselect.features.scaling import window_stats
    from ccselect.models.groups import fit_groups
    cfg, spark = _session(config, "ccs-groups")
    window = Window.parse(hours)
    stats, _, _ = window_stats(spark, cfg, window)
    res = fit_groups(spark, cfg, window, stats, k)
    if as_json:
        typer.echo(json.dumps(_clean(res), indent=2, sort_keys=True))
        return
    for name, info in res["types"].items():
        extra = f" silhouette {info['silhouette']}" if "silhouette" in info else ""
        typer.echo(f"{name}: K={info['k']} ({info['chosen_by']}) over {info['n_prefixes']} prefixes, "
                   f"{info['n_rows']} rows; sizes {info['sizes']}{extra}")
    typer.echo(f"{res['rows']} rows → {res['table']} (window {res['window']})")


def evaluate_cmd(
    hours: str = typer.Option(..., "--hours", help="window FROM..TO (inclusive)"),
    variants: Optional[str] = typer.Option(None, "--variants", help="comma-separated (default: all of evaluation.evaluate.ALL_VARIANTS: models.train.VARIANTS, the per-node standardized baselines, configanator, gbdt and gbdt_nodestd)"),
    share: Optional[float] = typer.Option(None, "--share", help="share of the window's nodes to train on, drawn from the labelled ones (default model.evaluate.share, 0.3)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="node split and training seed (default model.evaluate.seed)"),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="training epochs (default: TrainParams)"),
    k: Optional[int] = typer.Option(None, "--k", help="prefix groups per type (default: model.groups)"),
    grid: bool = typer.Option(False, "--grid", help="choose λ1, λ2 first by the Appendix D grid (models/grid.py)"),
    train_seeds: Optional[int] = typer.Option(None, "--train-seeds", help="train each network variant with this many seeds and average each node's accuracy over them (default model.evaluate.train_seeds, 1)"),
    as_json: bool = typer.Option(False, "--json", help="print every variant's table as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Cross-node evaluation (ALICCS §5.1): train on a share of nodes, score each held-out node;
    writes gold.model_eval and gold.model_eval_summary."""

    from ccselect.evaluation.evaluate import run_evaluation
    cfg, spark = _session(config, "ccs-evaluate")
    window = Window.parse(hours)
    say = (lambda m: print(m, file=sys.stderr)) if as_json else typer.echo
    res = run_evaluation(spark, cfg, window, variants=variants.split(",") if variants else None,
                         share=share, seed=seed, epochs=epochs, k=k, grid=grid, progress=say, train_seeds=train_seeds)
    say(f"result saved to {results.save(cfg, 'evaluate', _clean(res))}")
    if as_json:
        typer.echo(json.dumps(_clean(res), indent=1, sort_keys=True, default=str))
        return
    typer.echo(f"window {res['window']}: train nodes {res['train_nodes']} ({res['n_train']} rows), "
               f"{len(res['test_nodes'])} held out ({res['n_test']} rows); excluded {res['excluded_nodes']}")
    typer.echo(f"{'variant':14s} {'mean':>7s} {'worst':>7s} {'std':>7s} {'nodes':>5s} {'seeds':>5s} {'worst sd':>8s} "
               f"{'probe':>6s}")
    for v, r in res["variants"].items():
        sd = f"{r['worst_sd']:8.4f}" if r.get("train_seeds", 1) > 1 else f"{'-':>8s}"
        pr = f"{r['probe']['balanced_accuracy']:6.3f}" if r.get("probe") else f"{'-':>6s}"
        typer.echo(f"{v:14s} {r['mean']:7.4f} {r['worst']:7.4f} {r['std']:7.4f} {r['nodes']:5d} {r.get('train_seeds', 1):5d} {sd} {pr}")
    if res.get("probe"):
        f = res["probe"]["features"]
        typer.echo(f"probe: balanced accuracy of a classifier reading the node from G's output (chance "
                   f"{f['chance']:.3f}); from the features themselves {f['balanced_accuracy']:.3f}, per-node "
                   f"standardized {res['probe']['features_nodestd']['balanced_accuracy']:.3f}")
