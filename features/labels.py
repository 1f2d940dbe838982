"""Labels for the network-type classifier and, for later comparison, a per-/24 best-CC label.

- `net_type_label`: wifi → 1, 4g/5g → 0 (ALICCS §4.2: Wi-Fi → CUBIC, 4G/5G → BBR), else null.
- `training_set`: the labelled connections (`net_type` present), optionally balanced to a share
  of class 0 (the paper trains on 50% 4G) by deterministic hash-ordered downsampling.
- `best_cc_per_prefix24`: from A/B outcomes, the CC with the lower rebuffer rate in each /24 over
  a window (ALICCS Appendix A), with enough sessions on both sides.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, functions as F

WIFI, CELLULAR = 1, 0


def net_type_label(net_type: Column) -> Column:
    return F.when(net_type == "wifi", F.lit(WIFI)).when(net_type.isin("4g", "5g"), F.lit(CELLULAR))


def training_set(connections: DataFrame, cellular_share: float | None = 0.5, seed: int = 7) -> DataFrame:
    """Labelled connections with `label`; when `cellular_share` is set, the larger class is
    downsampled (the rows with the smallest xxhash64(conn_id, seed) are kept) so that class 0
    makes up that share (as close as whole rows allow). A connection with imputed features
    (silver's `imputed`, ingest.missing_features: impute) teaches nothing about them: left out."""
    lab = connections.filter(F.col("net_type").isNotNull()).withColumn("label", net_type_label(F.col("net_type")))
    if "imputed" in connections.columns:      # silver written before the column: no imputed rows
        lab = lab.filter(F.coalesce(F.size("imputed") == 0, F.lit(True)))
    lab = lab.filter(F.col("label").isNotNull())
    if cellular_share is None:
        return lab
    if not 0.0 < cellular_share < 1.0:
        raise ValueError("cellular_share must be in (0, 1)")
    counts = {r["label"]: r["count"] for r in lab.groupBy("label").count().collect()}
    n0, n1 = counts.get(CELLULAR, 0), counts.get(WIFI, 0)
    if n0 == 0 or n1 == 0:
        return lab
    if n0 / (n0 + n1) > cellular_share:   # too many cellular rows: cut class 0
        keep0, keep1 = int(n1 * cellular_share / (1 - cellular_share)), n1
    else:                                   # too many Wi-Fi rows: cut class 1
        keep0, keep1 = n0, int(n0 * (1 - cellular_share) / cellular_share)
    w = Window.partitionBy("label").orderBy(F.xxhash64("conn_id", "node_id", F.lit(seed)), "conn_id", "node_id")
    return (lab.withColumn("_rank", F.row_number().over(w))
            .filter(((F.col("label") == CELLULAR) & (F.col("_rank") <= keep0))
                    | ((F.col("label") == WIFI) & (F.col("_rank") <= keep1)))
            .drop("_rank"))


def best_cc_per_prefix24(connections: DataFrame, min_sessions: int = 20,
                         decisions: tuple[str, ...] = ("ab_control",)) -> DataFrame:
    """Per IPv4 /24: sessions, play and rebuffer time per CC, and `best_cc` = the CC with the lower
    rebuffer rate (sum rebuffer_ms / sum play_ms), null on a tie or with fewer than
    `min_sessions` QoE sessions on either arm."""
    ab = connections.filter(F.col("decision").isin(*decisions) & F.col("prefix24").isNotNull()
                            & (F.col("qoe_sessions") > 0) & F.col("cc").isin("cubic", "bbr"))
    per = ab.groupBy("prefix24").agg(*[
        agg for cc in ("cubic", "bbr") for agg in (
            F.sum(F.when(F.col("cc") == cc, F.col("qoe_sessions")).otherwise(0)).cast("bigint").alias(f"sessions_{cc}"),
            F.sum(F.when(F.col("cc") == cc, F.col("play_ms")).otherwise(0)).cast("bigint").alias(f"play_ms_{cc}"),
            F.sum(F.when(F.col("cc") == cc, F.col("rebuffer_ms")).otherwise(0)).cast("bigint").alias(f"rebuffer_ms_{cc}"),
        )])
    for cc in ("cubic", "bbr"):
        per = per.withColumn(f"rebuffer_rate_{cc}", F.when(F.col(f"play_ms_{cc}") > 0,
                                                           F.col(f"rebuffer_ms_{cc}") / F.col(f"play_ms_{cc}")))
    enough = (F.col("sessions_cubic") >= min_sessions) & (F.col("sessions_bbr") >= min_sessions)
    rc, rb = F.col("rebuffer_rate_cubic"), F.col("rebuffer_rate_bbr")
    best = F.when(enough & (rb < rc), F.lit("bbr")).when(enough & (rc < rb), F.lit("cubic"))
    return per.withColumn("best_cc", best).withColumn("rebuffer_rate_gap", F.when(enough, rc - rb))
