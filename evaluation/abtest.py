"""The randomized control test of ALICCS §5.3: treatment (odd CRC32 of the client address, the
CCS strategy) against control (even, the default CUBIC), as Figs. 12 and 14 plot it — rebuffer
rate and retransmission rate, overall, per region (Fig. 14 right: per province) and per
client-reported network type (Fig. 12: Wi-Fi vs 4G).

Assignment is by `ab_treatment` (intent to treat: a treatment connection whose prefix missed the
table still counts as treatment). Both metrics are ratios of sums over connections, and the unit
of randomization is the client address, not the connection: the connections of one address share
its path, so they are correlated. The confidence interval therefore comes from the delta method
on per-address cluster sums (the ratio-metric variance of Deng et al., "Applying the Delta Method
in Metric Analytics", KDD'18): per arm, R = ΣY/ΣX over clusters i with

    Var(R) ≈ Σ_i (Y_i − R·X_i)² / (n (n − 1) X̄²),

and the relative change t/c − 1 gets its interval on the log scale,
log(R_t/R_c) ± z·sqrt(Var(R_t)/R_t² + Var(R_c)/R_c²) (the arms are independent).

extract (silver.connections over the hours) → pure transforms (`metric_rows`, `arm_moments` in
Spark; `compare` on the few moment rows, pure Python so numpy can run the same estimator) → load
(gold.ab_test, replaced per window).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect.hours import Window
from ccselect.lake import AB_TEST, connections_in, write_window
from ccselect.features.ab_moments import (  # noqa: F401  (re-exported: the analysis reads them as abtest.*)
    METRICS, MOMENT_KEYS, NET_GROUPS, ArmMoments, arm_moments, metric_rows, segments)


@dataclass(frozen=True)
class Comparison:
    control: float | None
    treatment: float | None
    rel_change: float | None
    ci_lo: float | None
    ci_hi: float | None
    p_value: float | None
    significant: bool | None


def compare(control: ArmMoments, treatment: ArmMoments, confidence: float = 0.95,
            min_clusters: int = 30) -> Comparison:
    """Treatment vs control of one ratio metric: both rates, the relative change t/c − 1, its
    two-sided `confidence` interval (delta method on the log ratio, so the interval stays above
    −100%) and the p-value of "no change". The interval and p-value need `min_clusters` clusters
    in each arm (the delta method is a large-sample approximation) and non-zero rates."""
    c, t = control.ratio, treatment.ratio
    rel = t / c - 1 if c and t is not None else None
    none = Comparison(c, t, rel, None, None, None, None)
    if rel is None or not t or min(control.clusters, treatment.clusters) < max(min_clusters, 2):
        return none
    vc, vt = control.ratio_var(), treatment.ratio_var()
    if vc is None or vt is None:
        return none
    se = math.sqrt(vc / (c * c) + vt / (t * t))
    log_ratio = math.log(t / c)
    if se == 0:
        return Comparison(c, t, rel, rel, rel, 0.0 if log_ratio else 1.0, log_ratio != 0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = math.erfc(abs(log_ratio) / se / math.sqrt(2))
    return Comparison(c, t, rel, math.exp(log_ratio - z * se) - 1, math.exp(log_ratio + z * se) - 1, p,
                      p < 1 - confidence)


RESULT_SCHEMA = ("segment_kind string, segment string, metric string, n_control long, n_treatment long, "
                 "clusters_control long, clusters_treatment long, control double, treatment double, "
                 "rel_change double, ci_lo double, ci_hi double, p_value double, significant boolean")


def results(moments: list[dict[str, Any]], confidence: float, min_clusters: int) -> list[tuple]:
    """gold.ab_test rows (RESULT_SCHEMA order) from collected `arm_moments` rows; a segment with
    one arm only gets its rate and counts, no comparison."""
    by: dict[tuple[str, str, str], dict[str, ArmMoments]] = {}
    for m in moments:
        am = ArmMoments(int(m["conns"]), int(m["clusters"]),
                        *[float(m[k]) for k in ("sy", "sx", "syy", "sxx", "sxy")])
        by.setdefault((m["segment_kind"], m["segment"], m["metric"]), {})[m["arm"]] = am
    empty = ArmMoments(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    out = []
    for key in sorted(by):
        c, t = by[key].get("control", empty), by[key].get("treatment", empty)
        r = compare(c, t, confidence, min_clusters)
        out.append((*key, c.conns, t.conns, c.clusters, t.clusters, r.control, r.treatment, r.rel_change,
                    r.ci_lo, r.ci_hi, r.p_value, r.significant))
    return out


def analyse(conns: DataFrame, confidence: float = 0.95, min_clusters: int = 30) -> DataFrame:
    """silver.connections rows → the gold.ab_test rows of one window (without `window`)."""
    rows = [r.asDict() for r in arm_moments(metric_rows(conns)).collect()]
    return conns.sparkSession.createDataFrame(results(rows, confidence, min_clusters), RESULT_SCHEMA)


def assignment(conns: DataFrame) -> dict[str, Any]:
    """How the logged decisions agree with the arms: control connections should all be
    `ab_control` and no treatment connection should be; otherwise no A/B ran in (part of) the
    window and the comparison is not a randomized one."""
    r = conns.agg(
        F.count(F.when(~F.col("ab_treatment"), 1)).alias("control"),
        F.count(F.when(F.col("ab_treatment"), 1)).alias("treatment"),
        F.count(F.when(~F.col("ab_treatment") & (F.col("decision") == "ab_control"), 1)).alias("control_ab_control"),
        F.count(F.when(F.col("ab_treatment") & (F.col("decision") == "ab_control"), 1)).alias("treatment_ab_control"),
        F.count(F.when(F.col("ab_treatment") & (F.col("cc") == "bbr"), 1)).alias("treatment_bbr"),
        F.count(F.when(~F.col("ab_treatment") & (F.col("cc") == "bbr"), 1)).alias("control_bbr"),
    ).first().asDict()
    share = lambda a, b: round(r[a] / r[b], 4) if r[b] else None  # noqa: E731
    return {"connections": {"control": r["control"], "treatment": r["treatment"]},
            "control_logged_ab_control": share("control_ab_control", "control"),
            "treatment_logged_ab_control": share("treatment_ab_control", "treatment"),
            "bbr_share": {"control": share("control_bbr", "control"), "treatment": share("treatment_bbr", "treatment")}}


# ---- extract / load -----------------------------------------------------------------------------

def extract(spark: SparkSession, cfg: Config, window: Window) -> DataFrame:
    cols = ("ab_treatment", "decision", "cc", "client_ip", "ug_id", "net_type", *{c for yx in METRICS.values() for c in yx})
    return connections_in(spark, cfg, window).select(*cols)


def run(spark: SparkSession, cfg: Config, window: Window) -> dict[str, Any]:
    """gold.ab_test for the window's hours, replacing that window's rows; returns the window, its
    rows (as dicts) and the assignment check."""
    confidence, min_clusters = cfg.settings.abtest.confidence, cfg.settings.abtest.min_clusters
    conns = extract(spark, cfg, window).cache()
    try:
        table = analyse(conns, confidence, min_clusters)
        n = write_window(spark, cfg, table, AB_TEST, window.name)
        check = assignment(conns)
    finally:
        conns.unpersist()
    return {"window": window.name, "confidence": confidence, "rows": n, "assignment": check,
            "results": [r.asDict() for r in table.collect()]}
