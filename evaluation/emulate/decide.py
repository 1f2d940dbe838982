"""What each policy decides, as functions of the estimates (and of the tables, trees and truth
they read): (conn_id, choice) for the sessions a policy decides."""
from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect.contract import FEATURES, HANDSHAKE_FEATURES
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import hour_shift
from ccselect.ipaddr import with_ip
from ccselect.lake import CONNECTIONS, PREDICTIONS, table_path
from ccselect.settings import ConfiganatorSettings, EmulateSettings
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables.aggregate import address_decisions, ladder_entries, model_weights
from ccselect.features.prefixes import prefix_means_frame
from ccselect.models import gbdt
from ccselect.models.configanator import choose_classes, network_class
from ccselect.evaluation.emulate.estimate import CCS, hour_shift_col, qoe
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.

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
