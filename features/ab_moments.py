"""The A/B split's moments (ALICCS §5.3, §4.3): per arm (odd CRC32 of the client address:
treatment; even: control), segment and ratio metric, the cluster-sum moments the delta method
needs, with the client address as the cluster. Below both readers: the offline analysis
(evaluation/abtest.py) and the rollout's canary gate (export/delivery/canary.py).

Both metrics are ratios of sums over connections; the connections of one address share its path,
so the address is the unit. For an arm, R = ΣY/ΣX over clusters i and

    Var(R) ≈ Σ_i (Y_i − R·X_i)² / (n (n − 1) X̄²)

(the ratio-metric variance of Deng et al., "Applying the Delta Method in Metric Analytics",
KDD'18)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import DataFrame, functions as F

#: metric → (numerator, denominator) silver columns: ALICCS §5.3's rebuffer rate (stall time over
#: play time, connections with a playback session) and retransmission rate (retransmitted over sent
#: segments)
METRICS = {"rebuffer_rate": ("rebuffer_ms", "play_ms"), "retrans_rate": ("total_retrans", "data_segs_out")}
#: the canary gate's metrics (export/delivery/canary.py, issue 58): METRICS and the delivery rate,
#: the goodput the access log measures — bytes sent over the time spent serving them (silver's
#: `bytes_sent` / `request_time_ms`, the sums over the connection's requests of nginx's
#: $bytes_sent and $request_time; silver's `delivery_rate_bps` is the same ratio per connection).
#: Higher is better on it, worse on the other two.
CANARY_METRICS = {**METRICS, "delivery_rate": ("bytes_sent", "request_time_ms")}
#: client-reported network types → the two groups Fig. 12 compares (4G and 5G are both cellular)
NET_GROUPS = {"wifi": "wifi", "4g": "cell", "5g": "cell"}
MOMENT_KEYS = ("segment_kind", "segment", "metric", "arm")
#: exact integer moments: squared cluster sums can pass 2^63 on a big window, decimal(38,0) cannot
_EXACT = "decimal(38,0)"


# ---- Spark transforms ---------------------------------------------------------------------------

def segments(df: DataFrame) -> DataFrame:
    """One row per connection and segment it belongs to: (`all`, `all`), (`region`, the region of
    its user group `<region>-AS<asn>`; none when unmatched) and (`net_type`, `wifi`/`cell`; only
    for the 5-10% of connections whose client reported a network type)."""
    region = F.regexp_extract(F.col("ug_id"), r"^(.*)-AS[0-9]+$", 1)
    net = F.create_map(*[F.lit(x) for kv in NET_GROUPS.items() for x in kv])[F.lower(F.col("net_type"))]
    seg = F.array(
        F.struct(F.lit("all").alias("segment_kind"), F.lit("all").alias("segment")),
        F.struct(F.lit("region").alias("segment_kind"), F.when(region != "", region).alias("segment")),
        F.struct(F.lit("net_type").alias("segment_kind"), net.alias("segment")))
    return (df.select("*", F.explode(seg).alias("_seg")).select("*", "_seg.*").drop("_seg")
            .where(F.col("segment").isNotNull()))


def metric_rows(df: DataFrame, metrics: dict[str, tuple[str, str]] = METRICS) -> DataFrame:
    """One row per (segment, metric, connection) that counts for the metric: `arm`, the cluster
    `client_ip`, numerator `y` and denominator `x` (connections with x = 0 — no playback session,
    nothing sent, no request served — have no rate and are left out, as the paper's rates over
    sessions). `metrics`: name → (numerator, denominator) columns (METRICS, or CANARY_METRICS)."""
    arm = F.when(F.col("ab_treatment"), F.lit("treatment")).otherwise(F.lit("control"))
    ms = F.array(*[F.struct(F.lit(m).alias("metric"), F.col(y).cast("long").alias("y"), F.col(x).cast("long").alias("x"))
                   for m, (y, x) in metrics.items()])
    return (segments(df.where(F.col("ab_treatment").isNotNull()))
            .select("segment_kind", "segment", arm.alias("arm"), "client_ip", F.explode(ms).alias("_m"))
            .select("segment_kind", "segment", "_m.metric", "arm", "client_ip", "_m.y", "_m.x")
            .where((F.col("x") > 0) & F.col("y").isNotNull()))


def arm_moments(rows: DataFrame) -> DataFrame:
    """Per (segment, metric, arm): connections, clusters (client addresses) and the cluster-sum
    moments the delta method needs — Σy, Σx, Σy², Σx², Σxy over per-address sums, exact."""
    per_ip = rows.groupBy(*MOMENT_KEYS, "client_ip").agg(
        F.count(F.lit(1)).alias("conns"), F.sum("y").cast(_EXACT).alias("y"), F.sum("x").cast(_EXACT).alias("x"))
    return per_ip.groupBy(*MOMENT_KEYS).agg(
        F.sum("conns").alias("conns"), F.count(F.lit(1)).alias("clusters"),
        F.sum("y").alias("sy"), F.sum("x").alias("sx"),
        F.sum(F.col("y") * F.col("y")).cast(_EXACT).alias("syy"),
        F.sum(F.col("x") * F.col("x")).cast(_EXACT).alias("sxx"),
        F.sum(F.col("x") * F.col("y")).cast(_EXACT).alias("sxy"))


# ---- the estimator (pure Python: the same function runs on numpy sums in the tests) ---------------

@dataclass(frozen=True)
class ArmMoments:
    """Cluster-sum moments of one arm: `conns` connections in `clusters` clusters, and
    Σ_i Y_i, Σ_i X_i, Σ_i Y_i², Σ_i X_i², Σ_i X_i·Y_i over the clusters' sums."""
    conns: int
    clusters: int
    sy: float
    sx: float
    syy: float
    sxx: float
    sxy: float

    @classmethod
    def of_clusters(cls, y: Any, x: Any, conns: int | None = None) -> "ArmMoments":
        """From per-cluster sums Y_i, X_i (array-likes of equal length)."""
        ys, xs = np.asarray(y, dtype=float), np.asarray(x, dtype=float)
        return cls(len(ys) if conns is None else conns, len(ys), float(ys.sum()), float(xs.sum()),
                   float(ys @ ys), float(xs @ xs), float(xs @ ys))

    @property
    def ratio(self) -> float | None:
        return self.sy / self.sx if self.sx > 0 else None

    def ratio_var(self) -> float | None:
        """Delta-method variance of ΣY/ΣX with the cluster as unit: Σ(Y_i − R X_i)² / (n(n−1) X̄²)
        (Σ(Y_i − R X_i) is 0 at R = ΣY/ΣX, so this is the residuals' sample variance over n)."""
        n, r = self.clusters, self.ratio
        if r is None or n < 2:
            return None
        resid = max(self.syy - 2 * r * self.sxy + r * r * self.sxx, 0.0)
        xbar = self.sx / n
        return resid / (n * (n - 1) * xbar * xbar)
