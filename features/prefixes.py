"""Per-prefix feature means: the mean feature vector of the rows of each key (a /24, or a (node,
/24) path), in numpy (`prefix_means`) and in Spark (`prefix_means_frame`). The prefix groups
(models/groups.py, models/dataset.py), the in-memory experiment (evaluation/experiment.py) and the
Configanator baseline (models/configanator.py, evaluation/emulate.py) all cluster these means.

numpy order of the keys, which K-means and `np.searchsorted` callers depend on:
- one key array: the order of `np.unique` on it as given (pass `.astype(str)` for string order);
- several: the sorted order of the keys joined with "|" as strings ("node|prefix"), the order of
  `models.dataset.path_ids`.
Sums are `np.add.at` into float64, counts `np.bincount`, means = sums / counts. In Spark the sums
are exact (`features.scaling.exact_sum`): the same means on any partitioning of the rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, functions as F

from ccselect.features.scaling import exact_sum

SEP = "|"


@dataclass(frozen=True)
class PrefixMeans:
    keys: tuple[np.ndarray, ...]   # the unique keys, one array per key argument, aligned with `means`
    means: np.ndarray              # [P, F] float64 mean features per unique key
    counts: np.ndarray             # [P] int64 rows per unique key
    inverse: np.ndarray            # [N] int64 each row's index into keys/means

    def __len__(self) -> int:
        return len(self.counts)


def prefix_means(x: np.ndarray, *keys: np.ndarray) -> PrefixMeans:
    """Per unique key (one key array, or the tuple of several aligned key arrays) of rows x [N, F]:
    the unique keys, the mean features [P, F], the row counts [P] and each row's index [N]."""
    if not keys:
        raise TypeError("prefix_means needs at least one key array")
    if len(keys) == 1:
        uniq, inv = np.unique(keys[0], return_inverse=True)
        inv = inv.reshape(-1).astype(np.int64, copy=False)
        ukeys: tuple[np.ndarray, ...] = (uniq,)
    else:
        joined = pd.Series(np.asarray(keys[0]).astype(str))
        for k in keys[1:]:
            joined = joined + SEP + pd.Series(np.asarray(k).astype(str))
        codes, _ = pd.factorize(joined, sort=True)
        inv = codes.astype(np.int64)
        first = np.unique(inv, return_index=True)[1]
        ukeys = tuple(np.asarray(k)[first] for k in keys)
    counts = np.bincount(inv, minlength=len(ukeys[0])).astype(np.int64, copy=False)
    sums = np.zeros((len(counts), x.shape[1]))
    np.add.at(sums, inv, x)
    return PrefixMeans(ukeys, sums / counts[:, None], counts, inv)


def prefix_means_frame(df: DataFrame, keys, features, prefix: str = "z_") -> DataFrame:
    """One row per `keys`: n_rows and `m_<feature>` = the mean of column `<prefix><feature>` (its
    exact sum rounded once, over its non-null count)."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    agg = df.groupBy(*keys).agg(F.count(F.lit(1)).alias("n_rows"),
                                *[F.count(prefix + f).alias("n_" + f) for f in features],
                                *[exact_sum(prefix + f).alias("s_" + f) for f in features])
    return agg.select(*keys, "n_rows", *[(F.col("s_" + f).cast("double") / F.col("n_" + f)).alias("m_" + f)
                                         for f in features])
