"""`ccs keys init`, `ccs export`, `ccs rollout` (and `ccs rollout status`), `ccs rollback`,
`ccs freeze` / `ccs unfreeze`: signed prefix tables to the edge.

The export and delivery modules pull in pyspark, so each command imports them when it runs (the
CLI's start stays quick)."""
from __future__ import annotations

import json
import os
from typing import Optional

import typer

from ccselect.flows.job_metrics import write_freeze
from ccselect.config import Config, load_config
from ccselect.hours import Window
from ccselect.spark import get_spark
from ccselect.export.artifact import signing
from ccselect.export.delivery.rollout import deploy
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.

keys_app = typer.Typer(help="Ed25519 keys that sign exported tables.", no_args_is_help=True)
rollout_app = typer.Typer(help="Guards, publish, then the fleet cohort by cohort; `status`: where it stands.",
                          invoke_without_command=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("export")(export_cmd)
    app.add_typer(rollout_app, name="rollout")
    app.command("rollback")(rollback_cmd)
    app.command("freeze")(freeze_cmd)
    app.command("unfreeze")(unfreeze_cmd)
    app.command("undeploy")(undeploy_cmd)


def _gate(cfg: Config, gate: str, look_s: float):
    """The gate a cohort passes before the next (export/delivery/gates.py)."""
    from ccselect.export.delivery import gates
    if gate == "health":
        return gates.health_gate
    if gate == "canary":
        spark = get_spark(cfg, "ccs-rollout-canary")
        return gates.CanaryVerdict(cfg.settings.export.canary, gates.silver_moments(spark, cfg), look_s=look_s)
    raise typer.BadParameter(f"--gate {gate}: health or canary")


@keys_app.command("init")
def keys_init_cmd(
    force: bool = typer.Option(False, "--force", help="replace an existing key pair"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Generate the table-signing key pair under export.keys_dir (private key mode 0600)."""
    from ccselect.export.delivery.publish import PublishError, init_keys
    try:
        priv, pub = init_keys(load_config(config), force)
    except PublishError as exc:
        raise typer.BadParameter(str(exc))
    typer.echo(json.dumps({"private_key": priv, "public_key": pub}, indent=1))


@keys_app.command("epoch")
def keys_epoch_cmd(
    new: bool = typer.Option(False, "--new", help="open the next epoch (logged beside the key)"),
    reason: str = typer.Option("", "--reason", help="why: the new lake, store or key (required with --new)"),
    fleet_epoch: Optional[int] = typer.Option(None, "--fleet-epoch", help="with --new: the fleet's epoch (`ccs-edge floor`), when this keys dir is behind it"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """The deployment epoch tables are signed in; --new opens the next one (a new lake, store or
    key whose versions start again: docs/edge-versions.md). Agents take the next epoch's tables
    from then on and refuse the older epoch's."""
    from ccselect.export.artifact import epoch
    cfg = load_config(config)
    try:
        if new:
            e = epoch.open_next(cfg, reason, fleet_epoch)
            typer.echo(f"epoch {e} opened: the next export signs its tables in it ({reason})", err=True)
        typer.echo(json.dumps({"epoch": epoch.current(cfg), "opened": epoch.history(cfg)}, indent=1))
    except epoch.EpochError as exc:
        raise typer.BadParameter(str(exc))


def export_cmd(
    hours: str = typer.Option(..., "--hours", help="HOUR or FROM..TO (inclusive) of gold.predictions"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Purity-aggregate the model's decisions (ALICCS Algorithm 1) into a signed prefix table,
    recorded in gold.cc_tables."""
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.tables import aggregate
    cfg = load_config(config)
    priv, _ = key_paths(cfg)
    if not os.path.exists(priv):
        raise typer.BadParameter(f"no signing key at {priv}: run `ccs keys init` first")
    window = Window.parse(hours)
    spark = get_spark(cfg, "ccs-export")
    man = aggregate.run_export(spark, cfg, window, signing.load_private_key(priv))
    typer.echo(json.dumps(man, indent=1))


@rollout_app.callback()
def rollout_cmd(
    ctx: typer.Context,
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, cohorts)"),
    version: Optional[int] = typer.Option(None, "--version", help="exported version (default: latest)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    gate: Optional[str] = typer.Option(None, "--gate", help="what promotes a cohort: health (connection rate) or "
                                       "canary (the A/B on outcomes from silver.connections, export.canary); "
                                       "default export.rollout.gate"),
    look_s: float = typer.Option(60.0, "--look-s", help="with --gate canary --wait: seconds between looks"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="with --gate canary: look here until every cohort "
                              "is decided, or load the canary and leave the rollout in flight (`ccs rollout "
                              "advance`, the stream and the hourly runs look at it)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Guards, publish to the artifact store, then the fleet's cohorts in order (canary first),
    each gated before the next; decisions in gold.rollout_decisions. Refused while frozen."""
    if ctx.invoked_subcommand:
        return
    from ccselect.export.delivery.freeze import Frozen
    from ccselect.export.delivery.gates import DecisionLog
    from ccselect.export.delivery.guards import GuardRefused
    from ccselect.export.delivery.publish import PublishError, fleet_and_store, publish
    cfg = load_config(config)
    fl, store = fleet_and_store(cfg, fleet, store_url)
    gate = gate or cfg.settings.export.rollout.gate
    in_flight = gate == "canary" and not wait
    g = None if in_flight else _gate(cfg, gate, look_s)
    spark = get_spark(cfg, "ccs-rollout")
    try:
        pub = publish(spark, cfg, store, version, log=typer.echo)
        if in_flight:
            from ccselect.export.delivery import inflight
            from ccselect.flows.pipeline import rollout_lock
            with inflight.locked(rollout_lock(cfg)):
                res = inflight.begin(fl, store, pub["version"], cfg.settings.export.rollout.health, log=typer.echo,
                                     decisions=DecisionLog.for_config(cfg))
            typer.echo(json.dumps(res, indent=1, default=str))
            if res.get("ok") is False:
                raise typer.Exit(1)
            return
        res = deploy(fl, store, pub["version"], cfg.settings.export.rollout.health, log=typer.echo, gate=g,
                     decisions=DecisionLog.for_config(cfg))
    except PublishError as exc:
        raise typer.BadParameter(str(exc))
    except (GuardRefused, Frozen) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    if res.get("freeze"):        # the gate rolled the table back and froze the fleet
        _freeze_metrics(cfg)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)


@rollout_app.command("advance")
def rollout_advance_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, cohorts)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """One look at the rollout in flight (`ccs rollout --gate canary --no-wait`, or the pipeline's
    with export.rollout.gate canary): the canary's A/B on its outcomes in silver.connections so
    far; promote to the next cohort, keep observing, or roll back and freeze. For a timer (cron,
    a systemd timer) on the control host; exit 1 when it rolled back or sent the table back."""
    from ccselect.export.delivery import inflight
    from ccselect.export.delivery.gates import DecisionLog
    from ccselect.export.delivery.publish import fleet_and_store
    from ccselect.flows.pipeline import look_at, rollout_lock
    cfg = load_config(config)
    fl, store = fleet_and_store(cfg, fleet, store_url)
    with inflight.locked(rollout_lock(cfg)):
        res = look_at(cfg, fl, store, DecisionLog.for_config(cfg), log=typer.echo)
    if res.get("inflight", True) is None and "next" not in res:
        typer.echo("no rollout in flight")
        return
    _freeze_metrics(cfg)     # the freeze and in-flight gauges, whatever the look did
    typer.echo(json.dumps(res, indent=1, default=str))
    if res.get("decision") in ("rollback", "observe"):
        raise typer.Exit(1)


@rollout_app.command("status")
def rollout_status_cmd(
    fleet: Optional[str] = typer.Option(None, "--fleet", help="fleet file: show its cohorts"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    last: int = typer.Option(10, "--last", help="decisions shown (gold.rollout_decisions)"),
    as_json: bool = typer.Option(False, "--json"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """The store's current table and history, the freeze (if any) and its log, the fleet's
    cohorts, and the newest gate decisions."""
    from ccselect.lake import table_path
    from ccselect.export.delivery import freeze, inflight
    from ccselect.export.delivery.gates import DECISIONS_TABLE, read_decisions
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.delivery.rollout import load_fleet
    from ccselect.export.delivery.store import store_for
    cfg = load_config(config)
    store = store_for(cfg, store_url)
    st = store.state()
    out = {"store": store.url, "current": st["current"],
           "current_epoch": store.serial(st["current"])[0] if st["current"] is not None else None,
           "history": st["history"][-10:], "freeze": freeze.current(store),
           "freeze_log": freeze.history(store)[-5:],
           "decisions": read_decisions(table_path(cfg, DECISIONS_TABLE), last),
           "inflight": inflight.current(store), "inflight_last": inflight.last(store)}
    if fleet:
        fl = load_fleet(fleet, cfg, public_key=key_paths(cfg)[1])
        out["cohorts"] = {c: [n.node_id for n in ns] for c, ns in fl.cohorts}
    if as_json:
        typer.echo(json.dumps(out, indent=1, default=str))
        return
    typer.echo(f"store {out['store']}: current table {out['current']} (epoch {out['current_epoch']}), "
               f"history {out['history']}")
    typer.echo(f"FROZEN: {freeze.describe(out['freeze'])}" if out["freeze"] else "not frozen")
    for r in out["freeze_log"]:
        typer.echo(f"  {r['at']} {r['action']} by {r['who']}: {r['why']}")
    for c, ns in (out.get("cohorts") or {}).items():
        typer.echo(f"cohort {c}: {', '.join(ns)}")
    typer.echo(_describe_inflight(out["inflight"], out["inflight_last"]))
    for r in out["decisions"]:
        typer.echo(f"{r['rollout_id']} cohort {r['cohort']} ({r['node_ids']}) table {r['epoch']}:{r['version']} "
                   f"at {r['minute']:g} min: {r['decision']} — {r['reason']}")


def _describe_inflight(st: dict | None, last: dict | None) -> str:
    """The rollout in flight (export/delivery/inflight.py) in a line: its cohort, since when, the
    last look's outcome rows and each node's decision so far; or how the last one ended."""
    if st is None:
        if not last:
            return "no rollout in flight"
        return (f"no rollout in flight; the last, table {last['version']} ({last['rollout_id']}): "
                + ("every cohort promoted" if last.get("ok") else f"stopped: {last.get('stopped')}"))
    look = (st.get("looks") or [{}])[-1]
    line = (f"IN FLIGHT: table {st['epoch']}:{st['version']} ({st['rollout_id']}) on cohort {st['cohort']} "
            f"({', '.join(st['nodes'])}), {len(st.get('looks') or [])} looks, the last at "
            f"{look.get('minute', 0):g} min with outcome rows {look.get('rows', st.get('rows'))}")
    for n, t in (st.get("tests") or {}).items():
        line += f"\n  {n}: {t['decision']} — {t['reason']}"
    if st.get("next") is not None:
        line += f"\n  waiting behind it: table {st['next']}"
    return line


def _freeze_metrics(cfg: Config) -> None:
    """The freeze gauges rewritten at once (flows/job_metrics.py, with `pipeline.metrics_dir`), so
    CcsRolloutFrozen does not wait for the next rollout step; from the configured store, which is
    what that step reads. A failure is said and leaves the freeze as it is."""
    try:
        path = write_freeze(cfg)
    except Exception as exc:  # noqa: BLE001 — the freeze itself holds; only its gauge is late
        typer.echo(f"freeze metrics not written: {exc}", err=True)
        return
    if path:
        typer.echo(f"freeze metrics: {path}", err=True)


def freeze_cmd(
    reason: str = typer.Option(..., "--reason", help="why (kept in the store's freeze record and log)"),
    who: Optional[str] = typer.Option(None, "--who", help="who freezes (default: user@host)"),
    fleet: Optional[str] = typer.Option(None, "--fleet", help="also put every node of this fleet file back on the pinned table"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """The operator's kill switch: pin the store's current table fleet-wide and refuse every
    publish and rollout until `ccs unfreeze` (export/delivery/freeze.py)."""
    from ccselect.export.delivery import freeze
    from ccselect.export.delivery.publish import fleet_and_store
    from ccselect.export.delivery.store import store_for
    cfg = load_config(config)
    store = store_for(cfg, store_url)
    try:
        rec = freeze.freeze(store, reason, who)
    except (freeze.Frozen, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    typer.echo(freeze.describe(rec), err=True)
    _freeze_metrics(cfg)
    out = {"freeze": rec}
    if fleet and rec["pinned"] is not None:
        fl, _ = fleet_and_store(cfg, fleet, store_url)
        res = deploy(fl, store, rec["pinned"], cfg.settings.export.rollout.health, log=typer.echo, allow_older=True)
        out["pinned_on_fleet"] = res
        if not res["ok"]:
            typer.echo(json.dumps(out, indent=1, default=str))
            raise typer.Exit(1)
    typer.echo(json.dumps(out, indent=1, default=str))


def unfreeze_cmd(
    reason: str = typer.Option(..., "--reason", help="why the freeze can be lifted"),
    who: Optional[str] = typer.Option(None, "--who", help="who lifts it (default: user@host)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Lift the freeze: rollouts and publishing go on."""
    from ccselect.export.delivery import freeze
    from ccselect.export.delivery.store import StoreError, store_for
    cfg = load_config(config)
    try:
        rec = freeze.unfreeze(store_for(cfg, store_url), reason, who)
    except (StoreError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    _freeze_metrics(cfg)
    typer.echo(json.dumps(rec, indent=1))


def rollback_cmd(
    fleet: str = typer.Option("infra/fleet.yaml", "--fleet", help="fleet file (nodes, canaries)"),
    store_url: Optional[str] = typer.Option(None, "--store", help="artifact store (default: export.rollout.store)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Republish the store's previous version to the fleet (canaries first, same health checks).
    Refused while frozen (the freeze already pins a table)."""
    from ccselect.export.delivery.freeze import Frozen
    from ccselect.export.delivery.publish import fleet_and_store
    cfg = load_config(config)
    fl, store = fleet_and_store(cfg, fleet, store_url)
    prev = store.previous()
    if prev is None:
        typer.echo(f"no previous version in the store {store.url}", err=True)
        raise typer.Exit(2)
    try:
        res = deploy(fl, store, prev, cfg.settings.export.rollout.health, log=typer.echo)
    except Frozen as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps(res, indent=1, default=str))
    if not res["ok"]:
        raise typer.Exit(1)


def undeploy_cmd(
    fleet: Optional[str] = typer.Option(None, "--fleet", help="fleet file (default: pipeline.fleet, the one make run deploys to)"),
    config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
) -> None:
    """Take the fleet's enforcement off this machine: each node's sock_ops program detached, its
    pins and route CCs gone, its cgroup removed once empty (make clean runs this). Exits 1 when
    something is still there."""
    from ccselect.export.delivery.rollout import load_fleet
    from ccselect.export.edge.probe import undeploy
    cfg = load_config(config)
    res = undeploy(load_fleet(fleet or cfg.settings.pipeline.fleet, cfg), log=typer.echo)
    typer.echo(json.dumps(res, indent=1))
    if any(r["left"] for r in res.values()):
        raise typer.Exit(1)
