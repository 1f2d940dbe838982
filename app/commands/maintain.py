"""`ccs maintain`: the lake's compaction, retention and VACUUM (jobs/maintain.py; heavy imports inside)."""
from __future__ import annotations

import json
from typing import Optional

import typer

from ccselect.spark import session_for
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load pyspark.


def register(app: typer.Typer) -> None:
    app.command("maintain")(maintain_cmd)


def maintain_cmd(
    table: Optional[list[str]] = typer.Option(None, "--table", help="layer.table (repeatable; default: every table of the lake)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Compact the lake's closed hours, set its retention and VACUUM it (lake.retention_days,
    lake.open_hours): safe beside the stream and a backfill."""
    from ccselect.jobs import maintain
    cfg, spark = session_for(config, "ccs-maintain")
    try:
        result = maintain.run(spark, cfg, list(table or []) or None,
                              log=(lambda m: typer.echo(m, err=True)) if as_json else typer.echo)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        typer.echo(f"{len(result['tables'])} tables: {result['files_before']} → {result['files_after']} files, "
                   f"{result['vacuumed_files']} vacuumed (retention {result['retention_days']:g} days)")
