"""AutoPlex §3.4 (Fig. 3) on the simulated fleet, through the lake: `jobs.autoplex.run_similarity`
over the shared small lake (8 nodes × 6 h, 12 periods of 30 minutes). Better-performed sessions
(retransmission ratio 5-20th percentile of their user group) sit on good paths and change less
between adjacent periods than worse-performed ones (75-90th), which sit on broadband aggregation
whose congestion comes and goes (sim/congestion.py)."""
from __future__ import annotations

import pytest

from ccs_testing import copy_lake
from ccselect.hours import Window


@pytest.fixture(scope="module")
def summary(spark, small_lake, tmp_path_factory):
    from ccselect.jobs.autoplex import run_similarity
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("autoplex_sim"))
    res = run_similarity(spark, lake.cfg(), Window.hours(lake.lo, lake.hi))
    print(res["summary"])
    return {r["value"]: r for r in res["summary"]}


@pytest.mark.parametrize("value", ["goodput_bps", "max_cwnd_segs", "max_inflight_segs"])
def test_better_sessions_change_less_than_worse(summary, value):
    """Fig. 3: the better sessions' goodput change rate is 25-30% of the worse sessions'; worse
    sessions change max_cwnd 3.0-5.1× and max_inflight 1.3-3.0× more. Goodput is AutoPlex's — the
    delivery rate while sending (jobs/autoplex.py GOODPUT), not bytes over the connection's life."""
    r = summary[value]
    assert r["better"] < r["worse"], f"{value}: better {r['better']:.3f} vs worse {r['worse']:.3f}"


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_parameters_rerun_replaces_the_same_periods(spark, small_lake, tmp_path_factory, engine):
    """run_parameters twice over the same periods: the second run replaces the first's rows (same
    rows, none twice) and leaves other periods alone, with either engine."""
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from ccselect.lake import table_path
    from ccselect.jobs.autoplex import run_parameters
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("autoplex_rerun"))
    cfg = lake.cfg()
    window = Window.hours(lake.lo, lake.hi)
    first = run_parameters(spark, cfg, window, engine=engine)
    assert first["engine"] == engine
    path = table_path(cfg, "gold.autoplex_params")
    before = spark.read.format("delta").load(path).toPandas()
    second = run_parameters(spark, cfg, Window(window.start_ms + cfg.settings.autoplex.period_minutes * 60_000, window.end_ms),
                            engine=engine)   # all but the first again
    after = spark.read.format("delta").load(path)
    assert sum(first["rows_per_policy"].values()) == len(before) > 0
    assert after.groupBy("policy", "ug_id", "period").count().where(F.col("count") > 1).count() == 0
    assertDataFrameEqual(after, spark.createDataFrame(before, after.schema))
    assert set(second["periods"]) < set(first["periods"])
    files = after.select("period", F.input_file_name().alias("f")).distinct().groupBy("period").count()
    assert files.where(F.col("count") != 1).count() == 0, "one file per period partition"


def test_the_engines_write_the_same_tables(spark, small_lake, tmp_path_factory):
    """The Spark job, then the Arrow engine (the default on a local lake) over the same periods and
    window of one table: the Arrow engine's commit replaces the Spark job's rows with the same
    rows (means to 1e-12: summed in another order), Spark reads them, and a Spark run after it
    replaces them again without a duplicate."""
    import pandas as pd

    from ccselect.lake import table_path
    from ccselect.jobs.autoplex import run_parameters, run_similarity
    lake = copy_lake(small_lake, tmp_path_factory.mktemp("autoplex_engines"))
    cfg = lake.cfg()
    window = Window.hours(lake.lo, lake.hi)
    params, rates = table_path(cfg, "gold.autoplex_params"), table_path(cfg, "gold.autoplex_similarity")

    def read(path, keys):
        return spark.read.format("delta").load(path).toPandas().sort_values(keys).reset_index(drop=True)
    pk, rk = ["policy", "ug_id", "period_start_ms"], ["band", "value", "ug_id", "period_start_ms"]
    by_spark = run_parameters(spark, cfg, window, engine="spark"), run_similarity(spark, cfg, window, engine="spark")
    spark_rows = read(params, pk), read(rates, rk)
    by_arrow = run_parameters(None, cfg, window), run_similarity(None, cfg, window)
    assert [r["engine"] for r in by_arrow] == ["arrow", "arrow"]
    assert by_arrow[0]["rows_per_policy"] == by_spark[0]["rows_per_policy"] and by_arrow[1]["rows"] == by_spark[1]["rows"]
    for (path, keys), want in zip(((params, pk), (rates, rk)), spark_rows):
        got = read(path, keys)
        assert list(got.columns) == list(want.columns) and len(got) == len(want) > 0
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
    for a, b in zip(by_arrow[1]["summary"], by_spark[1]["summary"]):
        assert a["value"] == b["value"] and a["better_over_worse"] == pytest.approx(b["better_over_worse"], rel=1e-9)
    run_parameters(spark, cfg, window, engine="spark")
    assert len(read(params, pk)) == len(spark_rows[0])
    # a window without silver rows: nothing to replace there, the other periods stay
    assert run_parameters(None, cfg, Window.from_periods(window.start_ms + 10 * 86_400_000, 2, cfg.settings.autoplex.period_minutes))["rows_per_policy"] == {}
    assert len(read(params, pk)) == len(spark_rows[0])
