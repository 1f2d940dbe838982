"""Prefix groups, the discriminators' targets (ALICCS §3.1 "Scalability with domain
knowledge-assisted clustering", Fig. 6): the labelled rows are split by network type (Y = 0 4G,
Y = 1 Wi-Fi), and within each type Spark MLlib K-means (Euclidean) clusters the /24 prefixes by
the mean of their standardized features. D0 then predicts a 4G row's group, D1 a Wi-Fi row's.

K per type comes from the configuration (`model.groups.k`); when it is null, each type's K is the
one in `model.groups.k_range` with the highest silhouette (MLlib's ClusteringEvaluator, squared
Euclidean), and the summary reports every score. Results go to gold.prefix_groups
(window, label, prefix24, group, k, n_rows, chosen_by), replaced per window.

`prefix24` is the path unit: the /24 of an IPv4 client, the /48 of an IPv6 one (models/dataset.py).
"""
from __future__ import annotations

import logging

import pandas as pd
from pyspark.ml.clustering import KMeans
from pyspark.ml.evaluation import ClusteringEvaluator
from pyspark.ml.functions import array_to_vector
from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect.hours import Window
from ccselect.lake import PREFIX_GROUPS, table_path, write_window
from ccselect.features.prefixes import prefix_means_frame
from ccselect.features.scaling import FeatureStats
from ccselect.models.dataset import standardized, training_frame

log = logging.getLogger(__name__)

TABLE = PREFIX_GROUPS
TYPES = {0: "4g", 1: "wifi"}


def prefix_vectors(df: DataFrame, features: tuple[str, ...]) -> DataFrame:
    """Per (label, prefix24): row count and the mean standardized feature vector `vec`."""
    agg = prefix_means_frame(df, ["label", "prefix24"], features, prefix="z_")
    return agg.select("label", "prefix24", "n_rows",
                      array_to_vector(F.array(*[F.col("m_" + f) for f in features])).alias("vec"))


def _kmeans(means: DataFrame, k: int, seed: int):
    return KMeans(k=k, seed=seed, featuresCol="vec", predictionCol="group",
                  distanceMeasure="euclidean", maxIter=50).fit(means)


def cluster_type(means: DataFrame, n_prefixes: int, k: int | None, k_range, seed: int) -> tuple[DataFrame, dict]:
    """K-means over one type's per-/24 means → (label, prefix24, group, n_rows) and how K came."""
    info: dict = {"n_prefixes": n_prefixes}
    if n_prefixes < 2:          # nothing to split: one group
        info.update(k=1, chosen_by="single prefix" if n_prefixes else "no prefix")
        return means.select("label", "prefix24", F.lit(0).alias("group"), "n_rows"), info
    # a few hundred /24 means: one partition, cached, so each K-means iteration is one small task;
    # in the prefixes' order, so that k-means||'s seeded draws (per partition index) and Lloyd's
    # sums see the same points in the same order on any cluster (issue 30)
    means = means.repartition(1).sortWithinPartitions("label", "prefix24").cache()
    if k is not None:
        kk = max(1, min(int(k), n_prefixes))
        info.update(k=kk, chosen_by="config" if kk == int(k) else f"config {k} capped at the prefix count")
        model = _kmeans(means, kk, seed) if kk > 1 else None
    else:
        lo, hi = int(k_range[0]), int(k_range[1])
        cands = [c for c in range(max(2, lo), min(hi, n_prefixes - 1) + 1)] or [min(2, n_prefixes)]
        ev = ClusteringEvaluator(featuresCol="vec", predictionCol="group", metricName="silhouette",
                                 distanceMeasure="squaredEuclidean")
        scores, models = {}, {}
        for c in cands:
            models[c] = _kmeans(means, c, seed)
            # silhouette is undefined when K-means left a single non-empty cluster
            non_empty = sum(1 for n in models[c].summary.clusterSizes if n > 0)
            scores[c] = ev.evaluate(models[c].transform(means)) if non_empty > 1 else float("-inf")
        best = max(cands, key=lambda c: (scores[c], -c))
        model = models[best]
        info.update(k=best, chosen_by="silhouette", silhouette={str(c): round(s, 4) for c, s in scores.items()})
    out = (model.transform(means) if model is not None else means.withColumn("group", F.lit(0)))
    return out.select("label", "prefix24", F.col("group").cast("int").alias("group"), "n_rows"), info


def compute_groups(spark: SparkSession, cfg: Config, window: Window, stats: FeatureStats,
                   k: int | None = None, nodes=None) -> tuple[pd.DataFrame, dict]:
    """The groups of the window (rows of `nodes` only, when given) as pandas
    (label, prefix24, group, k, n_rows, chosen_by) and a summary per type; writes nothing."""
    s = cfg.settings.model.groups
    k = s.k if k is None else k
    df = training_frame(spark, cfg, window)
    if nodes is not None:
        df = df.where(F.col("node_id").isin(*sorted(nodes)))
    means = prefix_vectors(standardized(df, stats), tuple(stats.features)).cache()
    counts = {int(r["label"]): int(r["count"]) for r in means.groupBy("label").count().collect()}
    parts, summary = [], {"window": window.name, "k_config": s.k if k is None else k,
                          "k_range": list(s.k_range), "seed": s.seed, "types": {}}
    for t, name in TYPES.items():
        out, info = cluster_type(means.where(F.col("label") == t), counts.get(t, 0), k, s.k_range, s.seed)
        pdf = out.toPandas()
        pdf["k"] = info["k"]
        pdf["chosen_by"] = info["chosen_by"]
        info["sizes"] = {str(g): int(n) for g, n in pdf.groupby("group")["prefix24"].count().items()}
        info["n_rows"] = int(pdf["n_rows"].sum()) if len(pdf) else 0
        summary["types"][name] = info
        log.info("prefix groups %s: K=%s (%s) over %d prefixes", name, info["k"], info["chosen_by"], info["n_prefixes"])
        parts.append(pdf)
    means.unpersist()
    cols = ["label", "prefix24", "group", "k", "n_rows", "chosen_by"]
    pdf = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
    pdf = pdf.sort_values(["label", "prefix24"]).reset_index(drop=True)
    return pdf, summary


SCHEMA = "label int, prefix24 string, group int, k int, n_rows long, chosen_by string"


def fit_groups(spark: SparkSession, cfg: Config, window: Window, stats: FeatureStats,
               k: int | None = None, nodes=None) -> dict:
    """Cluster the window's /24s per type and replace that window in gold.prefix_groups;
    returns the summary (per type: K, how it was chosen, silhouettes, sizes) plus `rows`."""
    pdf, summary = compute_groups(spark, cfg, window, stats, k, nodes)
    df = spark.createDataFrame(pdf.astype({"label": "int32", "group": "int32", "k": "int32", "n_rows": "int64"}),
                               SCHEMA)
    summary["rows"] = write_window(spark, cfg, df, TABLE, summary["window"])
    summary["table"] = table_path(cfg, TABLE)
    return summary


def load_groups(spark: SparkSession, cfg: Config, window: str) -> pd.DataFrame:
    """gold.prefix_groups of `window` as pandas (label, prefix24, group, k)."""
    df = (spark.read.format("delta").load(table_path(cfg, TABLE)).where(F.col("window") == window)
          .select("label", "prefix24", "group", "k"))
    return df.toPandas().sort_values(["label", "prefix24"]).reset_index(drop=True)
