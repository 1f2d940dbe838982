"""bench/rollout_drill: issue 58's rollout drill on a fleet that reacts (flows/follow.py).

Real agents (one per node, each attached to a throwaway cgroup of its own) load the tables the
rollout code gives them (export/delivery/rollout.deploy, cohorts canary → 50% → all); each node's
simulated clients get the CC its agent would give them under the table live there
(export/delivery/mirror.py); each cohort's gate is the canary's A/B on those outcomes
(gates.CanaryVerdict, export.canary's shipped settings, a look every simulated minute).

- twenty good tables in a row: each decides as ALICCS's rule on the truth (a prefix dominated by
  cellular clients at the hour it is built → bbr, else cubic; flows/follow.dominance_entries), over
  a random 90% of each node's prefixes, so successive tables differ as retrained ones do. A
  wrong decision is any cohort's verdict other than promote (a rollback: a false rollback; an
  observe: a good table held back, the cost of requiring evidence of no harm). Promised: a
  table that harms no metric is rolled back with probability at most α (export.canary.alpha); a
  table that harms a primary metric (export.canary.primary: delivery rate) by more than
  export.canary.harm_margin is promoted with probability at most α / number of metrics; a
  harm on a guardrail alone (retransmissions, rebuffer) rolls a table back only if its interval
  shows it within the window; nothing is promised on how many good tables are promoted.
- planted bad tables: the good table of the hour with every decision inverted, `--bad` times
  (the fleet unfrozen after each): the canary's verdict, the minutes of simulated traffic it
  took, and whether the table reached any node past the canary (the agents' live versions and
  the simulated fleet's record of what was live where).
- alternating good and bad tables (`--alternate N`, after the others: good, bad, good, ...; the fleet
  unfrozen after each, as an exporter that keeps publishing would find it): does the fleet flap?
  Per node, the live versions over the scenario's traffic in order, their changes, the agent's own
  swap count (ccs_ctl.generation), the returns to a version run before (A → B → A) and the bad
  versions it ran; and each table's change against the store's current one, by prefix (the flip
  and the revert the publishing guards' flip cap and hysteresis judge, request-weighted there:
  export/delivery/guards.py; this drill publishes past them, so the gate alone holds the bad ones).
- beside the gate's metrics (delivery rate, retransmissions, rebuffer), an outcome the logs
  carry that the gate does not read, on the canary over the same minutes (`side_metrics`):
  startup delay (the QoE beacon's startup_ms per session; higher is worse), with the
  always-valid interval at the decision's look (one look: not intersected over looks as the
  gate's are), to see whether a bad table moves it.

Run for each default CC (the control arm's, the nodes' sysctl) in `--defaults`: with bbr the
inverted table puts cellular clients on cubic (ALICCS Observation III's policed paths); with
cubic its harm is only Wi-Fi on bbr.

Writes bench/results/rollout_drill.json (docs/results/rollout-drill.md by bench/report.py); with
`--alternate 6 --out bench/results/rollout_drill_alternating.json`, the page
docs/results/rollout-drill-alternating.md (the simulated fleet runs longer, so the good and bad
tables before the alternation meet other traffic than rollout-drill.md's).

    sudo .venv/bin/python bench/rollout_drill.py [--good 20] [--bad 5] [--alternate 0] [--conns 20000] [--defaults bbr,cubic]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ccselect.flows.follow import FollowFleet, dominance_entries  # noqa: E402
from ccselect.config import load_config  # noqa: E402
from ccselect.settings import CanarySettings  # noqa: E402
from ccselect.export.artifact import signing  # noqa: E402
from ccselect.export.delivery import mirror  # noqa: E402
from ccselect.export.delivery.canary import cs_halfwidth  # noqa: E402
from ccselect.features.ab_moments import ArmMoments  # noqa: E402
from ccselect.export.delivery import freeze, gates  # noqa: E402
from ccselect.export.delivery.rollout import Health, deploy, load_fleet  # noqa: E402
from ccselect.export.delivery.store import Store  # noqa: E402
from ccselect.export.edge.agent import EdgeAgent, EdgeConfig  # noqa: E402
from ccselect.export.edge.probe import CGROUP_ROOT, in_cgroup, listener  # noqa: E402
from ccselect.sim.params import SimParams  # noqa: E402

HEALTH = Health(wait_s=0.2, min_rate_ratio=0.5)
COHORTS = ["canary", {"name": "50%", "share": 0.5}, "all"]


def edge_binary() -> str:
    other = os.environ.get("CCS_EDGE_BINARY")
    if other:
        return other
    subprocess.run(["make", "-s", "edge"], cwd=REPO, check=True)
    return str(REPO / "export" / "build" / "ccs-edge")


class Agents:
    """`nodes` agents, each attached to a cgroup of its own with one A/B service (a listener
    there), in a fleet file with the drill's cohorts."""

    def __init__(self, nodes: int, binary: str, public_key: str, root: Path):
        tag = f"{os.getpid()}"
        self.items, doc = [], {"cohorts": COHORTS, "nodes": []}
        for i in range(nodes):
            nid = f"drill-{i}-{tag}"
            cg = os.path.join(CGROUP_ROOT, nid)
            os.makedirs(cg)
            with in_cgroup(cg):
                ls = listener()
            self.items.append((nid, cg, f"/sys/fs/bpf/{nid}", ls))
            doc["nodes"].append({"node_id": nid, "canary": i == 0, "table_dir": str(root / nid / "tables"),
                                 "binary": binary,
                                 "agent": {"cgroup": cg, "pin_dir": f"/sys/fs/bpf/{nid}", "public_key": public_key,
                                           "sample_rate": 0.0, "state_dir": str(root / nid / "state"),
                                           "services": [{"port": ls.getsockname()[1], "name": "video", "ab": True}]}})
        self.path = str(root / "fleet.yaml")
        with open(self.path, "w") as f:
            yaml.safe_dump(doc, f)
        self.binary = binary
        for nid, cg, pin, _ in self.items:
            a = EdgeAgent(config=self._config(nid), binary=binary)
            a.attach(cg)
            a.close()

    def _config(self, nid: str) -> EdgeConfig:
        return next(n.config for n in load_fleet(self.path, CFG).nodes if n.node_id == nid)

    def cleanup(self) -> None:
        for nid, cg, pin, ls in self.items:
            ls.close()
            a = EdgeAgent(config=self._config(nid), binary=self.binary)
            try:
                a.detach(purge=True)
            except Exception as exc:     # reported, the rest still cleaned
                print(f"{nid}: detach failed: {exc}", file=sys.stderr)
            a.close()
            subprocess.run(["rm", "-rf", pin])
            for _ in range(50):
                try:
                    os.rmdir(cg)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


CFG = None


def live_versions(fleet) -> dict:
    """node → the table version its real agent has live (None: none)."""
    out = {}
    for n in fleet.nodes:
        ag = n.agent()
        try:
            out[n.node_id] = (ag.status().get("table") or {}).get("version")
        finally:
            ag.close()
    return out


def _publish(store, ff, key, out, version, hour, invert, rng, published=None):
    entries = {}
    for i in range(len(ff.nodes)):
        for e in dominance_entries(ff.world, i, hour, invert=invert, coverage=0.9, rng=rng):
            entries[str(e.prefix)] = e
    if published is not None:
        published[version] = {p: e.cc for p, e in entries.items()}
    now = int(time.time())
    store.publish(signing.write_table(list(entries.values()), version, f"drill-{version}", now + 48 * 3600, out, key,
                                      created=now, extra={"coverage": 0.9}).manifest)
    return len(entries)


def _generation(node) -> int:
    """The agent's swap count (ccs_ctl.generation: every load and rollback that changed the live slot)."""
    ag = node.agent()
    try:
        return int(ag.status()["generation"])
    finally:
        ag.close()


def _shares(published: dict, version: int, store, current) -> dict:
    """The table's change against the store's current table (the live one the publishing guards
    compare with), by prefix -- not request-weighted as guards.change_shares is: `flip` the share of
    the union of their prefixes whose CC differs (a prefix in one table only counts as changed),
    and `revert` the share the current table changed from the one before it and this one changes
    back (the hysteresis, export.guards.max_revert_share)."""
    if current is None:
        return {}
    new, live = published[version], published[current]
    hist = [v for v in store.state()["history"] if v != current and v in published and v < current]
    prev = published[hist[-1]] if hist else None
    keys = set(new) | set(live)
    flip = sum(1 for p in keys if new.get(p) != live.get(p)) / len(keys)
    out = {"against_version": current, "flip_share_by_prefix": round(flip, 4)}
    if prev is not None:
        keys |= set(prev)
        back = sum(1 for p in keys if live.get(p) != prev.get(p) and new.get(p) == prev.get(p)) / len(keys)
        out |= {"previous_version": hist[-1], "revert_share_by_prefix": round(back, 4)}
    return out


def _alternating_summary(rows: list, fleet, ff, alt_from: dict, canary_id: str) -> dict:
    """Does the fleet flap under alternating good/bad tables? Per node, from the simulated fleet's
    record of what was live (FollowFleet spans over the scenario's traffic) and the agent's own swap
    count: the live-version changes, the returns to a version run before (A → B → A: a flap),
    and the bad versions it ran."""
    bad = {r["version"] for r in rows if r["kind"] == "bad"}
    per = {}
    for n in fleet.nodes:
        first, gen0 = alt_from[n.node_id]
        spans = ff.versions_seen(n.node_id)[max(0, first - 1):]      # from the version live at its start
        seq = [v for i, v in enumerate(spans) if i == 0 or v != spans[i - 1]]
        returns = sum(1 for i, v in enumerate(seq) if v in seq[:i])
        per[n.node_id] = {"role": "canary" if n.node_id == canary_id else "past the canary",
                          "live_versions_in_order": seq, "live_changes": max(0, len(seq) - 1),
                          "agent_swaps": _generation(n) - gen0, "returns_to_an_earlier_version": returns,
                          "bad_versions_run": sorted(bad & set(seq))}
    past = [p for nid, p in per.items() if nid != canary_id]

    def on(decision, kind):
        return [d["minute"] for r in rows if r["kind"] == kind for d in r["decisions"]
                if d["cohort"] == "canary" and d["decision"] == decision]
    return {
        "tables": [r["kind"] for r in rows], "versions": [r["version"] for r in rows],
        "bad_held_back": sum(1 for r in rows if r["kind"] == "bad" and not r["ok"]),
        "bad_tables": len(bad), "good_promoted_everywhere": sum(1 for r in rows if r["kind"] == "good" and r["ok"]),
        "good_tables": sum(1 for r in rows if r["kind"] == "good"),
        "bad_canary_rollback_minutes": on("rollback", "bad"), "bad_canary_observe_minutes": on("observe", "bad"),
        "froze_after": [r["version"] for r in rows if r["froze"]],
        "nodes_past_canary_that_ran_a_bad_table": sum(1 for p in past if p["bad_versions_run"]),
        "max_returns_past_canary": max((p["returns_to_an_earlier_version"] for p in past), default=0),
        "canary_minutes_on_bad_tables": sum(on("rollback", "bad")) + sum(on("observe", "bad")),
        "per_node": per,
    }


def _evidence(d: dict) -> dict:
    ev = json.loads(d["evidence"])
    return {n: {m: {k: x.get(k) for k in ("rel_change", "cs", "clusters") if k in x} for m, x in e["metrics"].items()}
            for n, e in ev.get("nodes", {}).items()}


#: outcomes the logs carry that the gate does not read: name → (log, numerator, denominator, harm if higher)
SIDE_METRICS = {"startup_ms": ("qoe", "startup_ms", "sessions", True)}


def side_metrics(ff, node_id: str, from_ms: int, to_ms: int, settings) -> dict:
    """SIDE_METRICS on the node's logs that ended in [from_ms, to_ms): per metric the treatment's
    relative change against control and its always-valid (1 − α/metrics) interval at this one
    look (the gate's test, export/delivery/canary.py, on another ratio)."""
    if to_ms <= from_ms:
        return {}
    frames = {"access": [], "qoe": []}
    for h in ff.hours_between(from_ms, to_ms):
        nh = ff.hour(node_id, h)
        frames["access"].append(nh.access.filter(pl.col("ts_ms").is_between(from_ms, to_ms - 1)))
        frames["qoe"].append(nh.qoe.filter(pl.col("ts_ms").is_between(from_ms, to_ms - 1))
                             .with_columns(pl.lit(1, dtype=pl.Int64).alias("sessions")))
    out = {}
    alpha = settings.alpha / len(settings.metrics)
    for name, (log, y, x, worse_if_higher) in SIDE_METRICS.items():
        t = pl.concat(frames[log]).filter(pl.col(x) > 0)
        per = t.group_by("client_ip").agg(pl.len().alias("n"), pl.col(y).sum().alias("y"), pl.col(x).sum().alias("x"))
        odd = mirror.ab_odd(per["client_ip"].to_list(), ff._odd)
        arms = {}
        for arm, sel in (("control", ~odd), ("treatment", odd)):
            arms[arm] = ArmMoments.of_clusters(per["y"].to_numpy()[sel], per["x"].to_numpy()[sel], int(per["n"].to_numpy()[sel].sum()))
        c, tr = arms["control"], arms["treatment"]
        if min(c.clusters, tr.clusters) < 2 or not c.ratio or not tr.ratio:
            continue
        var = c.ratio_var() / c.ratio ** 2 + tr.ratio_var() / tr.ratio ** 2
        theta = float(np.log(tr.ratio / c.ratio))
        h = cs_halfwidth(var, settings.tau, alpha) if var > 0 else float("inf")
        out[name] = {"rel_change": float(np.expm1(theta)), "cs": [float(np.expm1(theta - h)), float(np.expm1(theta + h))],
                     "clusters": [c.clusters, tr.clusters], "worse_if": "higher" if worse_if_higher else "lower"}
    return out


def drill(default_cc: str, a, binary: str, root: Path) -> dict:
    global CFG
    key = signing.generate_key()
    signing.save_keypair(key, str(root / "priv.pem"), str(root / "pub.pem"))
    CFG = load_config()      # the fleet file names every path; the decisions are kept in memory
    agents = Agents(3, binary, str(root / "pub.pem"), root)
    out = {"default_cc": default_cc, "good": [], "bad": [], "alternating": []}
    try:
        fleet = load_fleet(agents.path, CFG)
        store = Store(str(root / "store"))
        hours = int(a.good * 1.6 + (a.bad + a.alternate) * 0.6) + 4
        ff = FollowFleet(SimParams(nodes=3, hours=hours, start="2026-11-01T00:00:00", conns_per_node_hour=a.conns,
                                   seed=a.seed, cc_mode="default"),
                         fleet, store, str(root / "pub.pem"), str(root / "scratch"), default_cc=default_cc)
        h0 = ff.world.hour_start_ms(0)
        settings = CanarySettings()
        log = gates.DecisionLog()
        gate = gates.CanaryVerdict(settings, ff.moments, look_s=60, clock=ff.now, sleep=ff.sleep)
        rng = np.random.default_rng(a.seed)
        version = 0
        published = {}       # version -> {prefix: cc}, for the flip and revert shares
        alt_from = None      # where the alternating scenario starts: per node, spans and generation
        kinds = [("good", "good")] * a.good + [("bad", "bad")] * a.bad + \
                [("alternating", "good" if i % 2 == 0 else "bad") for i in range(a.alternate)]
        for scenario, kind in kinds:
            if scenario == "alternating" and alt_from is None:
                alt_from = {n.node_id: (len(ff.versions_seen(n.node_id)), _generation(n)) for n in fleet.nodes}
                alt_current = store.current()
            version += 1
            hour = (ff.now() - h0) // 3_600_000
            n_entries = _publish(store, ff, key, str(root / "export"), version, hour, kind == "bad", rng,
                                 published)
            t_load, wall = ff.now(), time.time()
            res = deploy(fleet, store, version, HEALTH, gate=gate, decisions=log, log=lambda m: None)
            ff.now()
            seen = {n.node_id: ff.versions_seen(n.node_id) for n in fleet.nodes}
            live = live_versions(fleet)
            decs = [d for d in res["decisions"] if d["version"] == version]
            canary_dec = next((d for d in decs if d["cohort"] == "canary"), None)
            side = side_metrics(ff, fleet.nodes[0].node_id, t_load, t_load + int(canary_dec["minute"] * 60_000),
                                settings) if canary_dec else {}
            row = {"version": version, "kind": kind, "built_at_sim_hour": int(hour), "entries": n_entries,
                   "ok": res["ok"], "stopped": res.get("stopped"), "froze": "freeze" in res,
                   "sim_minute_loaded": round((t_load - h0) / 60_000, 1),
                   "decisions": [{"cohort": d["cohort"], "decision": d["decision"], "minute": d["minute"],
                                  "evidence": _evidence(d)} for d in decs],
                   "canary_side_metrics": side,
                   "reached_nodes": [n for n, vs in seen.items() if version in vs],
                   "live_after": live, "wall_s": round(time.time() - wall, 1)}
            if scenario == "alternating":
                row["shares_against_store_current"] = _shares(published, version, store, alt_current)
                if res["ok"]:
                    alt_current = version
            out[scenario].append(row)
            print(json.dumps({k: row[k] for k in ("version", "ok", "reached_nodes", "wall_s")}
                             | {"decisions": [(d["cohort"], d["decision"], d["minute"]) for d in decs]}), flush=True)
            if freeze.current(store) is not None:
                freeze.unfreeze(store, "drill: the next table", who="bench")
            ff.sleep(5 * 60)     # five minutes of traffic between rollouts
        canary_id = fleet.nodes[0].node_id

        def first(r, decision):       # the cohorts whose verdict was `decision`
            return [d for d in r["decisions"] if d["decision"] == decision]
        good_wrong = [r["version"] for r in out["good"] if not r["ok"]]
        false_rb = [r["version"] for r in out["good"] if first(r, "rollback")]
        held = [r["version"] for r in out["good"] if first(r, "observe")]
        bad_rb = [d["minute"] for r in out["bad"] for d in first(r, "rollback") if d["cohort"] == "canary"]
        bad_held = [d["minute"] for r in out["bad"] for d in first(r, "observe") if d["cohort"] == "canary"]
        ff.now()                 # the spans up to the last minute of traffic
        if alt_from is not None:
            out["alternating_summary"] = _alternating_summary(out["alternating"], fleet, ff, alt_from, canary_id)
        out["summary"] = {
            "good_tables": a.good, "good_promoted_everywhere": a.good - len(good_wrong),
            "good_wrong_decisions": len(good_wrong), "good_false_rollbacks": len(false_rb),
            "good_observed_not_promoted": len(held),
            "good_observed_on_cohort": {c: sum(1 for r in out["good"] for d in first(r, "observe") if d["cohort"] == c)
                                        for c in ("canary", "50%", "all")},
            "good_promoted_on_cohort": {c: sum(1 for r in out["good"] for d in first(r, "promote") if d["cohort"] == c)
                                        for c in ("canary", "50%", "all")},
            "good_rolled_back_on_cohort": {c: sum(1 for r in out["good"] for d in first(r, "rollback") if d["cohort"] == c)
                                           for c in ("canary", "50%", "all")},
            "good_promote_minutes_on_canary": [d["minute"] for r in out["good"] for d in first(r, "promote")
                                               if d["cohort"] == "canary"],
            "good_false_rollback_rate": len(false_rb) / max(1, a.good),
            "promised_false_rollback_rate_at_most": settings.alpha,
            "promised_false_promote_rate_at_most": settings.alpha / len(settings.metrics),
            "false_promote_promise_covers": f"a harm beyond the margin on the primary {list(settings.primary)}; "
                                            f"not a harm on a guardrail alone {list(settings.guardrails)}",
            "bad_tables": a.bad, "bad_rolled_back_on_canary": len(bad_rb),
            "bad_observed_on_canary_not_promoted": len(bad_held),
            "bad_promoted_from_canary": sum(1 for r in out["bad"] for d in first(r, "promote") if d["cohort"] == "canary"),
            "bad_missed": a.bad - len(bad_rb),
            "bad_reached_past_canary": sum(1 for r in out["bad"] if set(r["reached_nodes"]) - {canary_id}),
            "bad_rollback_minutes": bad_rb,
            "bad_rollback_minutes_max": max(bad_rb) if bad_rb else None,
            "window_minutes": settings.max_minutes,
            "node_hours_generated": ff.generated,
        }
    finally:
        agents.cleanup()
    return out


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def alternating_markdown(res: dict) -> str:
    """The alternating scenario of each drill as tables (the page's summary; every figure is in
    the JSON below it)."""
    out = ["## Alternating good and bad tables: does the fleet flap?", "",
           "Each table goes canary → 50% → all, gated by the canary's A/B on the reacting fleet's outcomes; "
           "the fleet is unfrozen after each table. The flip and revert shares are by prefix against the store's "
           "current table (the publishing guards weigh them by requests, and this drill publishes past the guards).",
           ""]
    for d in res["drills"]:
        s = d.get("alternating_summary")
        if not s:
            continue
        out += [f"### Default CC {d['default_cc']}", "",
                "| version | kind | decisions (cohort: decision at minute) | promoted to all | froze | flip / revert vs current |",
                "|---|---|---|---|---|---|"]
        for r in d["alternating"]:
            sh = r.get("shares_against_store_current") or {}
            decs = ", ".join(f"{x['cohort']}: {x['decision']} at {x['minute']:g}" for x in r["decisions"]) or "none"
            out.append(f"| {r['version']} | {r['kind']} | {decs} | {'yes' if r['ok'] else 'no'} | "
                       f"{'yes' if r['froze'] else 'no'} | {_pct(sh.get('flip_share_by_prefix'))} / "
                       f"{_pct(sh.get('revert_share_by_prefix'))} vs {sh.get('against_version', '–')} |")
        out += ["", "| node | role | live versions in order (from the one live before) | changes | agent swaps | "
                    "returns to an earlier version | bad versions run |", "|---|---|---|---|---|---|---|"]
        for nid, p in s["per_node"].items():
            out.append(f"| {nid} | {p['role']} | {' → '.join(str(v) for v in p['live_versions_in_order'])} | "
                       f"{p['live_changes']} | {p['agent_swaps']} | {p['returns_to_an_earlier_version']} | "
                       f"{', '.join(map(str, p['bad_versions_run'])) or 'none'} |")
        out += ["", f"Bad tables held back: {s['bad_held_back']} of {s['bad_tables']} (canary rollback at minute "
                    f"{', '.join(f'{m:g}' for m in s['bad_canary_rollback_minutes']) or '–'}; not promoted at minute "
                    f"{', '.join(f'{m:g}' for m in s['bad_canary_observe_minutes']) or '–'}); nodes past the canary that "
                    f"ran a bad table: {s['nodes_past_canary_that_ran_a_bad_table']}; the canary's minutes of traffic "
                    f"on bad tables: {s['canary_minutes_on_bad_tables']:g}; good tables promoted to all: "
                    f"{s['good_promoted_everywhere']} of {s['good_tables']}.", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--good", type=int, default=20)
    ap.add_argument("--bad", type=int, default=5)
    ap.add_argument("--alternate", type=int, default=0,
                    help="then this many tables alternating good, bad, good, ... (the no-flap scenario; "
                         "docs/results/rollout-drill-alternating.md: 6)")
    ap.add_argument("--conns", type=int, default=20000, help="mean connections per node-hour")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--defaults", default="bbr,cubic", help="the nodes' default CCs to drill under")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "rollout_drill.json"))
    ap.add_argument("--markdown-from", metavar="JSON",
                    help="only (re)write the alternating scenario's page summary (page_markdown) into this "
                         "drill JSON, from its own figures; nothing is run")
    a = ap.parse_args(argv)
    if a.markdown_from:
        res = json.loads(Path(a.markdown_from).read_text())
        res["page_markdown"] = alternating_markdown(res)
        Path(a.markdown_from).write_text(json.dumps(res, indent=2, default=list))
        return 0
    binary = edge_binary()
    t0 = time.time()
    res = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "load_avg": [round(x, 2) for x in os.getloadavg()],
           "command": "bench/rollout_drill.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "fleet": {"nodes": 3, "cohorts": ["canary", "50%", "all"], "conns_per_node_hour": a.conns, "seed": a.seed,
                     "look_every_sim_minutes": 1, "health_wait_s": HEALTH.wait_s},
           "canary_settings": {k: getattr(CanarySettings(), k) for k in ("alpha", "tau", "harm_margin", "min_clusters",
                                                                          "max_minutes", "bake_minutes", "metrics",
                                                                          "primary", "guardrails")},
           "drills": []}
    for dcc in [d for d in a.defaults.split(",") if d]:
        with tempfile.TemporaryDirectory(prefix="ccs-drill-") as d:
            res["drills"].append(drill(dcc, a, binary, Path(d)))
    res["wall_s"] = round(time.time() - t0, 1)
    if a.alternate:
        res["page_markdown"] = alternating_markdown(res)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2, default=list))
    print(json.dumps([d["summary"] | {"default_cc": d["default_cc"]}
                      | {"alternating": {k: v for k, v in d.get("alternating_summary", {}).items() if k != "per_node"}}
                      for d in res["drills"]], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
