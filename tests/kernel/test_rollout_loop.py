"""Issue 58's loop through the stream, end to end (bench/rollout_loop.py's drill, small): two real
agents, `ccs simulate --follow` writing their segments from the tables live on them, `ccs stream`
(file source, the Spark stream) putting them into silver, and the canary's gate reading the
canary's arms from silver (flows/rollout_loop.StreamGate). The planted bad table (a good one's
decisions inverted) is rolled back from the canary on what the gate read from silver, the fleet
frozen, the decision in gold.rollout_decisions, and the other node never runs it.

Minutes on 2 cores (a Spark stream and a second Spark session for the gate): its own lane,
`make test-loop` (marker `rollout_loop`), not `make test`. Without the stream the gate reads no
rows, says `observe` at its wall bound, and this test fails."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import rollout_loop  # noqa: E402

pytestmark = [pytest.mark.kernel, pytest.mark.rollout_loop]


def test_a_bad_table_is_rolled_back_from_the_canary_on_what_the_stream_put_in_silver(edge_binary, tmp_path):
    rec = rollout_loop.loop(tmp_path, edge_binary, nodes=2, conns=20000, speed=20, good=False, coverage=1.0)
    canary, other = rec["cohorts"]["canary"][0], rec["cohorts"]["all"][0]
    bad = rec["rollouts"]["bad"]
    assert not bad["ok"] and [d["cohort"] for d in bad["decisions"]] == ["canary"], bad
    d = bad["decisions"][0]
    # the verdict is on silver's rows of the canary since the table went live, and shows harm
    assert d["decision"] == "rollback" and not d["wall_bound_hit"], d
    assert d["outcome_rows"][canary] > 1000, "the gate read the canary's arms from silver"
    assert d["silver_through_ms"][canary] > d["live_from_ms"], d
    assert 0 < d["minute"] <= rec["canary_settings"]["max_minutes"], d
    assert "treatment" in d["reason"] and ("above 0" in d["reason"] or "below 0" in d["reason"]), d["reason"]
    # the gate's live-from (the fleet's next minute) is when the simulation made the table live, or after
    s = rec["bad_summary"]
    assert s["live_from_actual_ms"] and s["live_from_assumed_ms"] >= s["live_from_actual_ms"][0], s
    # rolled back and frozen; never on the other node, in the agents or in the simulated traffic
    assert bad["live_after"] == {canary: 1, other: 1} and bad["frozen"], bad
    assert rec["follow"]["versions_seen"][canary][:2] == [1, 2] and rec["follow"]["versions_seen"][other] == [1]
    assert s["reached_non_canary_nodes"] == []
    assert [(r["cohort"], r["version"], r["decision"]) for r in rec["gold_rollout_decisions"]] == \
        [("canary", 2, "rollback")]
    assert rec["stream_batches"]["with_files"] >= 2 and rec["stream_rc"] == 0


def test_the_stream_itself_keeps_a_bad_table_on_the_canary_from_the_rollout_in_flight(edge_binary, tmp_path):
    """The production path (export/delivery/inflight.py): this process only begins the rollout;
    `ccs stream`, deploying with export.rollout.gate canary on the records' clock
    (stream.rollout_clock: records), looks at the canary after its micro-batches. The planted bad
    table goes back from the canary and no other node ever has it: rolled back with a freeze when
    its harm shows within the window, or sent back at the window's end without evidence that it
    is within the margin (the drill measured both for bad tables: docs/results/rollout-drill.md);
    never promoted."""
    rec = rollout_loop.loop(tmp_path, edge_binary, nodes=2, conns=20000, speed=20, good=False, coverage=1.0,
                            inflight=True)
    canary, other = rec["cohorts"]["canary"][0], rec["cohorts"]["all"][0]
    bad = rec["rollouts"]["bad"]
    assert not bad["ok"] and [d["cohort"] for d in bad["decisions"]] == ["canary"], bad
    d = bad["decisions"][0]
    assert d["decision"] in ("rollback", "observe") and d["outcome_rows"][canary] > 1000, d
    assert 0 < d["minute"] <= rec["canary_settings"]["max_minutes"], d
    assert d["silver_through_ms"][canary] > d["live_from_ms"], d
    assert bad["live_after"] == {canary: 1, other: 1} and bad["frozen"] == (d["decision"] == "rollback"), bad
    assert rec["bad_summary"]["reached_non_canary_nodes"] == []
    assert [(r["cohort"], r["version"], r["decision"]) for r in rec["gold_rollout_decisions"]] == \
        [("canary", 2, d["decision"])]
    # the looks were the stream's, a look a minute of traffic: its micro-batches say so
    looks = [b["rollout_look"] for b in rollout_loop._batches(tmp_path / "stream.log") if "rollout_look" in b]
    assert looks and any(lk.get("decision") == d["decision"] for lk in looks), looks
