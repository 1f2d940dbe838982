"""Issue 58's rollout loop through real agents: the operator's freeze, progressive cohorts from the
fleet file, and a gate on the canary's A/B outcomes (export/delivery/gates.py) whose decisions go
to gold.rollout_decisions. The outcomes come from sim/ab_outcomes.py (two arms with a known
effect, a minute of traffic per look) where a deployment reads silver.connections
(`gates.silver_moments`)."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import yaml
from _edge_helpers import other_ccs, sysctl_cc
from test_rollout import LocalFleet, _cc_through, _table, fleet_env  # noqa: F401 (fixture)

from ccselect.settings import CanarySettings
from ccselect.features.ab_moments import ArmMoments
from ccselect.export.delivery import freeze, gates
from ccselect.export.delivery.rollout import Health, deploy
from ccselect.export.delivery.store import Store
from ccselect.sim.ab_outcomes import ArmsSetting, replay

pytestmark = pytest.mark.kernel
HEALTH = Health(wait_s=0.2, min_rate_ratio=0.5)


def _cli(cfg, *args):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    return CliRunner().invoke(app, [*args, "--config", str(cfg.path)])


def _v1_live_v2_published(fleet_env, keys, tmp_path):
    """Tables 1 and 2 (two CCs other than the namespace's default) in a new store, table 1
    rolled out to every node; → (cfg, lf, cc of 1, cc of 2, store, fleet)."""
    cfg, lf = fleet_env
    a, b = other_ccs(sysctl_cc())
    store = Store(str(tmp_path / "store"))
    fleet = lf.fleet(cfg)
    for v, cc in ((1, a), (2, b)):
        store.publish(_table(keys, str(tmp_path / "export"), v, cc).manifest)
    assert deploy(fleet, store, 1, HEALTH)["ok"]
    return cfg, lf, a, b, store, fleet


def test_freeze_pins_the_last_good_table_and_stops_every_rollout_until_lifted(fleet_env, keys, tmp_path):
    cfg, lf, a, b, store, fleet = _v1_live_v2_published(fleet_env, keys, tmp_path)
    # table 2 reached the canary by hand (a rollout half done) when the operator pulls the switch
    ag = fleet.nodes[0].agent()
    ag.load(store.fetch(2, fleet.nodes[0].table_dir))
    ag.close()
    assert _cc_through(lf, 0) == b
    cfg.raw["export"]["rollout"]["health_wait_s"] = 0.2
    with open(cfg.path, "w") as f:
        yaml.safe_dump(cfg.raw, f)
    s = str(tmp_path / "store")
    r = _cli(cfg, "freeze", "--store", s, "--fleet", lf.path, "--who", "ana@ops", "--reason", "retransmissions up on the canary")
    assert r.exit_code == 0, r.output + str(r.exception)
    assert [lf.status(cfg, i)["table"]["version"] for i in range(2)] == [1, 1], "the pinned table, fleet-wide"
    assert _cc_through(lf, 0) == a
    with pytest.raises(freeze.Frozen, match="refused rolling out table 2: the fleet is frozen since .* by ana@ops: "
                                            "retransmissions up on the canary — table 1 .* pinned"):
        deploy(fleet, store, 2, HEALTH)
    assert _cli(cfg, "rollback", "--store", s, "--fleet", lf.path).exit_code == 2
    r = _cli(cfg, "rollout", "status", "--store", s, "--fleet", lf.path)
    assert r.exit_code == 0, r.output + str(r.exception)
    assert "FROZEN: the fleet is frozen since" in r.output and "by ana@ops: retransmissions up on the canary" in r.output
    assert f"cohort canary: {fleet.nodes[0].node_id}" in r.output
    assert _cli(cfg, "unfreeze", "--store", s, "--who", "bo@ops", "--reason", "canary's clients fixed").exit_code == 0
    assert deploy(fleet, store, 2, HEALTH)["ok"]
    assert [_cc_through(lf, i) for i in range(2)] == [b, b]
    assert "not frozen" in _cli(cfg, "rollout", "status", "--store", s).output


def _outcomes(effect_retrans: float, effect_stall: float = 1.0, conns_per_minute: int = 600, seed: int = 5,
              effect_delivery: float = 1.0):
    """Each node's arms minute by minute (sim/ab_outcomes.py): a look reads one more minute."""
    runs: dict[str, object] = {}

    def moments(node_id, from_ms, to_ms):
        if node_id not in runs:
            runs[node_id] = replay(np.random.default_rng(seed + len(runs)), 600, effect_retrans=effect_retrans,
                                   effect_stall=effect_stall, effect_delivery=effect_delivery,
                                   s=ArmsSetting(conns_per_minute=conns_per_minute))
        arms = next(runs[node_id])[1]
        return {m: {arm: v if isinstance(v, ArmMoments) else ArmMoments.of_clusters(*v) for arm, v in a.items()}
                for m, a in arms.items()}
    return moments


@pytest.fixture
def three_cohorts(edge_binary, keys, tmp_path):
    from ccs_testing import write_config
    from ccselect.config import load_config
    cfg = load_config(write_config(tmp_path))
    lf = LocalFleet(edge_binary, keys["public_path"], tmp_path, more=1,
                    cohorts=["canary", {"name": "50%", "share": 0.5}, "all"])
    try:
        lf.attach_all(cfg)
        yield cfg, lf
    finally:
        lf.cleanup(cfg)


def test_cohorts_pass_the_canary_verdict_and_a_harmful_table_is_rolled_back_and_frozen(three_cohorts, keys, tmp_path):
    cfg, lf = three_cohorts
    a, b = other_ccs(sysctl_cc())
    store = Store(str(tmp_path / "store"))
    fleet = lf.fleet(cfg)
    ids = [n.node_id for n in fleet.nodes]
    assert [(c, [n.node_id for n in ns]) for c, ns in fleet.cohorts] == [("canary", ids[:1]), ("50%", ids[1:2]),
                                                                          ("all", ids[2:])]
    log = gates.DecisionLog.for_config(cfg)
    for v, cc in ((1, a), (2, b)):
        store.publish(_table(keys, str(tmp_path / "export"), v, cc).manifest)
    # a table 25% faster (the primary, delivery rate) with 30% fewer retransmissions and stalls:
    # each cohort promoted on its outcomes, in order. A look here reads a replayed minute every
    # 10 ms while the gate counts wall-clock minutes since the load, so no bake (the default's
    # whole window would be 30 wall-clock minutes)
    good = gates.CanaryVerdict(replace(CanarySettings(), bake_minutes=0), _outcomes(0.7, 0.7, effect_delivery=1.25),
                               look_s=0.01)
    res = deploy(fleet, store, 1, HEALTH, gate=good, decisions=log, log=lambda m: None)
    assert res["ok"] and list(res["nodes"]) == ids and store.current() == 1, res.get("stopped")
    assert [(d["cohort"], d["decision"]) for d in res["decisions"]] == [("canary", "promote"), ("50%", "promote"),
                                                                          ("all", "promote")]
    # +50% retransmissions: rolled back on the canary (the agent's rollback), never past it, frozen
    bad = gates.CanaryVerdict(CanarySettings(), _outcomes(1.5), look_s=0.01)
    res = deploy(fleet, store, 2, HEALTH, gate=bad, decisions=log, log=lambda m: None)
    assert not res["ok"] and list(res["nodes"]) == ids[:1], res
    assert res["rolled_back"][ids[0]]["rolled_back"] and res["rolled_back"][ids[0]]["live_version"] == 1
    assert [lf.status(cfg, i)["table"]["version"] for i in range(3)] == [1, 1, 1] and store.current() == 1
    assert [_cc_through(lf, i) for i in range(3)] == [a, a, a]
    fr = freeze.current(store)
    assert fr["who"] == "rollout" and fr["pinned"] == 1 and "retrans_rate: treatment +" in fr["why"], fr
    rows = gates.read_decisions(log.path)
    assert [(r["cohort"], r["version"], r["decision"]) for r in rows] == [
        ("canary", 1, "promote"), ("50%", 1, "promote"), ("all", 1, "promote"), ("canary", 2, "rollback")]
    ev = json.loads(rows[-1]["evidence"])
    assert ev["gate"] == "canary" and ev["nodes"][ids[0]]["metrics"]["retrans_rate"]["cs"][0] > 0, ev
    assert rows[-1]["node_ids"] == ids[0] and rows[-1]["minute"] > 0
    r = _cli(cfg, "rollout", "status", "--store", str(tmp_path / "store"))
    assert "FROZEN" in r.output and "canary (" + ids[0] + ") table 0:2" in r.output and ": rollback — " in r.output, r.output


def test_no_outcomes_within_the_window_does_not_promote(fleet_env, keys, tmp_path):
    """The canary's logs never reach the lake (no connection ends there): the window ends, the
    gate says so, the canary goes back, the store's table stays, and nothing is frozen."""
    cfg, lf, a, b, store, fleet = _v1_live_v2_published(fleet_env, keys, tmp_path)
    silent = gates.CanaryVerdict(CanarySettings(max_minutes=0.01), _outcomes(1.0, conns_per_minute=0), look_s=0.1)
    res = deploy(fleet, store, 2, HEALTH, gate=silent)
    assert not res["ok"] and res["decisions"][0]["decision"] == "observe", res
    assert f"no outcome rows of {fleet.nodes[0].node_id} in silver.connections" in res["stopped"]
    assert "Not promoted" in res["stopped"] and freeze.current(store) is None
    assert [lf.status(cfg, i)["table"]["version"] for i in range(2)] == [1, 1] and store.current() == 1


def test_a_table_the_canary_cannot_resolve_is_not_promoted_and_goes_back(fleet_env, keys, tmp_path):
    """Outcomes arrive, no harm is shown, and the intervals stay wider than export.canary.harm_margin
    when the window ends (a table that changes nothing, a few minutes of traffic): not promoted,
    the canary goes back to its previous table, nothing frozen, the next cohort never loads it."""
    cfg, lf, a, b, store, fleet = _v1_live_v2_published(fleet_env, keys, tmp_path)
    short = gates.CanaryVerdict(CanarySettings(max_minutes=0.01), _outcomes(1.0), look_s=0.1)
    res = deploy(fleet, store, 2, HEALTH, gate=short, log=lambda m: None)
    assert not res["ok"] and list(res["nodes"]) == [fleet.nodes[0].node_id], res
    d = res["decisions"][0]
    assert d["decision"] == "observe" and "ended without evidence either way" in d["reason"], d
    assert "delivery_rate " in d["reason"] and "not above the -5% margin (export.canary.harm_margin)" in d["reason"], \
        d["reason"]
    assert [lf.status(cfg, i)["table"]["version"] for i in range(2)] == [1, 1] and store.current() == 1
    assert freeze.current(store) is None


class _Clock:
    """The rollout in flight's clock (ms), moved by the test a minute a look."""

    def __init__(self):
        self.ms = 1_790_000_000_000

    def __call__(self) -> int:
        return self.ms


def test_a_rollout_in_flight_moves_on_one_look_at_a_time(three_cohorts, keys, tmp_path):
    """export/delivery/inflight.py through real agents: `begin` loads the canary and returns; each
    `advance` is one look, its state read from and written to the store (as the stream's
    micro-batches, the hourly runs and `ccs rollout advance` take them, each a process of its own);
    a good table goes cohort by cohort, never before the bake, and then becomes the store's
    current table; a table that arrives meanwhile waits and begins after it; a harmful one is
    rolled back from the canary, never reaches the next cohort, and freezes the fleet; the
    decisions are gold.rollout_decisions' rows and `ccs rollout status` shows the one in flight."""
    from ccselect.export.delivery import inflight
    cfg, lf = three_cohorts
    a, b = other_ccs(sysctl_cc())
    store = Store(str(tmp_path / "store"))
    fleet = lf.fleet(cfg)
    ids = [n.node_id for n in fleet.nodes]
    log = gates.DecisionLog.for_config(cfg)
    for v, cc in ((1, a), (2, b)):
        store.publish(_table(keys, str(tmp_path / "export"), v, cc).manifest)
    clock, settings, quiet = _Clock(), CanarySettings(), (lambda m: None)

    def live():
        return [(lf.status(cfg, i).get("table") or {}).get("version") for i in range(3)]

    def looks(moments, version):
        out = []
        while (inflight.current(store) or {}).get("version") == version and len(out) < 200:
            clock.ms += 60_000
            out.append(inflight.advance(fleet, store, HEALTH, settings, moments, clock=clock, log=quiet,
                                        decisions=log))
        return out

    res = inflight.begin(fleet, store, 1, HEALTH, clock=clock, log=quiet, decisions=log)
    assert res["inflight"] and res["cohort"] == "canary", res
    assert live() == [1, None, None] and store.current() is None
    assert inflight.begin(fleet, store, 2, HEALTH, clock=clock, log=quiet, decisions=log)["queued_behind"] == 1
    r = _cli(cfg, "rollout", "status", "--store", str(tmp_path / "store"))
    assert r.exit_code == 0, r.output + str(r.exception)
    assert f"IN FLIGHT: table 0:1 " in r.output and f"on cohort canary ({ids[0]})" in r.output, r.output
    assert "waiting behind it: table 2" in r.output, r.output

    steps = looks(_outcomes(0.7, 0.7, effect_delivery=1.25), 1)
    decided = [s for s in steps if "decision" in s]
    assert [(s["cohort"], s["decision"]) for s in decided] == [("canary", "promote"), ("50%", "promote"),
                                                               ("all", "promote")], decided
    assert all(s["minute"] >= settings.bake_minutes for s in decided), decided
    assert any(s.get("observing") for s in steps) and store.current() == 1
    # table 2 began on the canary as table 1 ended
    assert decided[-1]["next"]["inflight"] and inflight.current(store)["version"] == 2
    assert live() == [2, 1, 1]

    steps = looks(_outcomes(1.5), 2)
    assert steps[-1]["decision"] == "rollback" and "retrans_rate: treatment +" in steps[-1]["reason"], steps[-1]
    assert steps[-1]["rolled_back"][ids[0]]["rolled_back"], steps[-1]
    assert live() == [1, 1, 1] and store.current() == 1 and inflight.current(store) is None
    assert [_cc_through(lf, i) for i in range(3)] == [a, a, a]
    fr = freeze.current(store)
    assert fr["who"] == "rollout" and fr["pinned"] == 1 and "cohort canary" in fr["why"], fr
    rows = gates.read_decisions(log.path)
    assert [(r["cohort"], r["version"], r["decision"]) for r in rows] == [
        ("canary", 1, "promote"), ("50%", 1, "promote"), ("all", 1, "promote"), ("canary", 2, "rollback")]
    assert json.loads(rows[-1]["evidence"])["nodes"][ids[0]]["metrics"]["retrans_rate"]["cs"][0] > 0
    r = _cli(cfg, "rollout", "status", "--store", str(tmp_path / "store"))
    assert "no rollout in flight; the last, table 2" in r.output and "stopped: cohort canary: rollback" in r.output, \
        r.output
    with pytest.raises(freeze.Frozen):
        inflight.begin(fleet, store, 2, HEALTH, clock=clock, log=quiet, decisions=log)
    # lifted; table 2 again on the canary; an operator freezes while it is in flight: the next look
    # stops it, the canary goes back, the decision names the freeze
    freeze.unfreeze(store, "retransmissions understood", who="bo@ops")
    assert inflight.begin(fleet, store, 2, HEALTH, clock=clock, log=quiet, decisions=log)["inflight"]
    assert live() == [2, 1, 1]
    freeze.freeze(store, "maintenance window", who="ana@ops")
    clock.ms += 60_000
    r = inflight.advance(fleet, store, HEALTH, settings, _outcomes(1.0), clock=clock, log=quiet, decisions=log)
    assert r["decision"] == "observe" and "stopped by a freeze" in r["reason"] and "ana@ops" in r["reason"], r
    assert live() == [1, 1, 1] and inflight.current(store) is None and store.current() == 1
    r = _cli(cfg, "rollout", "advance", "--store", str(tmp_path / "store"), "--fleet", lf.path)
    assert r.exit_code == 0 and "no rollout in flight" in r.output, r.output + str(r.exception)


def test_the_pipelines_rollout_with_the_canary_gate_leaves_it_in_flight(fleet_env, keys, tmp_path, monkeypatch):
    """flows/pipeline.rollout (the hourly DAG's rollout task, the stream's table step) with
    export.rollout.gate canary: the canary loads and the rollout stays in flight, the store's table
    does not move, the next table waits behind it, and the gauges say so. The guards and the lake's
    side of publishing (export/delivery/publish.py, tested on their own) are replaced here by the
    store's own publish of a signed table, so no lake or Spark session is needed; nothing is in
    flight at the first call, so its look reads nothing either."""
    from ccselect.config import load_config
    from ccselect.export.delivery import inflight, publish as publish_mod
    from ccselect.flows import job_metrics, pipeline
    cfg, lf = fleet_env
    a, b = other_ccs(sysctl_cc())
    cfg.raw["export"]["rollout"].update(gate="canary", store=str(tmp_path / "store"))
    cfg.raw["pipeline"].update(fleet=lf.path, metrics_dir=str(tmp_path / "textfile"))
    with open(cfg.path, "w") as f:
        yaml.safe_dump(cfg.raw, f)
    cfg = load_config(cfg.path)
    tables = {v: _table(keys, str(tmp_path / "export"), v, cc) for v, cc in ((1, a), (2, b))}
    monkeypatch.setattr(publish_mod, "publish",
                        lambda session, cfg, store, version, **kw: {"version": store.publish(tables[version].manifest)})
    # no session: the first look finds nothing in flight, and publishing is the store's own
    monkeypatch.setattr(pipeline, "_spark", lambda cfg, app: None)
    store = Store(str(tmp_path / "store"))

    res = pipeline.rollout(1, cfg, deploy_fleet=True)
    assert res["deployed"] == "in flight" and res["look"] == {"inflight": None}, res
    assert res["begin"]["inflight"] and res["begin"]["cohort"] == "canary", res
    assert [(lf.status(cfg, i).get("table") or {}).get("version") for i in range(2)] == [1, None]
    assert store.current() is None and inflight.current(store)["version"] == 1
    assert _cc_through(lf, 0) == a
    res = pipeline.rollout(2, cfg, deploy_fleet=True, look=False)
    assert res["begin"] == {"version": 2, "queued_behind": 1, "next": 2}, res
    gauges = open(tmp_path / "textfile" / job_metrics.FREEZE_FILE).read()
    assert "ccs_rollout_inflight 1\n" in gauges and "ccs_rollout_inflight_cohort_index 0\n" in gauges, gauges
