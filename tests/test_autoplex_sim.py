"""AutoPlex §3.4 (Fig. 3) on the simulated fleet, through the lake: `jobs.autoplex.run_similarity`
over the shared small lake (8 nodes × 6 h, 12 periods of 30 minutes). Better-performed sessions
(retransmission ratio 5-20th percentile of their user group) sit on good paths and change less
between adjacent periods than worse-performed ones (75-90th), which sit on broadband aggregation
whose congestion comes and goes (sim/congestion.py)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from ccs_testing import copy_lake


@pytest.fixture(scope="module")
def summary(spark, small_lake, tmp_path_factory):
    from jobs.autoplex import run_similarity
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("autoplex_sim"))
    start = int(datetime.strptime(lake.lo, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc).timestamp() * 1000)
    res = run_similarity(spark, lake.cfg(), start, 2 * len(lake.hours))
    print(res["summary"])
    return {r["value"]: r for r in res["summary"]}


@pytest.mark.parametrize("value", ["goodput_bps", "max_cwnd_segs", "max_inflight_segs"])
def test_better_sessions_change_less_than_worse(summary, value):
    """Fig. 3: the better sessions' goodput change rate is 25-30% of the worse sessions'; worse
    sessions change max_cwnd 3.0-5.1× and max_inflight 1.3-3.0× more. Goodput is AutoPlex's — the
    delivery rate while sending (jobs/autoplex.py GOODPUT), not bytes over the connection's life."""
    r = summary[value]
    assert r["better"] < r["worse"], f"{value}: better {r['better']:.3f} vs worse {r['worse']:.3f}"


def test_parameters_rerun_replaces_the_same_periods(spark, small_lake, tmp_path_factory):
    """run_parameters twice over the same periods: the second run replaces the first's rows (same
    rows, none twice) and leaves other periods alone."""
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from ccselect.lake import table_path
    from jobs.autoplex import run_parameters
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("autoplex_rerun"))
    cfg = lake.cfg()
    start = int(datetime.strptime(lake.lo, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc).timestamp() * 1000)
    periods = 2 * len(lake.hours)
    first = run_parameters(spark, cfg, start, periods)
    path = table_path(cfg, "gold.autoplex_params")
    before = spark.read.format("delta").load(path).toPandas()
    second = run_parameters(spark, cfg, start + 30 * 60_000, periods - 1)   # all but the first period again
    after = spark.read.format("delta").load(path)
    assert sum(first["rows_per_policy"].values()) == len(before) > 0
    assert after.groupBy("policy", "ug_id", "period").count().where(F.col("count") > 1).count() == 0
    assertDataFrameEqual(after, spark.createDataFrame(before, after.schema))
    assert set(second["periods"]) < set(first["periods"])
