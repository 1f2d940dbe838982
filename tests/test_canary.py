"""The canary's sequential A/B (export/delivery/canary.py, issue 58) on replays of two arms with known
effects (sim/ab_outcomes.py): tables that change nothing are rolled back at most at the promised
rate however often the rollout looks, tables harmful on the primary metric (delivery rate) by the
margin are promoted at most at the promised rate (the window's end promotes nothing), a table
harmful on a guardrail or on the primary is rolled back within minutes, a helpful one is promoted
though its guardrails' intervals are wider than the margin — and so, as documented, can be a
table whose harm is on a guardrail alone; and the always-valid interval against its closed form."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from ccselect.settings import CanarySettings
from ccselect.export.delivery import canary
from ccselect.features.ab_moments import ArmMoments
from ccselect.sim.ab_outcomes import replay

S = CanarySettings()


def _run(rng, effect_retrans=1.0, effect_stall=1.0, settings=S, minutes=None, effect_delivery=1.0):
    c = canary.Canary(settings)
    for minute, sums in replay(rng, int(minutes or settings.max_minutes), effect_retrans, effect_stall,
                               effect_delivery):
        if c.look(minute, canary.cluster_moments(sums)) != canary.OBSERVE:
            return c.decision, minute, c
    return c.decision, minutes, c


def test_null_tables_are_rolled_back_at_most_at_alpha_with_a_look_every_minute():
    """600 tables that change nothing (20 in a row, 30 times over), looked at every minute for
    30 minutes: the false-rollback rate stays under α = 5%. A fixed-sample z-test read at every
    look rolls back far more of the same tables — the reason the test is sequential."""
    rng = np.random.default_rng(58)
    rollbacks, naive = 0, 0
    n = 600
    for _ in range(n):
        decision, _, _ = _run(rng)
        rollbacks += decision == canary.ROLLBACK
    rng = np.random.default_rng(59)
    for _ in range(200):
        for minute, sums in replay(rng, 30):
            moments = canary.cluster_moments(sums)
            hit = False
            for m in S.metrics:
                c, t = moments[m]["control"], moments[m]["treatment"]
                se = math.sqrt(c.ratio_var() / c.ratio ** 2 + t.ratio_var() / t.ratio ** 2)
                sign = 1 if canary.HARM_IF_HIGHER[m] else -1
                if sign * math.log(t.ratio / c.ratio) / se > 1.96:       # one-sided harm at each look
                    hit = True
            if hit:
                naive += 1
                break
    assert rollbacks / n <= S.alpha, f"{rollbacks} of {n} null tables rolled back"
    assert naive / 200 > 2 * S.alpha, f"peeking at a fixed-sample test: {naive} of 200 (the contrast)"


def test_the_primary_and_the_guardrails():
    """The default: delivery rate primary (the metric the canary resolves, docs/rollouts.md),
    retransmissions and rebuffer guardrails; every metric the settings know has a harm side and
    a pair of silver columns."""
    from ccselect.features.ab_moments import CANARY_METRICS
    assert (S.primary, S.guardrails) == (("delivery_rate",), ("retrans_rate", "rebuffer_rate"))
    assert set(CanarySettings.KNOWN) == set(canary.HARM_IF_HIGHER) == set(CANARY_METRICS)
    with pytest.raises(ValueError, match="export.canary.primary must be one or more of export.canary.metrics"):
        CanarySettings(metrics=("retrans_rate",))
    with pytest.raises(ValueError, match="export.canary.metrics must be among delivery_rate"):
        CanarySettings(metrics=("goodput_bps",), primary=("goodput_bps",))


def test_a_harmful_table_is_rolled_back_and_a_helpful_one_promoted():
    rng = np.random.default_rng(7)
    minutes = []
    for _ in range(40):              # a guardrail's harm: delivery rate unchanged
        decision, minute, c = _run(rng, effect_retrans=1.5)
        assert decision == canary.ROLLBACK, c.reason
        assert "retrans_rate: treatment +" in c.reason and "above 0" in c.reason
        minutes.append(minute)
    assert np.median(minutes) <= 10, f"median minutes to roll back a +50% retransmission table: {np.median(minutes)}"
    for _ in range(10):              # the primary's harm: 30% less delivery rate
        decision, minute, c = _run(rng, effect_delivery=0.7)
        assert decision == canary.ROLLBACK and "delivery_rate: treatment -" in c.reason, c.reason
        assert "] below 0" in c.reason, c.reason
    for _ in range(20):
        decision, minute, c = _run(rng, effect_retrans=0.7, effect_delivery=1.25)
        assert decision == canary.PROMOTE and minute == S.bake_minutes, c.reason
        assert "the primary metric (delivery_rate) within the 5% margin" in c.reason, c.reason
        # a guardrail's interval wider than the margin (stalls unchanged) did not hold it back
        rb = c.states["rebuffer_rate"]
        assert rb.hi > math.log1p(S.harm_margin) and "guardrails, no harm shown" in c.reason, c.reason


def test_too_few_clients_is_inconclusive_at_the_window_end_not_promoted():
    few = CanarySettings(min_clusters=10_000, max_minutes=5)
    decision, minute, c = _run(np.random.default_rng(1), effect_retrans=3.0, settings=few, minutes=5)
    assert (decision, minute) == (canary.INCONCLUSIVE, 5)
    assert "not promoted: the window (5 min" in c.reason and "ended without evidence either way" in c.reason
    assert "delivery_rate never had export.canary.min_clusters (10000) clients in both arms" in c.reason
    assert all(not st.last["judged"] for st in c.states.values())


def test_no_harm_shown_is_not_evidence_of_safety():
    """A table 10% worse on delivery rate, judged for 5 minutes: no harm is shown within the
    window, and neither is its absence beyond the margin, so it is not promoted (the rule before
    issue 58's fix promoted it when the window ended)."""
    short = CanarySettings(max_minutes=5)
    decision, minute, c = _run(np.random.default_rng(3), effect_delivery=0.9, settings=short, minutes=5)
    assert (decision, minute) == (canary.INCONCLUSIVE, 5), c.reason
    st = c.states["delivery_rate"]
    assert st.last["judged"] and st.lo < -math.log1p(short.harm_margin) < 0 < st.hi
    assert "delivery_rate " in c.reason and "not above the -5% margin (export.canary.harm_margin)" in c.reason


def test_tables_harmful_by_the_margin_are_promoted_at_most_at_alpha_over_the_metrics():
    """300 tables whose delivery rate is exactly `harm_margin` worse (ratio 1 / (1 + margin): the
    least harm the promote guarantee covers), looked at every minute for 30 minutes: promoted
    at most at α / 3 (the non-inferiority's level on the primary's confidence sequence)."""
    rng = np.random.default_rng(60)
    n, promoted, decided = 300, 0, {}
    for _ in range(n):
        decision, _, _ = _run(rng, effect_delivery=1 / (1 + S.harm_margin))
        promoted += decision == canary.PROMOTE
        decided[decision] = decided.get(decision, 0) + 1
    assert promoted / n <= S.alpha / len(S.metrics), decided
    assert decided.get(canary.INCONCLUSIVE, 0) + decided.get(canary.ROLLBACK, 0) == n - promoted


def test_the_bake_gives_the_guardrails_the_window():
    """A table 25% faster on the primary and 30% more stalling: without the bake
    (export.canary.bake_minutes 0) the primary promotes it within minutes in most of 20 replays,
    before the rebuffer guardrail shows the harm; with the default bake (the whole window) the
    guardrail rolls it back in nearly all. What stays unguaranteed (docs/rollouts.md): a harm on a
    guardrail alone smaller than its interval at the window's end passes."""
    decided = {}
    for bake in (0.0, S.bake_minutes):
        rng = np.random.default_rng(61)
        decided[bake] = [_run(rng, effect_stall=1.3, effect_delivery=1.25, settings=replace(S, bake_minutes=bake))
                         for _ in range(20)]
    early = [m for d, m, _ in decided[0.0] if d == canary.PROMOTE]
    assert len(early) >= 10 and max(early) <= 10, decided[0.0]
    baked = [d for d, _, _ in decided[S.bake_minutes]]
    assert baked.count(canary.ROLLBACK) >= 18, baked
    assert all(m >= S.bake_minutes for d, m, _ in decided[S.bake_minutes] if d == canary.PROMOTE)


def test_the_interval_is_the_inverted_msprt():
    """θ on the interval's edge has Λ = 1/α exactly; the interval only narrows over looks."""
    var, tau, alpha = 0.004, 0.2, 0.025
    h = canary.cs_halfwidth(var, tau, alpha)
    assert canary.msprt_lambda(h, var, tau) == pytest.approx(1 / alpha)
    assert canary.msprt_lambda(0.0, var, tau) < 1
    c = canary.Canary(CanarySettings(metrics=("retrans_rate",), primary=("retrans_rate",), min_clusters=2))
    wide = {"retrans_rate": {"control": ArmMoments.of_clusters([1, 2, 3], [100, 100, 100]),
                             "treatment": ArmMoments.of_clusters([1, 3, 2], [100, 90, 110])}}
    c.look(1, wide)
    lo, hi = c.states["retrans_rate"].lo, c.states["retrans_rate"].hi
    c.look(2, wide)
    assert (c.states["retrans_rate"].lo, c.states["retrans_rate"].hi) == (lo, hi)
    assert c.evidence()["metrics"]["retrans_rate"]["judged"]
