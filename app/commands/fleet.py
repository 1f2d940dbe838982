"""`ccs fleet status`: one table across every node of a fleet file (issue 59), from each node's
own agent (`ccs-edge status --json`, in the node's network namespace when it has one): the live
table's version, epoch, age and time to expiry, whether it is enforced, the hit mix, the errors,
and what needs attention. Exit 0 when no node needs any, 3 when one does (as `ccs cluster
status`), `--json` for scripts. What Prometheus shows per node (docs/operations-metrics.md), here
without Prometheus."""
from __future__ import annotations

import json
from typing import Optional

import typer

from ccselect.config import load_config
from ccselect.export.delivery.rollout import Node, load_fleet

#: counters that are errors: any nonzero one needs attention
ERRORS = ("setsockopt_err", "caps_err", "storage_err", "log_dropped", "log_lost", "log_errors")
#: the hit mix: a share of the lookups each
MIX = ("hit_cubic", "hit_bbr", "hit_reno", "hit_keep", "hit_lowconf", "miss")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="the edge fleet as its agents see it", no_args_is_help=True)
    sub.command("status")(status_cmd)
    app.add_typer(sub, name="fleet")


def node_row(node: Node, status: dict | None, error: str | None, margin_s: float) -> dict:
    """One node's row from its agent's status (None with `error` when the agent could not be
    asked); `attention` lists what an operator must look at, empty when nothing."""
    row = {"node": node.node_id, "canary": node.canary, "netns": node.netns, "reachable": status is not None}
    if status is None:
        return row | {"attention": [f"agent unreachable: {error}"]}
    t = status.get("table") or {}
    cnt = status.get("counters") or {}
    lookups = cnt.get("lookups", 0)
    row |= {
        "attached": bool(status.get("attached")), "link": status.get("link"),
        # the epoch of the newest table made live on the node (the version rule's floor): the
        # agent keeps no epoch per slot
        "version": t.get("version"), "epoch": status.get("epoch_floor"), "model_version": t.get("model_version"),
        "age_s": t.get("age_s"), "expires_in_s": t.get("expires_in_s"), "expired": t.get("expired"),
        "enforced": bool(t.get("enforced")),
        "previous": (status.get("previous") or {}).get("version"),
        "established": cnt.get("established", 0), "lookups": lookups, "ab_control": cnt.get("ab_control", 0),
        "mix": {k: round(cnt.get(k, 0) / lookups, 4) for k in MIX} if lookups else {},
        "errors": {k: cnt[k] for k in ERRORS if cnt.get(k)},
        "log_degraded": bool((status.get("log") or {}).get("degraded")),
    }
    why = []
    if not row["attached"]:
        why.append(f"not attached (link {row['link']})")
    if not t:
        why.append("no live table")
    elif t.get("expired"):
        why.append("live table expired")
    elif t.get("expires_in_s") is not None and t["expires_in_s"] < margin_s:
        why.append(f"live table expires in {t['expires_in_s']:.0f} s")
    if row["errors"]:
        why.append("errors: " + ", ".join(f"{k} {v}" for k, v in row["errors"].items()))
    if row["log_degraded"]:
        why.append("transport log degraded")
    return row | {"attention": why}


def fleet_rows(nodes: list[Node], margin_s: float) -> list[dict]:
    rows = []
    for node in nodes:
        agent = node.agent()
        try:
            status, error = agent.status(), None
        except Exception as exc:  # noqa: BLE001 — a node that cannot answer is a row saying why
            status, error = None, str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        finally:
            agent.close()
        rows.append(node_row(node, status, error, margin_s))
    return rows


def _cell(v, fmt="{}") -> str:
    return "-" if v is None else fmt.format(v)


def render(rows: list[dict]) -> str:
    head = (f"{'node':24} {'version':>8} {'epoch':>6} {'age':>8} {'expires':>9} {'enforced':>8} "
            f"{'lookups':>8} {'miss':>6} {'ab_ctl':>7} {'errors':>7}  attention")
    lines = [head]
    for r in rows:
        if not r["reachable"]:
            lines.append(f"{r['node']:24} {'-':>8} {'-':>6} {'-':>8} {'-':>9} {'-':>8} {'-':>8} {'-':>6} "
                         f"{'-':>7} {'-':>7}  {'; '.join(r['attention'])}")
            continue
        lines.append(
            f"{r['node']:24} {_cell(r['version']):>8} {_cell(r['epoch']):>6} {_cell(r['age_s'], '{}s'):>8} "
            f"{_cell(r['expires_in_s'], '{:.0f}s'):>9} {'yes' if r['enforced'] else 'no':>8} {r['lookups']:>8} "
            f"{_cell(r['mix'].get('miss'), '{:.0%}'):>6} {r['ab_control']:>7} {sum(r['errors'].values()):>7}  "
            f"{'; '.join(r['attention']) or 'ok'}")
    return "\n".join(lines)


def status_cmd(
    fleet: Optional[str] = typer.Option(None, "--fleet", help="fleet file (default: pipeline.fleet)"),
    margin: float = typer.Option(1800.0, "--expiry-margin", help="a live table expiring sooner needs attention (seconds; CcsTableExpiringSoon's margin)"),
    as_json: bool = typer.Option(False, "--json", help="the rows as JSON"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Every node of the fleet file: live version, epoch, age, expiry, enforced or not, hit mix,
    errors; exit 3 when any node needs attention."""
    cfg = load_config(config)
    rows = fleet_rows(load_fleet(fleet or cfg.settings.pipeline.fleet, cfg).nodes, margin)
    typer.echo(json.dumps(rows, indent=1) if as_json else render(rows))
    raise typer.Exit(3 if any(r["attention"] for r in rows) else 0)
