"""bench/handshake_window: how much of the access type the client's first window carries (issue 55).

On a default simulated fleet (20 nodes × 48 h, four hours a node sampled, the simulator's truth), a
depth-6 tree learns Wi-Fi against cellular on half of the nodes and is scored on the other half
(ALICCS §5.1's cross-node split), from the handshake features alone: the MSS, the window, both,
and both with the SYN-ACK→ACK time (the handshake tree's three features). Balanced accuracy, the
mean over `--splits` random halvings of the nodes, with a node-bootstrap 95% interval (the held-out
nodes resampled with replacement).

Three windows side by side, on the same connections:
- `grounded`: the simulator's (sim/stacks.py: each OS's rule from its buffer and its own MSS);
- `per_type_tables`: the per-type draws it replaced, recomputed here for the comparison (43,690
  only for Android on cellular, 87,380 only on Wi-Fi, ...);
- the grounded window along `android_legacy_kernel_share` (0, 0.1, 0.2, 0.4) and with the named
  knob `legacy_radio_buffer_share` = 1.

    .venv/bin/python bench/handshake_window.py [--splits 5] [--out bench/results/handshake_window.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ccselect.sim.params import SimParams  # noqa: E402
from ccselect.sim.traffic import generate_node_hour  # noqa: E402
from ccselect.sim.world import World  # noqa: E402
# Imported inside the functions that use them (heavy, not needed to import this module): sklearn.

SUBSETS = {"mss": ["mss_bytes"], "window": ["init_snd_wnd_bytes"], "mss+window": ["mss_bytes", "init_snd_wnd_bytes"],
           "mss+window+connection_time": ["mss_bytes", "init_snd_wnd_bytes", "connection_time_us"],
           "mss+connection_time": ["mss_bytes", "connection_time_us"]}
# the per-type tables of sim/traffic.py before 2026-11-28 (values, probabilities), for the comparison
_OLD = {"android_wifi": ([65160, 87380, 131072], [0.6, 0.2, 0.2]),
        "android_cell": ([29200, 65160, 43690], [0.45, 0.35, 0.2]),
        "ios": ([65535, 131072], [0.7, 0.3]), "pc": ([64240, 65535, 29200], [0.5, 0.3, 0.2])}


def fleet(params: SimParams) -> pl.DataFrame:
    world = World(params)
    frames = []
    for node in range(params.nodes):
        for hour in range(0, params.hours, max(1, params.hours // 4)):
            nh = generate_node_hour(world, node, hour)
            frames.append(nh.transport.select("conn_id", "node_id", "mss_bytes", "init_snd_wnd_bytes",
                                              "connection_time_us")
                          .join(nh.truth.select("conn_id", "net_type"), on="conn_id"))
    return pl.concat(frames)


def per_type_tables(df: pl.DataFrame, seed: int) -> np.ndarray:
    """The replaced draw: the window from per-(OS, type) tables. The OS mix is the simulator's
    (about 70% Android; PCs on broadband only), drawn here with its own generator."""
    rng = np.random.default_rng(seed)
    cell = (df["net_type"] != "wifi").to_numpy()
    u = rng.random(len(df))
    android = u < 0.7
    pc = (~cell) & (u > 0.94)

    def draw(key):
        v, p = _OLD[key]
        return np.array(v)[rng.choice(len(v), size=len(df), p=p)]
    return np.where(android, np.where(cell, draw("android_cell"), draw("android_wifi")),
                    np.where(pc, draw("pc"), draw("ios")))


def scores(df: pl.DataFrame, splits: int, boot: int = 200) -> dict:
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.tree import DecisionTreeClassifier
    y = (df["net_type"] == "wifi").to_numpy().astype(int)
    node = df["node_id"].to_numpy()
    nodes = np.unique(node)
    out = {}
    for name, cols in SUBSETS.items():
        x = df.select(cols).to_numpy()
        accs, boots = [], []
        for seed in range(splits):
            rng = np.random.default_rng(seed)
            train = np.isin(node, rng.choice(nodes, len(nodes) // 2, replace=False))
            tree = DecisionTreeClassifier(max_depth=6, min_samples_leaf=20, class_weight="balanced", random_state=0)
            tree.fit(x[train], y[train])
            pred = tree.predict(x[~train])
            yt, nt = y[~train], node[~train]
            accs.append(balanced_accuracy_score(yt, pred))
            held = np.unique(nt)
            idx = {n: np.flatnonzero(nt == n) for n in held}
            for _ in range(boot // splits):
                pick = np.concatenate([idx[n] for n in rng.choice(held, len(held), replace=True)])
                boots.append(balanced_accuracy_score(yt[pick], pred[pick]))
        out[name] = {"balanced_accuracy": round(float(np.mean(accs)), 4),
                     "per_split": [round(float(a), 4) for a in accs],
                     "node_bootstrap_95": [round(float(np.percentile(boots, 2.5)), 4),
                                           round(float(np.percentile(boots, 97.5)), 4)]}
    out["window_adds_over_mss_points"] = round(100 * (out["mss+window"]["balanced_accuracy"]
                                                      - out["mss"]["balanced_accuracy"]), 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "handshake_window.json"))
    a = ap.parse_args(argv)
    t0 = time.time()
    base = SimParams(nodes=20, hours=48, seed=7)
    df = fleet(base)
    res = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "load_avg": [round(x, 2) for x in os.getloadavg()], "fleet": "20 nodes × 48 h, seed 7, 4 hours a node",
           "connections": len(df), "splits": a.splits, "tree": "depth 6, min_samples_leaf 20, class_weight balanced",
           "grounded": scores(df, a.splits),
           "per_type_tables": scores(df.with_columns(pl.Series("init_snd_wnd_bytes", per_type_tables(df, 7))),
                                     a.splits),
           "sweep_android_legacy_kernel_share": {}}
    for share in (0.0, 0.1, 0.2, 0.4):
        s = scores(fleet(SimParams(nodes=20, hours=48, seed=7, android_legacy_kernel_share=share)), a.splits)
        res["sweep_android_legacy_kernel_share"][str(share)] = {
            "window_adds_over_mss_points": s["window_adds_over_mss_points"],
            "per_split_points": [round(100 * (w - m), 2) for w, m in zip(s["mss+window"]["per_split"],
                                                                           s["mss"]["per_split"])]}
    res["legacy_radio_buffer_share_1"] = scores(fleet(SimParams(nodes=20, hours=48, seed=7,
                                                                legacy_radio_buffer_share=1.0)), a.splits)
    res["seconds"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
