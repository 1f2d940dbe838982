"""`ccs autoplex`, `ccs autoplex-similarity`: AutoPlex per-user-group CC parameters."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Optional

import typer

from ccselect.config import Config, load_config
from ccselect.hours import Window
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("autoplex")(autoplex_cmd)
    app.command("autoplex-similarity")(similarity_cmd)


def _check_engine(engine: Optional[str]) -> Optional[str]:
    from ccselect.settings import ENGINES
    if engine is not None and engine not in ENGINES:
        raise typer.BadParameter(f"one of {', '.join(ENGINES)}")
    return engine


def _window(cfg: Config, period: str, periods: int) -> Window:
    """`periods` periods from the one `--period` (ISO 8601, UTC unless it says) lies in."""
    t = datetime.fromisoformat(period)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return Window.from_periods(int(t.timestamp() * 1000), periods, cfg.settings.autoplex.period_minutes)


def autoplex_cmd(
    period: str = typer.Option(..., "--period", help="first period's start, ISO 8601 UTC, e.g. 2026-11-01T10:00"),
    periods: int = typer.Option(1, "--periods", min=1, help="number of consecutive periods"),
    engine: Optional[str] = typer.Option(None, "--engine", help="auto, arrow or spark (default: autoplex.engine)",
                                         callback=_check_engine),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Per user group and period, the better-performed sessions' statistics → gold.autoplex_params
    (AutoPlex Algorithm 1; policies from `autoplex.policies` in the configuration)."""
    from ccselect.jobs import autoplex
    cfg = load_config(config)
    # no Spark session here: run_parameters refuses a bad policy first, and starts a session only
    # when the Spark engine runs (autoplex.engine)
    typer.echo(json.dumps(autoplex.run_parameters(None, cfg, _window(cfg, period, periods), engine=engine), indent=1))


def similarity_cmd(
    period: str = typer.Option(..., "--period", help="first period's start, ISO 8601 UTC"),
    periods: int = typer.Option(4, "--periods", min=2, help="number of consecutive periods"),
    engine: Optional[str] = typer.Option(None, "--engine", help="auto, arrow or spark (default: autoplex.engine)",
                                         callback=_check_engine),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """AutoPlex §3.4: how much better- and worse-performed sessions change between adjacent
    periods → gold.autoplex_similarity and a plot under <data_root>/reports/."""
    from ccselect.jobs import autoplex
    cfg = load_config(config)
    autoplex.load_policies(cfg.settings.autoplex)
    res = autoplex.run_similarity(None, cfg, _window(cfg, period, periods),
                                  os.path.join(cfg.data_root, "reports"), engine=engine)
    typer.echo(json.dumps(res, indent=1, default=str))
