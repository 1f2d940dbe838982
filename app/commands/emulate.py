"""`ccs emulate`: trace-driven QoE emulation of CC-selection policies (ALICCS §5.4)."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Optional

import typer

from ccselect.app import results
from ccselect.config import load_config
from ccselect.hours import Window
from ccselect.spark import get_spark
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def register(app: typer.Typer) -> None:
    app.command("emulate")(emulate_cmd)


def _table(res: dict) -> str:
    """The policies side by side: mean QoE, rebuffer and retransmission, the tail of the cells'
    rebuffer rate, the share of the CUBIC → Oracle gap closed, and estimate levels."""
    head = (f"{'policy':<22}{'sessions':>9}{'QoE':>9}{'rebuf':>8}{'retx':>8}{'reb p85':>9}{'reb p95':>9}"
            f"{'gap→oracle':>11}{'→in-sample':>11}{'bbr':>6}{'estimated':>10}")
    lines = [f"range {res['range']} ({res['sessions']:,} sessions, windows of {res['window_minutes']} min, "
             f"baselines trained on {res['train_hours']})", head]
    for name, d in res["policies"].items():
        if "qoe" not in d:
            continue
        lv = d["levels"]
        est = 1 - lv["observed"] / d["sessions"] if d["sessions"] else 0.0
        gap = d.get("gap_closed", {})
        f = lambda v, w, fmt: f"{v:>{w}{fmt}}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        lines.append(f"{name:<22}{d['sessions']:>9,}{d['qoe']:>9.5f}{d['rebuffer_rate']:>8.4f}{d['retrans_rate']:>8.4f}"
                     f"{f(d.get('rebuffer_pct', {}).get('p85'), 9, '.4f')}{f(d.get('rebuffer_pct', {}).get('p95'), 9, '.4f')}"
                     f"{f(gap.get('oracle'), 11, '.1%')}{f(gap.get('oracle_insample'), 11, '.1%')}"
                     f"{d['share_bbr']:>6.0%}{est:>10.0%}")
    for kind, tc in (res.get("tail_contrasts") or {}).items():
        if not tc:
            continue
        lines.append(f"{tc['reference']} − policy, cells' rebuffer rate ({kind}; 95% interval from {tc['reps']} "
                     f"resamples of {tc['nodes']} nodes; share of resamples where {tc['reference']} is lower):")
        for name, qs in tc["vs"].items():
            lines.append(f"  {name:<22}" + "  ".join(f"{q} {c['diff']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}] {c['p_lower']:.0%}"
                                                      for q, c in qs.items()))
    curve = res.get("lag_curve")
    if curve:
        lines.append(f"streaming table's lag curve (trigger {curve['trigger_minutes']} min, window "
                     f"{curve['window_minutes']} min): share of the true type's truth gain; rebuffer p85/p90/p95/p99 in truth")
        for pt in curve["points"]:
            parts = []
            for base in ("aliccs_stream", "true_table_stream"):
                d = pt.get(base)
                if not d:
                    continue
                share, pct = d.get("share_of_true_type_gain"), d.get("exp_rebuffer_pct") or {}
                parts.append(f"{base} " + (f"{share:.1%}" if share is not None else "-") + " "
                             + "/".join(f"{pct[q]:.5f}" for q in ("p85", "p90", "p95", "p99") if q in pct))
            lines.append(f"  lag {pt['lag_minutes']:>3} min  " + "   ".join(parts))
    return "\n".join(lines)


def emulate_cmd(
    hours: str = typer.Option(..., "--hours", help="hours to emulate, FROM..TO (inclusive); the learned baselines train on the hours before"),
    policies: Optional[str] = typer.Option(None, "--policies", help="comma-separated (default: all; true_type, true_table and "
                                           "true_table_stream only with --truth); a streaming policy at another lag as NAME@MINUTES"),
    truth: Optional[str] = typer.Option(None, "--truth", help="the simulator's output folder: adds true_type, true_table, "
                                        "true_table_stream and the truth check"),
    stream_lags: Optional[str] = typer.Option(None, "--stream-lags", help="the streaming table's lag curve at these lags "
                                              "(comma-separated minutes): adds aliccs_stream@L (and true_table_stream@L with --truth)"),
    lag_curve: bool = typer.Option(False, "--lag-curve", help="the lag curve at emulate.stream_lags_minutes"),
    window_minutes: Optional[int] = typer.Option(None, "--window-minutes", help="estimation window (default: emulate.window_minutes)"),
    train_hours: Optional[int] = typer.Option(None, "--train-hours", help="hours before the range the baselines learn from"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Replay hours of silver.connections under CC-selection policies (CUBIC, BBR, Oracle,
    ALICCS, Configanator, Disco, Pytheas) → gold.emulation, gold.emulation_cells."""
    from ccselect.evaluation import emulate
    cfg = load_config(config)
    window = Window.parse(hours)
    given = {"window_minutes": window_minutes, "train_hours": train_hours}
    p = replace(cfg.settings.emulate, **{k: v for k, v in given.items() if v is not None})
    pol = tuple(x.strip() for x in policies.split(",")) if policies else None
    if stream_lags:
        given_lags = [x.strip() for x in stream_lags.split(",") if x.strip()]
        if not all(x.isdigit() for x in given_lags):
            raise typer.BadParameter(f"lags are whole minutes >= 0, not {stream_lags!r}", param_hint="--stream-lags")
        lags = tuple(int(x) for x in given_lags)
    else:
        lags = p.stream_lags_minutes if lag_curve else ()
    spark = get_spark(cfg, "ccs-emulate")
    res = emulate.run(spark, cfg, window, pol, truth, p, stream_lags=lags)
    typer.echo(f"result saved to {results.save(cfg, 'emulate', res)}", err=True)
    typer.echo(json.dumps(res, indent=1, default=str) if as_json else _table(res))
