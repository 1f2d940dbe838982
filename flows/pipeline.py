"""The pipeline's steps as plain functions of (configuration, time), one per Airflow task: the DAGs
in dags/ only wire these, and `make run` calls the DAGs. Every step is keyed by its hour, period
or window and is safe to repeat (the jobs underneath replace their partitions). With
`pipeline.metrics_dir` set, each step's run writes its rows and duration there
(flows/job_metrics.py: `ccs-job-<job>.prom` for node_exporter's textfile collector), and a rollout
also the store's freeze (`ccs-rollout-freeze.prom`)."""
from __future__ import annotations

import json
import os
import sys
from datetime import datetime, datetime as _dt, timedelta, timezone

from ccselect.flows.job_metrics import measured, write_freeze
from ccselect.config import Config, load_config
from ccselect.hours import HOUR_FMT, Window, hour_of
from ccselect.lake import TRAINING_SET
from ccselect.spark import get_spark
from ccselect.export.artifact import signing
from ccselect.export.delivery.rollout import deploy
# Imported inside the functions that use them (heavy, not needed to import this module): our modules that load torch, pyspark or mlflow.


def previous_period(ts: datetime, cfg: Config | None = None) -> datetime:
    """The start of the AutoPlex period that ends at `ts` (periods of `autoplex.period_minutes`)."""
    cfg = cfg or load_config()
    minutes = cfg.settings.autoplex.period_minutes
    ts = ts.astimezone(timezone.utc)
    epoch_min = int(ts.timestamp() // 60)
    end = epoch_min - epoch_min % minutes
    return datetime.fromtimestamp((end - minutes) * 60, tz=timezone.utc)


def report(task: str, result):
    """Print a task's result as one `CCS_STEP <task> <json>` line (what `make run` shows while the
    DAGs run; Airflow keeps it in the task log too) and return it."""
    line = f"CCS_STEP {task} {json.dumps(result, default=str, sort_keys=True)}"
    print(line, flush=True)
    if sys.stdout is not sys.__stdout__:  # Airflow redirected the task's stdout into its log
        os.write(1, (line + "\n").encode())
    return result


def _spark(cfg: Config, app: str):
    return get_spark(cfg, app)


def asset_uri(name: str, cfg: Config | None = None) -> str:
    """The URI of lake table `name` (<layer>.<table>) as an Airflow asset: its Delta folder, on
    the object store or (file://) on a disk. The hourly DAG's tasks emit these assets, so a DAG or
    a sensor can wait on a table instead of a clock."""
    root = (cfg or load_config()).settings.lake.root.rstrip("/")
    layer, _, table = name.partition(".")
    if not layer or not table:
        raise ValueError(f"a lake table is <layer>.<table>, not {name!r}")
    path = f"{root}/{layer}/{table}"
    return path if "://" in path else "file://" + path


# ---- hourly -------------------------------------------------------------------------------------

@measured("ingest")
def ingest_hour(hour: str, cfg: Config | None = None) -> dict:
    """bronze, quarantine, audit and silver for one hour of every node; fails when the hour has no
    files at all (the sensor of a real deployment), so the rest of the hourly run waits."""
    from ccselect.jobs import ingest
    cfg = cfg or load_config()
    res = ingest.run(_spark(cfg, "ccs-ingest"), cfg, cfg.settings.pipeline.raw_dir, Window.hours(hour))
    return {"hour": hour, "files": res["files"], "silver_rows": res.get("silver_rows", 0),
            "streams": res["streams"]}


# ---- the lake's upkeep ----------------------------------------------------------------------------

@measured("maintain")
def maintain_lake(cfg: Config | None = None) -> dict:
    """Compaction of closed hours, retention and VACUUM of every table (jobs/maintain.py)."""
    from ccselect.jobs import maintain
    cfg = cfg or load_config()
    res = maintain.run(_spark(cfg, "ccs-maintain"), cfg)
    return {k: res[k] for k in ("files_before", "files_after", "vacuumed_files", "retention_days")} | {
        "tables": len(res["tables"])}


# ---- AutoPlex -----------------------------------------------------------------------------------

@measured("autoplex")
def autoplex_period(start: datetime, cfg: Config | None = None) -> dict:
    """AutoPlex Algorithm 1 for the period starting at `start` → gold.autoplex_params."""
    from ccselect.jobs import autoplex
    cfg = cfg or load_config()
    window = Window.from_periods(int(start.astimezone(timezone.utc).timestamp() * 1000), 1,
                                 cfg.settings.autoplex.period_minutes)
    # run_parameters refuses a bad policy first; no session unless the Spark engine runs
    # (autoplex.engine: auto runs in this process on a local lake)
    return autoplex.run_parameters(None, cfg, window)


@measured("infer", skip_on=(LookupError,))
def infer_hour(hour: str, cfg: Config | None = None) -> dict:
    """gold.predictions for the hour with `models:/<name>@champion` (LookupError when there is no
    champion yet: nothing is exported until a human — or `pipeline.auto_promote` — promotes one)."""
    from ccselect.models import infer
    cfg = cfg or load_config()
    return infer.run(_spark(cfg, "ccs-infer"), cfg, Window.hours(hour))


def export_window(hour: str, cfg: Config | None = None) -> Window:
    """The hours an hourly export aggregates: the last `pipeline.export_window_hours` up to `hour`."""
    cfg = cfg or load_config()
    n = cfg.settings.pipeline.export_window_hours
    end = datetime.strptime(hour, HOUR_FMT).replace(tzinfo=timezone.utc)
    return Window.hours(hour_of(end - timedelta(hours=n - 1)), hour)


@measured("export")
def export_hour(hour: str, cfg: Config | None = None) -> dict:
    """ALICCS Algorithm 1 over the window's decisions → a signed table, recorded in gold.cc_tables."""

    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.tables import aggregate
    cfg = cfg or load_config()
    priv, _ = key_paths(cfg)
    if not os.path.exists(priv):
        raise FileNotFoundError(f"no signing key at {priv}: run `ccs keys init` once")
    man = aggregate.run_export(_spark(cfg, "ccs-export"), cfg, export_window(hour, cfg), signing.load_private_key(priv))
    return {k: man[k] for k in ("version", "model_version", "entries", "coverage", "agreement",
                                "memory_saving", "manifest_path") if k in man}


class TableRefused(RuntimeError):
    """A guard refused the table: a verdict on this table, which retrying cannot change."""


@measured("rollout", also=write_freeze)
def rollout(version: int, cfg: Config | None = None, deploy_fleet: bool | None = None, spark=None,
            look: bool = True, clock=None) -> dict:
    """Guards, publish to the artifact store, then the fleet (canaries first), gated by
    `export.rollout.gate`: `health`, every cohort in this call (`rollout.deploy`); `canary`, a
    rollout in flight (export/delivery/inflight.py): the one in flight takes a look first, then
    this table's canary loads, or it waits behind the one in flight; later looks (the stream's
    micro-batches, the next hourly run, `ccs rollout advance`) move it on. The fleet step needs
    root (eBPF); without it — or with `pipeline.deploy: false` — the run stops at the published,
    signed artifact and says so. `look`: False where the caller has just looked (the stream);
    `clock`: the rollout in flight's (inflight.Clock; default the wall's)."""
    from ccselect.export.delivery.guards import GuardRefused
    from ccselect.export.delivery.publish import publish
    cfg = cfg or load_config()
    fleet, store = fleet_and_store_for(cfg)
    try:
        pub = publish(spark or _spark(cfg, "ccs-rollout"), cfg, store, version)
    except GuardRefused as e:
        raise TableRefused(str(e)) from e
    if deploy_fleet is None:
        deploy_fleet = cfg.settings.pipeline.deploy and os.geteuid() == 0
    if not deploy_fleet:
        store.set_current(pub["version"])
        return {"version": pub["version"], "published": True, "deployed": False,
                "why": "not root: stopped at the signed artifact in the store" if os.geteuid() != 0
                else "pipeline.deploy is false"}
    decisions, local = _decision_log(cfg)
    settings = cfg.settings.export.rollout
    if settings.gate == "canary":
        from ccselect.export.delivery import inflight
        with inflight.locked(rollout_lock(cfg)):
            clock = clock or inflight.wall_ms
            looked = look_at(cfg, fleet, store, decisions, spark, clock) if look else None
            res = inflight.begin(fleet, store, pub["version"], settings.health, decisions=decisions, clock=clock)
        if res.get("ok") is False:
            raise RuntimeError(f"rollout of v{version} stopped: {res.get('stopped')}; rolled back "
                               f"{sorted(res.get('rolled_back', {}))}")
        out = {"version": pub["version"], "published": True, "deployed": "in flight", "gate": "canary",
               "look": looked, "begin": {k: v for k, v in res.items() if k != "nodes"}}
    else:
        res = deploy(fleet, store, pub["version"], settings.health, decisions=decisions)
        if not res["ok"]:
            raise RuntimeError(f"rollout of v{version} stopped: {res.get('stopped')}; rolled back "
                               f"{sorted(res.get('rolled_back', {}))}")
        out = {"version": pub["version"], "published": True, "deployed": True, "nodes": sorted(res["nodes"]),
               "decisions": [{k: r[k] for k in ("cohort", "decision", "reason")} for r in decisions.rows]}
    if not local:
        out["decisions_not_written"] = "gold.rollout_decisions: the lake is on an object store (delta-rs storage options not set)"
    return out


def _decision_log(cfg: Config):
    """Each cohort's gate decision in gold.rollout_decisions, as `ccs rollout`, where the lake is a
    local folder: DecisionLog writes with delta-rs, which reads no s3a:// lake without storage
    options; there the decisions stay in the result, and it says so. → (log, local?)"""
    from ccselect.export.delivery.gates import DecisionLog
    local = "://" not in cfg.settings.lake.root
    return (DecisionLog.for_config(cfg) if local else DecisionLog()), local


def rollout_lock(cfg: Config) -> str:
    """The control host's lock on the rollout in flight (export/delivery/inflight.py `locked`)."""
    return os.path.join(cfg.data_root, "rollout", "inflight.lock")


def look_at(cfg: Config, fleet, store, decisions, spark=None, clock=None, log=print) -> dict:
    """One look at the rollout in flight in `store`, if any, on the canary's arms in
    silver.connections (a Spark session only when there is one to look at); the caller holds
    `rollout_lock`. {"inflight": None}: nothing in flight and nothing waiting."""
    from ccselect.export.delivery import inflight
    from ccselect.export.delivery.gates import silver_moments
    if inflight.idle(store):
        return {"inflight": None}
    moments = silver_moments(spark or _spark(cfg, "ccs-rollout"), cfg)
    return inflight.advance(fleet, store, cfg.settings.export.rollout.health, cfg.settings.export.canary, moments,
                            decisions=decisions, clock=clock or inflight.wall_ms, log=log)


def look_rollout(cfg: Config, spark=None, deploy_fleet: bool | None = None, clock=None) -> dict | None:
    """The stream's step: one look at the rollout in flight of the configured fleet and store
    (gate canary, the fleet deployed), under the control host's lock, then the in-flight and
    freeze gauges. None: nothing to look at here (gate health, or not deploying)."""
    if cfg.settings.export.rollout.gate != "canary":
        return None
    if deploy_fleet is None:
        deploy_fleet = cfg.settings.pipeline.deploy and os.geteuid() == 0
    if not deploy_fleet:
        return None
    from ccselect.export.delivery import inflight
    fleet, store = fleet_and_store_for(cfg)
    decisions, _ = _decision_log(cfg)
    with inflight.locked(rollout_lock(cfg)):
        res = look_at(cfg, fleet, store, decisions, spark, clock)
    if res.get("inflight", True) is not None:    # something was looked at: its gauges now
        write_freeze(cfg, store)
    return res


def fleet_and_store_for(cfg: Config):
    from ccselect.export.delivery.publish import fleet_and_store
    return fleet_and_store(cfg, cfg.settings.pipeline.fleet, None)


# ---- daily training -----------------------------------------------------------------------------

@measured("training_set")
def training_set(window: Window, cfg: Config | None = None) -> dict:
    """gold.feature_stats (fitted on the window) and gold.training_set for the window."""

    from ccselect.lake import connections_in, write_window
    from ccselect.features import labels, scaling
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-train")
    conns = connections_in(spark, cfg, window)
    stats = scaling.fit(conns, window=window.name)
    scaling.save(spark, cfg, stats, _dt.now(timezone.utc).isoformat())
    share = cfg.settings.pipeline.cellular_share
    n = write_window(spark, cfg, labels.training_set(conns, share), TRAINING_SET, window.name)
    return {"window": window.name, "training_rows": n, "stats_rows": stats.n}


@measured("prefix_groups")
def prefix_groups(window: Window, cfg: Config | None = None) -> dict:
    """Per-type K-means prefix groups of the window → gold.prefix_groups (ALICCS §3.1)."""
    from ccselect.features import scaling
    from ccselect.models.groups import fit_groups
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-train")
    stats = scaling.load(scaling.artifact_path(cfg.data_root, window.name), cfg)
    return fit_groups(spark, cfg, window, stats)


@measured("train")
def train(window: Window, cfg: Config | None = None) -> dict:
    """Train on the window's training nodes, evaluate per held-out node, log to MLflow, register a
    version and run its gate (challenger only when it passes)."""
    from ccselect.models import train_job
    cfg = cfg or load_config()
    res = train_job.run(_spark(cfg, "ccs-train"), cfg, window, variant=cfg.settings.pipeline.variant,
                        epochs=cfg.settings.pipeline.epochs)
    return {k: res[k] for k in ("window", "variant", "model_name", "version", "summary", "gate", "run_id",
                                "selection") if k in res}


@measured("promote")
def promote_if_configured(version: str, cfg: Config | None = None, auto: bool | None = None) -> dict:
    """Promotion is a human decision (`ccs promote`) unless `pipeline.auto_promote` is true (or a
    run's conf says `auto_promote`, as `make run`'s does)."""
    from ccselect.models import registry
    cfg = cfg or load_config()
    if not (cfg.settings.pipeline.auto_promote if auto is None else bool(auto)):
        return {"promoted": False, "why": "pipeline.auto_promote is false: promote with `ccs promote`"}
    return {"promoted": True, **registry.promote(cfg, version)}


@measured("handshake_tree")
def handshake_tree(window: Window, cfg: Config | None = None, auto: bool | None = None) -> dict:
    """The handshake tree of the window (issue 27, distill/handshake.py), registered beside the
    champion; `@champion` (the tree the next tables carry) only when it beats answering the
    majority type on the held-out nodes and promotion is automatic (`pipeline.auto_promote`)."""
    from ccselect.distill.jobs import run_handshake
    cfg = cfg or load_config()
    promote = cfg.settings.pipeline.auto_promote if auto is None else bool(auto)
    m = run_handshake(_spark(cfg, "ccs-handshake"), cfg, window, promote=promote)
    return {"registered": m["registered"], "heldout_accuracy": m["heldout"]["accuracy"],
            "majority_accuracy": m["majority_accuracy"], "beats_majority": m["beats_majority"],
            "nodes": m["nodes"], "depth": m["depth"]}


@measured("distill", skip_on=(LookupError,))
def distill_and_diagnose(window: Window, cfg: Config | None = None) -> dict:
    """The champion's distilled tree (ALICCS §3.2) and its SHAP diagnostics for the window."""
    from ccselect.distill.jobs import run_diagnose, run_distill
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-distill")
    d = run_distill(spark, cfg, window)
    g = run_diagnose(spark, cfg, window)
    return {"distill": {k: d[k] for k in ("dnn", "tree", "search") if k in d},
            "diagnose": {k: g[k] for k in ("report", "subsets") if k in g}}
