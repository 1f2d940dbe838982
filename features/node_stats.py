"""Per-node standardization, deployed (issue 55): each node's features standardized over its own
recent traffic, the same way in training, `ccs infer` (both engines), `ccs stream`, the
out-of-domain guard, calibration and distillation.

The table `silver.node_stats` (ccselect.lake.NODE_STATS) holds, per (node, hour), the count of
connections and, per Table 4 feature, the count of known values, the exact sum and the exact sum
of squares of log1p(feature) (`features.scaling.exact_sum`: the same on any partitioning of the
rows). It covers every connection of silver, labelled or not; the label is never read.
jobs/silver.py rebuilds it for the partitions it writes (`write`), so batch ingest and the
stream both keep it, and a re-run of an hour replaces that hour's rows.

The statistics for scoring hour h of node n (`scaling_for`) are the sums over the node's rows of
hours h − hours + 1 … h (`model.node_stats.hours`). The scored hour's own traffic is included:
its silver is written before it is scored (the hourly DAG ingests, then infers; the stream
rebuilds silver, then predictions, of the partitions a micro-batch touched), it is the traffic
the decision is for, and no label takes part. A node with fewer than `min_conns` connections in
that window is standardized with the fleet's statistics the model was trained with, and says so
(`source` "fleet_fallback"; `summary` counts them for the job's report).

Standardization per node of log1p(x): z = (log1p(x) − node mean) / node std, std 0 → 1. A missing
(imputed) value is the fleet's training mean, as under fleet standardization: its z is then
(fleet mean − node mean) / node std, in scoring (`standardize`) and in training (`from_fleet_z`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect.delta_arrow import live_files, local_path
from ccselect.hours import Window, hour_shift
from ccselect.lake import CONNECTIONS, NODE_STATS, table_path
from ccselect.features.scaling import FeatureStats, _log1p, exact_moments, exact_square_sum, exact_sum

KEYS = ("node_id", "hour")
NODE, FALLBACK = "node", "fleet_fallback"


# ---- the table ----------------------------------------------------------------------------------

def hour_stats(conns: DataFrame, features: tuple[str, ...] = FEATURES) -> DataFrame:
    """(node_id, hour, n, n_<f>, s_<f>, q_<f> per feature): the connections, the known values,
    Σ log1p(f) and Σ log1p(f)² (exact decimals) per (node, hour) of silver rows `conns`."""
    logs = conns.select(*KEYS, *[_log1p(f).alias(f) for f in features])
    return logs.groupBy(*KEYS).agg(
        F.count(F.lit(1)).alias("n"),
        *[F.count(f).alias(f"n_{f}") for f in features],
        *[exact_sum(f).alias(f"s_{f}") for f in features],
        *[exact_square_sum(f).alias(f"q_{f}") for f in features])


def write(spark: SparkSession, cfg: Config, keys: set[tuple[str, str]]) -> None:
    """Rebuild silver.node_stats' rows of the (node, hour) `keys` from silver.connections, in one
    commit that replaces them (a key without connections loses its row)."""
    if not keys:
        return
    conns = (spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
             .where(delta_io.partition_predicate(keys)))
    delta_io.replace_partitions(hour_stats(conns), table_path(cfg, NODE_STATS), keys)


# ---- what a champion records --------------------------------------------------------------------

@dataclass(frozen=True)
class NodeStandardization:
    """A node-standardized model's trailing window (hours, the scored hour's included) and the
    minimum of connections in it below which a node is scored with the fleet's statistics."""
    hours: int
    min_conns: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "NodeStandardization":
        d = json.loads(text)
        return cls(int(d["hours"]), int(d["min_conns"]))


@dataclass(frozen=True)
class NodeScaling:
    """The statistics one (node, hour) is standardized with: per feature mean and std of log1p,
    `source` NODE or FALLBACK (the fleet's), and the node's connections in the window."""
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    n: int


# ---- reading it ---------------------------------------------------------------------------------

def read_rows(cfg: Config, window: Window, spark: SparkSession | None = None) -> pd.DataFrame:
    """silver.node_stats' rows of the window's hours (sums as exact `Decimal`s): through Spark when a
    session is given, else from the Delta log's live files (ccselect.delta_arrow, a local lake).
    No table yet: no rows (every node then falls back)."""
    path = table_path(cfg, NODE_STATS)
    if spark is not None:
        if not delta_io.is_delta(spark, path):
            return pd.DataFrame(columns=[*KEYS, "n"])
        return (spark.read.format("delta").load(path).where(F.col("hour").between(window.lo, window.hi))
                .toArrow().to_pandas())
    path = local_path(path)
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return pd.DataFrame(columns=[*KEYS, "n"])
    frames = [pq.read_table(f).to_pandas().assign(node_id=node, hour=hour) for f, node, hour, _ in live_files(path, window)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*KEYS, "n"])


def _clean(std: float) -> float:
    return std if std > 0 and math.isfinite(std) else 1.0


def scaling_for(rows: pd.DataFrame, keys, fleet: FeatureStats, ns: NodeStandardization) -> dict[tuple[str, str], NodeScaling]:
    """For each (node, hour) of `keys`: the node's statistics over hours hour − ns.hours + 1 …
    hour of `rows` (silver.node_stats), summed exactly, or the fleet's (`fleet`) when the node
    has fewer than `ns.min_conns` connections there. A feature the node never had a value of
    keeps the fleet's mean and std."""
    feats = tuple(fleet.features)
    by_node = {n: g for n, g in rows.groupby("node_id")} if len(rows) else {}
    out = {}
    for node, hour in sorted(set(keys)):
        g = by_node.get(node)
        lo = hour_shift(hour, -(int(ns.hours) - 1))
        g = g[(g["hour"] >= lo) & (g["hour"] <= hour)] if g is not None else None
        n = int(g["n"].sum()) if g is not None and len(g) else 0
        if n < int(ns.min_conns) or not n:
            out[(node, hour)] = NodeScaling(tuple(fleet.mean), tuple(fleet.std), FALLBACK, n)
            continue
        mean, std = [], []
        for f, fm, fs in zip(feats, fleet.mean, fleet.std):
            k = int(g[f"n_{f}"].sum())
            if not k:
                mean.append(fm), std.append(fs)
                continue
            s = sum((Decimal(v) for v in g[f"s_{f}"] if v is not None), Decimal(0))
            q = sum((Decimal(v) for v in g[f"q_{f}"] if v is not None), Decimal(0))
            m, sd = exact_moments(k, s, q)
            mean.append(m), std.append(sd)
        out[(node, hour)] = NodeScaling(tuple(mean), tuple(std), NODE, n)
    return out


def lookup(cfg: Config, keys, fleet: FeatureStats, ns: NodeStandardization,
           spark: SparkSession | None = None) -> dict[tuple[str, str], NodeScaling]:
    """`scaling_for` the (node, hour) `keys`, reading only the hours their windows need."""
    keys = sorted(set((str(n), str(h)) for n, h in keys))
    if not keys:
        return {}
    lo = hour_shift(min(h for _, h in keys), -(int(ns.hours) - 1))
    hi = max(h for _, h in keys)
    return scaling_for(read_rows(cfg, Window.hours(lo, hi), spark), keys, fleet, ns)


def summary(table: dict[tuple[str, str], NodeScaling]) -> dict:
    """What the job reports: (node, hour) partitions per source, and the fallen-back ones."""
    back = sorted(f"{n}/{h}" for (n, h), s in table.items() if s.source == FALLBACK)
    return {NODE: sum(s.source == NODE for s in table.values()), FALLBACK: len(back), "fallback_partitions": back}


# ---- standardizing ------------------------------------------------------------------------------

def standardize(cols: list[np.ndarray], scaling: NodeScaling, fleet: FeatureStats) -> np.ndarray:
    """[N, F] float32 z of raw feature columns with one (node, hour)'s statistics: log1p(max(x,
    0)), a missing value at the fleet's mean, then (· − mean) / std. For a FALLBACK scaling this
    is exactly fleet standardization (a missing value: z = 0)."""
    n = len(cols[0]) if cols else 0
    out = np.empty((n, len(cols)), dtype=np.float32)
    for j, (c, fm, m, s) in enumerate(zip(cols, fleet.mean, scaling.mean, scaling.std)):
        v = np.log1p(np.maximum(c.astype(np.float64, copy=False), 0.0))
        v = np.where(np.isnan(v), fm, v)
        out[:, j] = (v - m) / _clean(s)
    return out


def standardize_rows(cols: list[np.ndarray], node: np.ndarray, hour: np.ndarray,
                     table: dict[tuple[str, str], NodeScaling], fleet: FeatureStats) -> np.ndarray:
    """`standardize` of rows from several (node, hour) partitions, each with its own scaling."""
    n = len(cols[0]) if cols else 0
    out = np.empty((n, len(cols)), dtype=np.float32)
    keys = pd.MultiIndex.from_arrays([np.asarray(node).astype(str), np.asarray(hour).astype(str)])
    codes, uniq = pd.factorize(keys)
    for i, key in enumerate(uniq):
        m = codes == i
        out[m] = standardize([c[m] for c in cols], table[tuple(key)], fleet)
    return out


def from_fleet_z(x: np.ndarray, node: np.ndarray, hour: np.ndarray,
                 table: dict[tuple[str, str], NodeScaling], fleet: FeatureStats) -> np.ndarray:
    """Training rows standardized with the fleet's statistics (`features.scaling.transform`, a
    missing value z = 0) → the same rows standardized per (node, hour) as `standardize` does:
    log1p(x) = z · fleet std + fleet mean, then the node's. Rows of a FALLBACK scaling stay as
    they are."""
    out = np.array(x, dtype=np.float32, copy=True)
    fm = np.asarray(fleet.mean, dtype=np.float64)
    fs = np.array([_clean(s) for s in fleet.std])
    keys = pd.MultiIndex.from_arrays([np.asarray(node).astype(str), np.asarray(hour).astype(str)])
    codes, uniq = pd.factorize(keys)
    for i, key in enumerate(uniq):
        sc = table[tuple(key)]
        if sc.source == FALLBACK:
            continue
        m = codes == i
        logs = x[m].astype(np.float64) * fs + fm
        out[m] = (logs - np.asarray(sc.mean)) / np.array([_clean(s) for s in sc.std])
    return out
