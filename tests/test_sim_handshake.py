"""The client's first window (sim/stacks.py) follows the stacks' own rules, and on a default fleet
it tells the access type no better than the MSS it is computed from (issue 55: the window used
to be drawn from per-type tables and added 10-12 points of balanced accuracy over the MSS)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ccselect.sim import stacks
from ccselect.sim.params import SimParams
from ccselect.sim.traffic import generate_node_hour
from ccselect.sim.world import World


def test_linux_rule_gives_the_windows_real_kernels_send():
    """tcp_select_initial_window() on Linux ≥ 4.19 with tcp_rmem[1] = 131072: 44 × 1460 = 64,240
    (Linux's familiar SYN window), 45 × 1448 = 65,160; before 4.19, 20 segments: 29,200 (the
    figure commit a337531b942b quotes for the old default)."""
    rmem = np.array([stacks.LINUX_RMEM_DEFAULT] * 3)
    mss = np.array([1460, 1448, 536])
    modern = stacks.linux_rcv_wnd(rmem, mss, None, np.ones(3, bool))
    assert modern.tolist() == [64240, 65160, 65392], modern
    legacy = stacks.linux_rcv_wnd(rmem, mss, None, np.zeros(3, bool))
    assert legacy.tolist() == [29200, 28960, 10720], legacy
    # Android's tcp_default_init_rwnd = 60 on an old kernel: 60 segments of the phone's own MSS
    android_old = stacks.linux_rcv_wnd(np.array([stacks.ANDROID_RMEM_DEFAULT]), np.array([1400]), 60, np.zeros(1, bool))
    assert android_old.tolist() == [84000]
    # the ACK carries the window at the client's scale, rounded up to a whole unit: 64,240 → 502 × 128
    assert stacks._align(np.array([64240]), 7).tolist() == [64256]


def test_only_the_phones_own_mss_and_the_named_knob_reach_the_window():
    """On current Android the window is the 64 KB cap whatever the radio; on an old kernel it is
    60 × the phone's MSS; EDGE-sized buffers (the knob) are the one per-radio difference."""
    stack = np.array([stacks.ANDROID, stacks.ANDROID, stacks.ANDROID_LEGACY_KERNEL, stacks.ANDROID_LEGACY_KERNEL,
                      stacks.IOS, stacks.WINDOWS, stacks.ANDROID])
    mss = np.array([1460, 1360, 1460, 1360, 1360, 1400, 1360])
    radio = np.array([False] * 6 + [True])
    w = stacks.established_window(stack, mss, radio)
    assert w[0] == w[1] == 65536, f"current Android: the U16_MAX cap at scale 6, whatever the MSS: {w}"
    assert w[2] == 87616 and w[3] == 81600, f"old Android: 60 × MSS at scale 6: {w}"
    assert w[4] == 131072 and w[5] == 64256, f"iOS 128 KiB, Windows 64,240 at scale 8: {w}"
    assert w[6] == 12288, f"EDGE's 26,280-byte buffer: rounddown(13,140, 1360) at scale 6: {w}"


def _type_gain_of_the_window(params: SimParams, splits: int = 5) -> float:
    """Balanced accuracy of a depth-6 tree reading Wi-Fi vs cellular from (MSS, window) minus from
    the MSS alone, trained on half the nodes and scored on the other half (ALICCS §5.1's
    cross-node split), averaged over `splits` random halvings. Reads the simulator's truth."""
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.tree import DecisionTreeClassifier
    world = World(params)
    frames = []
    for node in range(params.nodes):
        for hour in range(0, params.hours, params.hours // 4):
            nh = generate_node_hour(world, node, hour)
            frames.append(nh.transport.select("conn_id", "node_id", "mss_bytes", "init_snd_wnd_bytes")
                          .join(nh.truth.select("conn_id", "net_type"), on="conn_id"))
    df = pl.concat(frames)
    y = (df["net_type"] == "wifi").to_numpy().astype(int)
    node = df["node_id"].to_numpy()
    nodes = np.unique(node)
    gains = []
    for seed in range(splits):
        train = np.isin(node, np.random.default_rng(seed).choice(nodes, len(nodes) // 2, replace=False))
        acc = []
        for cols in (["mss_bytes"], ["mss_bytes", "init_snd_wnd_bytes"]):
            x = df.select(cols).to_numpy()
            tree = DecisionTreeClassifier(max_depth=6, min_samples_leaf=20, class_weight="balanced", random_state=0)
            tree.fit(x[train], y[train])
            acc.append(balanced_accuracy_score(y[~train], tree.predict(x[~train])))
        gains.append(acc[1] - acc[0])
    return float(np.mean(gains))


@pytest.mark.parametrize("knob, bound", [({}, (None, 0.02)), ({"legacy_radio_buffer_share": 1.0}, (0.03, None))],
                         ids=["default", "edge-buffers-on"])
def test_the_window_adds_at_most_two_points_over_the_mss(knob, bound):
    """Default 20-node × 48-hour fleet: ≤ 2 points. With the named knob on (every Android phone on
    cellular with EDGE-sized buffers) the window does name the type, so the check can fail."""
    gain = _type_gain_of_the_window(SimParams(nodes=20, hours=48, seed=7, **knob))
    lo, hi = bound
    assert hi is None or gain <= hi, f"the window adds {gain * 100:.2f} points of balanced accuracy over the MSS"
    assert lo is None or gain >= lo, f"the knob should make the window carry the type: +{gain * 100:.2f} points"


def test_the_per_type_tables_knob_changes_only_the_window():
    """`client_window="per_type_tables"` (the stress knob kept for issue 55's before/after) is the
    old tables' draw: 43,690 only for Android on cellular, 87,380 only on Wi-Fi; every field but the
    window and the two that follow from it is the default's, draw for draw."""
    world = World(SimParams(nodes=2, hours=1, seed=7))
    old_world = World(SimParams(nodes=2, hours=1, seed=7, client_window="per_type_tables"))
    new, old = generate_node_hour(world, 1, 0), generate_node_hour(old_world, 1, 0)
    changed = {c for c in new.transport.columns if not new.transport[c].equals(old.transport[c])}
    assert changed == {"init_snd_wnd_bytes", "max_snd_wnd_bytes", "min_snd_wnd_bytes"}, changed
    assert new.access.equals(old.access) and new.qoe.equals(old.qoe) and new.truth.equals(old.truth)
    t = old.transport.join(old.truth.select("conn_id", "net_type"), on="conn_id")
    by_type = {w: set(g["net_type"]) for w, g in t.group_by("init_snd_wnd_bytes")
               for w in [w[0] if isinstance(w, tuple) else w]}
    assert set(by_type) <= {29200, 43690, 64240, 65160, 65535, 87380, 131072}, by_type
    assert by_type[43690] <= {"4g", "5g"} and by_type[87380] == {"wifi"}, by_type
    with pytest.raises(ValueError, match="client_window"):
        generate_node_hour(World(SimParams(nodes=2, hours=1, seed=7, client_window="tables")), 0, 0)
