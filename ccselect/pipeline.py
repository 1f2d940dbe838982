"""The pipeline's steps as plain functions of (configuration, time), one per Airflow task: the DAGs
in dags/ only wire these, and `make run` calls the DAGs. Every step is keyed by its hour, period
or window and is safe to repeat (the jobs underneath replace their partitions)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ccselect.config import Config, load_config

HOUR_FMT = "%Y-%m-%dT%H"


def hour_of(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).strftime(HOUR_FMT)


def window_before(ts: datetime, hours: int) -> tuple[str, str]:
    """The `hours` whole hours that end at `ts` (exclusive): e.g. a daily run at 00:00 trains on
    the previous day."""
    end = ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour_of(end - timedelta(hours=hours)), hour_of(end - timedelta(hours=1))


def previous_period(ts: datetime, cfg: Config | None = None) -> datetime:
    """The start of the AutoPlex period that ends at `ts` (periods of `autoplex.period_minutes`)."""
    cfg = cfg or load_config()
    minutes = int(cfg.get("autoplex.period_minutes", 30))
    ts = ts.astimezone(timezone.utc)
    epoch_min = int(ts.timestamp() // 60)
    end = epoch_min - epoch_min % minutes
    return datetime.fromtimestamp((end - minutes) * 60, tz=timezone.utc)


def previous_hour(ts: datetime) -> str:
    """The whole hour that ends at (or before) `ts`: an hourly run at 06:00 works on 05:00–06:00."""
    end = ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour_of(end - timedelta(hours=1))


def report(task: str, result):
    """Print a task's result as one `CCS_STEP <task> <json>` line (what `make run` shows while the
    DAGs run; Airflow keeps it in the task log too) and return it."""
    import json
    import os
    import sys
    line = f"CCS_STEP {task} {json.dumps(result, default=str, sort_keys=True)}"
    print(line, flush=True)
    if sys.stdout is not sys.__stdout__:  # Airflow redirected the task's stdout into its log
        os.write(1, (line + "\n").encode())
    return result


def _spark(cfg: Config, app: str):
    from ccselect.spark import get_spark
    return get_spark(cfg, app)


def raw_dir(cfg: Config) -> str:
    return cfg.get("pipeline.raw_dir") or cfg.get("simulate.out")


# ---- hourly -------------------------------------------------------------------------------------

def ingest_hour(hour: str, cfg: Config | None = None) -> dict:
    """bronze, quarantine, audit and silver for one hour of every node; fails when the hour has no
    files at all (the sensor of a real deployment), so the rest of the hourly run waits."""
    from jobs import ingest
    cfg = cfg or load_config()
    res = ingest.run(_spark(cfg, "ccs-ingest"), cfg, raw_dir(cfg), (hour, hour))
    return {"hour": hour, "files": res["files"], "silver_rows": res.get("silver_rows", 0),
            "streams": res["streams"]}


# ---- AutoPlex -----------------------------------------------------------------------------------

def autoplex_period(start: datetime, cfg: Config | None = None) -> dict:
    """AutoPlex Algorithm 1 for the period starting at `start` → gold.autoplex_params."""
    from jobs import autoplex
    cfg = cfg or load_config()
    autoplex.settings(cfg)
    ms = int(start.astimezone(timezone.utc).timestamp() * 1000)
    return autoplex.run_parameters(_spark(cfg, "ccs-autoplex"), cfg, ms, 1)


def infer_hour(hour: str, cfg: Config | None = None) -> dict:
    """gold.predictions for the hour with `models:/<name>@champion` (LookupError when there is no
    champion yet: nothing is exported until a human — or `pipeline.auto_promote` — promotes one)."""
    from jobs import infer
    cfg = cfg or load_config()
    return infer.run(_spark(cfg, "ccs-infer"), cfg, hour, hour)


def export_window(hour: str, cfg: Config | None = None) -> tuple[str, str]:
    """The hours an hourly export aggregates: the last `pipeline.export_window_hours` up to `hour`."""
    cfg = cfg or load_config()
    n = int(cfg.get("pipeline.export_window_hours", 1))
    end = datetime.strptime(hour, HOUR_FMT).replace(tzinfo=timezone.utc)
    return hour_of(end - timedelta(hours=n - 1)), hour


def export_hour(hour: str, cfg: Config | None = None) -> dict:
    """ALICCS Algorithm 1 over the window's decisions → a signed table, recorded in gold.cc_tables."""
    import os

    from export import aggregate, signing
    from export.cli import key_paths
    cfg = cfg or load_config()
    priv, _ = key_paths(cfg)
    if not os.path.exists(priv):
        raise FileNotFoundError(f"no signing key at {priv}: run `ccs keys init` once")
    lo, hi = export_window(hour, cfg)
    man = aggregate.run_export(_spark(cfg, "ccs-export"), cfg, lo, hi, signing.load_private_key(priv))
    return {k: man[k] for k in ("version", "model_version", "entries", "coverage", "agreement",
                                "memory_saving", "manifest_path") if k in man}


def rollout(version: int, cfg: Config | None = None, deploy_fleet: bool | None = None) -> dict:
    """Guards, publish to the artifact store, then the fleet (canaries first). The fleet step needs
    root (eBPF); without it — or with `pipeline.deploy: false` — the run stops at the published,
    signed artifact and says so."""
    import os

    from export.cli import publish
    from export.rollout import Health, deploy
    cfg = cfg or load_config()
    fleet, store = _fleet_and_store_for(cfg)
    pub = publish(_spark(cfg, "ccs-rollout"), cfg, store, version)
    if deploy_fleet is None:
        deploy_fleet = bool(cfg.get("pipeline.deploy", True)) and os.geteuid() == 0
    if not deploy_fleet:
        store.set_current(pub["version"])
        return {"version": pub["version"], "published": True, "deployed": False,
                "why": "not root: stopped at the signed artifact in the store" if os.geteuid() != 0
                else "pipeline.deploy is false"}
    res = deploy(fleet, store, pub["version"], Health.from_config(cfg))
    if not res["ok"]:
        raise RuntimeError(f"rollout of v{version} stopped: {res.get('stopped')}; rolled back "
                           f"{sorted(res.get('rolled_back', {}))}")
    return {"version": pub["version"], "published": True, "deployed": True, "nodes": sorted(res["nodes"])}


def _fleet_and_store_for(cfg: Config):
    from ccselect.config import project_root
    from export.cli import _fleet_and_store
    return _fleet_and_store(cfg, cfg.get("pipeline.fleet") or str(project_root() / "infra" / "fleet.yaml"), None)


# ---- daily training -----------------------------------------------------------------------------

def training_set(lo: str, hi: str, cfg: Config | None = None) -> dict:
    """gold.feature_stats (fitted on the window) and gold.training_set for the window."""
    from datetime import datetime as _dt

    from features import labels, scaling
    from jobs.window import connections_in, write_window
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-train")
    conns = connections_in(spark, cfg, lo, hi)
    window = f"{lo}..{hi}"
    stats = scaling.fit(conns, window=window)
    scaling.save(spark, cfg, stats, _dt.now(timezone.utc).isoformat())
    share = cfg.get("pipeline.cellular_share", 0.5)
    n = write_window(spark, cfg, labels.training_set(conns, share), "gold.training_set", window)
    return {"window": window, "training_rows": n, "stats_rows": stats.n}


def prefix_groups(lo: str, hi: str, cfg: Config | None = None) -> dict:
    """Per-type K-means prefix groups of the window → gold.prefix_groups (ALICCS §3.1)."""
    from features import scaling
    from models.groups import fit_groups
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-train")
    stats = scaling.load(scaling.artifact_path(cfg.data_root, f"{lo}..{hi}"))
    return fit_groups(spark, cfg, lo, hi, stats)


def train(lo: str, hi: str, cfg: Config | None = None) -> dict:
    """Train on the window's training nodes, evaluate per held-out node, log to MLflow, register a
    version and run its gate (challenger only when it passes)."""
    from models import train_job
    cfg = cfg or load_config()
    epochs = cfg.get("pipeline.epochs")
    res = train_job.run(_spark(cfg, "ccs-train"), cfg, lo, hi, epochs=int(epochs) if epochs else None)
    return {k: res[k] for k in ("window", "variant", "model_name", "version", "summary", "gate", "run_id")
            if k in res}


def promote_if_configured(version: str, cfg: Config | None = None, auto: bool | None = None) -> dict:
    """Promotion is a human decision (`ccs promote`) unless `pipeline.auto_promote` is true (or a
    run's conf says `auto_promote`, as `make run`'s does)."""
    from models import registry
    cfg = cfg or load_config()
    if not (cfg.get("pipeline.auto_promote", False) if auto is None else bool(auto)):
        return {"promoted": False, "why": "pipeline.auto_promote is false: promote with `ccs promote`"}
    return {"promoted": True, **registry.promote(cfg, version)}


def distill_and_diagnose(lo: str, hi: str, cfg: Config | None = None) -> dict:
    """The champion's distilled tree (ALICCS §3.2) and its SHAP diagnostics for the window."""
    from distill.jobs import run_diagnose, run_distill
    cfg = cfg or load_config()
    spark = _spark(cfg, "ccs-distill")
    d = run_distill(spark, cfg, lo, hi)
    g = run_diagnose(spark, cfg, (lo, hi))
    return {"distill": {k: d[k] for k in ("dnn", "tree", "search") if k in d},
            "diagnose": {k: g[k] for k in ("report", "subsets") if k in g}}
