"""The main job's flow on the embedded default (`ccs run`, what `make run` calls; the command and its
summary are app/run.py's), through real Airflow.

1. simulate the configured fleet (reused when its parameters and the simulator are unchanged);
2. backfill: ingest the training window into the lakehouse (one Spark job over those hours);
3. `ccs_train` through Airflow (`dag.test()`): training set → prefix groups → train → gate →
   promote → distilled tree + SHAP diagnostics. Promotion is a human decision in production;
   `make run` stands in for that human (the run's conf says `auto_promote`);
4. `ccs_hourly` through Airflow for each hour after the window: ingest → infer → export →
   rollout, which loads the signed table into the kernel enforcer of the local fleet
   (infra/fleet.yaml: a canary and one more node, each an agent on its own cgroup) when root, and
   stops at the signed artifact otherwise;
5. when root: connections from simulated client addresses (in a network namespace of its own) to
   every node, to show the kernel giving them the table's CC; then the stream over the last hours;
6. the trace-driven emulation (`ccs emulate`, ALICCS §5.4) of the last hourly hour: CUBIC, BBR,
   the Oracle, the table the hour before exported (ALICCS), Configanator, Disco, Pytheas, and the
   true network type from the simulator's truth — into gold.emulation for notebook 06;
7. the lake's invariants (`ccs audit`).

A second run reuses the fleet, the backfilled lake, the keys and — when nothing it learnt from
changed — the champion model; the hourly runs are redone (each replaces its own partitions and
exports a new table version). `fresh` redoes everything after the simulation.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from ccselect.config import Config
from ccselect.hours import HOUR_FMT, Window, hour_shift
from ccselect.lake import CONNECTIONS, INGEST_AUDIT
from ccselect.spark import get_spark
from ccselect.export.artifact import signing
from ccselect.export.edge.agent import DEFAULT_BINARY
from ccselect.export.edge.probe import kernel_ready, probe
from ccselect.flows.airflow_env import airflow_env, ensure_db
from ccselect.flows.pipeline import fleet_and_store_for
from ccselect.jobs.sources import discover
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, pyspark, and our modules that load them.


class FleetTooShort(ValueError):
    """The simulated fleet has fewer hours than the training window, the hourly runs and the
    streamed hours need (the command line reports it as a bad parameter)."""


def say(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cfg: Config, hourly_hours: int = 2, fresh: bool = False, probe: bool = True,
        stream_hours: int = 0) -> tuple[dict, dict]:
    """The whole main job but its summary. → (result: {"ok", "train", "hourly", "probe", "emulation",
    "reused", "stream", "audit"}, what the summary reads besides: {"manifest", "seconds", "no_deploy"}).
    Raises FleetTooShort when the simulated fleet has too few hours for the plan."""
    t0 = time.time()
    reused: list[str] = []
    manifest, fleet_reused = fleet(cfg)                                         # 1. the fleet
    if fleet_reused:
        reused.append("fleet")
    start, window_hours = _window(manifest, hourly_hours, stream_hours)
    window = Window.hours(start.strftime(HOUR_FMT), (start + timedelta(hours=window_hours - 1)).strftime(HOUR_FMT))
    state_path = os.path.join(cfg.data_root, "run", "state.json")
    digest = _digest(manifest)
    state = _state(state_path, digest, fresh)
    spark = get_spark(cfg, "ccs-run")
    if _backfill(spark, cfg, window, window_hours, reuse=fleet_reused and not fresh):   # 2. backfill
        reused.append("backfill")
    if _keys(cfg):
        reused.append("keys")
    deploy, why, fleet_obj = _deployment(cfg)
    train_at = start + timedelta(hours=window_hours)
    plan, model_reused = _airflow_plan(cfg, state, window, train_at, window_hours, hourly_hours, deploy)  # 3. + 4.
    if model_reused:
        reused.append("model")
    train, hourly = _train_and_hourly(cfg, plan, state, state_path, window)
    probed = _probe(cfg, fleet_obj) if deploy and probe else None               # 5. the kernel
    streamed = None                                                             # 5b. the stream
    if stream_hours:
        first = train_at + timedelta(hours=hourly_hours)
        streamed = _stream(spark, cfg, [(first + timedelta(hours=i)).strftime(HOUR_FMT) for i in range(stream_hours)],
                           deploy, digest)
    last = (train_at + timedelta(hours=hourly_hours - 1)).strftime(HOUR_FMT)
    emulated = _emulate(spark, cfg, last, hourly_hours)                         # 6. the emulation
    from ccselect.jobs import audit
    audited = audit.run(spark, cfg)                                             # 7. the lake's invariants
    say("audit: clean" if audited["clean"] else "audit: broken:\n  " + "\n  ".join(audited["lines"]))
    ok = (train["state"] == "reused" or train["state"].endswith("success")) and len(hourly) == hourly_hours and \
        all(r["state"].endswith("success") for r in hourly) and "error" not in emulated and \
        (probed is None or all(n["as_table"] == n["connections"] for n in probed["nodes"].values())) and \
        (streamed is None or "error" not in streamed) and audited["clean"]
    result = {"ok": ok, "train": train, "hourly": hourly, "probe": probed, "emulation": emulated,
              "reused": reused, "stream": streamed, "audit": audited}
    return result, {"manifest": manifest, "seconds": time.time() - t0, "no_deploy": why if not deploy else None}


def _window(manifest: dict, hourly_hours: int, stream_hours: int) -> tuple[datetime, int]:
    """(the fleet's first hour, the training window's hours): the fleet's hours less the hourly and
    the streamed ones, at least 2 (FleetTooShort)."""
    start = datetime.fromisoformat(manifest["params"]["start"]).replace(tzinfo=timezone.utc)
    hours = int(manifest["params"]["hours"])
    if hours < hourly_hours + stream_hours + 2:
        raise FleetTooShort(f"the fleet has {hours} hours: need at least {hourly_hours + stream_hours + 2} "
                            f"(a training window of 2 or more, then {hourly_hours} hourly runs and "
                            f"{stream_hours} streamed)")
    return start, hours - hourly_hours - stream_hours


def _state(state_path: str, digest: str, fresh: bool) -> dict:
    """What the last run of the same fleet left (its model's window and version), or a new state."""
    state = {} if fresh or not os.path.exists(state_path) else json.load(open(state_path))
    return state if state.get("fleet") == digest else {"fleet": digest}


def _backfill(spark, cfg: Config, window: Window, window_hours: int, reuse: bool) -> bool:
    """The training window ingested into the lakehouse, unless `reuse` and it already is.
    → whether it was reused."""
    if reuse and _ingested(spark, cfg, window):
        say(f"backfill: reusing the lakehouse's {window.name} (gold.ingest_audit has every file of the window)")
        return True
    from ccselect.jobs import ingest
    say(f"backfill: ingest the training window {window.name} ({window_hours} h) into the lakehouse")
    res = ingest.run(spark, cfg, cfg.settings.pipeline.raw_dir, window)
    for stream, t in sorted(res["streams"].items()):
        say(f"  {stream:9s}: {t['lines_read']:,} lines = {t['accepted']:,} accepted + "
            f"{t['quarantined']:,} quarantined")
    return False


def _keys(cfg: Config) -> bool:
    """The signing keys, created when missing. → whether they were there (reused)."""
    from ccselect.export.delivery.publish import init_keys, key_paths
    if os.path.exists(key_paths(cfg)[0]):
        return True
    init_keys(cfg)
    say(f"signing keys created under {os.path.dirname(key_paths(cfg)[0])} (private key stays there)")
    return False


def _deployment(cfg: Config) -> tuple[bool, str, object]:
    """(deploy, why not, the local fleet): when the kernel enforcer can be used, the local fleet's
    agents attached (a new store's deployment starts from nodes cleared of the last one's table)."""
    deploy, why = _can_deploy(cfg)
    if not deploy:
        say(f"rollout will stop at the signed artifact in the store: {why}")
        return False, why, None
    from ccselect.export.edge.probe import ensure_attached, teardown
    fleet_obj, store = fleet_and_store_for(cfg)
    if store.current() is None:
        # A store without a table is a new deployment: what the local nodes hold (their table
        # and the version floor the agent keeps, versions only going forward) is the last one's.
        teardown(fleet_obj, log=say)
    ensure_attached(fleet_obj, log=say)
    return True, why, fleet_obj


def _airflow_plan(cfg: Config, state: dict, window: Window, train_at: datetime, window_hours: int,
                  hourly_hours: int, deploy: bool) -> tuple[list[dict], bool]:
    """(the DAG runs for Airflow, in order: ccs_train for the window unless the champion was trained
    on the same window of the same fleet, then ccs_hourly for each hour after it; whether the model
    is reused)."""
    from ccselect.models import registry
    champ = champion(cfg)
    model_state = state.get("model") or {}
    plan = []
    reuse = bool(champ) and model_state.get("window") == [window.lo, window.hi] and model_state.get("version") == champ["version"]
    if reuse:
        say(f"ccs_train: reusing {registry.model_name(cfg)} v{champ['version']} @champion "
            f"(trained on {window.name} of the same fleet)")
    else:
        say(f"Airflow: ccs_train for the window ending {train_at:%Y-%m-%dT%H:%M}Z ({window_hours} h), "
            "auto_promote on (make run stands in for the human who runs `ccs promote`)")
        plan.append({"dag_id": "ccs_train", "date": train_at.isoformat(),
                     "conf": {"window_hours": window_hours, "auto_promote": True}})
    for i in range(hourly_hours):
        at = train_at + timedelta(hours=i + 1)
        plan.append({"dag_id": "ccs_hourly", "date": at.isoformat(), "conf": {"deploy": deploy}})
    say(f"Airflow: ccs_hourly at {', '.join(p['date'][11:16] + 'Z' for p in plan if p['dag_id'] == 'ccs_hourly')} "
        "(each on the hour before it)")
    return plan, reuse


def _train_and_hourly(cfg: Config, plan: list[dict], state: dict, state_path: str,
                      window: Window) -> tuple[dict, list[dict]]:
    """`plan` run by one Airflow process. → (ccs_train's run, or {"state": "reused"} when the plan
    has none; the ccs_hourly runs); the state keeps the champion a successful training left."""
    runs = airflow_sequence(cfg, plan, os.path.join(cfg.data_root, "run", "airflow.log"))
    train = next((r for r in runs if r["dag_id"] == "ccs_train"), None) if plan[0]["dag_id"] == "ccs_train" \
        else {"state": "reused", "tasks": {}}
    hourly = [r for r in runs if r["dag_id"] == "ccs_hourly"]
    if train is None:
        train = {"dag_id": "ccs_train", "state": "failed (no result)", "tasks": {}}
    champ = champion(cfg)
    if champ and train["state"].endswith("success"):
        state["model"] = {"window": [window.lo, window.hi], "version": champ["version"]}
        _save(state_path, state)
    return train, hourly


# ---- steps --------------------------------------------------------------------------------------

def airflow_sequence(cfg: Config, plan: list[dict], log_path: str) -> list[dict]:
    """`dag.test()` the runs of `plan` in order in one Airflow child process (one Spark session for
    all of them), stopping at the first that fails; shows each task's result as it comes, keeps the
    whole output in `log_path`. → the runs' results (dag_id, logical_date, state, tasks)."""

    if not plan:
        return []
    ensure_db(cfg)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    results = []
    with open(log_path, "a") as log, subprocess.Popen(
            [sys.executable, "-m", "ccselect.flows.airflow_env", "sequence", json.dumps(plan)], env=airflow_env(cfg),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        say(f"  (Airflow's whole output: {log_path})")
        for line in proc.stdout:
            log.write(line)
            if line.startswith("CCS_RESULT "):
                r = json.loads(line[len("CCS_RESULT "):])
                results.append(r)
                say(f"  {r['dag_id']} {r['logical_date'][:16]}: {r['state']} ({_tasks(r)})")
            elif line.startswith("CCS_STEP "):
                _, task, body = line.rstrip("\n").split(" ", 2)
                try:
                    say(f"    {task}: {_brief(json.loads(body))}")
                except ValueError:
                    say(f"    {task}: {body[:150]}")
        proc.wait()
    return results


def _brief(result, width: int = 150) -> str:
    """A task's result in one short line: its scalar fields first."""
    if isinstance(result, dict):
        parts = [f"{k}={v}" for k, v in result.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) < 60]
        parts += [f"{k}={{…}}" for k, v in result.items() if isinstance(v, (dict, list))]
        text = ", ".join(parts)
    else:
        text = str(result)
    return text if len(text) <= width else text[:width - 1] + "…"


def fleet(cfg: Config) -> tuple[dict, bool]:
    """The simulated fleet of the `simulate` section: reused when its parameters and the
    simulator's code are the same as last time. → (manifest, reused)."""
    from ccselect.sim.fleet import code_version, simulate
    from ccselect.sim.summary import summarize
    params = SimParams.from_settings(cfg.settings.simulate)
    out = cfg.settings.simulate.out
    manifest_path = os.path.join(out, "manifest.json")
    old = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    if old.get("params") == json.loads(json.dumps(params.to_dict())) and old.get("code_version") == code_version():
        say(f"reusing the simulated fleet in {out} (same parameters, same simulator)")
        return old, True
    say(f"simulating {params.nodes} nodes × {params.hours} h × {params.conns_per_node_hour} connections "
         f"into {out}")
    manifest = simulate(params, out)
    print(summarize(out, manifest), flush=True)
    return manifest, False


def _digest(manifest: dict) -> str:
    return hashlib.sha256(json.dumps({k: manifest.get(k) for k in ("params", "code_version", "counts")},
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]


def _save(path: str, state: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


def _ingested(spark, cfg: Config, window: Window) -> bool:
    """Every node-hour file of the window under the raw directory has its row in gold.ingest_audit."""
    from pyspark.sql import functions as F

    from ccselect.delta_io import is_delta
    from ccselect.lake import table_path
    path = table_path(cfg, INGEST_AUDIT)
    if not is_delta(spark, path) or not is_delta(spark, table_path(cfg, CONNECTIONS)):
        return False
    files = {(f.stream, f.node_id, f.hour, f.path) for f in discover(cfg.settings.pipeline.raw_dir, window, cfg=cfg)}
    done = {tuple(r) for r in spark.read.format("delta").load(path).where(F.col("hour").between(window.lo, window.hi))
            .select("stream", "node_id", "hour", "source_file").collect()}
    return bool(files) and files <= done


def champion(cfg: Config) -> dict | None:
    from ccselect.models import registry
    return next((v for v in registry.list_versions(cfg) if "champion" in v["aliases"]), None)


def _tasks(run: dict) -> str:
    return ", ".join(f"{k} {v.split('.')[-1]}" for k, v in sorted(run.get("tasks", {}).items()))


def _can_deploy(cfg: Config) -> tuple[bool, str]:
    if not cfg.settings.pipeline.deploy:
        return False, "pipeline.deploy is false"
    why = kernel_ready()
    if why:
        return False, f"{why}: run as root to load the table into the kernel enforcer"
    if not os.path.exists(DEFAULT_BINARY):
        return False, f"the edge agent is not built ({DEFAULT_BINARY}; `make edge` as root)"
    return True, ""


def _probe(cfg: Config, fleet_obj) -> dict | None:
    from ccselect.export.delivery.publish import key_paths
    _, store = fleet_and_store_for(cfg)
    v = store.current()
    if v is None:
        say("kernel probe: the store has no current table")
        return None
    manifest = store.fetch(v, os.path.join(cfg.data_root, "run", "probe"))
    _, table = signing.read_manifest(manifest, signing.load_public_key(key_paths(cfg)[1]))
    say(f"kernel probe: connections from simulated client addresses of table v{v} to every node")
    res = probe(fleet_obj, table, per_cc=2, log=lambda m: say("  " + m))
    res["version"] = v
    return res


def _stream(spark, cfg: Config, hours: list[str], deploy: bool, digest: str) -> dict:
    """`ccs stream` over `hours` of the simulated fleet, cut into the agents' one-minute segments
    (sim/replay.py) under <data_root>/stream/raw: a quarter hour of segments per micro-batch, so
    the hour yields a table per `stream.table_minutes` boundary the batches pass. A second run
    finds no new segment (the checkpoint has them) and emits nothing."""
    from ccselect.flows import stream
    from ccselect.sim import replay
    raw = os.path.join(cfg.data_root, "stream", "raw")
    nodes = int(cfg.settings.simulate.nodes)
    marker = os.path.join(cfg.data_root, "stream", "raw.json")
    want = {"hours": hours, "fleet": digest}
    if not os.path.exists(marker) or json.load(open(marker)) != want:
        paths = replay.write_all(cfg.settings.pipeline.raw_dir, raw, hours)
        _save(marker, want)
        say(f"stream: {', '.join(hours)} as {len(paths):,} one-minute segments in {raw}")
    say(f"stream: ccs stream over them (Spark Structured Streaming; a table every "
         f"{cfg.settings.stream.table_minutes} min of traffic over the last {cfg.settings.stream.window_minutes})")
    try:
        res = stream.run(spark, cfg, raw, once=True, deploy=deploy, max_files=nodes * 3 * 15, log=lambda m: None)
    except Exception as e:  # noqa: BLE001 — reported in the summary, and the run is not ok
        return {"error": f"{type(e).__name__}: {e}"}
    # the canary's A/B verdict of each streamed table, on the simulated arms after its boundary
    # (export/delivery/stream_canary.py), recorded in gold.rollout_decisions
    from ccselect.export.delivery.store import store_for
    from ccselect.export.delivery.stream_canary import verdicts
    try:
        res["canary"] = {str(v["version"]): v for v in verdicts(spark, cfg, res["tables"], store=store_for(cfg))}
    except Exception as e:  # noqa: BLE001 — reported in the summary
        res["canary_error"] = f"{type(e).__name__}: {e}"
    return {"hours": hours, **res}


def _emulate(spark, cfg: Config, hour: str, hourly_hours: int) -> dict:
    """`ccs emulate --hours HOUR --truth <the simulated fleet>`: the ALICCS table is the one the
    hour before exported (with a single hourly run there is none, so that hour's own table)."""
    from ccselect.evaluation import emulate
    lag = 1 if hourly_hours > 1 else 0
    say(f"emulation: hour {hour} under every policy (ALICCS §5.4; table of {hour_shift(hour, -lag)})")
    try:
        return emulate.run(spark, cfg, Window.hours(hour), truth_dir=cfg.settings.pipeline.raw_dir,
                           params=replace(cfg.settings.emulate, table_lag_hours=lag))
    except Exception as e:  # noqa: BLE001 — reported in the summary, and the run is not ok
        return {"error": f"{type(e).__name__}: {e}"}
