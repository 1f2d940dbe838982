"""`ccs abtest`: the randomized control test of ALICCS §5.3 over a window of silver.connections."""
from __future__ import annotations

import json
from typing import Any, Optional

import typer

from ccselect.config import load_config
from ccselect.hours import Window
from ccselect.spark import get_spark
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.

KIND_ORDER = {"all": 0, "region": 1, "net_type": 2}


def register(app: typer.Typer) -> None:
    app.command("abtest")(abtest_cmd)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 100:+.2f}%"


def _rate(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.5f}"


def table_text(res: dict[str, Any]) -> str:
    """The result as a fixed-width table, one line per segment and metric (all, regions, types)."""
    rows = sorted(res["results"], key=lambda r: (r["metric"], KIND_ORDER.get(r["segment_kind"], 9), r["segment"]))
    ci = f"{res['confidence'] * 100:g}% CI"
    head = (f"{'metric':<13} {'kind':<8} {'segment':<10} {'conns c/t':>13} {'IPs c/t':>13} "
            f"{'control':>9} {'treatment':>9} {'change':>8} {ci:>19} {'p':>8}")
    lines = [f"window {res['window']}  (treatment = odd CRC32 of the client address; * = significant)", head]
    for r in rows:
        interval = "-" if r["ci_lo"] is None else f"[{_pct(r['ci_lo'])}, {_pct(r['ci_hi'])}]"
        p = "-" if r["p_value"] is None else f"{r['p_value']:.2g}"
        lines.append(f"{r['metric']:<13} {r['segment_kind']:<8} {r['segment']:<10} "
                     f"{r['n_control']:>6}/{r['n_treatment']:<6} {r['clusters_control']:>6}/{r['clusters_treatment']:<6} "
                     f"{_rate(r['control']):>9} {_rate(r['treatment']):>9} {_pct(r['rel_change']):>8} "
                     f"{interval:>19} {p:>8}{' *' if r['significant'] else ''}")
    a = res["assignment"]
    lines.append(f"assignment: control logged ab_control {a['control_logged_ab_control']}, treatment "
                 f"{a['treatment_logged_ab_control']}; BBR share control {a['bbr_share']['control']}, "
                 f"treatment {a['bbr_share']['treatment']}")
    return "\n".join(lines)


def abtest_cmd(
    hours: str = typer.Option(..., "--hours", help="window FROM..TO (inclusive), e.g. 2026-11-01T00..2026-11-01T05"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """ALICCS §5.3's randomized control test: rebuffer and retransmission rate, treatment (odd CRC32)
    vs control, overall, per region and per client-reported network type → gold.ab_test."""
    from ccselect.evaluation import abtest
    cfg = load_config(config)  # refuses a bad configuration before Spark starts
    window = Window.parse(hours)
    res = abtest.run(get_spark(cfg, "ccs-abtest"), cfg, window)
    typer.echo(json.dumps(res, indent=1, sort_keys=True, default=str) if as_json else table_text(res))
