"""What distillation and diagnosis read: the labelled connections of a training window (the
balanced gold.training_set, ALICCS §3.2 "all features from the training set"), with both the raw
Table 4 features (the tree's input: its rules read in bytes and microseconds) and the same
features standardized with the champion's statistics (the DNN's input), through Arrow.

A per-node standardized champion (`node_std`) sees each row standardized per (node, hour) over
the node's trailing traffic (features/node_stats.py), as `ccs infer` scores it: `z` is that, so
the tree is distilled from (and its fidelity measured against) the model as it is deployed. The
tree itself still reads raw bytes and microseconds, fleet-wide: it approximates the champion's
decisions without the per-node shift, and its fidelity says how far that holds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyspark.sql import functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import FEATURES
from ccselect.hours import Window
from ccselect.lake import TRAINING_SET, connections_in, table_path
from ccselect.features import labels, node_stats, scaling


@dataclass
class WindowRows:
    """Rows of one window, aligned: raw [N, 12] float64 and z [N, 12] float32 (model order),
    label int8 (1 Wi-Fi, 0 4G/5G), and the keys subsets are cut by."""

    raw: np.ndarray
    z: np.ndarray
    label: np.ndarray
    prefix16: np.ndarray
    prefix24: np.ndarray
    client_ip: np.ndarray
    node: np.ndarray
    conn_id: np.ndarray
    window: str

    def __len__(self) -> int:
        return len(self.label)

    def take(self, idx: np.ndarray) -> "WindowRows":
        return WindowRows(self.raw[idx], self.z[idx], self.label[idx], self.prefix16[idx], self.prefix24[idx],
                          self.client_ip[idx], self.node[idx], self.conn_id[idx], self.window)


def training_rows(spark, cfg: Config, window: Window):
    """gold.training_set for the window; when that window was never written, the same
    selection (labelled, balanced 50% 4G) over silver.connections."""


    path = table_path(cfg, TRAINING_SET)
    if delta_io.is_delta(spark, path):
        df = spark.read.format("delta").load(path).where(F.col("window") == window.name)
        if df.limit(1).count():
            return df
    return labels.training_set(connections_in(spark, cfg, window), 0.5)


def load_window(spark, cfg: Config, window: Window, stats, node_std=None) -> WindowRows:
    """The window's labelled rows, standardized with `stats` (features/scaling.py, the champion's),
    and with `node_std` (the champion's NodeStandardization) per (node, hour) on top."""

    df = scaling.transform(training_rows(spark, cfg, window), stats)
    cols = ["conn_id", "node_id", "hour", "client_ip", "prefix16", "prefix24", "label",
            *FEATURES, *[f"z_{f}" for f in stats.features]]
    pdf = df.select(*cols).orderBy("node_id", "conn_id").toPandas()
    z = pdf[[f"z_{f}" for f in stats.features]].to_numpy(dtype=np.float32)
    if node_std is not None and len(pdf):
        node, hour = pdf["node_id"].astype(str).to_numpy(), pdf["hour"].astype(str).to_numpy()
        table = node_stats.lookup(cfg, set(zip(node, hour)), stats, node_std, spark)
        z = node_stats.from_fleet_z(z, node, hour, table, stats)
    return WindowRows(
        raw=pdf[list(FEATURES)].to_numpy(dtype=np.float64),
        z=z,
        label=pdf["label"].to_numpy(dtype=np.int8),
        prefix16=pdf["prefix16"].fillna("").to_numpy(dtype=object),
        prefix24=pdf["prefix24"].fillna("").to_numpy(dtype=object),
        client_ip=pdf["client_ip"].to_numpy(dtype=object),
        node=pdf["node_id"].to_numpy(dtype=object),
        conn_id=pdf["conn_id"].to_numpy(dtype=object),
        window=window.name,
    )
