"""`ccs simulate --follow`'s options (app/commands/sim.py `follow_params`): what the reacting fleet
is simulated from, and what is refused before any agent is asked. The command itself runs against
real agents in tests/kernel/test_rollout_follow.py."""
from __future__ import annotations

import os

import pytest
import typer
from ccs_testing import write_config

from ccselect.app.commands.sim import FollowArgs, follow_params
from ccselect.config import load_config


def _args(**kw) -> FollowArgs:
    base = dict(out=None, nodes=None, start=None, seed=None, conns=None, fleet=None, store=None, public_key=None,
                start_hour=0, minutes=60, speed=60.0, default_cc="cubic", rotate_minutes=None, config=None,
                as_json=False)
    return FollowArgs(**{**base, **kw})


def test_the_simulated_fleet_covers_the_clock_and_serves_every_fleet_node(tmp_path):
    cfg = load_config(write_config(tmp_path))
    params, out, rotate = follow_params(_args(start_hour=2, minutes=61, seed=11, conns=900), 3, cfg)
    assert (params.nodes, params.hours, params.seed, params.conns_per_node_hour) == (3, 5, 11, 900), \
        "hours 2..4 cover 61 minutes from hour 2, one node per fleet node"
    assert params.cc_mode == "default" and params.start == cfg.settings.simulate.start
    assert out == os.path.join(str(tmp_path), "stream", "raw"), "where make run's stream reads the agents' segments"
    assert rotate == (cfg.settings.simulate.rotate_minutes or 1)
    params, out, rotate = follow_params(_args(nodes=5, out=str(tmp_path / "o"), rotate_minutes=5, minutes=60), 3, cfg)
    assert (params.nodes, params.hours, out, rotate) == (5, 2, str(tmp_path / "o"), 5)


@pytest.mark.parametrize("kw, hint", [
    ({"nodes": 2}, "--nodes"), ({"minutes": 0}, "--minutes"), ({"speed": -1.0}, "--speed"),
    ({"start_hour": -1}, "--start-hour"), ({"default_cc": "reno"}, "--default-cc"),
    ({"rotate_minutes": 7}, "--rotate-minutes"), ({"rotate_minutes": 0}, "--rotate-minutes"),
])
def test_refused_options_name_themselves(tmp_path, kw, hint):
    cfg = load_config(write_config(tmp_path))
    with pytest.raises(typer.BadParameter) as exc:
        follow_params(_args(**kw), 3, cfg)
    assert exc.value.param_hint == hint, exc.value
