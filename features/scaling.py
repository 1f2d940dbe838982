"""log1p then standardization of the twelve Table 4 features (ALICCS §4.2 "Data cleaning").

Statistics are fitted once on a training window, stored (gold.feature_stats and a JSON artifact
under the data root) and applied unchanged at training and inference time.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from pyspark.sql import DataFrame, functions as F

from ccselect import delta_io, files
from ccselect.contract import FEATURES
from ccselect.lake import connections_in, table_path


@dataclass(frozen=True)
class FeatureStats:
    """mean and (population) standard deviation of log1p(feature), in model order."""
    features: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    n: int
    window: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "FeatureStats":
        d = json.loads(text)
        return cls(tuple(d["features"]), tuple(d["mean"]), tuple(d["std"]), int(d["n"]), d["window"])


def _log1p(c: str):
    # Clip at 0: every feature is a non-negative counter or duration by contract. A missing
    # (imputed) feature stays null (`greatest` would make it 0): fit skips it, transform imputes.
    x = F.col(c).cast("double")
    return F.when(x.isNotNull(), F.log1p(F.greatest(x, F.lit(0.0))))


def fit(df: DataFrame, window: str, features: tuple[str, ...] = FEATURES) -> FeatureStats:
    row = df.select(*[_log1p(f).alias(f) for f in features]).agg(
        F.count(F.lit(1)).alias("_n"),
        *[F.avg(f).alias(f"m_{f}") for f in features],
        *[F.stddev_pop(f).alias(f"s_{f}") for f in features]).collect()[0]
    if not row["_n"]:
        raise ValueError("cannot fit feature statistics on an empty window")
    return FeatureStats(tuple(features), tuple(float(row[f"m_{f}"]) for f in features),
                        tuple(float(row[f"s_{f}"] or 0.0) for f in features), int(row["_n"]), window)


def transform(df: DataFrame, stats: FeatureStats, prefix: str = "z_") -> DataFrame:
    """Add `z_<feature>` = (log1p(x) - mean) / std (std 0 → 1) and `features` (array, model order).
    A missing (imputed) feature is the training mean: z = 0 (silver's `imputed` names it)."""
    cols = []
    for f, m, s in zip(stats.features, stats.mean, stats.std):
        z = (_log1p(f) - F.lit(m)) / F.lit(s if s > 0 and math.isfinite(s) else 1.0)
        cols.append(F.coalesce(z, F.lit(0.0)).alias(prefix + f))
    out = df.select("*", *cols)
    return out.withColumn("features", F.array(*[F.col(prefix + f) for f in stats.features]))


def stats_frame(spark, stats: FeatureStats, fitted_at: str) -> DataFrame:
    rows = [(stats.window, i, f, m, s, stats.n, fitted_at)
            for i, (f, m, s) in enumerate(zip(stats.features, stats.mean, stats.std))]
    return spark.createDataFrame(rows, "window string, idx int, feature string, mean double, std double, "
                                       "n bigint, fitted_at string")


def artifact_path(data_root: str, window: str) -> str:
    """Where a window's statistics are kept: a folder under a local data root, or the object
    store's under an s3a:// one (every host of a cluster reads what training wrote)."""
    return files.join(data_root, "artifacts", "feature_stats", f"{window.replace('..', '_')}.json")


def save(spark, cfg, stats: FeatureStats, fitted_at: str) -> str:
    """Write gold.feature_stats (replacing this window's rows) and the JSON artifact (plus
    `latest.json`); returns the artifact path."""
    delta_io.replace_partitions(stats_frame(spark, stats, fitted_at), table_path(cfg, "gold.feature_stats"),
                                {(stats.window,)}, ("window",))
    path = artifact_path(cfg.data_root, stats.window)
    for p in (path, files.join(path.rsplit("/", 1)[0], "latest.json")):
        files.write_text(cfg, p, stats.to_json())
    return path


def load(path: str, cfg=None) -> FeatureStats:
    """The statistics saved at `path` (a remote path needs the configuration's object store)."""
    if cfg is None:
        with open(path) as fh:
            return FeatureStats.from_json(fh.read())
    return FeatureStats.from_json(files.read_text(cfg, path))


def window_stats(spark, cfg, lo: str, hi: str, save_fitted: bool = False) -> tuple[FeatureStats, str | None, bool]:
    """The feature statistics of the window lo..hi: its saved artifact (`ccs features`), else
    fitted now on silver over the window (unlabelled rows too, §4.2 "Data cleaning") and, with
    `save_fitted`, saved as `ccs features` would. Returns (stats, artifact path or None, fitted now)."""
    window = f"{lo}..{hi}"
    path = artifact_path(cfg.data_root, window)
    if files.exists(cfg, path):
        return load(path, cfg), path, False
    stats = fit(connections_in(spark, cfg, lo, hi), window=window)
    if not save_fitted:
        return stats, None, True
    return stats, save(spark, cfg, stats, datetime.now(timezone.utc).isoformat(timespec="seconds")), True
