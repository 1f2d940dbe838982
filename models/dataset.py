"""The labelled rows of a training window as NumPy arrays for PyTorch (ALICCS §3.1, §4.2).

`load_labelled` reads gold.training_set for a `ccselect.hours.Window` (or, when that window was never
written, builds it from silver with `features.labels.training_set`), standardizes the twelve
Table 4 features with the window's fitted `FeatureStats` in Spark, and collects through Arrow
(`DataFrame.toArrow`), never row at a time.

The path unit is the client's /24 (IPv4) or /48 (IPv6, whose `prefix24` is null in silver): the
`prefix24` array holds whichever applies, as in ALICCS §3.1 ("requests with the same IP /24
prefix usually follow identical IP paths").

`to_train_data` turns those arrays plus the prefix groups (gold.prefix_groups, models/groups.py)
into `models.train.TrainData`:
- `prefix`: integer id of the (node, /24) pair — a path is a prefix *seen from one node*, so the
  same /24 on two nodes is two paths for L_variance (eq. 3);
- `group`: the /24's group within its own network type; a /24 without a stored group gets the
  group whose centroid (mean of its members' per-/24 means in these rows) is nearest to its own
  per-/24 mean (Euclidean, as the K-means that made the groups); a type with no groups at all
  puts every row in group 0.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.lake import TRAINING_SET, connections_in, table_path
from ccselect.features.labels import training_set
from ccselect.features.prefixes import prefix_means
from ccselect.features.scaling import FeatureStats, exact_moments, exact_square_sum, exact_sum, transform
from ccselect.models.train import TrainData


def path_prefix():
    """silver's path unit: the /24 of an IPv4 client, the /48 of an IPv6 one."""
    return F.coalesce(F.col("prefix24"), F.col("prefix48"))


@dataclass
class Labelled:
    """Labelled connections of a window: x float32 [N, 12] standardized (model order), y int8
    (1 Wi-Fi, 0 4G/5G), and per row its /24 (or /48), node, hour and connection id."""

    x: np.ndarray
    y: np.ndarray
    prefix24: np.ndarray
    node: np.ndarray
    hour: np.ndarray
    conn_id: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, mask: np.ndarray) -> "Labelled":
        """The rows where `mask` (boolean [N] or integer indices) selects."""
        return Labelled(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def of_nodes(self, nodes) -> "Labelled":
        return self.subset(np.isin(self.node, np.asarray(list(nodes), dtype=object)))


def training_frame(spark: SparkSession, cfg: Config, window: hours.Window, balanced: bool = True) -> DataFrame:
    """gold.training_set's rows of the window (as `ccs_train` wrote them), or the same set
    built from silver when that window has never been written: balanced to
    `pipeline.cellular_share`, or every labelled connection when that is null. With
    `balanced=False`: every labelled connection of the window (from silver, nothing
    downsampled)."""
    if not balanced:
        return training_set(connections_in(spark, cfg, window), None)
    path = table_path(cfg, TRAINING_SET)
    if delta_io.is_delta(spark, path):
        df = spark.read.format("delta").load(path).where(F.col("window") == window.name)
        if df.limit(1).count():
            return df
    return training_set(connections_in(spark, cfg, window), cfg.settings.pipeline.cellular_share)


def standardized(df: DataFrame, stats: FeatureStats) -> DataFrame:
    """(conn_id, node_id, hour, prefix24 = path unit, label, z_<feature>...) of labelled rows."""
    z = transform(df.filter(F.col("label").isNotNull()), stats)
    return z.select("conn_id", "node_id", "hour", path_prefix().alias("prefix24"),
                    F.col("label").cast("byte").alias("label"),
                    *[F.col("z_" + f).cast("float").alias("z_" + f) for f in stats.features])


def from_arrow(table, features: tuple[str, ...]) -> Labelled:
    """A `Labelled` from an Arrow table with the columns of `standardized`, rows in conn_id order
    (Spark gives no row order, so fix one for reproducible training)."""
    pdf = table.to_pandas()
    pdf = pdf.sort_values(["node_id", "hour", "conn_id"], kind="stable").reset_index(drop=True)
    x = pdf[["z_" + f for f in features]].to_numpy(dtype=np.float32) if len(pdf) else \
        np.zeros((0, len(features)), dtype=np.float32)
    as_str = lambda c: pdf[c].astype(object).to_numpy()  # noqa: E731
    return Labelled(x=np.ascontiguousarray(x), y=pdf["label"].to_numpy(dtype=np.int8),
                    prefix24=as_str("prefix24"), node=as_str("node_id"), hour=as_str("hour"),
                    conn_id=as_str("conn_id"))


def window_nodes(spark: SparkSession, cfg: Config, window: hours.Window) -> list[str]:
    """Every node with connections in silver over the window (labelled or not)."""
    return sorted(r["node_id"] for r in connections_in(spark, cfg, window).select("node_id").distinct().collect())


def load_labelled(spark: SparkSession, cfg: Config, window: hours.Window, stats: FeatureStats,
                  nodes=None, balanced: bool = True) -> Labelled:
    """The labelled rows of the window (optionally only `nodes`), standardized with `stats`:
    the training set, or with `balanced=False` every labelled connection."""
    df = training_frame(spark, cfg, window, balanced)
    if nodes is not None:
        df = df.where(F.col("node_id").isin(*sorted(nodes)))
    return from_arrow(standardized(df, stats).toArrow(), tuple(stats.features))


@dataclass
class Unlabelled:
    """Every node's connections of a window, labelled or not, standardized with the window's
    stats: at most `per_node` rows a node (drawn by a hash of conn_id, so the same each run), and
    per node the mean and standard deviation of its standardized features over *all* its rows
    in the window (issue 28: node domains, and per-node standardization)."""

    x: np.ndarray            # [N, F] float32
    node: np.ndarray         # [N] node id (object)
    nodes: list              # every node of the window, sorted
    node_mean: dict          # node -> [F] mean of its standardized features
    node_std: dict           # node -> [F] (population) std of them
    hour: np.ndarray | None = None   # [N] each row's hour (per-(node, hour) standardization)

    def node_index(self, node: np.ndarray) -> np.ndarray:
        """Index of each row's node in `nodes` (-1: not a node of the window)."""
        pos = {n: i for i, n in enumerate(self.nodes)}
        return np.array([pos.get(str(n), -1) for n in node], dtype=np.int64)

    def per_node_standardized(self, x: np.ndarray, node: np.ndarray) -> np.ndarray:
        """x re-standardized per node: (x − its node's mean) / its node's std (std 0 → 1); a
        row of a node without statistics is left as it is."""
        out = np.array(x, dtype=np.float32, copy=True)
        for n in set(map(str, node)):
            if n not in self.node_mean:
                continue
            m = np.asarray(node == n)
            sd = np.where(self.node_std[n] > 0, self.node_std[n], 1.0)
            out[m] = (x[m] - self.node_mean[n]) / sd
        return out


def load_unlabelled(spark: SparkSession, cfg: Config, window: hours.Window, stats: FeatureStats,
                    per_node: int = 3000) -> Unlabelled:
    """The window's connections of every node (labelled or not) for node-domain training and
    per-node standardization (`Unlabelled`). The labels are never read."""
    feats = tuple(stats.features)
    z = transform(connections_in(spark, cfg, window), stats)
    # one pass: each node's statistics over all its rows ride along on its sampled rows
    # (exact sums: the same statistics however Spark partitions the rows, features/scaling.py)
    whole = Window.partitionBy("node_id")
    w = Window.partitionBy("node_id").orderBy(F.xxhash64("conn_id"), "conn_id")
    sample = (z.select("node_id", "hour", "conn_id", *[F.col("z_" + f).cast("float").alias("z_" + f) for f in feats],
                       F.count(F.lit(1)).over(whole).alias("_n"),
                       *[exact_sum("z_" + f).over(whole).alias("s_" + f) for f in feats],
                       *[exact_square_sum("z_" + f).over(whole).alias("q_" + f) for f in feats],
                       F.row_number().over(w).alias("_r"))
              .where(F.col("_r") <= int(per_node)).drop("_r"))
    pdf = sample.toArrow().to_pandas().sort_values(["node_id", "conn_id"], kind="stable")
    first = pdf.drop_duplicates("node_id")
    node_mean, node_std = {}, {}
    for _, r in first.iterrows():
        moments = [exact_moments(r["_n"], r["s_" + f], r["q_" + f]) for f in feats]
        node_mean[r["node_id"]] = np.array([m for m, _ in moments], dtype=np.float32)
        node_std[r["node_id"]] = np.array([sd for _, sd in moments], dtype=np.float32)
    pdf = pdf.drop(columns=["_n", *["s_" + f for f in feats], *["q_" + f for f in feats]])
    x = pdf[["z_" + f for f in feats]].to_numpy(dtype=np.float32) if len(pdf) else np.zeros((0, len(feats)), np.float32)
    return Unlabelled(np.ascontiguousarray(x), pdf["node_id"].astype(object).to_numpy(),
                      sorted(node_mean), node_mean, node_std, pdf["hour"].astype(object).to_numpy())


# -- to the trainer's arrays ---------------------------------------------------------------------
def path_ids(node: np.ndarray, prefix24: np.ndarray) -> np.ndarray:
    """Integer id per (node, prefix) pair, dense from 0, in sorted order of the pairs."""
    keys = pd.Series(node.astype(str)) + "|" + pd.Series(prefix24.astype(str))
    codes, _ = pd.factorize(keys, sort=True)
    return codes.astype(np.int64)


def assign_groups(x: np.ndarray, prefix24: np.ndarray, known: dict[str, int]) -> np.ndarray:
    """Each row's group for rows of one network type: the stored group of its /24, else the
    nearest centroid's (centroids = mean of the member /24s' means among these rows)."""
    group = np.zeros(len(x), dtype=np.int64)
    if not len(x) or not known:
        return group
    pm = prefix_means(x, prefix24.astype(str))
    uniq, means = pm.keys[0], pm.means
    g_of = np.array([known.get(p, -1) for p in uniq], dtype=np.int64)
    have = g_of >= 0
    if (~have).any() and have.any():
        gids = np.unique(g_of[have])
        cents = np.stack([means[g_of == g].mean(0) for g in gids])
        d = ((means[~have, None, :] - cents[None, :, :]) ** 2).sum(-1)
        g_of[~have] = gids[d.argmin(1)]
    g_of[g_of < 0] = 0
    return g_of[pm.inverse]


def to_train_data(labelled: Labelled, groups_pd: pd.DataFrame) -> tuple[TrainData, np.ndarray]:
    """(TrainData, node per row) from labelled rows and a (label, prefix24, group[, k]) frame."""
    group = np.zeros(len(labelled), dtype=np.int64)
    n_groups = []
    for t in (0, 1):
        g = groups_pd[groups_pd["label"].astype(int) == t]
        k = int(g["k"].max()) if "k" in g and len(g) else int(g["group"].max()) + 1 if len(g) else 1
        n_groups.append(max(1, k))
        m = labelled.y == t
        group[m] = assign_groups(labelled.x[m], labelled.prefix24[m],
                                 dict(zip(g["prefix24"].astype(str), g["group"].astype(int))))
    data = TrainData(x=labelled.x, y=labelled.y.astype(np.int64),
                     prefix=path_ids(labelled.node, labelled.prefix24), group=group,
                     n_groups=(n_groups[0], n_groups[1]))
    return data, labelled.node
