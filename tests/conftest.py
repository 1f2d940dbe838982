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


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
