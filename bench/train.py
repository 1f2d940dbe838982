"""bench/train: wall time to train the ALICCS classifier (variant `aliccs`, TrainParams defaults)
on 500,000 labelled rows on 2 CPU cores, and the plain MLP on the same rows for the ratio
(the GAN/RSC/variance terms' cost). Issue 4 "Must show".

The rows come from a simulated fleet (`ccs simulate`, 20 nodes × 25 h × 5,600 connections an
hour ≈ 2.8 M connections, of which ≈ 18% carry a client-reported network type), read straight from
its transport and access logs with polars — the same labelled rows silver would hold (a
connection's label is its access log's `net_type`), not balanced. 500,000 of them are drawn
(seeded); standardization (log1p, z) and the prefix groups (K-means per type over per-/24
means, sklearn, K = 8) are set-up, not timed. Only `models.train.fit` is timed, with
`torch.set_num_threads(2)`.

    .venv/bin/python bench/train.py [--fleet DIR] [--rows 500000] [--epochs N] [--out FILE]

Writes var/bench/train.json (or --out) and prints it.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ccselect.contract import FEATURES  # noqa: E402
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): polars, sklearn, torch, and our modules that load them.

SIM = {"nodes": 20, "hours": 25, "conns_per_node_hour": 5600, "seed": 1}


def simulate(out: str) -> dict:
    from ccselect.sim.fleet import simulate as sim
    t = time.perf_counter()
    m = sim(SimParams(**SIM), out, workers=2, progress=False)
    return {"wall_s": round(time.perf_counter() - t, 1), "counts": m["counts"], **SIM}


def _path_unit(ip: str) -> str:
    if ":" in ip:
        return str(ipaddress.IPv6Network(f"{ip}/48", strict=False).network_address) + "/48"
    return ip.rsplit(".", 1)[0] + ".0/24"


def load_rows(fleet: str):
    """(raw features [N, 12], y, node, prefix) of the fleet's labelled connections."""
    import polars as pl
    labels = (pl.scan_ndjson(os.path.join(fleet, "access", "*", "*.jsonl"))
              .select("conn_id", "net_type").filter(pl.col("net_type").is_in(["wifi", "4g", "5g"]))
              .group_by("conn_id").agg(pl.col("net_type").first()))
    tr = (pl.scan_ndjson(os.path.join(fleet, "transport", "*", "*.jsonl"))
          .select("conn_id", "node_id", "client_ip", *FEATURES))
    df = tr.join(labels, on="conn_id", how="inner").sort("node_id", "conn_id").collect()
    ips = df["client_ip"].unique()
    pfx = pl.DataFrame({"client_ip": ips, "prefix": [_path_unit(i) for i in ips.to_list()]})
    df = df.join(pfx, on="client_ip", how="left")
    return (df.select(FEATURES).to_numpy().astype(np.float64), (df["net_type"] == "wifi").to_numpy().astype(np.int64),
            df["node_id"].to_numpy().astype(object), df["prefix"].to_numpy().astype(object))


def train_data(raw, y, node, prefix, k: int, seed: int):
    from sklearn.cluster import KMeans

    from ccselect.models.dataset import path_ids
    from ccselect.models.train import TrainData
    z = np.log1p(np.maximum(raw, 0.0))
    x = ((z - z.mean(0)) / np.where(z.std(0) > 0, z.std(0), 1.0)).astype(np.float32)
    pid = path_ids(node, prefix)
    group = np.zeros(len(y), dtype=np.int64)
    ks = []
    for t in (0, 1):   # ALICCS §3.1: per network type, K-means over the per-/24 means
        m = y == t
        uniq, inv = np.unique(prefix[m].astype(str), return_inverse=True)
        sums = np.zeros((len(uniq), x.shape[1]))
        np.add.at(sums, inv, x[m])
        kt = max(1, min(k, len(uniq)))
        group[m] = KMeans(kt, n_init=2, random_state=seed).fit(sums / np.bincount(inv)[:, None]).labels_[inv]
        ks.append(kt)
    return TrainData(x=x, y=y, prefix=pid, group=group, n_groups=(ks[0], ks[1]))


def time_fit(params, data) -> dict:
    from ccselect.models.train import fit
    epochs = []
    last = [time.perf_counter()]

    def on_epoch(e, m):
        now = time.perf_counter()
        epochs.append(round(now - last[0], 2))
        last[0] = now
    t = time.perf_counter()
    trainer = fit(params, data, on_epoch)
    wall = time.perf_counter() - t
    acc = trainer.evaluate(data.x[:100_000], data.y[:100_000])["accuracy"]
    return {"wall_s": round(wall, 2), "epochs": params.epochs, "epoch_s": epochs,
            "rows_per_s": round(len(data.y) * params.epochs / wall), "train_accuracy_first_100k": round(acc, 4),
            "params": params.to_dict()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", help="a `ccs simulate` folder to read instead of simulating one")
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--epochs", type=int, default=None, help="default: TrainParams' epochs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", default="aliccs,mlp")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "var", "bench", "train.json"))
    a = ap.parse_args(argv)

    import torch

    from ccselect.models.train import TrainParams
    torch.set_num_threads(a.threads)
    result: dict = {"bench": "train", "goal": f"wall time to train on {a.rows:,} labelled rows on 2 CPU cores",
                    "cpu": platform.processor() or platform.machine(), "cores_visible": os.cpu_count(),
                    "torch_threads": a.threads, "device": a.device}
    tmp = None
    fleet = a.fleet
    if not fleet:
        tmp = fleet = tempfile.mkdtemp(prefix="ccs-bench-train-")
        print(f"simulating {SIM} into {fleet}", file=sys.stderr)
        result["simulate"] = simulate(fleet)
    try:
        t = time.perf_counter()
        raw, y, node, prefix = load_rows(fleet)
        result["labelled_rows_available"] = int(len(y))
        result["load_s"] = round(time.perf_counter() - t, 1)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    n = min(a.rows, len(y))
    idx = np.sort(np.random.default_rng(0).choice(len(y), size=n, replace=False))
    data = train_data(raw[idx], y[idx], node[idx], prefix[idx], k=8, seed=0)
    result.update(rows=int(n), wifi_share=round(float(data.y.mean()), 4), n_groups=list(data.n_groups),
                  paths=int(data.prefix.max() + 1))
    params = TrainParams(seed=0, device=a.device)
    if a.epochs:
        params = replace(params, epochs=a.epochs)
    result["variants"] = {}
    for v in a.variants.split(","):
        print(f"training {v} on {n:,} rows, {params.epochs} epochs", file=sys.stderr)
        result["variants"][v] = time_fit(replace(params, variant=v), data)
    if {"aliccs", "mlp"} <= set(result["variants"]):
        result["aliccs_over_mlp"] = round(result["variants"]["aliccs"]["wall_s"] / result["variants"]["mlp"]["wall_s"], 2)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
