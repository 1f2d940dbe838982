"""Shared fixtures: one session-scoped Spark (UI off, few shuffle partitions, Delta configured),
a fresh configuration rooted in a temporary directory per test, and a small simulated fleet."""
from __future__ import annotations

import os

import pytest

from ccs_testing import REPO, write_config  # noqa: F401  (re-exported for tests)


@pytest.fixture
def cfg(tmp_path):
    """A configuration whose data root is a fresh temporary directory."""
    from ccselect.config import load_config
    return load_config(write_config(tmp_path))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One Spark session for the whole run, Delta enabled, UI off, 2 shuffle partitions."""
    from ccselect.config import load_config
    from ccselect.spark import get_spark
    root = tmp_path_factory.mktemp("spark")
    session = get_spark(load_config(write_config(root)), app_name="ccs-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def small_fleet(tmp_path_factory):
    """A small simulated fleet (8 nodes × 6 hours), shared read-only by the tests."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    out = tmp_path_factory.mktemp("fleet")
    params = SimParams(nodes=8, hours=6, conns_per_node_hour=400, seed=11)
    manifest = simulate(params, str(out), workers=2, progress=False)
    return str(out), manifest


@pytest.fixture(scope="session")
def small_lake(tmp_path_factory, spark, small_fleet):
    """`small_fleet` ingested into a lake of its own: bronze, quarantine, audit and
    silver.connections for all 6 hours, gold.feature_stats (+ artifact) fitted on the whole window
    and gold.training_set (balanced 50% 4G) for it. Shared read-only: a test that writes into a
    lake copies it first (`ccs_testing.copy_lake`). Returns a `SmallLake`."""
    from datetime import datetime, timezone

    from ccs_testing import SmallLake
    from ccselect.config import load_config
    from ccselect.lake import connections_in, write_window
    from ccselect.features import labels, scaling
    from ccselect.jobs import ingest

    fleet_dir, manifest = small_fleet
    root = tmp_path_factory.mktemp("small_lake")
    cfg_path = write_config(root)
    cfg = load_config(cfg_path)
    result = ingest.run(spark, cfg, fleet_dir)
    hours = sorted({h for h in _fleet_hours(fleet_dir)})
    lo, hi = hours[0], hours[-1]
    window = f"{lo}..{hi}"
    from ccselect.hours import Window
    conns = connections_in(spark, cfg, Window.hours(lo, hi))
    stats = scaling.fit(conns, window=window)
    stats_path = scaling.save(spark, cfg, stats, datetime.now(timezone.utc).isoformat())
    n_train = write_window(spark, cfg, labels.training_set(conns, 0.5), "gold.training_set", window)
    return SmallLake(root=root, cfg_path=cfg_path, fleet_dir=fleet_dir, lo=lo, hi=hi, window=window,
                     hours=hours, stats_path=stats_path, ingest=result, training_rows=n_train)


@pytest.fixture(scope="session")
def lake_with_champion(tmp_path_factory, spark, small_lake):
    """A writable copy of the small lake with a champion trained on its labelled rows, registered
    with its out-of-domain guard and a temperature (models/ood.py): (lake, cfg, version). Shared
    (issue 63: one training for the tests that need a champion): tests/test_infer.py writes
    gold.predictions into it, tests/test_identity.py only reads its champion; a test that promotes
    another version or needs an empty gold makes a lake of its own."""
    from ccs_testing import copy_lake, quick_champion
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("champion_lake"))
    cfg = lake.cfg()
    return lake, cfg, quick_champion(spark, cfg, lake)


def _fleet_hours(fleet_dir: str) -> list[str]:
    from ccselect.jobs.sources import discover
    return [f.hour for f in discover(fleet_dir, streams=("transport",))]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """The log transport's broker (topology/kafka.py): one real KRaft node per test session under a
    fresh folder, with the stream topics, started on first use; its process group is gone after
    the session (checked)."""
    from ccselect.topology.kafka import Broker
    from ccselect.topology.proc import group_members
    broker = Broker(tmp_path_factory.mktemp("kafka"))
    broker.up(log=print)
    try:
        yield broker
    finally:
        pid = broker.server().pid()      # a test may have killed and restarted it (tests/test_kafka_stream.py)
        broker.down()
        assert pid is None or not group_members(pid), f"broker processes {group_members(pid)} left after down"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def main_job(tmp_path_factory, small_lake):
    """`ccs run` — the main job, through real Airflow — on a copy of the small lake: the fleet is
    `small_fleet` (reused: same parameters), the backfill is reused (the lake already holds every
    file of the window), ccs_train learns from hours 00..04 (auto-promoted by the run), ccs_hourly
    runs at 06:00 on hour 05, then ccs_autoplex for 03:00–03:30. As root the table goes into the
    kernel of a throwaway two-node fleet and the run probes it with real connections; otherwise the
    run stops at the signed artifact. Each step writes its rows and duration under
    `<lake>/job-metrics` (pipeline.metrics_dir). Returns (cfg, result of app.run.main, autoplex run)."""
    import json

    import yaml

    from ccselect.app import run as main_run
    from ccselect.flows.airflow_env import result_of, run_in_airflow
    from ccs_testing import copy_lake, raw_section
    from ccselect.config import load_config
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("main_job"))
    manifest = json.load(open(os.path.join(lake.fleet_dir, "manifest.json")))
    p = manifest["params"]
    deploy = os.geteuid() == 0
    tag = f"{os.getpid()}"
    fleet_path = lake.root / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump({"nodes": [
        {"node_id": f"mj-{role}-{tag}", "canary": role == "canary",
         "agent": {"cgroup": f"/sys/fs/cgroup/unified/ccs-mj-{role}-{tag}", "pin_dir": f"/sys/fs/bpf/ccs-mj-{role}-{tag}",
                   "sample_rate": 0.0, "services": [{"port": 443, "name": "video"}]}}
        for role in ("canary", "node")]}))
    path = write_config(
        lake.root, airflow={"home": str(lake.root / "airflow")},
        simulate={"out": lake.fleet_dir, **{k: p[k] for k in ("nodes", "hours", "start", "seed", "conns_per_node_hour")}},
        pipeline={**raw_section("pipeline"), "raw_dir": lake.fleet_dir, "epochs": 10, "deploy": deploy,
                  "fleet": str(fleet_path), "metrics_dir": str(lake.root / "job-metrics")},
        # two selection candidates, not the shipped five: the run's selection step is what this
        # covers (tests/test_select.py and tests/test_node_stats.py cover the per-node candidates)
        # and K of the prefix groups from 2..4, not the shipped 2..12: on this fleet the whole range
        # picks K = 2 for both types (silhouettes 0.83 / 0.45 at K = 2, at most 0.42 / 0.40 above it;
        # ci14, 655f002), so the groups are the same, in 6 K-means fits instead of 22
        # (tests/test_models_pipeline.py covers the silhouette choice)
        model={**(m := raw_section("model")), "gate": {**m["gate"], "min_mean_accuracy": 0.5, "min_worst_accuracy": 0.0},
               "select": {**m.get("select", {}), "candidates": ["mlp", "aliccs_nodes"]},
               "groups": {**m.get("groups", {}), "k_range": [2, 4]}},
        export={**(e := raw_section("export")), "rollout": {**e["rollout"], "health_wait_s": 0.3}})
    cfg = load_config(path)
    try:
        res = main_run.main(cfg, hourly_hours=1)
        print(res["summary"])
        autoplex = result_of(run_in_airflow(cfg, ["test", "ccs_autoplex", "--date", "2026-11-01T03:30:00+00:00"],
                                            timeout=1500))
        yield cfg, res, autoplex
    finally:
        if deploy:
            from ccselect.flows.pipeline import fleet_and_store_for
            from ccselect.export.edge.probe import teardown
            teardown(fleet_and_store_for(cfg)[0])
