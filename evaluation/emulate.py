"""`ccs emulate`: trace-driven QoE emulation of CC-selection policies (ALICCS §5.4, Appendix E, G).

The trace is silver.connections with QoE joined: every playback session (a connection with a QoE
beacon) with the CC it was served with. The fleet runs an A/B split by CRC32 of the client IP
(ALICCS Appendix A), so inside every /24 and time window both CUBIC and BBR serve a random share of
the clients: the time-window mechanism of §5.4 ([25, 27]) gets unbiased outcome estimates per CC.

The estimator (§5.4 "To simulate any algorithm's outcomes for CCs ... not actually adopted"): a
policy picks a CC for each session. If the trace served the session with that CC, its outcome is
the observed one; otherwise it is the average outcome of the sessions the CC served in the same
prefix group (/24, IPv6 /48), network type and window; if the CC served none there, the average
over earlier windows of that prefix group and type ("historical times"); failing that, the CC's
average over the node's sessions of that type in the window; failing everything, the observed
outcome is kept and the session is counted as unestimated. Every session's estimate level is
counted per policy (`n_observed`, `n_window`, `n_history`, `n_node`, `n_unestimated`).

The network type of a session is its client-reported label where there is one, else the
champion's predicted type (gold.predictions), else "unknown".

Outcomes: rebuffer rate (rebuffer_ms / play_ms), retransmission rate (total_retrans /
data_segs_out), and §5.4's aggregate QoE = 1 − α·rebuffer − (1 − α)·retransmission (α = 0.8).

Policies (all decide before seeing the session's outcome; the learned ones learn only from hours
before the emulated range, or, for Pytheas, online from its own choices):
- `cubic` (the production default), `bbr`: everyone on one CC.
- `oracle`: per window and /24, the CC with the best average QoE (§5.4). In-sample, that choice
  also picks the noise of the averages it is scored with (a winner's curse: on the default fleet
  its estimated gain over CUBIC was 2.4× its true gain, measured against the simulator's truth), so
  it is cross-fitted: sessions are split in two folds by a hash of the connection id; a fold's CC is
  the one that did best on the other fold, and the fold is scored with its own data only.
  `oracle_insample` is the paper's literal version, reported beside it.
- `aliccs`: the purity-aggregated table (export.tables.aggregate, Algorithm 1) built from the previous
  hour's gold.predictions (the last `pipeline.export_window_hours` of them, as the hourly export
  does), looked up by longest-prefix match; a miss keeps the default CC — what the edge enforces
  in the hour after the hourly export. Only model decisions make entries, and every decision the
  model declined (fallback, `ood`, `evidence`) counts against its prefix's purity and support, as
  in the export (export/tables/aggregate.py); the summary's `baselines.aliccs` counts the table's
  source predictions per decision.
- `aliccs_fill`, `aliccs_combine`, `aliccs_flow`, `aliccs_prior`: that table with the handshake tree it carries
  (`ccs handshake`, distill/handshake.py; export/tables/flow.py), decided per session exactly as
  the kernel does in the service's flow mode (table_format.decide; export/edge/README.md): `fill`
  — the tree where the entry misses or is mixed (purity below export.flow_min_purity_permille);
  `combine` — also where the entry is confident, the tree's leaf wins when it disagrees with more
  confidence than the entry's purity; `flow` — the tree for every connection; `prior` — the tree
  for every connection, except that a confident entry decides where the leaf is unsure
  (confidence below export.flow_min_leaf_permille): the flow first, the prefix's history where
  the flow says little. The tree is fitted on the training window's labelled connections (before the emulated hours), on the
  handshake features alone (`HANDSHAKE_FEATURES`), as it would ship.
- `aliccs_stream` (issue 26): the streaming table — the same Algorithm 1 rebuilt every
  `stream_trigger_minutes` over the model predictions of the connections that ended in the last
  `stream_window_minutes` (a prediction exists once its connection has ended; its time is the
  connection's `ts_end_ms`, from silver.connections), live `stream_delay_minutes` after its
  boundary (processing and rotation). A session starting at t is decided by the table of boundary
  b = floor((t − delay) / trigger)·trigger, longest-prefix matched as `aliccs`; a miss keeps the
  default. A prefix whose type changes (ALICCS §3.3, Observation IV) is followed within about
  trigger + delay, not the hour or two of the hourly export.
- `aliccs_stream_fill`, `_combine`, `_flow`, `_prior`: the flow policies over the streaming table.
- Any streaming policy at lag L minutes instead of the delay, as `<policy>@<L>`: the table of
  b = floor((t − L) / trigger)·trigger (L = 0: the boundary just passed, built in no time).
  `run(..., stream_lags=)` (`ccs emulate --stream-lags`) adds `aliccs_stream@L` and
  `true_table_stream@L` per lag and the summary's `lag_curve`: per lag, the share of the true
  type's truth gain and the rebuffer tail.
- `configanator`: network classes (K-means over per-/24 mean features, Configanator §3.2), each
  class's best CC over the training hours, a decision tree from {the /24's features, its class}
  to that CC (the exploitation arm, §3.1), and an ε-bandit exploring a random CC (§3.1 arm 2).
- `disco`: a decision tree from what a flow shows when it is accepted (its MSS, the client's
  initial window, the handshake's RTT — `HANDSHAKE_FEATURES`) to the CC that did better in its /24
  and window over the training hours (Disco [47]; Antelope is the same per flow, Appendix E). Only
  the handshake: the rest of a session's TCP statistics exist once it has run under some CC.
- `disco_type`: Disco's tree on the same handshake features, trained on the network-type label
  instead (the labelled training sessions, Wi-Fi → CUBIC, 4G/5G → BBR, as ALICCS §4.2 maps the
  type): Disco given ALICCS's own label, so that a gap between `disco` and `aliccs` is not only
  Disco's noisier per-prefix QoE label (issue 55).
- `gbdt`: the hourly table built as `aliccs`'s (the same source predictions, the same OOD, evidence
  and fallback declines, the same ladder and purity), with every model decision's type predicted
  instead by gradient-boosted trees (models/gbdt.py) trained on the labelled training sessions'
  twelve log features — the skeptic's classifier in ALICCS's place (issue 55).
- `pytheas`: group-based exploration–exploitation (Pytheas [26]): per user group (region + ASN)
  and node, a discounted UCB bandit over the two CCs, updated with each session's outcome.
- `true_type` (only with the simulator's truth): Wi-Fi → CUBIC, 4G/5G → BBR by the true network
  type — the classifier's upper bound, per session.
- `true_table` (only with the truth): the table ALICCS's design would serve with a perfect
  classifier — per prefix group, the majority true type of its sessions in the hour the table is
  built from (`table_lag_hours` before, all nodes, as the hourly export), Wi-Fi → CUBIC, 4G/5G →
  BBR, a group without sessions then → the default. The bound of a prefix table with that lag:
  what the hour of lag costs even without a single misclassification.
- `true_table_stream` (only with the truth): the same bound on the streaming table's timeline —
  per prefix group, the majority true type of the sessions that ended in the window of the table
  live at the session's start (same trigger, window and lag as `aliccs_stream`).
The truth is read for these three policies and for the `truth` check of the summary (each
policy's `share_of_true_type_gain`: its truth gain over all-CUBIC as a share of `true_type`'s),
never for anything a policy learns from.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window, functions as F

from ccselect.config import Config
from ccselect.contract import FEATURES, HANDSHAKE_FEATURES
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import SPARK_HOUR_FMT, hour_shift
from ccselect.ipaddr import with_ip
from ccselect.lake import CONNECTIONS, EMULATION, EMULATION_CELLS, PREDICTIONS, table_path, write_window
from ccselect.settings import ConfiganatorSettings, EmulateSettings
from ccselect.distill.handshake import load_handshake
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables.aggregate import address_decisions, ladder_entries, model_weights
from ccselect.export.tables.flow import table_tree
from ccselect.features.prefixes import prefix_means_frame
from ccselect.models import gbdt
from ccselect.models.configanator import choose_classes, network_class
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.

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


def split_lag(name: str, p: EmulateSettings) -> tuple[str, int | None]:
    """A policy name as (policy, lag in minutes): `aliccs_stream@15` → ("aliccs_stream", 15); a
    streaming policy without `@` runs at `stream_delay_minutes`; any other policy has no lag (None).
    Raises ValueError on a lag that is not a whole number of minutes ≥ 0, or one on a policy that
    is not a streaming one."""
    base, at, lag = name.partition("@")
    if not at:
        return base, (p.stream_delay_minutes if base in STREAM_POLICIES else None)
    if base not in STREAM_POLICIES or not lag.isdigit():
        raise ValueError(f"{name!r}: only the streaming policies ({', '.join(STREAM_POLICIES)}) take a lag, "
                         f"as <policy>@<minutes>")
    return base, int(lag)


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


# ---- policies: each returns (conn_id, choice) for the sessions it decides -----------------------

def fixed_policy(est: DataFrame, cc: str) -> DataFrame:
    return est.select("conn_id", F.lit(cc).alias("choice"))


def oracle_insample(est: DataFrame, p: EmulateSettings) -> DataFrame:
    """§5.4's Oracle as written: per node, window and /24, the CC with the best average QoE over
    the cell's sessions (observed or estimated)."""
    cell = ["node_id", "window_ms", "prefix"]
    q = {c: F.avg(qoe(F.col(f"reb_{c}"), F.col(f"ret_{c}"), p.alpha)).alias(f"q_{c}") for c in CCS}
    best = est.groupBy(*cell).agg(*q.values()).select(
        *cell, F.when(F.col("q_bbr") > F.col("q_cubic"), "bbr").otherwise("cubic").alias("choice"))
    return est.select("conn_id", *cell).join(best, cell).select("conn_id", "choice")


def oracle_crossfit(est: DataFrame, p: EmulateSettings) -> DataFrame:
    """The Oracle cross-fitted over two folds: fold f of a (node, window, /24) takes the CC whose
    average QoE over the other fold's sessions (fold-own estimates) is best; where the other fold
    has no session, the CC whose earlier-window estimate is best for the cell."""
    cell = ["node_id", "window_ms", "prefix"]
    per_fold = est.groupBy(*cell, "fold").agg(
        *[F.avg(qoe(F.col(f"freb_{c}"), F.col(f"fret_{c}"), p.alpha)).alias(f"q_{c}") for c in CCS])
    other = per_fold.select(*cell, (F.lit(1) - F.col("fold")).alias("fold"),
                            F.when(F.col("q_bbr") > F.col("q_cubic"), "bbr").otherwise("cubic").alias("_other"))
    prior = est.groupBy(*cell).agg(*[F.avg(qoe(F.col(f"preb_{c}"), F.col(f"pret_{c}"), p.alpha)).alias(f"p_{c}")
                                     for c in CCS]).select(
        *cell, F.when(F.col("p_bbr") > F.col("p_cubic"), "bbr").otherwise("cubic").alias("_prior"))
    return (est.select("conn_id", *cell, "fold").join(other, cell + ["fold"], "left").join(prior, cell, "left")
            .select("conn_id", F.coalesce("_other", "_prior").alias("choice")))


def true_type_policy(est: DataFrame, truth: DataFrame) -> DataFrame:
    """Wi-Fi → CUBIC, 4G/5G → BBR by the simulator's true network type (an upper bound)."""
    return (est.select("conn_id").join(truth.select("conn_id", "true_type"), "conn_id", "left")
            .select("conn_id", F.when(F.col("true_type") == "wifi", "cubic")
                    .when(F.col("true_type").isNotNull(), "bbr").otherwise("cubic").alias("choice")))


def true_table_policy(s: DataFrame, est: DataFrame, truth: DataFrame, p: EmulateSettings) -> DataFrame:
    """The prefix table of a perfect classifier, `table_lag_hours` old: per prefix group and hour
    the share of cellular sessions by the true type (all nodes), the table of hour h from hour
    h − lag; a cellular majority → BBR, else CUBIC; a group without sessions then → default."""
    share = (s.select("conn_id", "prefix", "hour").join(truth.select("conn_id", "true_type"), "conn_id")
             .groupBy("prefix", "hour").agg(F.avg((F.col("true_type") != "wifi").cast("double")).alias("_cell"))
             .select("prefix", hour_shift_col("hour", p.table_lag_hours).alias("hour"), "_cell"))
    return (est.select("conn_id", "prefix", "hour").join(share, ["prefix", "hour"], "left")
            .select("conn_id", F.when(F.col("_cell") > 0.5, "bbr").when(F.col("_cell").isNotNull(), "cubic")
                    .otherwise(p.default_cc).alias("choice")))


def true_stream_shares(s: DataFrame, truth: DataFrame, p: EmulateSettings) -> DataFrame:
    """Per prefix group and streaming slot (`stream_slots`): the share of cellular sessions by the
    true type among those whose connection ended in the slot's window (all nodes) — what a perfect
    classifier's streaming table would see. Only the sessions of `s` count: the window reaches as
    far back as `s` does (the range and its `train_hours`)."""
    return (s.select("conn_id", "prefix", "ts_end_ms").join(truth.select("conn_id", "true_type"), "conn_id")
            .withColumn("slot", F.explode(stream_slots("ts_end_ms", p)))
            .groupBy("prefix", "slot").agg(F.avg((F.col("true_type") != "wifi").cast("double")).alias("_cell")))


def true_table_stream_policy(est: DataFrame, shares: DataFrame, p: EmulateSettings, lag_minutes: int) -> DataFrame:
    """`true_table_policy` on the streaming table's timeline: per session, its prefix group's
    majority true type in the table live at its start with lag `lag_minutes` (`live_slot`;
    `true_stream_shares`), a cellular majority → BBR, else CUBIC; no sessions there → default.
    The bound of the streaming table: what its lag and window cost without a misclassification."""
    return (est.select("conn_id", "prefix", live_slot("ts_start_ms", lag_minutes, p).alias("slot"))
            .join(shares, ["prefix", "slot"], "left")
            .select("conn_id", F.when(F.col("_cell") > 0.5, "bbr").when(F.col("_cell").isNotNull(), "cubic")
                    .otherwise(p.default_cc).alias("choice")))


def slot_entries(preds: DataFrame, settings) -> DataFrame:
    """ALICCS Algorithm 1 (§3.3, Appendix F) once per table: `preds` are model predictions, each
    already copied into every table it feeds (column `slot`: an hour, or a streaming table's
    boundary index); → (slot, fam, level, key, `_ecc` its CC, `_pur` its purity in permille, as
    the table carries it). The export's ladder and purity tiers (`settings`: export's PrefixLadder).

    The weights are materialized first (`localCheckpoint`, which runs them): the ladder reads them
    in three branches, and with the address parsing's plan under each Spark's optimizer alone took
    about 40 s on a dozen predictions (tests/test_emulate_stream.py: the test went from about 90 s
    to about 20 s on a loaded 2-core machine)."""
    by = ("slot",)
    weights = model_weights(address_decisions(preds, by), by).localCheckpoint()
    return ladder_entries(weights, settings, by).select(
        "slot", "fam", "level", "key", F.col("cc").alias("_ecc"),
        F.floor(F.col("top_weight") * 1000 / F.col("weight")).cast("int").alias("_pur"))


def match_entries(est: DataFrame, slot, entries: DataFrame, settings) -> DataFrame:
    """Per session (conn_id): the entry of the table `slot` (a column over `est`: which table was
    live when the session started) that its client address matches longest, as the kernel's LPM
    trie does — `_ecc` and `_pur`, both null on a miss (or where `slot` is null)."""
    conns = with_ip(est.select("conn_id", "client_ip", slot.alias("slot")), "client_ip").select(
        "conn_id", "slot", F.col("ip.family").alias("fam"), F.col("ip.hex").alias("hex"))
    levels = None
    for fam, lv in settings.ladder.items():
        arr = F.array(*[F.lit(x) for x in lv])
        levels = F.when(F.col("fam") == fam, arr) if levels is None else levels.when(F.col("fam") == fam, arr)
    looked = (conns.withColumn("level", F.explode(levels)).withColumn("key", F.expr("substring(hex, 1, level div 4)"))
              .join(entries, ["slot", "fam", "level", "key"], "left")
              .groupBy("conn_id").agg(F.max(F.when(F.col("_ecc").isNotNull(), F.struct("level", "_ecc", "_pur"))).alias("_m")))
    return (est.select("conn_id").join(looked, "conn_id", "left")
            .select("conn_id", F.col("_m._ecc").alias("_ecc"), F.col("_m._pur").alias("_pur")))


def table_lookup(spark: SparkSession, cfg: Config, est: DataFrame, p: EmulateSettings,
                 counts: dict | None = None) -> DataFrame | None:
    """Per session (conn_id): the entry of the table the edge would have had live — the hourly
    export of the previous hour (ALICCS Algorithm 1 over gold.predictions, the export's ladder and
    purity thresholds), longest-prefix matched — as `_ecc` (its CC) and `_pur` (its purity in
    permille, as the table carries it); both null on a miss. Only `decision == "model"`
    predictions make entries; the declined ones count against purity, as the export counts them.
    None without gold.predictions. With `counts` (a dict), it receives the source predictions per
    decision."""
    settings = cfg.settings.export
    hours = [r["hour"] for r in est.select("hour").distinct().collect()]
    pred_path = table_path(cfg, PREDICTIONS)
    if not hours or not os.path.exists(pred_path):
        return None
    n_hours = max(1, cfg.settings.pipeline.export_window_hours)
    src_hours = sorted({hour_shift(h, -p.table_lag_hours - k) for h in hours for k in range(n_hours)})
    if counts is not None:
        counts.update({r["decision"]: int(r["count"]) for r in spark.read.format("delta").load(pred_path)
                       .where(F.col("hour").isin(src_hours)).groupBy("decision").count().collect()})
    # a prediction of hour t goes into the tables of hours t .. t + n − 1 (pipeline.export_window_hours)
    preds = (spark.read.format("delta").load(pred_path).where(F.col("hour").isin(src_hours))
             .withColumn("slot", F.explode(F.array(*[hour_shift_col("hour", k) for k in range(n_hours)]))))
    return match_entries(est, hour_shift_col("hour", -p.table_lag_hours), slot_entries(preds, settings), settings)


# ---- the streaming table (issue 26) -------------------------------------------------------------
# Slot k is the table the streaming job builds at boundary b = k·trigger, from the model
# predictions of the connections that ended in (b − window, b]. A session that starts at t with lag
# L is decided by the table of the latest boundary b with b + L ≤ t: k = floor((t − L) / trigger).
# The operating lag is `stream_delay_minutes` (processing and rotation); lag 0 is the table of the
# boundary just passed, as if built and rotated in no time. Since a prediction exists only once its
# connection ended (ts_end ≥ ts_start), no session is ever decided by its own prediction.

def stream_slots(ts: str, p: EmulateSettings):
    """The slots (a column to explode) whose window covers an event at `ts` (ms, column name):
    the boundaries b = k·T with ts ≤ b < ts + W, i.e. k from ceil(ts / T) to ceil((ts + W) / T) − 1
    (T trigger, W window): W/T slots when the trigger divides the window."""
    t, w = p.stream_trigger_minutes * 60_000, p.stream_window_minutes * 60_000
    return F.sequence(F.expr(f"({ts} + {t - 1}) div {t}"), F.expr(f"({ts} + {w + t - 1}) div {t} - 1"))


def live_slot(ts: str, lag_minutes: int, p: EmulateSettings):
    """The slot live at `ts` (ms, column name) with lag L minutes: floor((ts − L) / T)."""
    t = p.stream_trigger_minutes * 60_000
    return F.expr(f"({ts} - {lag_minutes * 60_000}) div {t}")


def stream_lag_hours(p: EmulateSettings, max_lag_minutes: int) -> int:
    """Hours before an emulated hour whose predictions can be in a table live in it: the oldest
    table a session there uses is built at most max_lag + trigger before it, from `window` more;
    and one hour more, for a connection filed under the hour it began in but ended after."""
    return -(-(max_lag_minutes + p.stream_trigger_minutes + p.stream_window_minutes) // 60) + 1


def extract_stream_predictions(spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings,
                               max_lag_minutes: int) -> DataFrame | None:
    """The predictions (gold.predictions, every decision: the declined ones count against purity,
    as the export counts them) a streaming table live in the window's hours lo..hi can hold, each with its connection's end (`ts_end_ms`, from silver.connections:
    predictions carry the hour, not the time). None without gold.predictions."""
    pred_path = table_path(cfg, PREDICTIONS)
    if not os.path.exists(pred_path):
        return None
    first = hour_shift(window.lo, -stream_lag_hours(p, max_lag_minutes))
    span = F.col("hour").between(first, window.hi)
    ends = (spark.read.format("delta").load(table_path(cfg, CONNECTIONS)).where(span)
            .select("conn_id", "node_id", "hour", "ts_end_ms"))
    return (spark.read.format("delta").load(pred_path).where(span)
            .join(ends, ["conn_id", "node_id", "hour"]).where(F.col("ts_end_ms").isNotNull()))


def stream_entries(preds: DataFrame, settings, p: EmulateSettings) -> DataFrame:
    """Every streaming table's entries (`slot_entries`), each prediction in the slots whose window
    covers its connection's end (`stream_slots`). One pass for all the tables; persist it when
    several lags read it."""
    return slot_entries(preds.withColumn("slot", F.explode(stream_slots("ts_end_ms", p))), settings)


def stream_lookup(est: DataFrame, entries: DataFrame | None, settings, p: EmulateSettings, lag_minutes: int) -> DataFrame:
    """`table_lookup` for the streaming table: per session, the entry of the table live at its
    start with lag `lag_minutes` (`live_slot`); `_ecc`, `_pur` null on a miss or without entries."""
    if entries is None:
        return est.select("conn_id", F.lit(None).cast("string").alias("_ecc"), F.lit(None).cast("int").alias("_pur"))
    return match_entries(est, live_slot("ts_start_ms", lag_minutes, p), entries, settings)


def aliccs_policy(spark: SparkSession, cfg: Config, est: DataFrame, p: EmulateSettings,
                  counts: dict | None = None) -> DataFrame:
    """The previous hour's exported table (`table_lookup`); a miss keeps the default CC, and so do
    fallback and ood predictions (they make no entries)."""
    return aliccs_choice(est, table_lookup(spark, cfg, est, p, counts), p)


def aliccs_choice(est: DataFrame, looked: DataFrame | None, p: EmulateSettings) -> DataFrame:
    """`aliccs_policy` with the table's entries given: `looked` is (conn_id, _ecc, _pur) from
    `table_lookup` or `stream_lookup`, None for no table (every session keeps the default)."""
    if looked is None:
        return est.select("conn_id", F.lit(p.default_cc).alias("choice"))
    return looked.select("conn_id", F.coalesce(F.col("_ecc"), F.lit(p.default_cc)).alias("choice"))


def flow_policy(spark: SparkSession, cfg: Config, est: DataFrame, p: EmulateSettings, tree: tf.Tree,
                mode: str) -> tuple[DataFrame, dict]:
    """The edge with the table's handshake tree (issue 27): per session, the previous hour's table
    entry (`table_lookup`) and the session's handshake features go through the kernel's decision
    (table_format.decide, identical to ccs.bpf.c) in flow mode `mode`; a decision without a CC
    keeps the default."""
    return flow_decide(spark, est, p, tree, mode, table_lookup(spark, cfg, est, p))


def flow_decide(spark: SparkSession, est: DataFrame, p: EmulateSettings, tree: tf.Tree, mode: str,
                looked: DataFrame | None) -> tuple[DataFrame, dict]:
    """`flow_policy` with the table's entries given: `looked` is (conn_id, _ecc, _pur) from
    `table_lookup` or `stream_lookup`, None for no table (every session a miss)."""
    return flow_decide_local(spark, flow_inputs(est, looked), p, tree, mode)


def flow_inputs(est: DataFrame, looked: DataFrame | None) -> pa.Table:
    """Per session, in this process: its handshake features (a missing one as 0) and its table
    entry (`_ecc`, `_pur`; null on a miss) — what `flow_decide_local` decides from. The flow
    policies of one table share it."""
    cols = ["conn_id", *[F.coalesce(F.col(f).cast("long"), F.lit(0)).alias(f) for f in HANDSHAKE_FEATURES]]
    base = est.select(*cols)
    base = base.join(looked, "conn_id", "left") if looked is not None else \
        base.withColumn("_ecc", F.lit(None).cast("string")).withColumn("_pur", F.lit(None).cast("int"))
    return base.toArrow()


def flow_decide_local(spark: SparkSession, t: pa.Table, p: EmulateSettings, tree: tf.Tree,
                      mode: str) -> tuple[DataFrame, dict]:
    """`flow_decide` over `flow_inputs`' table: the kernel's decision (table_format.decide) per
    session in flow mode `mode`; a decision without a CC keeps the default."""
    ecc = t.column("_ecc").to_pandas()
    hit = ecc.notna().to_numpy()
    cc_id = ecc.map(tf.CC_IDS).fillna(0).to_numpy(np.int64)     # a miss (or an unknown name): 0
    purity = np.nan_to_num(t.column("_pur").to_numpy(zero_copy_only=False).astype(float), nan=0).astype(np.int64)
    x = np.stack([t.column(f).to_numpy() for f in HANDSHAKE_FEATURES], axis=1).astype(np.int64)
    x = np.clip(x, 0, tf.U32_MAX)
    cc, dec = tf.decide(hit, cc_id, 0, purity, tree, x, mode)
    # the kernel's CC id → its name; 0 (no CC) → the default
    names = np.array([p.default_cc] + [tf.CC_NAMES[i] for i in range(1, max(tf.CC_NAMES) + 1)], dtype=object)
    out = pd.DataFrame({"conn_id": t.column("conn_id").to_pandas(), "choice": names[np.asarray(cc, dtype=np.int64)]})
    kinds, counts = np.unique(dec, return_counts=True)
    info = {"mode": mode, "decisions": {str(k): int(v) for k, v in zip(kinds, counts)},
            "tree_nodes": len(tree.nodes), "min_purity_permille": tree.min_purity_permille}
    return spark.createDataFrame(out, "conn_id string, choice string"), info


def _log_features(features: tuple[str, ...]) -> list:
    return [F.log1p(F.greatest(F.col(f).cast("double"), F.lit(0.0))).alias(f) for f in features]


def _best_cc_labels(train: DataFrame, keys: list[str], p: EmulateSettings) -> DataFrame:
    """Per `keys` over the training sessions: the CC whose observed average QoE is better (both
    CCs must have served the group; ties → the default)."""
    q = qoe(F.col("reb"), F.col("ret"), p.alpha)
    g = train.groupBy(*keys).agg(*[F.avg(F.when(F.col("cc") == c, q)).alias(f"q_{c}") for c in CCS])
    return (g.where(F.col("q_cubic").isNotNull() & F.col("q_bbr").isNotNull())
            .select(*keys, F.when(F.col("q_bbr") > F.col("q_cubic"), "bbr")
                    .when(F.col("q_cubic") > F.col("q_bbr"), "cubic").otherwise(p.default_cc).alias("best")))


def _prefix_means(df: DataFrame) -> DataFrame:
    """Per (node, /24): the mean log features of its sessions (Configanator's per-path archive)."""
    means = prefix_means_frame(df.select("node_id", "prefix", *_log_features(FEATURES)),
                               ["node_id", "prefix"], FEATURES, prefix="")
    return means.select("node_id", "prefix", *[F.col("m_" + f).alias(f) for f in FEATURES])


def _explore(p: EmulateSettings, tag: str):
    """Deterministic per-session coin of the ε-bandit: (explores?, the random CC)."""
    u = (F.crc32(F.concat(F.col("conn_id"), F.lit(f"/{tag}/{p.seed}"))) % 10_000) / 10_000.0
    return u < F.lit(p.epsilon), F.when((F.crc32(F.concat(F.lit(f"{tag}/"), F.col("conn_id"))) % 2) == 1, "bbr").otherwise("cubic")


def configanator_policy(train: DataFrame, est: DataFrame, p: EmulateSettings) -> tuple[DataFrame, dict]:
    """Configanator §3.1-3.2 as a CC selector: network classes (K-means over the training /24s'
    mean log features, K by the NC-spread rule of models/configanator.py), each class's best CC
    over the training sessions, a decision tree {the /24's mean features, its class} → that CC,
    and an ε-bandit exploring a random CC on ε of the sessions."""
    from sklearn.tree import DecisionTreeClassifier

    spark = est.sparkSession
    # sorted: K-means and the tree then see the same rows in the same order on every run
    means = _prefix_means(train).toPandas().sort_values(["node_id", "prefix"], ignore_index=True)
    if means.empty:
        return est.select("conn_id", F.lit(p.default_cc).alias("choice")), {"classes": 0}
    mu, sd = means[list(FEATURES)].mean(), means[list(FEATURES)].std(ddof=0).replace(0, 1.0)
    z = ((means[list(FEATURES)] - mu) / sd).to_numpy()
    km, info = choose_classes(ConfiganatorSettings(seed=p.seed), z)
    centroids = np.asarray(km.cluster_centers_)
    means["nc"] = network_class(centroids, z)
    # each class's best CC over its /24s' training sessions
    nc_of = spark.createDataFrame(means[["node_id", "prefix", "nc"]].astype({"nc": "int64"}))
    best = _best_cc_labels(train.join(nc_of, ["node_id", "prefix"]), ["nc"], p).toPandas()
    best_of = dict(zip(best["nc"], best["best"]))
    y = means["nc"].map(lambda c: best_of.get(c, p.default_cc)).to_numpy()
    k = len(centroids)

    def design(zz: np.ndarray, nc: np.ndarray) -> np.ndarray:
        return np.hstack([zz, np.eye(k)[nc]])
    tree = DecisionTreeClassifier(max_depth=p.tree_depth, min_samples_leaf=1, random_state=p.seed)
    tree.fit(design(z, means["nc"].to_numpy()), y)
    # the emulated /24s: their class from the training archive where known, else the nearest
    # centroid of their own means over the emulated sessions (Configanator's background clusters)
    cur = _prefix_means(est).toPandas().sort_values(["node_id", "prefix"], ignore_index=True)
    known = means.set_index(["node_id", "prefix"])
    zc = ((cur[list(FEATURES)] - mu) / sd).to_numpy()
    nc = network_class(centroids, zc)
    idx = pd.MultiIndex.from_frame(cur[["node_id", "prefix"]])
    arch = known["nc"].reindex(idx).to_numpy()
    nc = np.where(pd.isna(arch), nc, arch).astype(int)
    za = np.where(pd.isna(arch)[:, None], zc, ((known[list(FEATURES)].reindex(idx) - mu) / sd).to_numpy())
    cur["choice"] = tree.predict(design(za, nc)) if len(cur) else []
    choice = spark.createDataFrame(cur[["node_id", "prefix", "choice"]]) if len(cur) else None
    explores, arm = _explore(p, "configanator")
    if choice is None:
        return est.select("conn_id", F.lit(p.default_cc).alias("choice")), {"classes": k}
    out = (est.select("conn_id", "node_id", "prefix").join(F.broadcast(choice), ["node_id", "prefix"], "left")
           .select("conn_id", F.when(explores, arm).otherwise(F.coalesce("choice", F.lit(p.default_cc))).alias("choice")))
    return out, {"classes": k, "k_chosen_by": info.get("chosen_by"), "class_best_cc": {int(a): b for a, b in best_of.items()}}


def disco_policy(train: DataFrame, est: DataFrame, p: EmulateSettings) -> tuple[DataFrame, dict]:
    """Disco [47] per flow: a decision tree from the flow's handshake (log) features to the CC that
    did better in its /24 and window over the training hours."""
    from sklearn.tree import DecisionTreeClassifier

    labels = _best_cc_labels(train, ["node_id", "prefix", "window_ms"], p)
    feats = HANDSHAKE_FEATURES
    data = (train.join(labels, ["node_id", "prefix", "window_ms"]).select("conn_id", *_log_features(feats), "best")
            .toPandas().sort_values("conn_id", ignore_index=True))
    if data.empty or data["best"].nunique() < 2:
        only = data["best"].iloc[0] if len(data) else p.default_cc
        return est.select("conn_id", F.lit(only).alias("choice")), {"train_rows": len(data)}
    tree = DecisionTreeClassifier(max_depth=p.tree_depth, min_samples_leaf=p.tree_min_leaf, random_state=p.seed)
    tree.fit(data[list(feats)].to_numpy(), data["best"].to_numpy())
    bc = est.sparkSession.sparkContext.broadcast(tree)

    @F.pandas_udf("string")              # Arrow batches, never a row at a time (STYLE)
    def predict(x: pd.DataFrame) -> pd.Series:
        return pd.Series(bc.value.predict(x[list(feats)].to_numpy(dtype=np.float64)))
    out = est.select("conn_id", predict(F.struct(*_log_features(feats))).alias("choice"))
    return out, {"train_rows": len(data), "share_bbr_labels": float((data["best"] == "bbr").mean())}


def _type_cc(label):
    """ALICCS §4.2's mapping: Wi-Fi (1) → CUBIC, 4G/5G (0) → BBR."""
    return F.when(label == 1, "cubic").otherwise("bbr")


def disco_type_policy(train: DataFrame, est: DataFrame, p: EmulateSettings) -> tuple[DataFrame, dict]:
    """Disco's tree (`disco_policy`: the handshake features, the same depth and leaves) trained on
    the labelled training sessions' network type instead of the per-prefix QoE label; the type it
    predicts maps to the CC as ALICCS's table does."""
    from sklearn.tree import DecisionTreeClassifier

    feats = HANDSHAKE_FEATURES
    data = (train.where(F.col("type_label").isNotNull()).select("conn_id", *_log_features(feats), "type_label")
            .toPandas().sort_values("conn_id", ignore_index=True))
    if data.empty or data["type_label"].nunique() < 2:
        return est.select("conn_id", F.lit(p.default_cc).alias("choice")), {"train_rows": len(data)}
    tree = DecisionTreeClassifier(max_depth=p.tree_depth, min_samples_leaf=p.tree_min_leaf, random_state=p.seed)
    tree.fit(data[list(feats)].to_numpy(), data["type_label"].to_numpy())
    bc = est.sparkSession.sparkContext.broadcast(tree)

    @F.pandas_udf("int")                 # Arrow batches, never a row at a time (STYLE)
    def predict(x: pd.DataFrame) -> pd.Series:
        return pd.Series(bc.value.predict(x[list(feats)].to_numpy(dtype=np.float64)).astype(np.int32))
    out = est.select("conn_id", _type_cc(predict(F.struct(*_log_features(feats)))).alias("choice"))
    return out, {"train_rows": len(data), "share_wifi_labels": float((data["type_label"] == 1).mean())}


def gbdt_table_policy(spark: SparkSession, cfg: Config, train: DataFrame, est: DataFrame,
                      p: EmulateSettings) -> tuple[DataFrame, dict]:
    """The hourly table of `table_lookup` with the classifier swapped: gradient-boosted trees
    (models/gbdt.py, its defaults and `p.seed`) trained on the labelled training sessions' twelve
    log1p features (trees need no standardization: it is monotone per feature) decide the type of
    every source prediction the champion decided (`decision == "model"`), threshold 0.5; every
    declined prediction stays declined, so both tables answer the same connections."""
    settings = cfg.settings.export
    data = (train.where(F.col("type_label").isNotNull()).select("conn_id", *_log_features(FEATURES), "type_label")
            .toPandas().sort_values("conn_id", ignore_index=True))
    hours = [r["hour"] for r in est.select("hour").distinct().collect()]
    pred_path = table_path(cfg, PREDICTIONS)
    info = {"train_rows": len(data)}
    if data.empty or data["type_label"].nunique() < 2 or not hours or not os.path.exists(pred_path):
        return est.select("conn_id", F.lit(p.default_cc).alias("choice")), info
    model = gbdt.fit(data[list(FEATURES)].to_numpy(), data["type_label"].to_numpy(), seed=p.seed)
    bc = spark.sparkContext.broadcast(model)

    @F.pandas_udf("double")              # Arrow batches, never a row at a time (STYLE)
    def p_wifi(x: pd.DataFrame) -> pd.Series:
        return pd.Series(gbdt.predict_proba(bc.value, x[list(FEATURES)].to_numpy(dtype=np.float64)))
    n_hours = max(1, cfg.settings.pipeline.export_window_hours)
    src_hours = sorted({hour_shift(h, -p.table_lag_hours - k) for h in hours for k in range(n_hours)})
    silver = (spark.read.format("delta").load(table_path(cfg, CONNECTIONS)).where(F.col("hour").isin(src_hours))
              .select("conn_id", "node_id", "hour", *_log_features(FEATURES)))
    preds = (spark.read.format("delta").load(pred_path).where(F.col("hour").isin(src_hours))
             .select("conn_id", "node_id", "hour", "client_ip", "requests", "cc", "decision", "default_cc")
             .join(silver, ["conn_id", "node_id", "hour"], "left"))
    model_cc = F.when(p_wifi(F.struct(*FEATURES)) >= 0.5, "cubic").otherwise("bbr")
    preds = (preds.withColumn("cc", F.when(F.col("decision") == "model", model_cc).otherwise(F.col("cc")))
             .withColumn("slot", F.explode(F.array(*[hour_shift_col("hour", k) for k in range(n_hours)]))))
    looked = match_entries(est, hour_shift_col("hour", -p.table_lag_hours), slot_entries(preds, settings), settings)
    info["share_wifi_labels"] = float((data["type_label"] == 1).mean())
    return aliccs_choice(est, looked, p), info


def pytheas_policy(hist: DataFrame, p: EmulateSettings) -> DataFrame:
    """Pytheas [26]: per (node, user group), a discounted-UCB bandit over the CCs run through the
    sessions in time order — the training hours too, so it starts warm — and updated with each
    session's outcome under the CC it chose (observed or estimated). The exploration bonus is
    scaled by the std of the rewards seen (QoE varies in the third decimal, so a [0, 1] UCB1 bonus
    would explore forever)."""

    alpha, c_ucb, gamma = p.alpha, p.ucb_c, p.ucb_discount

    def run(df: pd.DataFrame) -> pd.DataFrame:
        df = df.sort_values(["ts_start_ms", "conn_id"])
        q = np.stack([1 - alpha * df[f"reb_{c}"].to_numpy() - (1 - alpha) * df[f"ret_{c}"].to_numpy() for c in CCS], 1)
        n = np.zeros(2)
        s = np.zeros(2)
        s2 = np.zeros(2)
        choice = np.empty(len(df), dtype=object)
        for i in range(len(df)):
            if (n < 1e-9).any():
                a = int(np.argmax(n < 1e-9))
            else:
                mean = s / n
                var = max(float((s2.sum() / n.sum()) - (s.sum() / n.sum()) ** 2), 1e-12)
                bonus = c_ucb * math.sqrt(var) * np.sqrt(2 * math.log(n.sum()) / n)
                a = int(np.argmax(mean + bonus))
            choice[i] = CCS[a]
            n *= gamma
            s *= gamma
            s2 *= gamma
            r = q[i, a]
            n[a] += 1
            s[a] += r
            s2[a] += r * r
        return pd.DataFrame({"conn_id": df["conn_id"].to_numpy(), "choice": choice, "in_range": df["in_range"].to_numpy()})

    cols = ["node_id", "ug_id", "conn_id", "ts_start_ms", "in_range"] + [f"{m}_{c}" for c in CCS for m in ("reb", "ret")]
    out = (hist.select(*cols).fillna({"ug_id": "unknown"}).groupBy("node_id", "ug_id")
           .applyInPandas(run, "conn_id string, choice string, in_range boolean"))
    return out.where("in_range").select("conn_id", "choice")


# ---- the policies, registered ---------------------------------------------------------------------
# Each policy is one function, registered here with `@policy` (its name, and what it needs: the
# simulator's truth, the handshake tree, a lag on the streaming table's timeline), in the order the
# summaries list them. `run` loops over this registry; `app/run.py`'s summary over `POLICIES`.
# A registered function gets the emulation (`Emulation`: the sessions, the range's estimates, the
# training sessions, the truth, and the tables several policies share, each built once) and the
# policy's name (`<policy>` or `<policy>@<lag>`), and returns its (conn_id, choice) frame and what
# the summary's `baselines` reports of it (None: nothing).


@dataclass(frozen=True)
class Policy:
    name: str
    decide: Callable[["Emulation", str], tuple[DataFrame, dict | None]]
    #: reads the simulator's truth (only with --truth)
    truth: bool = False
    #: the table's handshake tree (`ccs handshake`), in this kernel flow mode
    flow_mode: str | None = None
    #: on the streaming table's timeline: runs at `stream_delay_minutes`, or at a lag as `<name>@<L>`
    stream: bool = False
    #: the tails are also contrasted against it (issue 26: the streaming table; issue 27: does the
    #: table with its handshake tree beat Disco's tail?), beside ALICCS's hourly table
    tail_reference: bool = False
    #: scored with its fold-own estimates (the cross-fitted Oracle)
    fold_scored: bool = False


REGISTRY: dict[str, Policy] = {}


def policy(*names: str, flow_modes: tuple[str, ...] | None = None, **needs):
    """Register the decorated function as the policies `names` (`flow_modes`: each one's kernel
    flow mode, for the policies of the table with its handshake tree); `needs`: Policy's flags."""
    def register(decide):
        for i, name in enumerate(names):
            if name in REGISTRY:
                raise ValueError(f"policy {name!r} registered twice")
            REGISTRY[name] = Policy(name, decide, flow_mode=flow_modes[i] if flow_modes else None, **needs)
        return decide
    return register


class Emulation:
    """What the policies of one `run` read: the sessions `s` (the range and the training hours
    before it), `est_all` (their estimates), `est` (the range's), `train` (the hours before), the
    truth, and the tables several policies read, each built once on first use and unpersisted by
    `close`; `info` collects the summary's `baselines`."""

    def __init__(self, spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings,
                 lag_of: dict[str, tuple[str, int | None]], s: DataFrame, est_all: DataFrame,
                 truth: DataFrame | None):
        self.spark, self.cfg, self.window, self.p, self.lag_of = spark, cfg, window, p, lag_of
        self.s, self.est_all, self.truth = s, est_all, truth
        self.est: DataFrame | None = None
        self.train: DataFrame | None = None
        self.info: dict[str, Any] = {}
        # built once, read by several policies: the streaming tables (all slots), the truth's shares
        # per slot, each lag's lookup in them, and the hourly table's lookup (with its source decisions)
        self.tables: dict[Any, DataFrame | None] = {}
        self.hourly_counts: dict[str, int] = {}
        self._flow_in: dict[Any, pa.Table] = {}
        self._flow_tree: tf.Tree | None = None

    def in_range(self) -> int:
        """Narrow to the range's sessions; their count."""
        self.est = self.est_all.where("in_range").persist()
        self.train = self.s.where(~F.col("in_range"))
        return self.est.count()

    def handshake_tree(self, name: str) -> tf.Tree:
        if self._flow_tree is None:
            loaded = load_handshake(self.cfg)
            if loaded is None:
                raise ValueError(f"policy {name} needs the handshake tree: run `ccs handshake` first")
            ex = self.cfg.settings.export
            self._flow_tree = table_tree(loaded[0], self.cfg.settings.infer, ex.flow_min_purity_permille,
                                         ex.flow_min_leaf_permille)
            self.info["flow_tree"] = {"model": loaded[1], "features": list(loaded[0].features),
                                      "nodes": len(self._flow_tree.nodes), "depth": self._flow_tree.depth()}
        return self._flow_tree

    def stream_table(self, lag: int) -> DataFrame:
        """The streaming tables' lookup at `lag` (`stream_lookup`), shared by the streaming policies."""
        p, stream = self.p, self.tables
        if "entries" not in stream:
            max_lag = max(lg for b, lg in self.lag_of.values() if b in STREAM_POLICIES)
            preds = extract_stream_predictions(self.spark, self.cfg, self.window, p, max_lag)
            stream["entries"] = stream_entries(preds, self.cfg.settings.export, p).persist() if preds is not None else None
            self.info["stream_table"] = {"trigger_minutes": p.stream_trigger_minutes, "window_minutes": p.stream_window_minutes,
                                         "delay_minutes": p.stream_delay_minutes,
                                         "source_hours": f"{hour_shift(self.window.lo, -stream_lag_hours(p, max_lag))}..{self.window.hi}"}
        if ("lookup", lag) not in stream:     # the streaming policies at one lag share the lookup
            stream[("lookup", lag)] = stream_lookup(self.est, stream["entries"], self.cfg.settings.export, p, lag).persist()
        return stream[("lookup", lag)]

    def flow_table(self, key, looked: DataFrame | None) -> pa.Table:
        """`flow_inputs` of one table's lookup (`looked`), fetched once for its flow policies."""
        if key not in self._flow_in:
            self._flow_in[key] = flow_inputs(self.est, looked)
        return self._flow_in[key]

    def hourly_table(self) -> tuple[DataFrame | None, dict]:
        """The previous hour's table looked up once (`table_lookup`): ALICCS and every flow
        policy read the same entries."""
        if "hourly" not in self.tables:
            looked = table_lookup(self.spark, self.cfg, self.est, self.p, self.hourly_counts)
            self.tables["hourly"] = looked.persist() if looked is not None else None
        return self.tables["hourly"], self.hourly_counts

    def true_shares(self) -> DataFrame:
        """`true_stream_shares`, built once for every lag of `true_table_stream`."""
        if "truth" not in self.tables:
            self.tables["truth"] = true_stream_shares(self.s, self.truth, self.p).persist()
        return self.tables["truth"]

    def lag(self, name: str) -> int | None:
        return self.lag_of[name][1]

    def close(self) -> None:
        for frame in self.tables.values():
            if frame is not None:
                frame.unpersist()


@policy("cubic", "bbr")
def _fixed(em: Emulation, name: str):
    """Everyone on one CC (`cubic`: the production default)."""
    return fixed_policy(em.est, name), None


@policy("oracle", fold_scored=True)
def _oracle(em: Emulation, name: str):
    return oracle_crossfit(em.est, em.p), None


@policy("oracle_insample")
def _oracle_insample(em: Emulation, name: str):
    return oracle_insample(em.est, em.p), None


@policy("aliccs")
def _aliccs(em: Emulation, name: str):
    looked, counts = em.hourly_table()
    return aliccs_choice(em.est, looked, em.p), {"source_decisions": dict(counts)}


@policy("aliccs_fill", "aliccs_combine", "aliccs_flow", "aliccs_prior",
        flow_modes=("fill", "combine", "flow", "prior"), tail_reference=True)
def _aliccs_with_tree(em: Emulation, name: str):
    """The hourly table with its handshake tree, decided as the kernel does in the flow mode."""
    return flow_decide_local(em.spark, em.flow_table("hourly", em.hourly_table()[0]), em.p,
                             em.handshake_tree(name), REGISTRY[name].flow_mode)


@policy("aliccs_stream", stream=True, tail_reference=True)
def _aliccs_stream(em: Emulation, name: str):
    return em.stream_table(em.lag(name)).select(
        "conn_id", F.coalesce(F.col("_ecc"), F.lit(em.p.default_cc)).alias("choice")), None


@policy("aliccs_stream_fill", "aliccs_stream_combine", "aliccs_stream_flow", "aliccs_stream_prior",
        flow_modes=("fill", "combine", "flow", "prior"), stream=True, tail_reference=True)
def _aliccs_stream_with_tree(em: Emulation, name: str):
    """The streaming table with its handshake tree."""
    base, lag = em.lag_of[name]
    return flow_decide_local(em.spark, em.flow_table(("stream", lag), em.stream_table(lag)), em.p,
                             em.handshake_tree(name), REGISTRY[base].flow_mode)


@policy("configanator")
def _configanator(em: Emulation, name: str):
    return configanator_policy(em.train, em.est, em.p)


@policy("disco")
def _disco(em: Emulation, name: str):
    return disco_policy(em.train, em.est, em.p)


@policy("disco_type")
def _disco_type(em: Emulation, name: str):
    return disco_type_policy(em.train, em.est, em.p)


@policy("gbdt")
def _gbdt(em: Emulation, name: str):
    return gbdt_table_policy(em.spark, em.cfg, em.train, em.est, em.p)


@policy("pytheas")
def _pytheas(em: Emulation, name: str):
    return pytheas_policy(em.est_all, em.p), None


@policy("true_type", truth=True)
def _true_type(em: Emulation, name: str):
    return true_type_policy(em.est, em.truth), None


@policy("true_table", truth=True)
def _true_table(em: Emulation, name: str):
    return true_table_policy(em.s, em.est, em.truth, em.p), None


@policy("true_table_stream", truth=True, stream=True)
def _true_table_stream(em: Emulation, name: str):
    return true_table_stream_policy(em.est, em.true_shares(), em.p, em.lag(name)), None


#: every policy, in the order the summaries list them
POLICIES = tuple(REGISTRY)
#: the policies of the table with its handshake tree, and the kernel's flow mode each emulates
FLOW_POLICIES = {x.name: x.flow_mode for x in REGISTRY.values() if x.flow_mode}
#: the policies of the streaming table (issue 26); each also runs at another lag as `<name>@<minutes>`
STREAM_POLICIES = tuple(x.name for x in REGISTRY.values() if x.stream)
#: the policies that read the simulator's truth (only with --truth)
TRUTH_POLICIES = tuple(x.name for x in REGISTRY.values() if x.truth)


# ---- scoring ------------------------------------------------------------------------------------

def score(est: DataFrame, choices: dict[str, DataFrame], p: EmulateSettings) -> DataFrame:
    """Per policy and session: the choice and its outcome (the cross-fitted oracle scores with the
    fold-own estimates), its level, and QoE. A session a policy made no choice for keeps the
    default CC.

    Every policy's choices are stacked first and joined with the sessions once (each session
    paired with every policy's name): one join, not one per policy. With twenty policies the
    per-policy joins were twenty shuffles of the sessions in a plan the driver analysed again at
    every step; with this join and the shared table lookups of `run`, one warm `run` over the test
    suite's main-job hour went from 84-86 s to 43-48 s on 2 cores."""
    spark = est.sparkSession
    stacked = None
    for name, ch in choices.items():
        part = ch.select(F.lit(name).alias("policy"), "conn_id", "choice")
        stacked = part if stacked is None else stacked.unionByName(part)
    names = spark.createDataFrame([(name,) for name in choices], "policy string")
    e = (est.crossJoin(F.broadcast(names)).join(stacked, ["policy", "conn_id"], "left")
         .withColumn("choice", F.coalesce("choice", F.lit(p.default_cc))))
    oracle = F.col("policy").isin([x.name for x in REGISTRY.values() if x.fold_scored])

    def pick(m: str):
        def of(cc: str):
            return F.when(oracle, F.col(f"f{m}_{cc}")).otherwise(F.col(f"{m}_{cc}"))
        return F.when(F.col("choice") == "bbr", of("bbr")).otherwise(of("cubic"))
    out = e.select("policy", "conn_id", "node_id", "window_ms", "prefix", "net_type", "choice",
                   pick("reb").alias("rebuffer"), pick("ret").alias("retrans"), pick("lvl").alias("level"))
    return out.withColumn("qoe", qoe(F.col("rebuffer"), F.col("retrans"), p.alpha))


def per_window(scored: DataFrame) -> DataFrame:
    """gold.emulation: per policy, node, window and network type."""
    return scored.groupBy("policy", "node_id", "window_ms", "net_type").agg(
        F.count(F.lit(1)).alias("sessions"), F.avg("rebuffer").alias("rebuffer_rate"), F.avg("retrans").alias("retrans_rate"),
        F.avg("qoe").alias("qoe"), F.avg((F.col("choice") == "bbr").cast("double")).alias("share_bbr"),
        *[F.sum((F.col("level") == lv).cast("long")).alias(f"n_{lv}") for lv in LEVELS]
    ).withColumn("window_start", (F.col("window_ms") / 1000).cast("timestamp"))


def per_cell(scored: DataFrame) -> DataFrame:
    """gold.emulation_cells: per policy, node, window, prefix group and network type — the
    samples of the distributions (ALICCS Figs. 15, 17)."""
    return scored.groupBy("policy", "node_id", "window_ms", "prefix", "net_type").agg(
        F.count(F.lit(1)).alias("sessions"), F.avg("rebuffer").alias("rebuffer_rate"),
        F.avg("retrans").alias("retrans_rate"), F.avg("qoe").alias("qoe"))


def _tail_rows(cells: DataFrame, *extra) -> list:
    """Per policy (one collect): the cells' rebuffer (`reb`) and retransmission (`ret`)
    percentiles at PERCENTILES, and any `extra` aggregations."""
    qs = [x / 100 for x in PERCENTILES]
    return cells.groupBy("policy").agg(F.percentile_approx("rebuffer_rate", qs, 10_000).alias("reb"),
                                       F.percentile_approx("retrans_rate", qs, 10_000).alias("ret"), *extra).collect()


def _by_percentile(values, percentiles=PERCENTILES) -> dict[str, float]:
    return {f"p{x}": v for x, v in zip(percentiles, values)}


def summarize(windows: DataFrame, cells: DataFrame, p: EmulateSettings, truth: dict | None = None) -> dict[str, Any]:
    """Per policy: session-weighted means (all, Wi-Fi, cellular), the distribution tail of the
    cells' rebuffer and retransmission rates (cells with ≥ min_cell_sessions sessions), estimate
    levels; and the share of the all-CUBIC → Oracle QoE gap each policy closes."""
    w = windows.groupBy("policy", "net_type").agg(
        F.sum("sessions").alias("n"), *[F.sum(F.col(m) * F.col("sessions")).alias(m) for m in ("rebuffer_rate", "retrans_rate", "qoe", "share_bbr")],
        *[F.sum(f"n_{lv}").alias(f"n_{lv}") for lv in LEVELS]).collect()
    out: dict[str, Any] = {}
    for r in w:
        d = out.setdefault(r["policy"], {"sessions": 0, "levels": {lv: 0 for lv in LEVELS}, "_sums": {}, "by_type": {}})
        d["sessions"] += r["n"]
        for lv in LEVELS:
            d["levels"][lv] += r[f"n_{lv}"]
        for m in ("rebuffer_rate", "retrans_rate", "qoe", "share_bbr"):
            d["_sums"][m] = d["_sums"].get(m, 0.0) + r[m]
        d["by_type"][r["net_type"]] = {"sessions": r["n"], **{m: r[m] / r["n"] for m in ("rebuffer_rate", "retrans_rate", "qoe")}}
    for d in out.values():
        for m, v in d.pop("_sums").items():
            d[m] = v / d["sessions"] if d["sessions"] else None
    big = cells.where(F.col("sessions") >= p.min_cell_sessions)
    low = [1 - x / 100 for x in PERCENTILES]
    for r in _tail_rows(big, F.count(F.lit(1)).alias("cells"), F.percentile_approx("qoe", low, 10_000).alias("q")):
        d = out.setdefault(r["policy"], {})
        d["cells"] = r["cells"]
        d["rebuffer_pct"] = _by_percentile(r["reb"])
        d["retrans_pct"] = _by_percentile(r["ret"])
        d["qoe_low_pct"] = _by_percentile(r["q"], [100 - x for x in PERCENTILES])
    base = out.get("cubic", {}).get("qoe")
    for oracle in ("oracle", "oracle_insample"):
        top = out.get(oracle, {}).get("qoe")
        if base is None or top is None or top <= base:
            continue
        for name, d in out.items():
            d.setdefault("gap_closed", {})[oracle] = (d["qoe"] - base) / (top - base)
    if truth:
        for name, t in truth.items():
            out.setdefault(name, {})["truth"] = t
    return out


def tail_contrasts(cells: pd.DataFrame, p: EmulateSettings, reference: str = "aliccs", metric: str = "rebuffer_rate",
                   percentiles: tuple[int, ...] = (85, 90, 95, 99)) -> dict[str, Any]:
    """How sure is "the reference beats policy X at the q-th percentile"? The cells' percentiles of
    `metric` (cells with ≥ min_cell_sessions sessions), reference − X, with a 95% interval from a
    bootstrap over nodes (the cells of one node share its paths and hours, so the node is the unit
    that is resampled) and the share of resamples in which the reference is lower (by more than
    TAIL_TIE: a tie is not lower). `cells` holds gold.emulation_cells rows (policy, node_id,
    window_ms, prefix, net_type, sessions, metric)."""
    big = cells[cells["sessions"] >= p.min_cell_sessions]
    if reference not in set(big["policy"]):
        return {}
    wide = big.pivot_table(index=["node_id", "window_ms", "prefix", "net_type"], columns="policy", values=metric)
    wide = wide.dropna()
    nodes = sorted(wide.index.get_level_values("node_id").unique())
    by_node = [wide.xs(n, level="node_id").to_numpy() for n in nodes]
    cols = list(wide.columns)
    ref = cols.index(reference)
    q = np.asarray(percentiles, dtype=float)

    def diffs(arr: np.ndarray) -> np.ndarray:          # (policies, percentiles): reference − policy
        pct = np.percentile(arr, q, axis=0).T
        return pct[ref][None, :] - pct

    point = diffs(wide.to_numpy())
    rng = np.random.default_rng(p.seed)
    boot = np.stack([diffs(np.concatenate([by_node[i] for i in rng.integers(0, len(nodes), len(nodes))]))
                     for _ in range(p.bootstrap_reps)])
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    out: dict[str, Any] = {"reference": reference, "metric": metric, "unit": "node", "nodes": len(nodes),
                           "cells": len(wide), "reps": p.bootstrap_reps, "vs": {}}
    for i, name in enumerate(cols):
        if i == ref:
            continue
        out["vs"][name] = {f"p{int(x)}": {"diff": float(point[i, k]), "lo": float(lo[i, k]), "hi": float(hi[i, k]),
                                          "p_lower": float((boot[:, i, k] < -TAIL_TIE).mean())}
                           for k, x in enumerate(q)}
    return out


def with_truth(scored: DataFrame, truth: DataFrame) -> DataFrame:
    """Each scored session with the simulator's expected outcomes under the CC its policy chose
    (`exp_rebuffer`, `exp_retrans`). Evaluation only: no policy reads it."""
    bbr = F.col("choice") == "bbr"
    t = truth.select("conn_id", "exp_rebuffer_cubic", "exp_rebuffer_bbr", "retrans_cubic", "retrans_bbr")
    return (scored.join(t, "conn_id").select(
        "policy", "node_id", "window_ms", "prefix", "net_type",
        F.when(bbr, F.col("exp_rebuffer_bbr")).otherwise(F.col("exp_rebuffer_cubic")).alias("exp_rebuffer"),
        F.when(bbr, F.col("retrans_bbr")).otherwise(F.col("retrans_cubic")).alias("exp_retrans")))


def truth_cells(truthful: DataFrame, p: EmulateSettings) -> DataFrame:
    """The cells of the estimated tails (≥ min_cell_sessions sessions) of `with_truth`'s sessions,
    each at the mean of its sessions' expected outcomes: the tail without the estimator's noise,
    which in a cell of a few sessions is the noise of one or two stalls."""
    return (truthful.groupBy("policy", "node_id", "window_ms", "prefix", "net_type")
            .agg(F.count(F.lit(1)).alias("sessions"), F.avg("exp_rebuffer").alias("rebuffer_rate"),
                 F.avg("exp_retrans").alias("retrans_rate"))
            .where(F.col("sessions") >= p.min_cell_sessions))


def cubic_truth_qoe(est: DataFrame, truth: DataFrame, p: EmulateSettings) -> float | None:
    """The expected QoE of all-CUBIC over `est`'s sessions by the simulator's truth: the base of
    every policy's truth gain, whether or not `cubic` is among the policies run."""
    r = (est.select("conn_id").join(truth, "conn_id")
         .agg(F.avg("exp_rebuffer_cubic").alias("reb"), F.avg("retrans_cubic").alias("ret")).first())
    return None if r is None or r["reb"] is None else 1 - p.alpha * r["reb"] - (1 - p.alpha) * r["ret"]


def cubic_truth_by_node(est: DataFrame, truth: DataFrame, p: EmulateSettings) -> dict[str, tuple[int, float]]:
    """Per node of `est`'s sessions: (sessions, the sum of all-CUBIC's expected QoE by the truth),
    the base of `truth_check`'s node-bootstrap intervals."""
    rows = (est.select("conn_id", "node_id").join(truth, "conn_id").groupBy("node_id")
            .agg(F.count(F.lit(1)).alias("n"), F.sum("exp_rebuffer_cubic").alias("reb"), F.sum("retrans_cubic").alias("ret"))
            .collect())
    return {str(r["node_id"]): (int(r["n"]), r["n"] - p.alpha * r["reb"] - (1 - p.alpha) * r["ret"]) for r in rows}


def _node_intervals(truthful: DataFrame, p: EmulateSettings, base_by_node: dict[str, tuple[int, float]],
                    out: dict) -> None:
    """Adds to each policy of `out` the 95% intervals of its truth gain over all-CUBIC and of its
    share of `true_type`'s gain from a bootstrap over nodes (the sessions of one node share its paths
    and hours): `exp_qoe_gain_vs_cubic_node_95`, `share_of_true_type_gain_node_95` (each resample's
    session-weighted gains, as the point figures)."""
    rows = (truthful.groupBy("policy", "node_id")
            .agg(F.count(F.lit(1)).alias("n"), F.sum("exp_rebuffer").alias("reb"), F.sum("exp_retrans").alias("ret"))
            .collect())
    nodes = sorted(base_by_node)
    if not nodes:
        return
    col = {n: i for i, n in enumerate(nodes)}
    pols = sorted({r["policy"] for r in rows})
    gain = np.full((len(pols), len(nodes)), np.nan)     # per node: sum of (policy − CUBIC) expected QoE
    for r in rows:
        n = str(r["node_id"])
        if n in col:
            gain[pols.index(r["policy"]), col[n]] = (r["n"] - p.alpha * r["reb"] - (1 - p.alpha) * r["ret"]
                                                     - base_by_node[n][1])
    sessions = np.array([base_by_node[n][0] for n in nodes], dtype=float)
    rng = np.random.default_rng(p.seed)
    picks = rng.integers(0, len(nodes), (p.bootstrap_reps, len(nodes)))
    g = np.nan_to_num(gain)[:, picks].sum(axis=2) / sessions[picks].sum(axis=1)     # (policies, reps)
    top = g[pols.index("true_type")] if "true_type" in pols else None
    for i, name in enumerate(pols):
        d = out.setdefault(name, {})
        if np.isnan(gain[i]).any():
            continue          # a node without this policy's sessions: no interval
        d["exp_qoe_gain_vs_cubic_node_95"] = [float(x) for x in np.percentile(g[i], [2.5, 97.5])]
        if top is not None and (top > 0).all():
            d["share_of_true_type_gain_node_95"] = [float(x) for x in np.percentile(g[i] / top, [2.5, 97.5])]
    for d in out.values():
        d["bootstrap"] = {"unit": "node", "nodes": len(nodes), "reps": p.bootstrap_reps}


def truth_check(truthful: DataFrame, cells: DataFrame, p: EmulateSettings, base: float | None = None,
                base_by_node: dict[str, tuple[int, float]] | None = None) -> dict:
    """What each policy's choices would truly have delivered (`with_truth`'s sessions: the
    simulator's per-connection expectations under the chosen CC), against the estimate: how far
    the emulator is off; and the tail percentiles of `cells` (truth_cells). Evaluation only.
    `exp_qoe_gain_vs_cubic` is against `base` (`cubic_truth_qoe`; by default the `cubic`
    policy's), and `share_of_true_type_gain` that gain over the `true_type` policy's: how much of
    the per-session classifier bound a policy reaches. With `base_by_node` (`cubic_truth_by_node`)
    both also get a 95% interval from a bootstrap over nodes (`_node_intervals`)."""
    rows = truthful.groupBy("policy").agg(F.count(F.lit(1)).alias("n"), F.avg("exp_rebuffer").alias("reb"),
                                          F.avg("exp_retrans").alias("ret")).collect()
    out = {r["policy"]: {"sessions": r["n"], "exp_rebuffer_rate": r["reb"], "exp_retrans_rate": r["ret"],
                         "exp_qoe": 1 - p.alpha * r["reb"] - (1 - p.alpha) * r["ret"]} for r in rows}
    if base is None:
        base = out.get("cubic", {}).get("exp_qoe")
    for d in out.values():
        d["exp_qoe_gain_vs_cubic"] = d["exp_qoe"] - base if base is not None else None
    top = out.get("true_type", {}).get("exp_qoe_gain_vs_cubic")
    for d in out.values():
        d["share_of_true_type_gain"] = (d["exp_qoe_gain_vs_cubic"] / top
                                         if top is not None and top > 0 and d["exp_qoe_gain_vs_cubic"] is not None else None)
    if base_by_node:
        _node_intervals(truthful, p, base_by_node, out)
    for r in _tail_rows(cells):
        d = out.setdefault(r["policy"], {})
        d["exp_rebuffer_pct"] = _by_percentile(r["reb"])
        d["exp_retrans_pct"] = _by_percentile(r["ret"])
    return out


def read_truth(spark: SparkSession, truth_dir: str) -> DataFrame:
    """The simulator's per-connection truth (DIR/_truth/connections/<node>/<hour>.parquet)."""
    path = os.path.join(truth_dir, "_truth", "connections") if os.path.isdir(os.path.join(truth_dir, "_truth")) else truth_dir
    return (spark.read.option("recursiveFileLookup", "true").parquet(path)
            .select("conn_id", F.col("net_type").alias("true_type"), "exp_rebuffer_cubic", "exp_rebuffer_bbr",
                    "retrans_cubic", "retrans_bbr"))


# ---- load and the job ---------------------------------------------------------------------------

def lag_curve(summary: dict[str, Any], lags: tuple[int, ...], p: EmulateSettings) -> dict[str, Any]:
    """Per lag L of the curve: `aliccs_stream@L`'s and `true_table_stream@L`'s estimated QoE and
    rebuffer tail, and with the truth their share of the true type's truth gain and the rebuffer
    tail in truth (the truth cells' percentiles) — how fast the table's worth decays with its age
    (ALICCS §3.3, Observation IV)."""
    points = []
    for lag in lags:
        row: dict[str, Any] = {"lag_minutes": lag}
        for base in ("aliccs_stream", "true_table_stream"):
            d = summary.get(f"{base}@{lag}")
            if not d:
                continue
            t = d.get("truth") or {}
            row[base] = {"qoe": d.get("qoe"), "rebuffer_pct": d.get("rebuffer_pct"),
                         "share_of_true_type_gain": t.get("share_of_true_type_gain"),
                         "exp_rebuffer_pct": t.get("exp_rebuffer_pct")}
        points.append(row)
    return {"trigger_minutes": p.stream_trigger_minutes, "window_minutes": p.stream_window_minutes,
            "operating_delay_minutes": p.stream_delay_minutes, "points": points}


def run(spark: SparkSession, cfg: Config, window: hours.Window, policies: tuple[str, ...] | None = None,
        truth_dir: str | None = None, params: EmulateSettings | None = None,
        stream_lags: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Emulate the window's hours: gold.emulation and gold.emulation_cells for the range (replaced on a
    re-run), and the summary. `stream_lags` (minutes): the streaming table's lag curve — adds
    `aliccs_stream@L` (and, with the truth, `true_table_stream@L`) for each L, and the summary's
    `lag_curve`."""
    p = params or cfg.settings.emulate
    if not policies:     # by default every policy this lake can run: the flow ones need `ccs handshake`
        has_tree = load_handshake(cfg) is not None
        policies = tuple(x.name for x in REGISTRY.values() if (not x.truth or truth_dir) and (not x.flow_mode or has_tree))
    policies = tuple(policies)
    lags = tuple(stream_lags or ())
    for lag in lags:
        policies += tuple(x for x in (f"aliccs_stream@{lag}", f"true_table_stream@{lag}" if truth_dir else None)
                          if x and x not in policies)
    lag_of = {x: split_lag(x, p) for x in policies}
    unknown = {x for x, (base, _) in lag_of.items() if base not in REGISTRY}
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; known: {', '.join(POLICIES)}")
    needs = [x for x in policies if REGISTRY[lag_of[x][0]].truth]
    if needs and not truth_dir:
        raise ValueError(f"policies {', '.join(needs)} need --truth (the simulator's output folder)")
    # two policies and the truth check join it: read the parquet once
    truth = read_truth(spark, truth_dir).persist() if truth_dir else None
    # the sessions feed five aggregations of the estimator and the baselines' training: read once
    s = sessions(extract(spark, cfg, window, p), p).persist()
    est_all = estimates(s).persist()
    em = Emulation(spark, cfg, window, p, lag_of, s, est_all, truth)
    try:
        n = em.in_range()
        if n == 0:
            return {"range": window.name, "sessions": 0, "policies": {}}
        est = em.est
        choices: dict[str, DataFrame] = {}
        for name in policies:
            choices[name], reported = REGISTRY[lag_of[name][0]].decide(em, name)
            if reported is not None:
                em.info[name] = reported
        return _score_and_summarize(spark, cfg, window, p, em, choices, n, policies, lags)
    finally:
        em.close()
        est_all.unpersist()
        s.unpersist()
        if truth is not None:
            truth.unpersist()


def _score_and_summarize(spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings, em: Emulation,
                         choices: dict[str, DataFrame], n: int, policies: tuple[str, ...],
                         lags: tuple[int, ...]) -> dict[str, Any]:
    """Score every policy's choices, write gold.emulation and gold.emulation_cells for the range,
    and the summary: per policy, the tail contrasts, the truth check (with the truth), the lag curve."""
    est, truth = em.est, em.truth
    scored = score(est, choices, p).persist()
    rng = window.name
    n_w = write_window(spark, cfg, per_window(scored), EMULATION, rng)
    n_c = write_window(spark, cfg, per_cell(scored), EMULATION_CELLS, rng)
    path_w, path_c = table_path(cfg, EMULATION), table_path(cfg, EMULATION_CELLS)
    windows = spark.read.format("delta").load(path_w).where(F.col("window") == rng)
    cells = spark.read.format("delta").load(path_c).where(F.col("window") == rng)
    cols = ["policy", "node_id", "window_ms", "prefix", "net_type", "sessions", "rebuffer_rate"]
    # the tails against ALICCS's hourly table and against each policy registered as a reference
    flow_refs = [x for x in policies if x in REGISTRY and REGISTRY[x].tail_reference]
    est_cells = cells.where(F.col("sessions") >= p.min_cell_sessions).select(*cols).toPandas()
    contrasts = {"estimated": tail_contrasts(est_cells, p),
                 **{f"estimated, {r}": tail_contrasts(est_cells, p, reference=r) for r in flow_refs}}
    checked = None
    if truth is not None:
        # one join with the truth, one aggregation into cells: the check and the contrasts read both
        truthful = with_truth(scored, truth).persist()
        t_cells = truth_cells(truthful, p).persist()
        checked = truth_check(truthful, t_cells, p, base=cubic_truth_qoe(est, truth, p),
                              base_by_node=cubic_truth_by_node(est, truth, p))
        truth_pd = t_cells.select(*cols).toPandas()
        contrasts["truth"] = tail_contrasts(truth_pd, p)
        contrasts.update({f"truth, {r}": tail_contrasts(truth_pd, p, reference=r) for r in flow_refs})
        t_cells.unpersist()
        truthful.unpersist()
    summary = summarize(windows, cells, p, checked)
    scored.unpersist()
    est.unpersist()
    out = {"range": rng, "sessions": n, "train_hours": f"{hour_shift(window.lo, -p.train_hours)}..{hour_shift(window.lo, -1)}",
           "window_minutes": p.window_minutes, "alpha": p.alpha, "rows": {EMULATION: n_w, EMULATION_CELLS: n_c},
           "policies": summary, "tail_contrasts": contrasts, "baselines": em.info}
    if lags:
        out["lag_curve"] = lag_curve(summary, lags, p)
    return out
