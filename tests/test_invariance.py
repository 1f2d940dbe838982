"""Issue 28's building blocks on synthetic rows: the invariance probe reads a node that shifts
the features and not one that does not; the node-domain discriminator (dann_nodes) makes the node
harder to read from G's output than a plain MLP leaves it; per-node standardization removes a
node's offset."""
from __future__ import annotations

import numpy as np
import pytest

from ccselect.models.dataset import Unlabelled
from ccselect.models.invariance import node_probe
from ccselect.models.train import NODE_DOMAIN_VARIANTS, TrainData, TrainParams, fit


def _nodes(n_nodes=4, per_node=600, shift=1.5, seed=0):
    """Rows of n_nodes nodes: 2 signal features decide the label; 4 nuisance features carry a
    per-node offset (what the node's access plant adds) and say nothing about the label."""
    rng = np.random.default_rng(seed)
    xs, ys, nodes = [], [], []
    for k in range(n_nodes):
        y = rng.integers(0, 2, per_node)
        sig = rng.normal(size=(per_node, 2)) + (2 * y - 1)[:, None] * 1.2
        off = rng.normal(scale=shift, size=4)
        nui = rng.normal(size=(per_node, 4)) + off
        xs.append(np.hstack([sig, nui]).astype(np.float32))
        ys.append(y)
        nodes += [f"n{k}"] * per_node
    return np.vstack(xs), np.concatenate(ys), np.array(nodes, dtype=object)


def test_probe_reads_a_shifting_node_and_not_noise():
    x, _, node = _nodes()
    shifted = node_probe(x, node, seed=1)
    assert shifted["nodes"] == 4 and shifted["chance"] == 0.25
    assert shifted["balanced_accuracy"] > 0.8, shifted
    noise = node_probe(np.random.default_rng(2).normal(size=x.shape), node, seed=1)
    assert noise["balanced_accuracy"] < 0.4, noise


def test_node_domain_training_hides_the_node_better_than_the_mlp():
    x, y, node = _nodes(per_node=2000, seed=3)
    ids = np.array([int(n[1:]) for n in node])
    train = ids < 2  # two labelled nodes; every node's rows are there unlabelled
    data = TrainData(x=x[train], y=y[train].astype(np.int64), prefix=np.arange(train.sum()) // 8,
                     group=np.zeros(train.sum(), dtype=np.int64), n_groups=(1, 1),
                     x_unl=x, node_unl=ids, n_nodes=4)
    assert "dann_nodes" in NODE_DOMAIN_VARIANTS and "aliccs_nodes" in NODE_DOMAIN_VARIANTS
    probes = {}
    for v in ("mlp", "dann_nodes"):
        t = fit(TrainParams(variant=v, epochs=20, batch_size=256, lambda3=3.0, seed=0, device="cpu"), data)
        probes[v] = node_probe(t.represent(x), node, seed=0)["balanced_accuracy"]
        acc = ((t.predict_proba(x[~train]) >= 0.5) == y[~train].astype(bool)).mean()
        assert acc > 0.75, f"{v}: held-out accuracy {acc:.3f}"
    assert probes["dann_nodes"] < probes["mlp"] - 0.1, probes


def test_node_domain_variant_needs_unlabelled_nodes():
    x, y, _ = _nodes(n_nodes=1)
    data = TrainData(x=x, y=y.astype(np.int64), prefix=np.arange(len(y)) // 8,
                     group=np.zeros(len(y), dtype=np.int64), n_groups=(1, 1))
    with pytest.raises(ValueError, match="two or more nodes"):
        fit(TrainParams(variant="aliccs_nodes", epochs=1, device="cpu"), data)


def test_per_node_standardization_removes_the_node_offset():
    x, _, node = _nodes(shift=3.0, seed=4)
    nodes = sorted(set(node))
    u = Unlabelled(x=x, node=node, nodes=nodes,
                   node_mean={n: x[node == n].mean(0) for n in nodes},
                   node_std={n: x[node == n].std(0) for n in nodes})
    z = u.per_node_standardized(x, node)
    for n in nodes:
        assert np.allclose(z[node == n].mean(0), 0, atol=1e-4) and np.allclose(z[node == n].std(0), 1, atol=1e-3)
    assert np.array_equal(u.node_index(np.array(["n2", "zz"], dtype=object)), [2, -1])
    assert node_probe(z, node, seed=0)["balanced_accuracy"] < 0.45
