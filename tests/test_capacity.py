"""bench/capacity.py: the capacity plan's arithmetic from the benches' per-core rates, and the goals
table reading the benches' JSON (missing benches listed as not measured)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import capacity  # noqa: E402


def test_plan_cores_and_the_bounding_stage():
    rates = [{"stage": "ingest", "unit": "connections", "rows_per_s": 2000, "peak_rss_mb": 4096},
             {"stage": "infer", "unit": "connections", "rows_per_s": 2_000_000, "peak_rss_mb": 2048}]
    kernel = {"median": {"route_ccs": {"net_ns_per_connection": 100.0}, "logging": {"net_ns_per_connection": 1000.0}}}
    p = capacity.plan(rates, nodes=10, node_rps=100.0, req_per_conn=1.0, hourly_minutes=15, kernel=kernel)
    assert p["connections_per_s"] == 1000 and p["connections_per_hour"] == 3_600_000
    ingest, infer = p["stages"]
    # 1000 rows/s per core: 1000 connections/s need 1 core streaming; an hour in 15 minutes needs 4
    assert (ingest["rows_per_s_per_core"], ingest["streaming_cores"], ingest["hourly_cores"]) == (1000, 1, 4)
    assert ingest["memory_gb_per_core"] == 2.0 and ingest["hourly_memory_gb"] == 8.0
    assert (infer["streaming_cores"], infer["hourly_cores"]) == (1, 1)
    assert p["bound_by"] == "ingest" and p["hourly_cores_total"] == 5
    assert p["edge_per_node"]["sock_ops_core_share"] == 1e-5          # 100 conns/s × 100 ns


def test_goals_read_the_benches_and_name_the_missing(tmp_path, monkeypatch):
    (tmp_path / "autoplex.json").write_text(json.dumps({
        "rows_in_window": 1000, "nodes": 2, "spark_over_duckdb": 4.0, "arrow_over_duckdb": 3.5, "goal_ratio": 3.0,
        "spark": {"seconds": 8.0, "rows_per_s": 125, "peak_driver_rss_mb": 100},
        "arrow": {"seconds": 7.0, "rows_per_s": 143, "peak_rss_mb": 50},
        "duckdb": {"seconds": 2.0}, "load_average_1m": {"start": 0.4, "spark_start": 0.5}}))
    monkeypatch.setattr(capacity, "RESULTS", tmp_path)
    goals, rates = capacity.stages()
    by = {g["stage"]: g for g in goals}
    # the goal row is the default (Arrow) engine's, with the Spark job's figure in its detail
    assert by["AutoPlex, one day"]["met"] is False and by["AutoPlex, one day"]["figure"] == 3.5
    assert "the Spark job 8.0 s (4.0×)" in by["AutoPlex, one day"]["detail"]
    assert "missing" in by["ingest, files → silver"] and "missing" in by["ccs infer"]
    assert rates == [{"stage": "autoplex", "unit": "connections", "rows_per_s": 125, "peak_rss_mb": 100}]
    page = capacity.markdown(goals, [capacity.plan(rates, 1, 10.0, 1.0, 15, None)],
                             type("A", (), {"requests_per_connection": 1.0, "hourly_minutes": 15.0, "node_rps": 10.0}))
    assert "not measured: run `python bench/ingest.py`" in page and "| **no** |" in page
