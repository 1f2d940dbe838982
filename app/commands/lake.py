"""`ccs ingest`, `ccs validate`, `ccs features`, `ccs labels`: the lakehouse commands (heavy imports inside)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import datetime, timezone
from typing import Optional

import typer

from ccselect.hours import Window
from ccselect.lake import TRAINING_SET
from ccselect.spark import session_for

from ccselect.flows.stream_metrics import StreamMetrics
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest_cmd)
    app.command("features")(features_cmd)
    app.command("labels")(labels_cmd)
    app.command("validate")(validate_cmd)
    app.command("stream")(stream_cmd)
    app.command("audit")(audit_cmd)


def _session(config: Optional[str], app_name: str):
    return session_for(config, app_name)


def _emit(result: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
        return
    for k, v in result.items():
        typer.echo(f"{k}: {json.dumps(v, sort_keys=True, default=str)}")


def ingest_cmd(
    input: str = typer.Option(..., "--input", help="folder with <stream>/<node_id>/<YYYY-MM-DDTHH>.jsonl"),
    hours: Optional[str] = typer.Option(None, "--hours", help="HOUR or FROM..TO (inclusive), e.g. 2026-11-01T00..2026-11-01T05"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    no_silver: bool = typer.Option(False, "--no-silver", help="stop after bronze, quarantine and the audit"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Ingest the edge logs: bronze.*, bronze.quarantine, gold.ingest_audit, silver.connections."""
    from ccselect.jobs import ingest
    cfg, spark = _session(config, "ccs-ingest")
    result = ingest.run(spark, cfg, input, Window.parse(hours), silver=not no_silver)
    for s in result["skipped"]:
        typer.echo(f"not read: {s['path']} ({s['why']})", err=True)
    _emit(result, as_json)


def stream_cmd(
    input: Optional[str] = typer.Option(None, "--input", help="the edge logs' folder, segments <stream>/<node_id>/<YYYY-MM-DDTHHMM>.jsonl (default: pipeline.raw_dir)"),
    once: bool = typer.Option(False, "--once", help="process the segments there now, then stop (Trigger.AvailableNow)"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="stop after this many seconds"),
    deploy: Optional[bool] = typer.Option(None, "--deploy/--no-deploy", help="roll tables out to the fleet (default: pipeline.deploy as root)"),
    metrics_file: Optional[str] = typer.Option(None, "--metrics-file", help="keep the stream's metrics in this file, Prometheus's text format for node_exporter's textfile collector (flows/stream_metrics.py)"),
    source: Optional[str] = typer.Option(None, "--source", help="file (the segments under --input) or kafka (the broker's topics ccs.<stream>; --input then only holds the reference); default: stream.source"),
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help="the Kafka broker, host:port (default: stream.kafka_bootstrap, else the project's broker's <home>/bootstrap)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Fresh tables: ingest, score and re-aggregate the edge's log segments as they arrive (Spark
    Structured Streaming; a long-lived service, infra/ccs-stream.service), emitting a signed table
    every `stream.table_minutes` of traffic when it changed enough; stop with SIGTERM."""
    from ccselect.config import load_config
    from ccselect.spark import get_spark
    from ccselect.flows import stream
    from ccselect.jobs import stream_sources
    # --source, and the Kafka source's jar only in a session that reads Kafka
    cfg = stream_sources.session_config(load_config(config), source)
    if cfg.settings.stream.source == "kafka" and not bootstrap and not cfg.settings.stream.kafka_bootstrap:
        from ccselect.topology.kafka import Broker
        bootstrap = Broker(os.path.join(cfg.data_root, "kafka")).bootstrap()
    spark = get_spark(cfg, "ccs-stream")
    src = input or cfg.settings.pipeline.raw_dir
    log = lambda m: typer.echo(m, err=True)  # noqa: E731
    with contextlib.ExitStack() as stack:
        if metrics_file:
            log = stack.enter_context(StreamMetrics(metrics_file, src, cfg.settings.export.out, log))
        with contextlib.redirect_stdout(sys.stderr):      # the rollout's guard lines are log, not the result
            result = stream.run(spark, cfg, src, once=once, deploy=deploy, timeout_s=timeout, log=log,
                                bootstrap=bootstrap)
    _emit(result, True)


def validate_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="folder with <stream>/<node_id>/<YYYY-MM-DDTHH>.jsonl"),
    hours: Optional[str] = typer.Option(None, "--hours", help="HOUR or FROM..TO (inclusive)"),
    examples: int = typer.Option(3, "--examples", help="example lines shown per reason"),
    as_json: bool = typer.Option(False, "--json", help="print the whole report as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Check edge logs against the data contract without writing the lake (exit 1 on any problem)."""
    from ccselect.jobs import validate
    cfg, spark = _session(config, "ccs-validate")
    report = validate.run(spark, path, Window.parse(hours), k=examples,
                          missing_features=cfg.settings.ingest.missing_features,
                          imputable_features=cfg.settings.ingest.imputable_features)
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        for stream, s in report["streams"].items():
            typer.echo(f"{stream}: {s['files']} files, {s['lines_read']} lines, {s['accepted']} accepted, "
                       f"{s['quarantined']} quarantined {json.dumps(s['by_reason'], sort_keys=True)}")
        for f in report["files"]:
            if f["quarantined"]:
                typer.echo(f"  {f['file']}: {f['lines_read']} read, {f['accepted']} accepted, "
                           f"{f['quarantined']} quarantined {json.dumps(f['by_reason'], sort_keys=True)}")
        for stream, by_reason in report["examples"].items():
            for reason, lines in by_reason.items():
                typer.echo(f"{stream} {reason}:")
                for e in lines:
                    typer.echo(f"  {e['where']}: {e['raw']}")
        for n in report["notices"]:
            typer.echo(f"notice: {n['stream']}: {n['check']} in {n['file']}: {n['detail']}")
        typer.echo(f"{len(report['problems'])} problem(s)")
        for p in report["problems"]:
            typer.echo(f"  {p}")
        for h in report.get("hints", []):
            typer.echo(f"hint: {h}")
    if report["problems"]:
        raise typer.Exit(1)


def features_cmd(
    hours: str = typer.Option(..., "--hours", help="training window FROM..TO (inclusive)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Fit log1p+standardization statistics on silver.connections over a training window."""

    from ccselect.lake import connections_in
    from ccselect.features import scaling
    cfg, spark = _session(config, "ccs-features")
    window = Window.parse(hours)
    stats = scaling.fit(connections_in(spark, cfg, window), window=window.name)
    path = scaling.save(spark, cfg, stats, datetime.now(timezone.utc).isoformat())
    _emit({"window": stats.window, "n": stats.n, "artifact": path}, False)


def labels_cmd(
    hours: str = typer.Option(..., "--hours", help="window FROM..TO (inclusive)"),
    cellular_share: float = typer.Option(0.5, "--cellular-share", help="share of 4G/5G rows after balancing; 0 = no balancing"),
    min_sessions: int = typer.Option(20, "--min-sessions", help="QoE sessions per arm for a /24 best-CC label"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Build gold.training_set (net-type labels) and gold.best_cc_prefix24 (A/B labels)."""
    from ccselect.lake import connections_in, write_window
    from ccselect.features import labels
    cfg, spark = _session(config, "ccs-labels")
    window = Window.parse(hours)
    conns = connections_in(spark, cfg, window)
    ts = labels.training_set(conns, cellular_share or None)
    n_train = write_window(spark, cfg, ts, TRAINING_SET, window.name)
    n_best = write_window(spark, cfg, labels.best_cc_per_prefix24(conns, min_sessions), "gold.best_cc_prefix24", window.name)
    _emit({"window": window.name, "training_rows": n_train, "prefix24_rows": n_best}, False)


def audit_cmd(
    as_json: bool = typer.Option(False, "--json", help="print the whole report as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Check the lake's invariants: one row per identity, audit balanced with bronze, silver traceable to bronze, predictions one per silver row (exit 1 on any break)."""
    from ccselect.jobs import audit
    cfg, spark = _session(config, "ccs-audit")
    result = audit.run(spark, cfg)
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        for line in result["lines"]:
            typer.echo(line)
        typer.echo("audit: clean" if result["clean"] else f"audit: {len(result['findings'])} checks broken")
    if not result["clean"]:
        raise typer.Exit(1)
