"""`ccs relocate --from OLD`: after the data root moved (a new `data_root`/`CCS_DATA_ROOT`), rewrite
the absolute paths under OLD that the data root's stores keep, so they name the new data root.

What keeps absolute paths (found with grep and by listing an MLflow store's text columns):
- the MLflow SQLite store (cfg `mlflow.tracking_uri`): `experiments.artifact_location`,
  `runs.artifact_uri`, `logged_models.artifact_location`, `model_versions.storage_location`
  (and `source` where it is a path) — every text column of every table is scanned, so a column a
  newer MLflow adds is covered too; a value is rewritten when it is OLD or starts with `OLD/`,
  bare or behind `file://`, `file:` or `sqlite:///`;
- `MLmodel` files under cfg `mlflow.artifact_root` (their `artifact_path:` line);
- `gold.cc_tables.manifest_path` (Delta; rewritten with one UPDATE when the table exists).
Left as they are: `bronze.*`/`bronze.quarantine`/`gold.ingest_audit` `source_file`, the
provenance of each ingested line (the file that was read, which a move does not change), and
Airflow's own metadata database.

Idempotent: a second run finds nothing under OLD (a value already under the new root is never
rewritten, even when the new root lies inside OLD). `--dry-run` counts and changes nothing.
"""
from __future__ import annotations

import json
import os
import sqlite3
from typing import Optional

import typer

from ccselect.config import Config, load_config
from ccselect.lake import CC_TABLES, table_path
from ccselect.spark import get_spark
# Imported inside the functions that use them (heavy, not needed to import this module): delta, pyspark.

SCHEMES = ("", "file://", "file:", "sqlite:///")


def register(app: typer.Typer) -> None:
    app.command("relocate")(relocate_cmd)


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def rewrite(value: str, old: str, new: str) -> str | None:
    """`value` with the data root `old` replaced by `new`, or None when it is not under `old`
    (or already under `new`)."""
    for scheme in SCHEMES:
        p, q = scheme + old, scheme + new
        if value == q or value.startswith(q + "/"):
            return None
        if value == p or value.startswith(p + "/"):
            return q + value[len(p):]
    return None


def relocate_sqlite(db_path: str, old: str, new: str, dry_run: bool = False) -> dict[str, int]:
    """Rewrite every text value under `old` in the SQLite database; → {"table.column": rows}."""
    counts: dict[str, int] = {}
    con = sqlite3.connect(db_path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        with con:
            for t in tables:
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')
                        if (r[2] or "").upper().split("(")[0] in ("TEXT", "VARCHAR", "CHAR", "CLOB", "STRING", "")]
                for c in cols:
                    rows = con.execute(f'SELECT rowid, "{c}" FROM "{t}" WHERE "{c}" LIKE ?',
                                       ("%" + old.replace("%", "") + "%",)).fetchall()
                    changed = [(v2, rowid) for rowid, v in rows if isinstance(v, str) and (v2 := rewrite(v, old, new))]
                    if changed:
                        counts[f"{t}.{c}"] = len(changed)
                        if not dry_run:
                            con.executemany(f'UPDATE "{t}" SET "{c}" = ? WHERE rowid = ?', changed)
    finally:
        con.close()
    return counts


def relocate_mlmodel_files(artifact_root: str, old: str, new: str, dry_run: bool = False) -> int:
    """Rewrite the `artifact_path:` line of every MLmodel file under `artifact_root`; → files changed."""
    n = 0
    for dirpath, _, files in os.walk(artifact_root):
        if "MLmodel" not in files:
            continue
        path = os.path.join(dirpath, "MLmodel")
        lines = open(path).read().split("\n")
        out, hit = [], False
        for line in lines:
            if line.startswith("artifact_path: ") and (v := rewrite(line[len("artifact_path: "):], old, new)):
                line, hit = "artifact_path: " + v, True
            out.append(line)
        if hit:
            n += 1
            if not dry_run:
                tmp = path + ".relocate"
                with open(tmp, "w") as f:
                    f.write("\n".join(out))
                os.replace(tmp, path)
    return n


def relocate_cc_tables(cfg: Config, old: str, new: str, dry_run: bool = False) -> int | None:
    """gold.cc_tables.manifest_path under `old` → `new`; → rows (None: no such table)."""
    path = table_path(cfg, CC_TABLES)
    if "://" in path or not os.path.isdir(os.path.join(path, "_delta_log")):
        return None
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    spark = get_spark(cfg, "ccs-relocate")
    col = F.col("manifest_path")
    under_old = (col == old) | col.startswith(old + "/")
    under_new = (col == new) | col.startswith(new + "/")
    cond = under_old & ~under_new
    n = spark.read.format("delta").load(path).filter(cond).count()
    if n and not dry_run:
        DeltaTable.forPath(spark, path).update(cond, {"manifest_path": F.concat(F.lit(new), F.expr(f"substring(manifest_path, {len(old) + 1})"))})
    return n


def relocate(cfg: Config, old_root: str, dry_run: bool = False) -> dict:
    """Everything above, from `old_root` to cfg's data root."""
    old, new = _norm(old_root), _norm(cfg.data_root)
    if old == new:
        raise ValueError(f"--from {old_root} is the configured data root already")
    result: dict = {"from": old, "to": new, "dry_run": dry_run, "mlflow": {}, "mlmodel_files": 0, "cc_tables": None}
    uri = cfg.settings.mlflow.tracking_uri
    if uri.startswith("sqlite:///"):
        db = uri[len("sqlite:///"):]
        if os.path.exists(db):
            result["mlflow"] = relocate_sqlite(db, old, new, dry_run)
    art = cfg.settings.mlflow.artifact_root
    if "://" not in art and os.path.isdir(art):
        result["mlmodel_files"] = relocate_mlmodel_files(art, old, new, dry_run)
    result["cc_tables"] = relocate_cc_tables(cfg, old, new, dry_run)
    result["changed"] = sum(result["mlflow"].values()) + result["mlmodel_files"] + (result["cc_tables"] or 0)
    return result


def relocate_cmd(
    old: str = typer.Option(..., "--from", help="the data root the stores were written under"),
    dry_run: bool = typer.Option(False, "--dry-run", help="count what would change, change nothing"),
    as_json: bool = typer.Option(False, "--json"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """After moving the data root: point the MLflow registry and gold.cc_tables at the new one."""
    try:
        result = relocate(load_config(config), old, dry_run)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    verb = "would rewrite" if dry_run else "rewrote"
    typer.echo(f"{result['from']} -> {result['to']}")
    for k, n in sorted(result["mlflow"].items()):
        typer.echo(f"  {verb} {n} row(s) of mlflow {k}")
    typer.echo(f"  {verb} {result['mlmodel_files']} MLmodel file(s)")
    typer.echo(f"  {verb} {result['cc_tables'] or 0} row(s) of gold.cc_tables" if result["cc_tables"] is not None
               else "  gold.cc_tables: none")
