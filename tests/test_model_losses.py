"""Losses of ALICCS eqs. (1)-(7) on tiny tensors with hand-computed values, RSC's masking share,
and the alternating optimiser leaving the frozen side unchanged."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ccselect.models.losses import DiscriminatorLoss, PrefixVarianceLoss, RSCLoss, total_loss
from ccselect.models.train import TrainData, Trainer, TrainParams, prefix_batches


def test_discriminator_loss_sums_per_type_cross_entropy():
    # D0 sees the 4G rows (y=0), D1 the Wi-Fi rows (y=1); uniform logits → CE = ln K.
    logits0 = torch.zeros(3, 4)           # K0 = 4
    logits1 = torch.zeros(3, 2)           # K1 = 2
    y = torch.tensor([0, 0, 1])
    g = torch.tensor([3, 1, 0])
    assert DiscriminatorLoss()(logits0, logits1, y, g).item() == pytest.approx(math.log(4) + math.log(2))
    # a confident, correct D1 contributes ~0
    logits1 = torch.tensor([[0.0, 0.0], [0.0, 0.0], [50.0, 0.0]])
    assert DiscriminatorLoss()(logits0, logits1, y, g).item() == pytest.approx(math.log(4), abs=1e-6)
    # a type absent from the batch adds nothing
    assert DiscriminatorLoss()(logits0, logits1, torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2])).item() == \
        pytest.approx(math.log(4))


def test_prefix_variance_is_within_prefix_scatter():
    z = torch.tensor([[0.0, 0.0], [2.0, 0.0], [5.0, 5.0], [1.0, 1.0]])
    prefix = torch.tensor([7, 7, 9, 4])
    # prefix 7: mean (1,0), scatter 1+1 = 2; prefixes 9 and 4 alone: 0 → 2 / B(=4)
    assert PrefixVarianceLoss()(z, prefix).item() == pytest.approx(0.5)
    assert PrefixVarianceLoss()(z, torch.arange(4)).item() == 0.0


def test_total_loss_is_eq7():
    assert total_loss(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(4.0), 0.5, 0.25).item() == pytest.approx(1.0)


def test_rsc_mutes_the_most_salient_features_of_the_chosen_samples():
    torch.manual_seed(0)
    clf = torch.nn.Linear(6, 2)
    with torch.no_grad():
        clf.weight.copy_(torch.tensor([[0.0] * 6, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]]))
        clf.bias.zero_()
    z = torch.ones(9, 6)
    y = torch.ones(9, dtype=torch.long)
    rsc = RSCLoss(feature_drop=1 / 3, batch_drop=1 / 3)
    mask = rsc.masks(z, y, clf)
    muted_rows = (mask == 0).any(1)
    assert muted_rows.sum().item() == 3, "a third of the batch is challenged"
    for row in mask[muted_rows]:
        assert row.tolist() == [0, 0, 1, 1, 1, 1], "the two (1/3 of 6) most salient dimensions are muted"
    assert (mask[~muted_rows] == 1).all()
    loss, _ = rsc(z, y, clf)
    expected = torch.nn.functional.cross_entropy(clf(z * mask), y)
    assert loss.item() == pytest.approx(expected.item())


def _tiny_data(n=256, seed=0) -> TrainData:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = (rng.normal(size=(n, 12)) + y[:, None]).astype(np.float32)
    prefix = rng.integers(0, 20, n)
    return TrainData(x, y, prefix, prefix % 3, (3, 3))


def _params(m):
    return [p.detach().clone() for p in m.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_alternating_steps_leave_the_frozen_side_unchanged():
    data = _tiny_data()
    tr = Trainer(TrainParams(variant="aliccs", device="cpu"), 12, data.n_groups)
    x = torch.as_tensor(data.x[:64])
    y = torch.as_tensor(data.y[:64])
    g = torch.as_tensor(data.group[:64])
    pfx = torch.as_tensor(data.prefix[:64])
    g0, c0, d0, d1 = _params(tr.G), _params(tr.C), _params(tr.D0), _params(tr.D1)
    tr.discriminator_step(x, y, g)
    assert _same(g0, _params(tr.G)) and _same(c0, _params(tr.C)), "phase 1 must not move G or C"
    assert not _same(d0, _params(tr.D0)), "phase 1 trains D0"
    d0, d1 = _params(tr.D0), _params(tr.D1)
    tr.generator_step(x, y, g, pfx, lambda1=0.5)
    assert _same(d0, _params(tr.D0)) and _same(d1, _params(tr.D1)), "phase 2 must not move the discriminators"
    assert not _same(g0, _params(tr.G)), "phase 2 trains G"


def test_prefix_batches_cover_every_row_once_in_prefix_runs():
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 30, 1000)
    batches = prefix_batches(prefix, 128, 8, rng)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000))
    b = batches[0]
    _, counts = np.unique(prefix[b], return_counts=True)
    assert counts.max() > 1, "batches must hold several rows of a /24 for eq. 3"


def test_training_is_seeded():
    data = _tiny_data()
    from ccselect.models.train import fit
    a = fit(TrainParams(variant="aliccs", epochs=2, device="cpu", seed=3), data).predict_proba(data.x)
    b = fit(TrainParams(variant="aliccs", epochs=2, device="cpu", seed=3), data).predict_proba(data.x)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="unknown variant"):
        TrainParams(variant="gan++").flags()


def test_grid_picks_least_spread_within_tolerance_of_best_mean():
    """Appendix D: the least per-node spread among the pairs whose mean accuracy is within the
    tolerance of the best mean; a flatter pair with a clearly lower mean is not taken."""
    from ccselect.models.grid import choose
    table = [
        {"lambda1": 0.0, "lambda2": 0.0, "mean": 0.960, "std": 0.030},
        {"lambda1": 0.3, "lambda2": 0.05, "mean": 0.957, "std": 0.010},
        {"lambda1": 1.0, "lambda2": 0.2, "mean": 0.900, "std": 0.001},
    ]
    assert choose(table, tolerance=0.005)["lambda1"] == 0.3
    assert choose(table, tolerance=0.001)["lambda1"] == 0.0


def test_grid_validates_on_training_nodes_only_each_once():
    from ccselect.models.grid import grid_search, node_folds
    folds = node_folds(np.array(["a", "b", "c", "a", "d", "e"]), 2, seed=1)
    assert sorted(sum(folds, [])) == ["a", "b", "c", "d", "e"] and len(folds) == 2
    data = _tiny_data(n=240)
    node = np.array(["n1", "n2", "n3"] * 80)
    res = grid_search(TrainParams(epochs=1, device="cpu"), data, node, lambda1s=(0.0, 0.3), lambda2s=(0.05,))
    assert len(res.table) == 2 and (res.lambda1, res.lambda2) in {(0.0, 0.05), (0.3, 0.05)}
    assert all(sorted(r["per_node"]) == ["n1", "n2", "n3"] for r in res.table)
    with pytest.raises(ValueError, match="two training nodes"):
        node_folds(np.array(["only"] * 5), 2, seed=0)


def test_experiment_split_and_scaler_use_training_nodes_only():
    from ccselect.evaluation.experiment import Scaler, prefix_groups, split_nodes
    nodes = [f"n{i}" for i in range(10)]
    train, test = split_nodes(nodes, labelled=nodes[:7], train_share=0.3, seed=0)
    assert len(train) == 3 and set(train) | set(test) == set(nodes[:7]) and not set(train) & set(test)
    raw = np.array([[0.0, 10.0], [np.e - 1, 10.0]])
    z = Scaler.fit(raw).transform(raw)
    np.testing.assert_allclose(z[:, 0], [-1.0, 1.0], atol=1e-6)  # log1p then standardize
    assert np.all(np.isfinite(z))
    # two clearly separated /24 clusters per type → two groups, all rows of a /24 in one group
    x = np.repeat(np.array([[0.0], [0.1], [5.0], [5.1]]), 3, axis=0).repeat(2, axis=0)
    y = np.array([0] * 12 + [1] * 12)
    prefix = np.tile(np.repeat(np.arange(4), 3), 2) + np.repeat([0, 10], 12)
    group, k = prefix_groups(x, y, prefix, k=2, seed=0)
    assert k == (2, 2)
    for p in np.unique(prefix):
        assert len(set(group[prefix == p])) == 1
    assert group[0] == group[3] and group[0] != group[6]


def test_a_small_window_trains_for_at_least_min_steps():
    """`min_steps`: a window whose rows make few batches gets more epochs (the make-run window's
    1,755 rows are 4 batches, 48 steps in 12 epochs); a large one keeps its epochs."""
    from ccselect.models.train import effective_epochs, fit
    p = TrainParams(variant="mlp", epochs=3, batch_size=100, min_steps=30, device="cpu", seed=0)
    assert effective_epochs(p, 250) == 10          # 3 batches an epoch: 10 epochs for 30 steps
    assert effective_epochs(p, 5000) == 3          # 50 batches an epoch: 3 epochs are 150 steps
    assert effective_epochs(replace(p, min_steps=0), 250) == 3
    data = _tiny_data(n=250)
    steps = []
    t = fit(p, data, on_epoch=lambda e, m: steps.append(e))
    assert t.p.epochs == 10 and len(steps) == 10
