"""AutoPlex (autoplex-nai22.txt), the Spark job: per user group and period, the better-performed
sessions' statistics become the next period's CC parameters (Algorithm 1), and the similarity
analysis of §3.4 (better sessions change less between periods than worse ones). The policies, the
band rule, the parameters' arithmetic, the periods and the summary are jobs/autoplex_core.py's,
shared with the in-process engine (jobs/autoplex_arrow.py); this module ranks, counts and sums with
Spark's window functions, and chooses the engine for a run (`run_parameters`, `run_similarity`).

A job is extract → pure transforms → load; the transforms take any DataFrame with the silver
columns they name, so they are tested on tiny inline frames.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.delta_arrow import by_engine
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.lake import AUTOPLEX_PARAMS, AUTOPLEX_SIMILARITY, connections_in, table_path
from ccselect.spark import get_spark
from ccselect.jobs import autoplex_arrow
# the computation both engines share; its names stay importable from here
from ccselect.jobs.autoplex_core import (GOODPUT, METRIC_INPUTS, VALUES, Policy, PolicyError, f_cap, hour_key,  # noqa: F401
                                in_band, input_columns, load_policies, max_cwnd_last, orderings, period_labels,
                                plot_similarity, similarity_bands, similarity_summary as _summary,
                                similarity_window)

#: metrics a policy may sort by: name → Spark expression over silver.connections columns (the
#: names and inputs of autoplex_core.METRIC_INPUTS; autoplex_arrow.metric_values in NumPy)
METRICS = {
    "retrans_ratio": lambda: F.col("retrans_ratio"),
    # goodput / srtt in Mbps per second, as AutoPlex Fig. 2 reports it
    "goodput_per_srtt": lambda: (F.col(GOODPUT) / 1e6) / (((F.col("min_srtt_us") + F.col("max_srtt_us")) / 2) / 1e6),
}
def with_period(df: DataFrame, period_minutes: int) -> DataFrame:
    """Adds `period_start_ms`: the start of the T-minute period the connection closed in."""
    t = period_minutes * 60_000
    return df.withColumn("period_start_ms", (F.floor(F.col("ts_end_ms") / t) * t).cast("bigint"))


def _metric_col(metric: str) -> str:
    return f"_m_{metric}"


def with_metrics(df: DataFrame, metrics) -> DataFrame:
    """Adds a column `_m_<metric>` for each of `metrics` (names of METRICS)."""
    return df.withColumns({_metric_col(m): METRICS[m]() for m in sorted(set(metrics))})


def _sort_entry(i: int, p: Policy):
    """One ordering's sort key, as a struct: `_o` (the ordering's index), `_f` and `_key` (sorted
    ascending, nulls last, they give the policy's order of its metric) and `_m` (the metric). A
    descending metric sorts as -m, with `_f` putting NaN (which Spark orders above every number)
    first, as `desc_nulls_last` does; -0.0 and 0.0 compare equal either way, so ties still fall to
    conn_id."""
    m = F.col(_metric_col(p.metric))
    flag, key = (F.lit(0), m) if p.ascending else (F.when(F.isnan(m), F.lit(0)).otherwise(F.lit(1)), -m)
    return F.struct(F.lit(i).alias("_o"), flag.alias("_f"), key.alias("_key"), m.alias("_m"))


def _banded(df: DataFrame, bands: list[tuple[str, Policy]], group_cols: list[str]) -> DataFrame:
    """Algorithm 1's Extract for any bands, in one sort: per group, period and ordering (metric and
    direction, `autoplex_core.orderings`), sessions ordered by the metric (ties broken by conn_id, so the result
    is deterministic; sessions without the metric last and not counted) take positions k (0-based,
    n sessions with the metric); a session is in band (label, policy) by `autoplex_core.in_band`. One row per
    session and band it is in, with `_band` (the label), `_m` (the band's metric) and `n_sessions`.
    `df` carries the `_m_<metric>` columns of `with_metrics`.

    With several orderings each session becomes one row per ordering (an explode of their sort
    keys, `_sort_entry`) and a single window over (ordering, group, period) ranks them all: one
    scan and one shuffle of the input rather than a cached input and a shuffle and sort per
    ordering (measured in jobs/README, AutoPlex)."""
    by_order = orderings(bands)
    keys = [*group_cols, "period_start_ms"]
    entries = [_sort_entry(i, o[0][1]) for i, o in enumerate(by_order)]
    # one ordering needs no explode (§3.4's two bands share one)
    stacked = df.withColumn("_e", entries[0] if len(entries) == 1 else F.explode(F.array(*entries)))
    stacked = stacked.withColumns({c: F.col("_e")[c] for c in ("_o", "_f", "_key", "_m")}).drop("_e")
    w = Window.partitionBy("_o", *keys).orderBy(F.col("_f"), F.col("_key").asc_nulls_last(), F.col("conn_id"))
    # the count over the same ordered window (whole frame), so both come from one window operator
    whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    ranked = stacked.withColumns({"_k": F.row_number().over(w) - 1, "n_sessions": F.count("_key").over(whole)})
    k, n, o = F.col("_k"), F.col("n_sessions"), F.col("_o")
    member = {label: (o == i) & in_band(k, n, p) for i, ordering in enumerate(by_order) for label, p in ordering}
    if len(member) == 1:
        (label, cond), = member.items()
        out = ranked.where(cond).withColumn("_band", F.lit(label))
    else:   # bands may overlap: a row per band the session is in (explode and when: compiled, no lambda)
        any_band = functools.reduce(lambda a, b: a | b, member.values())
        out = (ranked.where(any_band)
               .withColumn("_band", F.explode(F.array(*[F.when(c, F.lit(label)) for label, c in member.items()])))
               .where(F.col("_band").isNotNull()))
    return out.drop("_o", "_f", "_key", "_k")


def band(df: DataFrame, policy: Policy, group_cols: list[str]) -> DataFrame:
    """Algorithm 1's Extract for one policy: the rows of `df` in its band (see `_banded`), with
    `n_sessions` (the group's count of sessions with the metric) and `_m` (the metric)."""
    return _banded(with_metrics(df, [policy.metric]), [("", policy)], group_cols).drop("_band")


def band_means(df: DataFrame, bands: list[tuple[str, Policy]], group_cols: list[str]) -> DataFrame:
    """Algorithm 1 line 6 (§4.2, better-performed session extraction) for every band at once: per
    group, period and band (`_band`, the label), `n_sessions`, `n_band` and the band means of
    VALUES and of the metric; groups with fewer sessions than the band's policy asks get no row.

    Every band comes from one window (`_banded`: the default policies and §3.4's two bands are one
    sort each); each band's means are summed in that sort's order, the order a window per policy
    gives, so the floating-point means are the same bits."""
    keys = [*group_cols, "period_start_ms"]
    min_sessions = F.create_map(*[F.lit(x) for label, p in bands for x in (label, p.min_sessions)])
    agg = (_banded(with_metrics(df, [p.metric for _, p in bands]), bands, group_cols)
           .groupBy(*keys, "_band")
           .agg(F.first("n_sessions").alias("n_sessions"), F.count(F.lit(1)).alias("n_band"),
                *[F.avg(src).alias(f"mean_{c}") for c, src in VALUES.items()],
                F.avg("_m").alias("mean_metric")))
    return agg.where(F.col("n_sessions") >= min_sessions[F.col("_band")])


def parameters_all(df: DataFrame, policies: list[Policy], group_cols: list[str], period_minutes: int) -> DataFrame:
    """Algorithm 1 lines 5-8 per policy, group and period: mean goodput, max_inflight, max_cwnd of
    the policy's band; pacing_rate_last = goodput; max_cwnd_last = (max_inflight + max_cwnd) / 2.
    Groups below the policy's minimum session count get no row. `applies_from_ms` is the next
    period. `df` has `period_start_ms` (`with_period`)."""
    bands = [(str(i), p) for i, p in enumerate(policies)]   # labels by position: names may repeat
    keys = [*group_cols, "period_start_ms"]

    def lookup(f):
        return F.create_map(*[F.lit(x) for label, p in bands for x in (label, f(p))])[F.col("_band")]
    agg = band_means(df, bands, group_cols)
    return agg.select(
        *keys, "n_sessions", "n_band", *[f"mean_{c}" for c in VALUES], "mean_metric",
        lookup(lambda p: p.name).alias("policy"), lookup(lambda p: p.metric).alias("metric"),
        lookup(lambda p: float(p.band_lo)).alias("band_lo"), lookup(lambda p: float(p.band_hi)).alias("band_hi"),
        F.col("mean_goodput_bps").alias("pacing_rate_last_bps"),
        max_cwnd_last(F.col("mean_max_inflight_segs"), F.col("mean_max_cwnd_segs")).alias("max_cwnd_last_segs"),
        (F.col("period_start_ms") + F.lit(period_minutes * 60_000)).alias("applies_from_ms"))


def parameters(df: DataFrame, policy: Policy, group_cols: list[str], period_minutes: int) -> DataFrame:
    """`parameters_all` for one policy."""
    return parameters_all(df, [policy], group_cols, period_minutes)


def change_rates(df: DataFrame, group_cols: list[str], better: Policy, worse: Policy,
                 period_minutes: int) -> DataFrame:
    """AutoPlex §3.4: for the better and the worse band, the change rate |m_T − m_{T−1}| / m_{T−1}
    of each band mean (goodput, max_cwnd, max_inflight) between adjacent periods of a group.
    Both bands' means come from one pass (`band_means`), and one window over (group, band) gives
    every value's previous period."""
    t = period_minutes * 60_000
    means = band_means(df, [("better", better), ("worse", worse)], group_cols).withColumnRenamed("_band", "band")
    w = Window.partitionBy(*group_cols, "band").orderBy("period_start_ms")
    adjacent = F.col("period_start_ms") - F.lag("period_start_ms").over(w) == t
    rates = []
    for c in VALUES:
        prev = F.lag(f"mean_{c}").over(w)
        rates.append(F.struct(F.lit(c).alias("value"),
                              F.when((prev > 0) & adjacent, F.abs(F.col(f"mean_{c}") - prev) / prev).alias("change_rate")))
    # the window first, then the generator (Spark does not plan both in one projection)
    return (means.select(*group_cols, "period_start_ms", "band", F.array(*rates).alias("_rates"))
            .select(*group_cols, "period_start_ms", "band", F.inline("_rates"))
            .where(F.col("change_rate").isNotNull()))


def similarity_summary(rates: DataFrame) -> list[dict[str, Any]]:
    """Mean change rate per band and value, and better/worse ratio (`autoplex_core.similarity_summary`)."""
    means = rates.groupBy("value", "band").agg(F.avg("change_rate").alias("m")).collect()
    return _summary([(r["value"], r["band"], r["m"]) for r in means])


def prefix_caps(reference: DataFrame, params: DataFrame, headroom: float = 1.0) -> DataFrame:
    """Maps user groups back to the address blocks of the reference table, so the export can
    attach caps to table entries of that group: `pacing_rate_bps` = pacing_rate_last × headroom
    (the kernel then paces at min(BBR's own rate, cap), the a <= b branch of eq. (1)) and
    `cwnd_clamp_segs` = max_cwnd_last. Uses each group's latest period."""
    w = Window.partitionBy("ug_id", "policy").orderBy(F.col("period_start_ms").desc())
    latest = (params.withColumn("_r", F.row_number().over(w)).where("_r = 1")
              .select("ug_id", "policy", "applies_from_ms",
                      (F.col("pacing_rate_last_bps") * headroom).cast("bigint").alias("pacing_rate_bps"),
                      F.ceil("max_cwnd_last_segs").cast("int").alias("cwnd_clamp_segs")))
    ref = reference.select("cidr", F.concat_ws("-AS", F.col("region"), F.col("asn").cast("string")).alias("ug_id"))
    return ref.join(latest, "ug_id")


def inputs(silver: DataFrame, group_cols: list[str], metrics) -> DataFrame:
    """The silver columns that the bands of `metrics` and their means read (`autoplex_core.input_columns`)."""
    return silver.select(*input_columns(group_cols, metrics))


def run(silver: DataFrame, policies: list[Policy], group_cols: list[str], period_minutes: int) -> DataFrame:
    """gold.autoplex_params' rows (without `period`) for every policy, from one pass."""
    return parameters_all(with_period(silver, period_minutes), policies, group_cols, period_minutes)


# --- extract / load ----------------------------------------------------------------------------

def _period_label(ms_col: str = "period_start_ms"):
    return F.date_format(F.timestamp_millis(F.col(ms_col)), "yyyy-MM-dd'T'HH:mm")


def extract(spark: SparkSession, cfg: Config, window: hours.Window) -> DataFrame:
    """silver.connections closed in the window."""
    return (connections_in(spark, cfg, window)
            .where((F.col("ts_end_ms") >= window.start_ms) & (F.col("ts_end_ms") < window.end_ms)))


def _engine(cfg: Config, engine: str | None, arrow_job, spark_job, spark: SparkSession | None) -> dict[str, Any]:
    """`arrow_job()` or `spark_job(spark)` by `engine` (default `autoplex.engine`; see
    `ccselect.delta_arrow.by_engine`). A Spark session is started only when the Spark job runs."""
    return by_engine(engine or cfg.settings.autoplex.engine, arrow_job,
                     lambda: {**spark_job(spark or get_spark(cfg, "ccs-autoplex")), "engine": "spark"})


def run_parameters(spark: SparkSession | None, cfg: Config, window: hours.Window,
                   engine: str | None = None) -> dict[str, Any]:
    """Compute gold.autoplex_params for the window's periods (`Window.from_periods`; replacing
    them), with `engine` (see `_engine`; `spark` may be None)."""
    load_policies(cfg.settings.autoplex)       # a bad policy is refused before either engine starts
    return _engine(cfg, engine, lambda: autoplex_arrow.run_parameters(cfg, window),
                   lambda sp: _run_parameters_spark(sp, cfg, window), spark)


def _run_parameters_spark(spark: SparkSession, cfg: Config, window: hours.Window) -> dict[str, Any]:
    s = cfg.settings.autoplex
    policies, group_cols, period = load_policies(s), list(s.group_by), s.period_minutes
    labels = period_labels(window, period)
    # the columns read, once: every policy's band comes from one window over them (`_banded`)
    silver = inputs(extract(spark, cfg, window), group_cols, {p.metric for p in policies})
    params = run(silver, policies, group_cols, period).withColumn("period", _period_label()).cache()
    counts = {r["policy"]: r["n"] for r in params.groupBy("policy").agg(F.count(F.lit(1)).alias("n")).collect()}
    write_parameters(cfg, params, labels)
    params.unpersist()
    return {"periods": labels, "group_by": group_cols, "rows_per_policy": counts}


def write_parameters(cfg: Config, params: DataFrame, labels: list[str]) -> None:
    """gold.autoplex_params' `labels` periods replaced by `params` in one commit, by
    `spark.default.parallelism` writers (no more than there are periods), each writing whole
    periods, so one file per period; from one task a day's 48 files were written one after
    another (jobs/README.md, "Bench": the job 7.40-8.16 s with one writer, 6.72-7.60 s with two)."""
    writers = min(params.sparkSession.sparkContext.defaultParallelism, len(labels))
    delta_io.replace_partitions(params.repartition(writers, "period"), table_path(cfg, AUTOPLEX_PARAMS),
                                {(p,) for p in labels}, ("period",))


def write_similarity(cfg: Config, rates: DataFrame, window: str) -> None:
    """gold.autoplex_similarity's `window` partition replaced by `rates` in one commit, as
    lake.write_window does, from one task (one file)."""
    delta_io.replace_partitions(rates.coalesce(1).withColumn("window", F.lit(window)),
                                table_path(cfg, AUTOPLEX_SIMILARITY), {(window,)}, ("window",))


def run_similarity(spark: SparkSession | None, cfg: Config, window: hours.Window,
                   plot_dir: str | None = None, engine: str | None = None) -> dict[str, Any]:
    """AutoPlex §3.4 over the window's periods: gold.autoplex_similarity (per group, period, band and
    value) and the summary better/worse ratios, with a bar plot; `engine` as `run_parameters`."""
    similarity_bands(cfg.settings.autoplex)
    return _engine(cfg, engine, lambda: autoplex_arrow.run_similarity(cfg, window, plot_dir),
                   lambda sp: _run_similarity_spark(sp, cfg, window, plot_dir), spark)


def _run_similarity_spark(spark: SparkSession, cfg: Config, window: hours.Window,
                          plot_dir: str | None = None) -> dict[str, Any]:
    s = cfg.settings.autoplex
    group_cols, period = list(s.group_by), s.period_minutes
    better, worse = similarity_bands(s)
    key = similarity_window(window, period)
    df = with_period(extract(spark, cfg, window), period)
    rates = change_rates(df, group_cols, better, worse, period).cache()
    n = rates.count()       # from the cache rather than from the table read back
    write_similarity(cfg, rates, key)
    summary = similarity_summary(rates)
    rates.unpersist()
    out = {"window": key, "rows": n, "summary": summary}
    if plot_dir and summary:
        out["plot"] = plot_similarity(summary, os.path.join(plot_dir, "autoplex_similarity.png"))
    return out
