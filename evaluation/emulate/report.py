"""Scoring the policies' choices and the summary: per window and cell, the tail percentiles and
contrasts, and the check against the simulator's truth."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.settings import EmulateSettings
from ccselect.evaluation.emulate.estimate import LEVELS, PERCENTILES, TAIL_TIE, qoe, sessions
from ccselect.evaluation.emulate.policies import REGISTRY

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
