"""The canary verdict of a stream run's tables (export/delivery/stream_canary.py, issue 58) on the
shared small lake's silver.connections: its looks see the moments export.delivery.canary reads over the
same rows, a treatment arm made to retransmit more is rolled back, and every verdict is a row of
gold.rollout_decisions."""
from __future__ import annotations

from dataclasses import replace

import pytest
from pyspark.sql import functions as F

from ccs_testing import write_config
from ccselect.config import load_config
from ccselect.lake import table_path
from ccselect.export.delivery.canary import canary_moments
from ccselect.export.delivery import gates, stream_canary


@pytest.fixture(scope="module")
def lake(spark, small_lake):
    cfg = load_config(small_lake.cfg_path)
    conns = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    lo = conns.agg(F.min("ts_end_ms")).first()[0]
    return cfg, conns, (lo // 3_600_000 + 1) * 3_600_000    # a table at the second hour's start


def test_looks_read_the_moments_the_canary_reads(spark, lake):
    cfg, conns, b = lake
    node = stream_canary.canary_node(conns, b, b + 30 * 60_000)
    top = (conns.where(F.col("ts_end_ms").between(b, b + 30 * 60_000 - 1)).groupBy("node_id").count()
           .orderBy(F.desc("count")).first())
    assert top["count"] == conns.where((F.col("node_id") == node) & F.col("ts_end_ms").between(b, b + 30 * 60_000 - 1)).count()
    rows = stream_canary.minute_sums(conns, node, b, 30)
    live = gates.silver_moments(spark, cfg)       # the live gate's read of silver.connections
    for minutes in (7, 30):
        ours = stream_canary.cumulative(rows, minutes)
        theirs = canary_moments(conns, node, b, b + minutes * 60_000)
        if minutes == 30:
            assert live(node, b, b + minutes * 60_000) == theirs
        assert set(ours) == set(theirs) and ours, (ours, theirs)
        for metric, arms in theirs.items():
            for arm, m in arms.items():
                o = ours[metric][arm]
                assert (o.conns, o.clusters) == (m.conns, m.clusters), (metric, arm)
                assert [getattr(o, k) for k in ("sy", "sx", "syy", "sxx", "sxy")] == pytest.approx(
                    [getattr(m, k) for k in ("sy", "sx", "syy", "sxx", "sxy")], rel=1e-12)


def test_a_harmful_treatment_arm_is_rolled_back_and_every_verdict_recorded(lake, tmp_path):
    cfg, conns, b = lake
    # the small lake's node has some 70 clients per arm in 30 min, with heavy-tailed rates: a
    # quarter of every treatment connection's segments retransmitted more, judged over two hours
    few = replace(cfg.settings.export.canary, min_clusters=5, max_minutes=120)
    worse = conns.withColumn("total_retrans", F.when(F.col("ab_treatment"), (F.col("data_segs_out") / 4).cast("long")
                                                     + F.col("total_retrans")).otherwise(F.col("total_retrans")))
    log = gates.DecisionLog(str(tmp_path / "rollout_decisions"))
    tables = [{"version": 4, "boundary": b}, {"version": 5, "boundary": 10 ** 13}]   # the second: past the lake
    bad, none = stream_canary.verdicts(None, cfg, tables, log, conns=worse, settings=few)
    assert bad["decision"] == "rollback" and "retrans_rate: treatment +" in bad["reason"], bad
    assert bad["metrics"]["retrans_rate"]["cs"][0] > 0 and 1 <= bad["minute"] <= few.max_minutes
    assert none["decision"] == "observe" and "no outcome rows" in none["reason"] and none["node_id"] is None
    assert "canary A/B on the simulated arms" in stream_canary.summary_line(bad)
    rows = gates.read_decisions(log.path)
    assert [(r["version"], r["decision"], r["cohort"]) for r in rows] == [
        (4, "rollback", stream_canary.COHORT), (5, "observe", stream_canary.COHORT)]
    # make run's summary: the verdict under its table's line
    from ccselect.app.run import _stream_lines
    lines = _stream_lines({"hours": ["h"], "files": 1, "lines_read": 1, "batches": 1,
                           "tables": [{"version": 4, "boundary": b, "entries": 3, "changed": None, "rollout": {}}],
                           "canary": {"4": bad}})
    assert lines[2].startswith("    canary A/B on the simulated arms") and "rollback at" in lines[2], lines


def test_the_live_gate_reads_no_rows_from_a_lake_without_silver(spark, lake, tmp_path):
    """A fresh lake (the stream has committed nothing yet): the gate's read is empty, so it observes
    rather than failing (`ccs rollout --gate canary` right after a lake is made)."""
    cfg, _, b = lake
    fresh = load_config(write_config(tmp_path))          # a data root of its own: no lake yet
    assert gates.silver_moments(spark, fresh)("node", b, b + 60_000) == {}
