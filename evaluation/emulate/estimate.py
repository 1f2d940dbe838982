"""The emulation's inputs and its estimator: the sessions of silver over the emulated hours and
the training hours before them, their outcomes, and the per-cell estimates every policy is scored
on (see the package's docstring)."""
from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession, Window, functions as F

from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import SPARK_HOUR_FMT, hour_shift
from ccselect.lake import CONNECTIONS, PREDICTIONS, table_path
from ccselect.settings import EmulateSettings

CCS = ("cubic", "bbr")
# POLICIES (every policy, in the order the summaries list them), FLOW_POLICIES, STREAM_POLICIES and
# TRUTH_POLICIES are read off the registry below ("the policies, registered"), after its last entry.
LEVELS = ("observed", "window", "history", "node", "unestimated")
PERCENTILES = (50, 85, 90, 95, 99)
#: a reference − policy difference of a tail percentile within this of 0 is a tie, not "lower": two
#: policies that chose alike in a cell have the same mean up to the order it was summed in
TAIL_TIE = 1e-12


def hour_shift_col(hour: str, hours: int):
    """`hour_shift` as a column expression over the string column `hour`."""
    return F.date_format(F.to_timestamp(hour, SPARK_HOUR_FMT) + F.expr(f"INTERVAL {hours} HOURS"), SPARK_HOUR_FMT)


# ---- extract ------------------------------------------------------------------------------------

def extract(spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings) -> DataFrame:
    """The playback sessions of silver over [lo − train_hours, hi] (the window's hours lo..hi),
    with the champion's predicted type (gold.predictions, where scored) and `in_range` marking the
    emulated hours."""
    lo, hi = window.lo, window.hi
    first = hour_shift(lo, -p.train_hours)
    conns = (spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
             .where(F.col("hour").between(first, hi) & (F.col("play_ms") > 0)))
    pred_path = table_path(cfg, PREDICTIONS)
    if os.path.exists(pred_path):
        preds = (spark.read.format("delta").load(pred_path).where(F.col("hour").between(first, hi))
                 .select("conn_id", "node_id", "hour", "pred_net_type"))
        conns = conns.join(preds, ["conn_id", "node_id", "hour"], "left")
    else:
        conns = conns.withColumn("pred_net_type", F.lit(None).cast("string"))
    return conns.withColumn("in_range", F.col("hour").between(lo, hi))


# ---- transforms: outcomes and the estimator -----------------------------------------------------

def sessions(conns: DataFrame, p: EmulateSettings) -> DataFrame:
    """One row per playback session: keys, the observed outcome, network type, window, fold, and
    the connection's start (`ts_start_ms`: when a policy decides) and end (`ts_end_ms`: when its
    prediction exists, so when a streaming table can learn from it)."""
    # silver's label is 1 (Wi-Fi) / 0 (4G/5G); a hand-made trace may name the type (_type_label)
    label = _type_label(F.col("label"))
    typ = (F.when(label == 1, "wifi").when(label == 0, "cell")
           .when(F.col("pred_net_type").isNotNull(), F.col("pred_net_type")).otherwise("unknown"))
    wms = p.window_minutes * 60_000
    # the streaming tables learn from a connection once it has ended (its end where the trace has one)
    end = F.coalesce(F.col("ts_end_ms"), F.col("ts_start_ms")) if "ts_end_ms" in conns.columns else F.col("ts_start_ms")
    return conns.select(
        "conn_id", "node_id", "hour", "in_range", "client_ip", "ug_id", "cc", *FEATURES,
        F.coalesce(F.col("prefix24"), F.col("prefix48"), F.col("client_ip")).alias("prefix"),
        typ.alias("net_type"),
        label.alias("type_label"),
        (F.floor(F.col("ts_start_ms") / wms) * wms).cast("long").alias("window_ms"),
        F.least(F.col("rebuffer_ms") / F.col("play_ms"), F.lit(1.0)).alias("reb"),
        F.when(F.col("data_segs_out") > 0, F.col("total_retrans") / F.col("data_segs_out"))
        .otherwise(0.0).alias("ret"),
        (F.crc32(F.col("conn_id")) % 2).cast("int").alias("fold"),
        F.col("ts_start_ms"), end.cast("long").alias("ts_end_ms"))


def _type_label(label):
    """The training label as 1 (Wi-Fi) / 0 (4G/5G) / null: silver's `label` is already 1/0 (features/labels.py);
    a hand-made trace may give the type's name."""
    t = F.lower(label.cast("string"))
    return F.when(t.isin("1", "wifi"), 1).when(t.isin("0", "4g", "5g", "cell"), 0).cast("int")


def _cell_stats(s: DataFrame, keys: list[str], suffix: str) -> DataFrame:
    """Per `keys`: sessions and summed outcomes per CC, pivoted to `<n|reb|ret>_<cc><suffix>`."""
    aggs = []
    for c in CCS:
        mine = F.col("cc") == c
        aggs += [F.sum(F.when(mine, 1).otherwise(0)).alias(f"n_{c}{suffix}"),
                 F.sum(F.when(mine, F.col("reb")).otherwise(0.0)).alias(f"reb_{c}{suffix}"),
                 F.sum(F.when(mine, F.col("ret")).otherwise(0.0)).alias(f"ret_{c}{suffix}")]
    return s.groupBy(*keys).agg(*aggs)


def _history(s: DataFrame) -> DataFrame:
    """Per (node, prefix, type, window): sums over the strictly earlier windows of that prefix
    group and type, as `<n|reb|ret>_<cc>_h`."""
    keys = ["node_id", "prefix", "net_type"]
    per_window = _cell_stats(s, keys + ["window_ms"], "_h")
    w = Window.partitionBy(*keys).orderBy("window_ms").rowsBetween(Window.unboundedPreceding, -1)
    cols = [c for c in per_window.columns if c.endswith("_h")]
    return per_window.select(*keys, "window_ms", *[F.coalesce(F.sum(c).over(w), F.lit(0)).alias(c) for c in cols])


def estimates(s: DataFrame) -> DataFrame:
    """Add, for each CC, the session's outcome under it (`reb_<cc>`, `ret_<cc>`) and the level it
    came from (`lvl_<cc>`), with the chain of the module docstring; and the same from the
    session's own fold only (`freb_<cc>`, `fret_<cc>`, `flvl_<cc>`: observed, the fold's window,
    history, node), which the cross-fitted oracle scores with; and the estimate without the
    current window (`preb_<cc>`, `pret_<cc>`: history, node), which it decides with where the other
    fold is empty."""
    cell = ["node_id", "prefix", "net_type", "window_ms"]
    out = (s.join(_cell_stats(s, cell, "_w"), cell, "left")
           .join(_cell_stats(s, cell + ["fold"], "_f"), cell + ["fold"], "left")
           .join(_history(s), cell, "left")
           .join(_cell_stats(s, ["node_id", "net_type", "window_ms"], "_n"), ["node_id", "net_type", "window_ms"], "left"))
    cols = []
    for c in CCS:
        obs = F.col("cc") == c

        def mean(metric: str, suffix: str):
            return F.col(f"{metric}_{c}{suffix}") / F.col(f"n_{c}{suffix}")

        def has(suffix: str):
            return F.coalesce(F.col(f"n_{c}{suffix}"), F.lit(0)) > 0

        def chain(levels: list[tuple[str, str]], observed: bool):
            """(when-expression per metric, level) over (suffix, level name) in order."""
            out_cols = {}
            for metric in ("reb", "ret"):
                e = F.when(obs, F.col(metric)) if observed else None
                for suffix, _ in levels:
                    e = F.when(has(suffix), mean(metric, suffix)) if e is None else e.when(has(suffix), mean(metric, suffix))
                out_cols[metric] = e.otherwise(F.col(metric))     # unestimated: the observed outcome
            lvl = F.when(obs, "observed") if observed else None
            for suffix, name in levels:
                lvl = F.when(has(suffix), name) if lvl is None else lvl.when(has(suffix), name)
            return out_cols, lvl.otherwise("unestimated")

        std, lvl = chain([("_w", "window"), ("_h", "history"), ("_n", "node")], True)
        fold, flvl = chain([("_f", "window"), ("_h", "history"), ("_n", "node")], True)
        prior, _ = chain([("_h", "history"), ("_n", "node")], False)
        cols += [std["reb"].alias(f"reb_{c}"), std["ret"].alias(f"ret_{c}"), lvl.alias(f"lvl_{c}"),
                 fold["reb"].alias(f"freb_{c}"), fold["ret"].alias(f"fret_{c}"), flvl.alias(f"flvl_{c}"),
                 prior["reb"].alias(f"preb_{c}"), prior["ret"].alias(f"pret_{c}")]
    return out.select(*s.columns, *cols)


def qoe(reb, ret, alpha: float):
    """ALICCS §5.4: QoE = 1 − α·rebuffer − (1 − α)·retransmission."""
    return F.lit(1.0) - F.lit(alpha) * reb - F.lit(1.0 - alpha) * ret
