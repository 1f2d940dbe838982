"""Simulator presets (sim/params.PRESETS): `strong_shift` widens what differs between nodes
(issue 28), the default fleet's draws stay as they were, and options beside a preset win."""
from __future__ import annotations

import numpy as np
import pytest

from ccselect.settings import SimulateSettings
from ccselect.sim import physics
from ccselect.sim.params import PRESETS, SimParams
from ccselect.sim.world import World


def _settings(**kw) -> SimulateSettings:
    return SimulateSettings(**{"out": "/tmp/unused", "nodes": 20, "hours": 2, "start": "2026-11-01T00:00:00",
                               "seed": 7, "conns_per_node_hour": 100, **kw})


def test_a_preset_sets_its_knobs_and_options_beside_it_win():
    p = SimParams.from_settings(_settings(), "strong_shift")
    assert p.preset == "strong_shift"
    for k, v in PRESETS["strong_shift"].items():
        assert getattr(p, k) == v
    q = SimParams.from_settings(_settings(), "strong_shift", in_carrier_node_share=0.1)
    assert q.in_carrier_node_share == 0.1 and q.node_rtt_sigma == PRESETS["strong_shift"]["node_rtt_sigma"]
    assert SimParams.from_settings(_settings()).preset is None
    with pytest.raises(ValueError, match="unknown simulator preset"):
        SimParams.from_settings(_settings(), "no_such_preset")


def test_strong_shift_spreads_the_nodes_and_the_default_keeps_its_draws():
    base, strong = World(SimParams(nodes=20, seed=7)), World(SimParams(nodes=20, seed=7, **PRESETS["strong_shift"]))
    # the default fleet: no buffer multiplier, base RTTs in the old 1.5..90 ms range
    assert all(n.buffer_mult == 1.0 for n in base.nodes)
    assert all(1.5 <= n.base_rtt_ms <= 90.0 for n in base.nodes)
    spread = lambda w: float(np.std(np.log([n.base_rtt_ms for n in w.nodes])))  # noqa: E731
    assert spread(strong) > 1.3 * spread(base)
    mult = np.array([n.buffer_mult for n in strong.nodes])
    assert mult.max() / mult.min() > 2.0
    tunnels = lambda w: sum(n.mss_clamp < 65535 for n in w.nodes)  # noqa: E731
    assert tunnels(strong) > tunnels(base)
    in_carrier = lambda w: sum(n.host_isp >= 0 for n in w.nodes)  # noqa: E731
    assert in_carrier(strong) > in_carrier(base)
    # which nodes carry labels is drawn before any knob of the preset
    assert [n.labelled for n in strong.nodes] == [n.labelled for n in base.nodes]


def test_the_node_buffer_multiplier_scales_the_bottleneck_buffer():
    n = 500
    args = dict(cell=np.arange(n) % 2 == 0, is5g=np.zeros(n, bool), fam6=np.zeros(n, bool),
                base_rtt_ms=np.full(n, 10.0), dist_rtt_ms=np.full(n, 5.0), cap_mult=np.ones(n),
                capacity_factor=1.0, competing=2, path_jitter_ms=np.ones(n), police_p=0.1,
                police_rate=(0.8, 2.5), bbr_day_effect=np.ones(n), access_scale=np.ones((n, 2)))
    one = physics.draw_path(np.random.default_rng(3), **args)
    deep = physics.draw_path(np.random.default_rng(3), **args, buffer_mult=2.5)
    np.testing.assert_allclose(deep.buffer_ms, 2.5 * one.buffer_ms)
    np.testing.assert_array_equal(deep.min_rtt_ms, one.min_rtt_ms)


def test_shift_severity_scales_the_preset_from_the_default_fleet():
    """The stress knob (issue 55): severity 0 is the default fleet's knobs, 1 the strong_shift
    preset's values exactly (as docs/simulator.md tabulates them), halfway lies halfway, shares
    stay ≤ 1 beyond 1; from_settings records the severity and refuses it beside a preset."""
    from ccselect.sim.params import STRONG_SHIFT, shift_knobs
    table = {"node_rtt_median_ms": 20.0, "node_rtt_sigma": 1.2, "node_rtt_max_ms": 180.0, "node_buffer_sigma": 0.7,
             "node_tunnel_share": 0.5, "odd_broadband_share": 0.5, "odd_cellular_share": 0.5,
             "access_branch_sigma": 0.8, "in_carrier_node_share": 0.5}
    assert STRONG_SHIFT == table and PRESETS["strong_shift"] == table == shift_knobs(1.0)
    default = SimParams()
    assert shift_knobs(0.0) == {k: getattr(default, k) for k in table}
    half = shift_knobs(0.5)
    assert half["node_rtt_median_ms"] == pytest.approx(14.5) and half["node_tunnel_share"] == pytest.approx(0.375)
    assert all(shift_knobs(5.0)[k] == 1.0 for k in ("node_tunnel_share", "odd_broadband_share",
                                                   "odd_cellular_share", "in_carrier_node_share"))
    p = SimParams.from_settings(_settings(), shift_severity=0.5)
    assert p.extra == {"shift_severity": 0.5} and p.node_rtt_sigma == pytest.approx(half["node_rtt_sigma"])
    assert SimParams.from_settings(_settings(), shift_severity=0.0).node_rtt_median_ms == default.node_rtt_median_ms
    with pytest.raises(ValueError):
        SimParams.from_settings(_settings(), "strong_shift", shift_severity=0.5)
    with pytest.raises(ValueError):
        shift_knobs(-0.1)
