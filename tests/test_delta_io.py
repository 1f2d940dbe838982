"""delta_io.partition_predicate: the compact predicate selects exactly the partitions named."""
from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings, strategies as st

from ccselect.delta_io import partition_predicate

NODES = ["n1", "n2", "edge-x", "o'brien"]
HOURS = ["2026-11-01T00", "2026-11-01T01", "2026-11-01T02"]
STREAMS = ["transport", "access", "qoe"]


def test_full_grid_is_one_rectangle():
    keys = set(itertools.product(NODES[:3], HOURS))
    assert partition_predicate(keys) == ("(node_id IN ('edge-x', 'n1', 'n2') AND hour IN "
                                         "('2026-11-01T00', '2026-11-01T01', '2026-11-01T02'))")


def test_predicate_selects_exactly_the_keys(spark):
    """Property: over every combination of the columns' values, the predicate is true on exactly
    the given keys (two and three partition columns, quotes in values)."""
    cols3 = ("stream", "node_id", "hour")
    grid3 = list(itertools.product(STREAMS, NODES, HOURS))
    df3 = spark.createDataFrame(grid3, "stream string, node_id string, hour string").cache()
    grid2 = list(itertools.product(NODES, HOURS))
    df2 = spark.createDataFrame(grid2, "node_id string, hour string").cache()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.booleans(), st.data())
    def check(three, data):
        grid, df, cols = (grid3, df3, cols3) if three else (grid2, df2, ("node_id", "hour"))
        keys = data.draw(st.sets(st.sampled_from(grid), min_size=1))
        got = {tuple(r) for r in df.where(partition_predicate(keys, cols)).collect()}
        assert got == keys, (partition_predicate(keys, cols), sorted(keys))
    check()
