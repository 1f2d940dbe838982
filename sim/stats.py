"""Calibration statistics of a simulated fleet, checked against CALIBRATION.md by the tests and
printed by `make run`. These read the ground truth on purpose: they validate the simulator, they
are not part of any training path.
"""
from __future__ import annotations

import os

import numpy as np
import polars as pl

from ccselect.contract import FEATURES
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.


def _scan(out: str, stream: str) -> pl.LazyFrame:
    return pl.scan_ndjson(os.path.join(out, stream, "*", "*.jsonl"))


def load_joined(out: str) -> pl.DataFrame:
    """Transport log joined with the truth and the QoE beacons (one row per connection)."""
    truth = pl.scan_parquet(os.path.join(out, "_truth", "connections", "*", "*.parquet"))
    qoe = _scan(out, "qoe").select("conn_id", "play_ms", "rebuffer_ms")
    return (_scan(out, "transport").join(truth.drop("node_id"), on="conn_id", how="inner")
            .join(qoe, on="conn_id", how="left").collect())


def purity_of_busy_prefixes(df: pl.DataFrame, min_conns: int = 30) -> np.ndarray:
    """Per IPv4 /24 and hour with at least `min_conns` connections: the share of the dominant
    access type (Wi-Fi vs cellular) — the quantity of ALICCS Fig. 7."""
    g = (df.filter(~pl.col("prefix").str.contains(":"))
         .with_columns(cell=pl.col("net_type") != "wifi")
         .group_by("node_id", "prefix", "hour_start_ms")
         .agg(n=pl.len(), cell=pl.col("cell").mean())
         .filter(pl.col("n") >= min_conns))
    c = g["cell"].to_numpy()
    return np.maximum(c, 1 - c)


def rebuffer_by(df: pl.DataFrame) -> dict[tuple[str, str], float]:
    """Rebuffer rate (stalled / played) per (access class, CC)."""
    g = (df.filter(pl.col("play_ms").is_not_null())
         .with_columns(access=pl.when(pl.col("net_type") == "wifi").then(pl.lit("wifi")).otherwise(pl.lit("cell")))
         .group_by("access", "cc").agg(r=pl.col("rebuffer_ms").sum() / pl.col("play_ms").sum()))
    return {(a, c): float(r) for a, c, r in g.iter_rows()}


def retrans_by(df: pl.DataFrame) -> dict[tuple[str, str], float]:
    g = (df.with_columns(access=pl.when(pl.col("net_type") == "wifi").then(pl.lit("wifi")).otherwise(pl.lit("cell")))
         .group_by("access", "cc").agg(r=pl.col("total_retrans").sum() / pl.col("data_segs_out").sum()))
    return {(a, c): float(r) for a, c, r in g.iter_rows()}


def policer_effect(df: pl.DataFrame) -> dict[str, float]:
    """Cellular connections with enough data to leave slow start: goodput and retransmission
    ratio with and without the token-bucket policer, per CC (ALICCS Observation III)."""
    cell = df.filter((pl.col("net_type") != "wifi") & (pl.col("bytes_acked") > 300_000))
    out = {}
    for cc in ("cubic", "bbr"):
        for pol in (True, False):
            s = cell.filter((pl.col("cc") == cc) & (pl.col("policed") == pol))
            key = f"{cc}_{'policed' if pol else 'free'}"
            mean = s["goodput_mbps"].mean() if s.height else None
            out[f"{key}_goodput_kbps"] = float(mean) * 1000 if mean is not None else float("nan")
            out[f"{key}_retrans"] = float(s["total_retrans"].sum() / max(1, s["data_segs_out"].sum()))
    return out


def labelled_share(out: str) -> float:
    a = _scan(out, "access").select(pl.col("net_type").is_not_null().mean()).collect()
    return float(a.item())


def cross_node_accuracy(out: str, train_share: float = 0.3, seed: int = 0) -> dict[str, object]:
    """A plain classifier (log1p + standardize + MLP, no domain adaptation) trained on the client
    labels of `train_share` of the labelled nodes, evaluated per held-out node against the
    truth: the domain shift ALICCS §3.1 describes should cost it accuracy on some nodes."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    labels = (_scan(out, "access").filter(pl.col("net_type").is_not_null())
              .group_by("conn_id").agg(pl.col("net_type").first()).collect())
    truth = pl.scan_parquet(os.path.join(out, "_truth", "connections", "*", "*.parquet")).select(
        "conn_id", pl.col("net_type").alias("true_type")).collect()
    tr = _scan(out, "transport").select("conn_id", "node_id", *FEATURES).collect()
    labelled_nodes = sorted(labels.join(tr, on="conn_id")["node_id"].unique().to_list())
    rng = np.random.default_rng(seed)
    k = max(1, int(round(train_share * len(tr["node_id"].unique()))))
    train_nodes = sorted(rng.choice(labelled_nodes, size=min(k, len(labelled_nodes)), replace=False).tolist())
    train = tr.filter(pl.col("node_id").is_in(train_nodes)).join(labels, on="conn_id")
    x = train.select(FEATURES).to_numpy().astype(float)
    y = (train["net_type"] == "wifi").to_numpy()
    model = make_pipeline(FunctionTransformer(np.log1p), StandardScaler(),
                          MLPClassifier(hidden_layer_sizes=(32, 16), max_iter=60, early_stopping=True, random_state=seed))
    model.fit(x, y)
    train_acc = float((model.predict(x) == y).mean())
    test = tr.filter(~pl.col("node_id").is_in(train_nodes)).join(truth, on="conn_id")
    pred = model.predict(test.select(FEATURES).to_numpy().astype(float))
    res = test.select("node_id").with_columns(ok=pl.Series(pred == (test["true_type"] == "wifi").to_numpy()))
    per_node = {n: float(a) for n, a in res.group_by("node_id").agg(pl.col("ok").mean()).iter_rows()}
    return {"train_nodes": train_nodes, "train_accuracy": train_acc, "per_node": per_node,
            "mean": float(np.mean(list(per_node.values()))), "worst": float(min(per_node.values()))}
