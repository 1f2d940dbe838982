"""log1p then standardization of the twelve Table 4 features (ALICCS §4.2 "Data cleaning").

Statistics are fitted once on a training window, stored (gold.feature_stats and a JSON artifact
under the data root) and applied unchanged at training and inference time.

Sums that feed a model are exact, so they do not depend on how Spark splits the rows (issue 30):
a double sum is added in the order the partitions arrive, which differs between `local[*]` and a
cluster's executors, and a last-bit difference in a mean grows through training into another
model. `exact_sum` adds each row's value as decimal(38,18) (rounded once, per row, the same on
any partitioning); decimal addition is exact and so order-free. `exact_moments` turns the count,
the sum and the sum of squares into the mean and the population standard deviation in Python's
decimal arithmetic, then rounds once to a float.
"""
from __future__ import annotations

import json
import math
from decimal import Decimal, localcontext
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from pyspark.sql import DataFrame, functions as F

from ccselect import delta_io, files
from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect.hours import Window
from ccselect.lake import FEATURE_STATS, connections_in, table_path


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


#: each row's value as an exact decimal: 20 integer digits (log1p of any counter, a z-score and
#: its square on any window stay far below), 18 fractional (a row's rounding ≤ 5e-19)
EXACT = "decimal(38,18)"


def exact_sum(c):
    """Σ c over the rows, exact and independent of the partitioning (null when all are null)."""
    c = F.col(c) if isinstance(c, str) else c
    return F.sum(c.cast(EXACT))


def exact_square_sum(c):
    """Σ c² over the rows, as `exact_sum` (each square computed in double, then made exact)."""
    c = F.col(c) if isinstance(c, str) else c
    return F.sum((c * c).cast(EXACT))


def exact_moments(n, s, ss) -> tuple[float, float]:
    """(mean, population std) from a count and `exact_sum`/`exact_square_sum` results, in exact
    decimal arithmetic; (0.0, 0.0) when there are no values (then z = log1p(x) where one appears)."""
    if not n or s is None:
        return 0.0, 0.0
    with localcontext() as ctx:
        ctx.prec = 80
        n, s, ss = Decimal(int(n)), Decimal(s), Decimal(ss)
        mean = s / n
        var = max(ss / n - mean * mean, Decimal(0))
        return float(mean), float(var.sqrt())


def _log1p(c: str):
    # Clip at 0: every feature is a non-negative counter or duration by contract. A missing
    # (imputed) feature stays null (`greatest` would make it 0): fit skips it, transform imputes.
    x = F.col(c).cast("double")
    return F.when(x.isNotNull(), F.log1p(F.greatest(x, F.lit(0.0))))


def fit(df: DataFrame, window: str, features: tuple[str, ...] = FEATURES) -> FeatureStats:
    """Mean and population std of each log1p(feature) over the rows (missing values skipped),
    from exact sums: the same statistics however the rows are partitioned."""
    row = df.select(*[_log1p(f).alias(f) for f in features]).agg(
        F.count(F.lit(1)).alias("_n"),
        *[F.count(f).alias(f"n_{f}") for f in features],
        *[exact_sum(f).alias(f"s_{f}") for f in features],
        *[exact_square_sum(f).alias(f"q_{f}") for f in features]).collect()[0]
    if not row["_n"]:
        raise ValueError("cannot fit feature statistics on an empty window")
    moments = [exact_moments(row[f"n_{f}"], row[f"s_{f}"], row[f"q_{f}"]) for f in features]
    return FeatureStats(tuple(features), tuple(m for m, _ in moments), tuple(sd for _, sd in moments),
                        int(row["_n"]), window)


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


def save(spark, cfg: Config, stats: FeatureStats, fitted_at: str) -> str:
    """Write gold.feature_stats (replacing this window's rows) and the JSON artifact (plus
    `latest.json`); returns the artifact path."""
    delta_io.replace_partitions(stats_frame(spark, stats, fitted_at), table_path(cfg, FEATURE_STATS),
                                {(stats.window,)}, ("window",))
    path = artifact_path(cfg.data_root, stats.window)
    for p in (path, files.join(path.rsplit("/", 1)[0], "latest.json")):
        files.write_text(cfg, p, stats.to_json())
    return path


def load(path: str, cfg: Config=None) -> FeatureStats:
    """The statistics saved at `path` (a remote path needs the configuration's object store)."""
    if cfg is None:
        with open(path) as fh:
            return FeatureStats.from_json(fh.read())
    return FeatureStats.from_json(files.read_text(cfg, path))


def window_stats(spark, cfg: Config, window: Window, save_fitted: bool = False) -> tuple[FeatureStats, str | None, bool]:
    """The feature statistics of the window: its saved artifact (`ccs features`), else
    fitted now on silver over the window (unlabelled rows too, §4.2 "Data cleaning") and, with
    `save_fitted`, saved as `ccs features` would. Returns (stats, artifact path or None, fitted now)."""
    path = artifact_path(cfg.data_root, window.name)
    if files.exists(cfg, path):
        return load(path, cfg), path, False
    stats = fit(connections_in(spark, cfg, window), window=window.name)
    if not save_fitted:
        return stats, None, True
    return stats, save(spark, cfg, stats, datetime.now(timezone.utc).isoformat(timespec="seconds")), True
