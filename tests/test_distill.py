"""Distillation (ALICCS §3.2) on hand-made data: fidelity, the depth search and its stopping
rule, per-/16 deepening, SHAP additivity on the multi-output tree, attribution shares."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ccselect.contract import FEATURES
from ccselect.settings import DiagnoseSettings, DistillSettings
from ccselect.distill import diagnose as dg
from ccselect.distill.tree import accuracy, agreement_by, depth_search, distill, fidelity, fit_tree, holdout_split, rules_text


def _probs(p_wifi) -> np.ndarray:
    p = np.asarray(p_wifi, dtype=float)
    return np.c_[1 - p, p]


def test_fidelity_hand_made():
    dnn = _probs([0.9, 0.8, 0.2, 0.4, 0.6])       # argmax 1 1 0 0 1
    tree = _probs([0.7, 0.3, 0.1, 0.55, 0.51])    # argmax 1 0 0 1 1
    assert fidelity(tree, dnn) == pytest.approx(3 / 5)
    assert fidelity(dnn, dnn) == 1.0
    assert np.isnan(fidelity(np.zeros((0, 2)), np.zeros((0, 2))))
    per = agreement_by(np.array(["a", "a", "b", "b", "b"]), tree, dnn)
    assert per == {"a": (2, 0.5), "b": (3, pytest.approx(2 / 3))}
    assert accuracy(dnn, np.array([1, 0, 0, 0, 1])) == pytest.approx(4 / 5)


def _and_data(n=4000, seed=1):
    """P(Wi-Fi) = 0.9 where x0 = x1 = .75, else 0.2 (x0, x1 ∈ {.25, .75}): one split (depth 1) agrees on 75% of
    rows, two (depth 2) on all of them."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 12))
    x[:, :2] = rng.choice([0.25, 0.75], (n, 2))   # split points fall exactly at 0.5
    p = np.where((x[:, 0] > 0.5) & (x[:, 1] > 0.5), 0.9, 0.2)
    return x, _probs(p)


def test_depth_search_stops_at_first_passing_depth():
    x, t = _and_data()
    tr, te = holdout_split(len(x), 0.3, 0)
    params = DistillSettings(fidelity=0.95, max_depth=10, min_samples_leaf=5)
    res = depth_search(x[tr], t[tr], x[te], t[te], params)
    assert [s.depth for s in res.steps] == [1, 2]
    assert res.steps[0].fidelity < 0.95 <= res.steps[1].fidelity
    assert (res.depth, res.global_depth, res.passed, res.tree.get_depth()) == (2, 2, True, 2)
    # deeper trees would pass too: stopping at 2 is the rule, not the only option
    assert fidelity(fit_tree(x[tr], t[tr], 4, params).predict(x[te]), t[te]) >= 0.95


def test_depth_search_unreachable_threshold_runs_to_max_depth():
    x, t = _and_data(1000)
    tr, te = holdout_split(len(x), 0.3, 0)
    x_noisy = x.copy()
    x_noisy[:, :2] = np.random.default_rng(5).random((len(x), 2))  # targets no longer follow x
    res = depth_search(x_noisy[tr], t[tr], x_noisy[te], t[te], DistillSettings(fidelity=0.99, max_depth=4))
    assert [s.depth for s in res.steps] == [1, 2, 3, 4]
    assert not res.passed and res.depth == 4


def test_low_agreement_subset_deepens_the_tree():
    """Globally one split suffices (x0 > .5), but in the subset x2 > .95 (~5% of rows) the DNN
    answers the opposite: the search passes globally at depth 1 and deepens to 2 for the subset."""
    rng = np.random.default_rng(3)
    x = rng.random((6000, 12))
    wifi = x[:, 0] > 0.5
    odd = x[:, 2] > 0.95
    t = _probs(np.where(wifi ^ odd, 0.85, 0.15))
    keys = np.where(odd, "10.1.0.0/16", "10.2.0.0/16")
    tr, te = holdout_split(len(x), 0.3, 0)
    params = DistillSettings(fidelity=0.93, subset_fidelity=0.9, subset_min_rows=20, max_depth=8)
    res = depth_search(x[tr], t[tr], x[te], t[te], params, subset_keys=keys[te])
    assert res.global_depth == 1
    assert res.steps[0].failing_subsets == ["10.1.0.0/16"]
    assert res.depth == 2 and res.subsets_passed and res.steps[-1].failing_subsets == []


def test_distill_metrics_and_rules():
    x, t = _and_data(3000)
    label = (t[:, 1] > 0.5).astype(np.int8)
    label[:300] = 1 - label[:300]                 # 10% of labels disagree with the "DNN"
    d = distill(x, t, label, np.array(["1.2.0.0/16"] * len(x), dtype=object), DistillSettings())
    m = d.metrics
    assert m["depth"] == 2 and m["fidelity"] == 1.0
    assert m["dnn_accuracy"] == pytest.approx(m["tree_accuracy"]) and m["accuracy_drop"] == pytest.approx(0.0)
    assert m["holdout_rows"] == 900 and m["train_rows"] == 2100
    text = rules_text(d.tree)
    assert f"{FEATURES[0]} <= 0.500" in text and f"{FEATURES[1]} <= 0.500" in text
    assert "value: [0.100, 0.900]" in text and "value: [0.800, 0.200]" in text


def test_shap_additivity_per_output():
    """values.sum(features) + expected value == the tree's prediction, for both outputs."""
    rng = np.random.default_rng(7)
    x = rng.lognormal(3, 1, (2000, 12))
    p = 1 / (1 + np.exp(-(np.log(x[:, 0]) - 3 + 0.5 * (np.log(x[:, 3]) - 3))))
    tree = fit_tree(x, _probs(p), 8, DistillSettings())
    values, expected = dg.shap_values(tree, x[:300])
    assert values.shape == (300, 12, 2) and expected.shape == (2,)
    pred = tree.predict(x[:300])
    for k in range(2):
        np.testing.assert_allclose(values[:, :, k].sum(1) + expected[k], pred[:, k], atol=1e-9)
    # the two outputs sum to 1, so their attributions are each other's negation
    np.testing.assert_allclose(values[:, :, 0], -values[:, :, 1], atol=1e-9)
    mean_abs, share = dg.shares(values[:, :, 1])
    assert share.sum() == pytest.approx(1.0)
    assert set(np.argsort(-mean_abs)[:2]) == {0, 3}


def test_profile_flags_over_relied_features():
    glob = np.array([0.4, 0.3, 0.2, 0.1] + [0.0] * 8)
    # subset attribution: feature 0 (mss_bytes) 0.8, feature 3 0.2 (lift 2 but 0.1 share points
    # over), feature 1 0.0
    vals = np.zeros((4, 12))
    vals[:, 0] = [0.8, -0.8, 0.8, -0.8]
    vals[:, 3] = [0.2, 0.2, -0.2, 0.2]
    prof = dg.profile(vals, glob, DiagnoseSettings(over_reliance=1.5, min_excess=0.05))
    assert prof.loc[0, "share"] == pytest.approx(0.8) and prof.loc[3, "share"] == pytest.approx(0.2)
    assert prof.loc[0, "lift"] == pytest.approx(2.0) and prof.loc[0, "excess"] == pytest.approx(0.4)
    assert dg.over_relied(prof) == ["mss_bytes", FEATURES[3]]
    assert dg.top_features(prof, 2) == ["mss_bytes", FEATURES[3]]
    strict = dg.profile(vals, glob, DiagnoseSettings(over_reliance=1.5, min_excess=0.2))
    assert dg.over_relied(strict) == ["mss_bytes"]


def test_select_subsets_modes():
    p16 = np.array(["1.1.0.0/16"] * 60 + ["2.2.0.0/16"] * 60 + ["3.3.0.0/16"] * 10, dtype=object)
    ip = np.array(["1.1.3.4"] * 60 + ["2.2.9.9"] * 60 + ["3.3.1.1"] * 10, dtype=object)
    node = np.array(["n1"] * 100 + ["n2"] * 30, dtype=object)
    label = np.ones(130, dtype=np.int8)
    dnn = _probs(np.r_[np.full(60, 0.9), np.r_[np.full(30, 0.9), np.full(30, 0.1)], np.full(10, 0.1)])
    by16 = dg.per_prefix16(p16, label, dnn, dnn)
    assert by16["prefix16"].tolist() == ["3.3.0.0/16", "2.2.0.0/16", "1.1.0.0/16"]
    assert by16["accuracy"].tolist() == [0.0, 0.5, 1.0]
    params = DiagnoseSettings(min_rows=50, accuracy_threshold=0.8)
    default = dg.select_subsets(p16, ip, node, by16, params)
    assert [s.key for s in default] == ["2.2.0.0/16"]            # 3.3/16 has too few rows
    worst = dg.select_subsets(p16, ip, node, by16, params, worst=2)
    assert [s.key for s in worst] == ["2.2.0.0/16", "1.1.0.0/16"]
    cidr = dg.select_subsets(p16, ip, node, by16, params, prefix="2.2.9.0/24")[0]
    assert cidr.mask.sum() == 60 and cidr.mask[60:120].all()
    assert dg.select_subsets(p16, ip, node, by16, params, node_id="n2")[0].mask.sum() == 30
    assert isinstance(by16, pd.DataFrame)
