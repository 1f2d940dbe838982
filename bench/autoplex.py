"""bench/autoplex: AutoPlex over one day of a 20-node fleet (issue 6 "Must show"), 2 cores.

Times the two AutoPlex jobs on the same silver.connections: `jobs.autoplex.run_parameters`
(Algorithm 1 for every configured policy, 48 periods of 30 minutes → gold.autoplex_params) and
`jobs.autoplex.run_similarity` (§3.4's change rates → gold.autoplex_similarity), with each engine:
the Spark job (local[2]) and the driver-side Arrow engine (`jobs/autoplex_arrow.py`, 2 threads,
what `ccs autoplex` runs by default on a local lake); and — in the same run, as the single-machine
reference — the same computation in DuckDB (2 threads) over the same silver Parquet files. Wall
time and silver rows/s for each; each engine over DuckDB next to issue 31's goal (within 3x of
DuckDB; `meets_goal` is the default engine's), peak memory, and the machine's load average. After
the Spark jobs, in the same session, Spark SQL runs DuckDB's own statements over the same silver
(`spark_reference_sql`): Spark's time for the reference's plan, next to the jobs'. Before it,
the Spark jobs run a second time, and their reads and writes alone (`spark_floor`): what is left
of the Spark jobs' time when nothing is computed.

The day's silver is built from the simulated transport and access logs through
`jobs.silver.build_connections` (user groups, delivery rate — AutoPlex's goodput —, retransmission
ratio) without the QoE beacons, which the AutoPlex jobs do not read (so QoE columns are null): the
ingest has its own bench and is hours of work at this size. Its layout is the one `ccs ingest`
writes: one file per (node, hour) partition, 480 for the day. Writes bench/results/autoplex.json and prints it.

    .venv/bin/python bench/autoplex.py [--nodes 20] [--hours 24] [--workdir /tmp/ccs-bench-autoplex]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import PeakRss, bench_config, read_stream  # noqa: E402
from ccselect.hours import Window
from ccselect.lake import AUTOPLEX_PARAMS, AUTOPLEX_SIMILARITY, CONNECTIONS
from ccselect.spark import get_spark
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): duckdb, pyspark, and our modules that load them.

#: issue 31's goal: the two AutoPlex jobs together within this factor of DuckDB's time
GOAL_RATIO = 3.0

# Algorithm 1's Extract + mean (lines 5-8) per policy, and §3.4's change rates, in DuckDB SQL:
# positions k (0-based, ties broken by conn_id) with lo·n/100 <= k < hi·n/100 of each group-period.
_BAND = """
WITH s AS (SELECT *, CAST(floor(ts_end_ms / {t}) * {t} AS BIGINT) AS period_start_ms, {metric} AS m
           FROM conns WHERE {metric} IS NOT NULL),
r AS (SELECT *, row_number() OVER (PARTITION BY ug_id, period_start_ms ORDER BY m {dir} NULLS LAST, conn_id) - 1 AS k,
             count(*) OVER (PARTITION BY ug_id, period_start_ms) AS n FROM s)
SELECT ug_id, period_start_ms, any_value(n) AS n_sessions, count(*) AS n_band,
       avg(delivery_rate_bps) AS mean_goodput_bps, avg(max_inflight_segs) AS mean_max_inflight_segs,
       avg(max_cwnd_segs) AS mean_max_cwnd_segs, avg(m) AS mean_metric
FROM r WHERE k >= n * {lo} / 100.0 AND k < n * {hi} / 100.0
GROUP BY ug_id, period_start_ms HAVING any_value(n) >= {min_n}
"""
_METRIC_SQL = {"retrans_ratio": "retrans_ratio",
               "goodput_per_srtt": "(delivery_rate_bps / 1e6) / (((min_srtt_us + max_srtt_us) / 2) / 1e6)"}


def reference_queries(query, load, policies, period_minutes: int, better, worse) -> dict:
    """The reference's computation: `load()` fills the table `conns` with the window's silver rows
    and returns their count; then `query(sql)` (the rows of one SQL statement) runs Algorithm 1's
    bands for every policy and §3.4's change rates."""
    t = period_minutes * 60_000
    t0 = time.perf_counter()
    rows = load()

    def band_sql(p):
        return _BAND.format(t=t, metric=_METRIC_SQL[p.metric], dir="ASC" if p.ascending else "DESC",
                            lo=p.band_lo, hi=p.band_hi, min_n=p.min_sessions)
    params = sum(len(query(band_sql(p))) for p in policies)
    t_params = time.perf_counter() - t0
    t1 = time.perf_counter()
    rates = []
    for label, p in (("better", better), ("worse", worse)):
        for v in ("goodput_bps", "max_inflight_segs", "max_cwnd_segs"):
            rates += query(f"""
                WITH b AS ({band_sql(p)}),
                l AS (SELECT *, lag(mean_{v}) OVER w AS prev, lag(period_start_ms) OVER w AS prev_start FROM b
                      WINDOW w AS (PARTITION BY ug_id ORDER BY period_start_ms))
                SELECT '{label}', '{v}', abs(mean_{v} - prev) / prev FROM l
                WHERE prev > 0 AND period_start_ms - prev_start = {t}""")
    summary = {}
    for label, v, r in rates:
        summary.setdefault(v, {}).setdefault(label, []).append(r)
    t_sim = time.perf_counter() - t1
    return {"rows": rows, "parameter_rows": params, "similarity_rows": len(rates),
            "parameters_seconds": round(t_params, 2), "similarity_seconds": round(t_sim, 2),
            "seconds": round(t_params + t_sim, 2), "summary": {v: {b: round(sum(x) / len(x), 4) for b, x in d.items()} for v, d in summary.items()}}


def duckdb_autoplex(parquet_glob: str, policies, period_minutes: int, start_ms: int, end_ms: int,
                    better, worse) -> dict:
    import duckdb
    con = duckdb.connect()
    con.execute("SET threads TO 2")

    def load():
        con.execute(f"CREATE TEMP TABLE conns AS SELECT * FROM read_parquet('{parquet_glob}', hive_partitioning=true) "
                    f"WHERE ts_end_ms >= {start_ms} AND ts_end_ms < {end_ms}")
        return con.execute("SELECT count(*) FROM conns").fetchone()[0]
    return reference_queries(lambda sql: con.execute(sql).fetchall(), load, policies, period_minutes, better, worse)


def spark_reference_sql(spark, silver_path: str, policies, period_minutes: int, start_ms: int, end_ms: int,
                        better, worse) -> dict:
    """DuckDB's statements run by Spark SQL over the same silver (Delta), its window's rows cached
    as DuckDB's temporary table holds them: what Spark takes for the reference's own plan, with
    no table written (the AutoPlex jobs write two)."""
    conns = spark.read.format("delta").load(silver_path).where(f"ts_end_ms >= {start_ms} AND ts_end_ms < {end_ms}")

    def load():
        conns.cache().createOrReplaceTempView("conns")
        return conns.count()
    try:
        return reference_queries(lambda sql: [tuple(r) for r in spark.sql(sql).collect()], load, policies,
                                 period_minutes, better, worse)
    finally:
        conns.unpersist()


def build_silver(spark, cfg, fleet: str) -> int:
    """silver.connections for the fleet's transport and access logs (see the module docstring)."""
    from pyspark.sql import functions as F

    from ccselect import delta_io
    from ccselect.lake import table_path
    from ccselect.jobs.parse import schema
    from ccselect.spark import conf_set
    from ccselect.jobs.silver import CO_PARTITIONED, SILVER_CONSTRAINTS, SILVER_PROPERTIES, build_connections, read_reference, reference_frame
    # keyed by (node_id, hour) as ingest's silver extract keys them (jobs/silver.py): one file per
    # node-hour, the layout `ccs ingest` leaves (shuffled by the join keys instead, every node-hour
    # was spread over each shuffle partition's file: 4 files per node-hour, 1,920 in all)
    def read(stream):
        return read_stream(spark, fleet, stream).repartition("node_id", "hour")
    transport = read("transport")
    empty = lambda s: spark.createDataFrame([], schema(s)).withColumn("hour", F.lit(None).cast("string"))  # noqa: E731
    ref = reference_frame(spark, read_reference(f"{fleet}/reference/ip_asn_region.csv"))
    conns = build_connections(transport, read("access"), empty("qoe"), ref)
    keys = {(r["node_id"], r["hour"]) for r in transport.select("node_id", "hour").distinct().collect()}
    path = table_path(cfg, CONNECTIONS)
    with conf_set(spark, CO_PARTITIONED):
        delta_io.replace_partitions(conns, path, keys, constraints=SILVER_CONSTRAINTS, properties=SILVER_PROPERTIES)
    return spark.read.format("delta").load(path).count()


def time_jobs(spark, cfg, window, engine: str) -> tuple[dict, float, dict, float]:
    """(result, seconds) of `run_parameters`, then of `run_similarity`, with `engine`."""
    from ccselect.jobs import autoplex
    t0 = time.perf_counter()
    params = autoplex.run_parameters(spark, cfg, window, engine=engine)
    t1 = time.perf_counter()
    sim = autoplex.run_similarity(spark, cfg, window, engine=engine)
    return params, t1 - t0, sim, time.perf_counter() - t1


def spark_floor(spark, cfg, window) -> dict:
    """What the two Spark jobs cost without their computation, in the session they ran in: a
    `noop` read of the silver columns each job reads (`scan_*`, `autoplex.inputs`), and each job's
    table write (`write_*`: `autoplex.write_parameters` / `write_similarity`) from the rows it
    wrote, read back and cached first. Run after the jobs, so that both tables exist, as on a
    re-run."""
    from pyspark.sql import functions as F

    from ccselect.lake import table_path
    from ccselect.jobs import autoplex
    s = cfg.settings.autoplex
    policies, group_cols, period = autoplex.load_policies(s), list(s.group_by), s.period_minutes
    better, _ = autoplex.similarity_bands(s)
    silver = autoplex.extract(spark, cfg, window)
    labels = autoplex.period_labels(window, period)
    key = autoplex.similarity_window(window, period)
    out = {}

    def timed(name: str, f) -> None:
        t0 = time.perf_counter()
        f()
        out[name] = round(time.perf_counter() - t0, 2)
    for name, metrics in (("scan_parameters", {p.metric for p in policies}), ("scan_similarity", {better.metric})):
        timed(name, autoplex.inputs(silver, group_cols, metrics).write.format("noop").mode("overwrite").save)
    params = (spark.read.format("delta").load(table_path(cfg, AUTOPLEX_PARAMS))
              .where(F.col("period").isin(labels)).cache())
    sim = (spark.read.format("delta").load(table_path(cfg, AUTOPLEX_SIMILARITY))
           .where(F.col("window") == key).drop("window").cache())
    params.count()
    sim.count()
    timed("write_parameters", lambda: autoplex.write_parameters(cfg, params, labels))
    timed("write_similarity", lambda: autoplex.write_similarity(cfg, sim, key))
    params.unpersist()
    sim.unpersist()
    out["seconds"] = round(sum(out.values()), 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--conns-per-node-hour", type=int, default=1500)
    ap.add_argument("--workdir", default="/tmp/ccs-bench-autoplex")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)

    from ccselect.jobs import autoplex
    from ccselect.sim.fleet import simulate

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "root").mkdir(parents=True)
    fleet = str(work / "fleet")
    start = "2026-11-01T00:00:00"
    t0 = time.perf_counter()
    manifest = simulate(SimParams(nodes=args.nodes, hours=args.hours, start=start, seed=17,
                                  conns_per_node_hour=args.conns_per_node_hour), fleet, workers=2, progress=False)
    sim_s = time.perf_counter() - t0

    cfg = bench_config(work, work / "root")
    policies, period = autoplex.load_policies(cfg.settings.autoplex), cfg.settings.autoplex.period_minutes
    start_ms = int(datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp() * 1000)
    periods = args.hours * 60 // period
    end_ms = start_ms + periods * period * 60_000
    window = Window.from_periods(start_ms, periods, period)
    print(f"simulated {manifest['counts']['transport']} connections in {sim_s:.0f} s; silver ...", file=sys.stderr, flush=True)
    load_start = os.getloadavg()[0]
    with PeakRss() as mem:
        spark = get_spark(cfg, "ccs-bench-autoplex")
        t0 = time.perf_counter()
        silver_rows = build_silver(spark, cfg, fleet)
        silver_s = time.perf_counter() - t0
        load_spark = os.getloadavg()[0]
        with PeakRss() as mem_jobs:     # the AutoPlex jobs alone (the JVM keeps the heap the build grew)
            params, params_s, sim, sim_sp_s = time_jobs(spark, cfg, window, "spark")
    # the same jobs again in the same session (their plans compiled, both tables there), and what
    # they cost without their computation
    _, params_w_s, _, sim_w_s = time_jobs(spark, cfg, window, "spark")
    floor = spark_floor(spark, cfg, window)
    from ccselect.lake import table_path
    better, worse = autoplex.similarity_bands(cfg.settings.autoplex)
    load_ref = os.getloadavg()[0]     # (after the peaks above: its cache is not the jobs' memory)
    ref_sql = spark_reference_sql(spark, table_path(cfg, CONNECTIONS), policies, period, start_ms, end_ms,
                                  better, worse)
    spark.stop()
    print(f"Spark parameters {params_s:.0f} s, similarity {sim_sp_s:.0f} s; DuckDB ...", file=sys.stderr, flush=True)
    load_duck = os.getloadavg()[0]
    with PeakRss() as mem_duck:
        duck = duckdb_autoplex(f"{table_path(cfg, CONNECTIONS)}/*/*/*.parquet", policies, period,
                               start_ms, end_ms, better, worse)
    # the Arrow engine in this process, after Spark's jobs and DuckDB (both tables replaced again)
    load_arrow = os.getloadavg()[0]
    with PeakRss() as mem_arrow:
        a_params, a_params_s, a_sim, a_sim_s = time_jobs(None, cfg, window, "arrow")
    rows = duck["rows"]
    spark_total = params_s + sim_sp_s
    arrow_total = a_params_s + a_sim_s
    duck_total = duck["seconds"]
    ratio = spark_total / duck_total
    arrow_ratio = arrow_total / duck_total
    summary_diff = max(abs(a[b] - x[b]) for a, x in zip(a_sim["summary"], sim["summary"])
                       for b in ("better", "worse")) if len(a_sim["summary"]) == len(sim["summary"]) else None
    out = {
        "bench": "autoplex", "goal": f"the default engine within {GOAL_RATIO:g}x of duckdb", "cores": 2,
        "nodes": args.nodes,
        "hours": args.hours, "periods": periods,
        "period_minutes": period, "policies": [p.name for p in policies],
        "simulate_seconds": round(sim_s, 1), "silver_build_seconds": round(silver_s, 1), "silver_rows": silver_rows,
        "rows_in_window": rows,
        "spark": {"parameters_seconds": round(params_s, 2), "parameters_rows_per_s": round(rows / params_s),
                  "parameter_rows": params["rows_per_policy"],
                  "similarity_seconds": round(sim_sp_s, 2), "similarity_rows_per_s": round(rows / sim_sp_s),
                  "similarity_rows": sim["rows"], "summary": sim["summary"],
                  "seconds": round(spark_total, 2), "rows_per_s": round(rows / spark_total),
                  # Python driver + JVM: over the silver build and the jobs, and over the jobs alone
                  "peak_driver_rss_mb": round(mem.peak / 2 ** 20), "peak_jobs_rss_mb": round(mem_jobs.peak / 2 ** 20),
                  "peak_jobs_jvm_rss_mb": round(mem_jobs.peak_jvm / 2 ** 20),
                  "master": "local[2]", "driver_memory": "4g",
                  # the goal's figure is the first run above; the second run in the same session,
                  # and the floor: the jobs' reads and writes alone (`spark_floor`)
                  "second_run": {"parameters_seconds": round(params_w_s, 2), "similarity_seconds": round(sim_w_s, 2),
                                 "seconds": round(params_w_s + sim_w_s, 2),
                                 "over_duckdb": round((params_w_s + sim_w_s) / duck_total, 2)},
                  "floor_without_compute": {**floor, "over_duckdb": round(floor["seconds"] / duck_total, 2)}},
        "arrow": {"parameters_seconds": round(a_params_s, 2), "parameters_rows_per_s": round(rows / a_params_s),
                  "parameter_rows": a_params["rows_per_policy"],
                  "similarity_seconds": round(a_sim_s, 2), "similarity_rows_per_s": round(rows / a_sim_s),
                  "similarity_rows": a_sim["rows"], "summary": a_sim["summary"],
                  "seconds": round(arrow_total, 2), "rows_per_s": round(rows / arrow_total),
                  # the same rows as the Spark job's; its means are summed in another order, so the
                  # summary's mean change rates may differ in their last bits
                  "same_rows_as_spark": a_params["rows_per_policy"] == params["rows_per_policy"]
                  and a_sim["rows"] == sim["rows"],
                  "summary_max_abs_diff_vs_spark": summary_diff,
                  # this Python process (the engine runs in it; the idle Spark JVM beside it not counted)
                  "peak_rss_mb": round(mem_arrow.peak_python / 2 ** 20), "threads": 2, "default": True},
        "duckdb": {**duck, "rows_per_s": round(rows / duck_total), "threads": 2,
                   "peak_rss_mb": round(mem_duck.peak_python / 2 ** 20)},   # this process, DuckDB in it (not the idle JVM)
        "spark_reference_sql": {**{k: v for k, v in ref_sql.items() if k != "summary"},
                                # the same row counts as DuckDB's, and its summary's mean change rates
                                # to 1e-3 (sums in another order): the same statements
                                "same_results_as_duckdb": all(ref_sql[k] == duck[k] for k in
                                                              ("rows", "parameter_rows", "similarity_rows"))
                                and all(abs(ref_sql["summary"][v][b] - x) <= 1e-3
                                        for v, d in duck["summary"].items() for b, x in d.items())},
        "spark_over_duckdb": round(ratio, 2), "arrow_over_duckdb": round(arrow_ratio, 2), "goal_ratio": GOAL_RATIO,
        # the default engine (autoplex.engine: auto runs the Arrow engine on a local lake), and the Spark job's
        "meets_goal": bool(arrow_ratio <= GOAL_RATIO), "spark_meets_goal": bool(ratio <= GOAL_RATIO),
        # DuckDB's own statements in Spark SQL, after the jobs in the same session, over DuckDB
        "reference_sql_over_duckdb": round(ref_sql["seconds"] / duck_total, 2),
        # other work on the machine slows both sides: the 1-minute load at the start of the bench
        # (before the silver build) and as each side started
        "load_average_1m": {"start": round(load_start, 2), "spark_start": round(load_spark, 2),
                            "reference_sql_start": round(load_ref, 2),
                            "duckdb_start": round(load_duck, 2), "arrow_start": round(load_arrow, 2),
                            "end": round(os.getloadavg()[0], 2)},
    }
    Path(REPO, "bench", "results").mkdir(parents=True, exist_ok=True)
    Path(REPO, "bench", "results", "autoplex.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(json.dumps(out, indent=2, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
