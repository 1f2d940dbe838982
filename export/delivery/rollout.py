"""`ccs rollout` / `ccs rollback`: publish a signed table to the artifact store, then load it on
the fleet cohort by cohort — the canary first, health checked through `ccs-edge status`, then a
gate (export/delivery/gates.py: health, or the canary's A/B on outcomes) before the next cohort
(infra/fleet.yaml's `cohorts:`: canary, then e.g. 10%, 50%, all; without it canary then rest).
A frozen store (export/delivery/freeze.py, `ccs freeze`) refuses every rollout.

Health of a node after a load (issue 7): the table is active (the live version is the new one and
enforced), no setsockopt error appeared since the load, and the connection rate (the program's
`established` counter over `health_wait_s`) stays above `min_rate_ratio` of the rate measured over
the same window just before the load (not checked when the node had no traffic before).
A failed canary stops the rollout: every canary already loaded goes back to the table it had
(the agent's own previous slot, `ccs-edge rollback`), the rest never see the new version and the
store's current version does not move. A failure among the rest rolls back every node loaded.

A fleet file (infra/fleet.yaml) lists nodes; on one machine each node is its own agent with its
own cgroup and pin dir (the way tests/kernel runs agents). A node with `netns:` stands for a remote
host (infra/fleet-netns.yaml, topology/edges.py): its agent's commands run in that network
namespace, and it pulls the table itself, over its own link, from the store at `store_endpoint`
(`python -m ccselect.export.delivery.pull`), instead of the control process copying it.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import yaml

from ccselect.config import Config, project_root
from ccselect.settings import Health  # cfg.settings.export.rollout.health
from ccselect.export.artifact import signing
from ccselect.export.delivery import freeze
from ccselect.export.delivery.gates import PROMOTE, ROLLBACK, Decision, DecisionLog, GateContext, health_gate
from ccselect.export.delivery.store import Store, StoreError
from ccselect.export.edge.agent import CAP_KEYS, EdgeAgent, EdgeAgentError, EdgeConfig, Service


def netns_argv(netns: str) -> list[str]:
    """The prefix that runs a command in a node's network namespace. `nsenter --net` changes the
    network namespace only; `ip netns exec` would also remount /sys, hiding the bpffs and cgroup2
    mounts under it that the agent's pins and cgroup live on."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--"]


class NetnsAgent(EdgeAgent):
    """The agent of a node on its own network namespace: every command runs there (so its route
    CCs, if on, go into the node's routing tables, and `run` sees the node's network)."""

    def __init__(self, netns: str, **kw):
        self.netns = netns
        super().__init__(**kw)

    def _argv(self, *args: str) -> list[str]:
        return netns_argv(self.netns) + super()._argv(*args)


@dataclass
class Node:
    node_id: str
    canary: bool
    config: EdgeConfig
    table_dir: str
    binary: str | None = None
    netns: str | None = None           # the node's network namespace (a remote host), or None
    address: str | None = None         # its address on the link to the host (CIDR), with netns
    store_endpoint: str | None = None  # the store as the node reaches it (http://host:port)
    cohort: str = ""                   # its cohort's name (the fleet file's `cohorts:`)

    def agent(self) -> EdgeAgent:
        kw = {"binary": self.binary} if self.binary else {}
        if self.netns:
            return NetnsAgent(self.netns, config=self.config, **kw)
        return EdgeAgent(config=self.config, **kw)


@dataclass
class Fleet:
    nodes: list[Node] = field(default_factory=list)
    order: list[str] = field(default_factory=lambda: ["canary", "rest"])   # the cohorts, in rollout order

    @property
    def canaries(self) -> list[Node]:
        return [n for n in self.nodes if n.canary]

    @property
    def rest(self) -> list[Node]:
        return [n for n in self.nodes if not n.canary]

    @property
    def cohorts(self) -> list[tuple[str, list[Node]]]:
        """(name, nodes) in rollout order; a cohort no node fell into (a share of a small fleet)
        is left out."""
        out = [(c, [n for n in self.nodes if n.cohort == c]) for c in self.order]
        return [(c, ns) for c, ns in out if ns]


def _cohorts(raw: dict, nodes: list[Node], path: str) -> list[str]:
    """Each node's cohort from the fleet file; → the cohorts' order.

    Without `cohorts:` (the fleet files before issue 58): `canary` (the nodes with `canary: true`)
    then `rest`. With it, a list of names or `{name, share}`: the first is the canary cohort
    (the nodes with `canary: true` or `cohort: <its name>`); a node with `cohort: NAME` is in
    that cohort; the others fill the cohorts after the first in order, a cohort with `share: S`
    taking nodes (in the file's order) until S of the whole fleet has had the table, the last
    cohort (no share: `all`) taking what is left."""
    spec = raw.get("cohorts")
    if spec is None:
        for n in nodes:
            n.cohort = "canary" if n.canary else "rest"
        return ["canary", "rest"]
    cohorts = [c if isinstance(c, dict) else {"name": c} for c in spec]
    names = [str(c["name"]) for c in cohorts]
    if len(cohorts) < 2 or len(set(names)) != len(names):
        raise ValueError(f"{path}: cohorts must name at least two distinct cohorts (the canary first): {names}")
    shares = [c.get("share") for c in cohorts[1:-1]]
    if cohorts[-1].get("share") not in (None, 1, 1.0) or any(
            x is None or not 0 < float(x) <= 1 for x in shares) or shares != sorted(shares):
        raise ValueError(f"{path}: each cohort between the first and the last needs a share in (0, 1], "
                         f"growing; the last takes the rest: {cohorts}")
    for n, want in zip(nodes, raw.get("_explicit", [])):
        if want is not None and str(want) not in names:
            raise ValueError(f"{path}: node {n.node_id}: cohort {want!r} is not in cohorts {names}")
        if n.canary and want is not None and str(want) != names[0]:
            raise ValueError(f"{path}: node {n.node_id} has canary: true and cohort {want!r}")
        n.cohort = names[0] if n.canary else (str(want) if want is not None else "")
        n.canary = n.cohort == names[0]
    total = len(nodes)
    free = [n for n in nodes if not n.cohort]
    for c in cohorts[1:]:
        share = c.get("share")
        have = sum(1 for n in nodes if n.cohort and names.index(n.cohort) <= names.index(str(c["name"])))
        want = total if share is None else math.ceil(float(share) * total - 1e-9)
        while free and have < want:
            free.pop(0).cohort = str(c["name"])
            have += 1
    return names


def _expand(value: str, cfg: Config) -> str:
    return str(value).replace("${data_root}", cfg.data_root)


def host_dir(cfg: Config, node_id: str) -> str:
    """A node's own folder on the one-machine fleet (tables it pulled; for a namespaced edge host
    also its agent's config and log): under `cluster.home` when set, else under the data root."""
    if cfg.settings.cluster.home:
        return os.path.join(cfg.settings.cluster.home, "edges", node_id)
    return os.path.join(cfg.data_root, "fleet", node_id)


def caps_from_guards(conf: EdgeConfig, cfg: Config, where: str = "config") -> EdgeConfig:
    """The agent's caps on one table (issue 58: entries, flow-tree nodes, bytes, growth against
    the live table) from `export.guards`, where the node's own config does not set them: the agent
    refuses what the publishing guards would (export/delivery/guards.py check_size), should a
    table reach it past them. A setting above the agent's compiled bound is an error naming it."""
    g = cfg.settings.export.guards
    for k in CAP_KEYS:
        if getattr(conf, k) is None:
            setattr(conf, k, getattr(g, k))
    try:
        conf.check_caps(where)
    except ValueError as exc:
        raise ValueError(f"{exc} (export.guards.* or the node's agent config)") from None
    return conf


def load_fleet(path: str, cfg: Config, public_key: str | None = None) -> Fleet:
    """Nodes from a fleet file: each with `node_id`, `canary`, optional `table_dir`, and its agent
    config either inline (`agent:` mapping, EdgeConfig fields) or as a file (`edge_config:`);
    optionally `netns`, `address` and `store_endpoint` (a node on a host of its own), and
    `cohort` (the file's `cohorts:`, `_cohorts`)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    raw["_explicit"] = [d.get("cohort") for d in raw.get("nodes") or []]
    base = os.path.dirname(os.path.abspath(path))
    nodes = []
    for d in raw.get("nodes") or []:
        nid = str(d["node_id"])
        if d.get("edge_config"):
            p = d["edge_config"]
            conf = EdgeConfig.from_yaml(p if os.path.isabs(p) else os.path.join(os.path.dirname(base), p))
        else:
            a = dict(d.get("agent") or {})
            svcs = [Service(int(s["port"]), str(s.get("name", "")), bool(s.get("ab", False)),
                            bool(s.get("caps", False)), str(s.get("flow_mode", "off")))
                    for s in a.pop("services", []) or []]
            a = {k: _expand(v, cfg) if isinstance(v, str) else v for k, v in a.items()}
            conf = EdgeConfig(services=svcs, **a)
        conf.node_id = conf.node_id if conf.node_id != "edge" else nid
        caps_from_guards(conf, cfg, f"{path}: node {nid}")
        if public_key and not conf.public_key:
            conf.public_key = public_key
        if not conf.state_dir:
            # the version floor (export/edge/floor.c) of a node of this fleet lives with its
            # lake, beside the node's tables: a fresh data root is a new lake, and starts again
            conf.state_dir = os.path.abspath(os.path.join(host_dir(cfg, nid), "state"))
        netns = d.get("netns")
        default_dir = (os.path.join(host_dir(cfg, nid), "tables") if netns
                       else os.path.join(cfg.data_root, "fleet", nid, "tables"))
        table_dir = _expand(d.get("table_dir") or default_dir, cfg)
        nodes.append(Node(nid, bool(d.get("canary", False)), conf, table_dir, d.get("binary"),
                          str(netns) if netns else None, d.get("address"), d.get("store_endpoint")))
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    order = _cohorts(raw, nodes, path)
    if not any(n.canary for n in nodes):
        raise ValueError(f"{path}: no canary node (set canary: true on at least one)")
    return Fleet(nodes, order)


def _counters(st: dict) -> dict:
    return st.get("counters") or {}


def _live_version(st: dict):
    t = st.get("table")
    return t["version"] if t else None


def pull(node: Node, store: Store, version: int, timeout: float = 120.0) -> str:
    """The node takes `version` from the store itself, from inside its network namespace, at the
    store's address as it sees it; → the manifest's path in the node's table dir."""
    endpoint = node.store_endpoint or store.endpoint
    cmd = (netns_argv(node.netns) + [sys.executable, "-m", "ccselect.export.delivery.pull", "--store", store.url,
                                     "--version", str(int(version)), "--dest", node.table_dir,
                                     "--region", store.region or "us-east-1"]
           + (["--endpoint", endpoint] if endpoint else []) + ([] if store.path_style else ["--virtual-host"]))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(project_root()))
    if r.returncode != 0 or not r.stdout.strip():
        raise StoreError(f"pull in {node.netns} from {endpoint} failed ({r.returncode}): "
                         f"{(r.stderr or r.stdout).strip()}")
    return r.stdout.strip().splitlines()[-1]


def deploy_node(node: Node, store: Store, version: int, health: Health,
                log: Callable[[str], None] = print, allow_older: bool = False) -> dict:
    """Load `version` on one node and judge its health; → report dict (`healthy`, `reasons`...).

    The agent's (epoch, version) only goes forward: a table older than the node's floor (status
    `epoch_floor`, `version_floor`) is refused as a replay unless `allow_older`, which loads it
    with the agent's explicit, logged override naming it (`--allow-downgrade EPOCH:VERSION`; a
    fleet rollback). A newer epoch or version needs no override."""
    agent = node.agent()
    rep = {"node_id": node.node_id, "canary": node.canary, "version": version, "healthy": False,
           "reasons": []}
    try:
        s0 = agent.status()
        if not s0.get("attached"):
            rep["reasons"].append("agent not attached (no pinned program)")
            return rep
        rep["previous_version"] = _live_version(s0)
        t0 = time.monotonic()
        time.sleep(health.wait_s)
        s1 = agent.status()
        rate_before = (_counters(s1).get("established", 0) - _counters(s0).get("established", 0)) / (time.monotonic() - t0)
        if node.netns:
            t_pull = time.monotonic()
            try:
                manifest = pull(node, store, version)
            except (StoreError, subprocess.TimeoutExpired) as exc:
                rep["reasons"].append(f"pull failed: {exc}")
                return rep
            rep["pull"] = {"netns": node.netns, "endpoint": node.store_endpoint or store.endpoint,
                           "s": round(time.monotonic() - t_pull, 3)}
        else:
            manifest = store.fetch(version, node.table_dir)
        epoch = int(store.manifest(version).get("epoch", 0))
        floor = (int(s0.get("epoch_floor") or 0), int(s0.get("version_floor") or 0))
        older = (epoch, version) < floor
        if older and allow_older:
            log(f"{node.node_id}: table {version} (epoch {epoch}) is older than table {floor[1]} "
                f"(epoch {floor[0]}) loaded there before: loading it with the agent's version-rule "
                "override")
        try:
            rep["load"] = agent.load(manifest, allow_downgrade=f"{epoch}:{version}" if older and allow_older
                                     else False)
        except EdgeAgentError as exc:
            rep["reasons"].append(f"load refused: {(exc.stderr or str(exc)).strip()}")
            return rep
        # a no-op load (the node already had this table live) changed nothing to roll back
        rep["loaded"] = not rep["load"].get("unchanged", False)
        t2 = time.monotonic()
        s2 = agent.status()
        time.sleep(health.wait_s)
        s3 = agent.status()
        rate_after = (_counters(s3).get("established", 0) - _counters(s2).get("established", 0)) / (time.monotonic() - t2)
        rep.update(rate_before=round(rate_before, 3), rate_after=round(rate_after, 3))
        t = s3.get("table") or {}
        if t.get("version") != version or not t.get("enforced"):
            rep["reasons"].append(f"table not active: live {t.get('version')} enforced={t.get('enforced')}")
        errs = _counters(s3).get("setsockopt_err", 0) - _counters(s1).get("setsockopt_err", 0)
        if errs:
            rep["reasons"].append(f"{errs} setsockopt errors since the load")
        if rate_before > 0 and rate_after < health.min_rate_ratio * rate_before:
            rep["reasons"].append(f"connection rate fell from {rate_before:.1f}/s to {rate_after:.1f}/s "
                                  f"(below {health.min_rate_ratio:.0%})")
        rep["healthy"] = not rep["reasons"]
        log(f"{node.node_id}: version {version} {'healthy' if rep['healthy'] else 'UNHEALTHY'} "
            f"{'; '.join(rep['reasons'])}")
        return rep
    finally:
        agent.close()


def rollback_node(node: Node, rep: dict, log: Callable[[str], None] = print) -> dict:
    """Put back the table the node had before `deploy_node` (the agent's previous slot)."""
    agent = node.agent()
    try:
        prev = rep.get("previous_version")
        if not rep.get("loaded"):
            return {"node_id": node.node_id, "rolled_back": False, "detail": "nothing was loaded"}
        if prev is None:
            return {"node_id": node.node_id, "rolled_back": False,
                    "detail": "the node had no table before: nothing to go back to"}
        agent.rollback()
        live = _live_version(agent.status())
        ok = live == prev
        log(f"{node.node_id}: rolled back to version {live}")
        return {"node_id": node.node_id, "rolled_back": ok, "live_version": live}
    except EdgeAgentError as exc:
        return {"node_id": node.node_id, "rolled_back": False, "detail": str(exc)}
    finally:
        agent.close()


def freeze_on_rollback(store: Store, epoch: int, version: int, cohort: str, reason: str, rollout_id: str,
                       nodes: list[str], log: Callable[[str], None] = print) -> dict | None:
    """A gate rolled table `epoch:version` back on `cohort`: freeze the fleet (who: rollout) unless
    a freeze already holds; → the freeze record, or None."""
    if freeze.current(store) is not None:
        return None
    rec = freeze.freeze(store, f"table {epoch}:{version} rolled back on cohort {cohort}: {reason}", who="rollout",
                        evidence={"rollout_id": rollout_id, "cohort": cohort, "nodes": nodes})
    log(freeze.describe(rec))
    return rec


def store_goes_back(store: Store, version: int) -> bool:
    """Is `version` one the store made current before and older, by (epoch, version), than its
    current one (`ccs rollback` republishing the previous table)? Only then may a node go back
    to a table older than one it loaded (`deploy`'s `allow_older`)."""
    cur = store.current()
    return (cur is not None and version in store.state()["history"]
            and store.serial(version) < store.serial(cur))


def load_cohort(cohort: str, nodes: list[Node], store: Store, version: int, health: Health,
                log: Callable[[str], None], allow_older: bool, reports: dict[str, dict],
                loaded: list[tuple[Node, dict]]) -> str | None:
    """Load `version` on each node of a cohort in turn, each health checked (`deploy_node`); each
    report goes to `reports` and `loaded`. → None, or why the cohort failed (the first unhealthy
    node: the caller rolls back every node in `loaded`)."""
    for node in nodes:
        rep = deploy_node(node, store, version, health, log, allow_older=allow_older)
        reports[node.node_id] = rep
        loaded.append((node, rep))
        if not rep["healthy"]:
            return f"{cohort} node {node.node_id} failed health: " + "; ".join(rep["reasons"])
    return None


def deploy(fleet: Fleet, store: Store, version: int, health: Health,
           log: Callable[[str], None] = print, allow_older: bool | None = None,
           gate: Callable[[GateContext], Decision] | None = None,
           decisions: DecisionLog | None = None) -> dict:
    """The fleet's cohorts in order (canary first); each node's health checked after its load,
    then the cohort's gate asked (`gates.health_gate` by default; `gates.CanaryVerdict` judges the
    cohort's A/B on outcomes) before the next cohort. Failed health, or a gate's `rollback` or
    `observe`, stops the rollout and rolls back every node loaded so far; a gate's `rollback`
    also freezes the fleet (export/delivery/freeze.py). Each gate decision goes to `decisions`
    (gold.rollout_decisions). The store's current version becomes `version` only when every
    cohort passed.

    A frozen store refuses every rollout (raises freeze.Frozen, naming the freeze) but the
    pinned table's own, which puts nodes back on it.

    `allow_older`: may a node go back to a table older than one it loaded (the agent's
    override of its version rule)? None (default): only when the store itself goes back -- the
    table is one the store made current before (its history) and older, by (epoch, version),
    than the store's current one: `ccs rollback` republishing the previous version. A table the
    store never made current, or one newer than its current one, gets no override: a newer
    epoch or version loads without one, and an older one a node refuses stays refused."""
    freeze.refuse_if_frozen(store, f"rolling out table {version}", version)
    if allow_older is None:
        allow_older = store_goes_back(store, version)
    gate = gate or health_gate
    decisions = decisions if decisions is not None else DecisionLog()
    epoch = store.serial(version)[0]
    rollout_id = f"{epoch}:{version}@{int(time.time() * 1000)}"
    result = {"version": version, "epoch": epoch, "rollout_id": rollout_id, "nodes": {}, "ok": False,
              "rolled_back": {}, "cohorts": [c for c, _ in fleet.cohorts], "decisions": decisions.rows}
    loaded: list[tuple[Node, dict]] = []

    def back() -> None:
        for n, r in loaded:
            result["rolled_back"][n.node_id] = rollback_node(n, r, log)

    for index, (cohort, nodes) in enumerate(fleet.cohorts):
        stopped = load_cohort(cohort, nodes, store, version, health, log, allow_older, result["nodes"], loaded)
        if stopped:
            result["stopped"] = stopped
            back()
            return result
        ctx = GateContext(cohort, index, [n.node_id for n in nodes], version, epoch, int(time.time() * 1000),
                          {n.node_id: result["nodes"][n.node_id] for n in nodes}, log)
        d = gate(ctx)
        decisions.record(rollout_id, ctx, d)
        log(f"cohort {cohort}: {d.decision} — {d.reason}")
        if d.decision == PROMOTE:
            continue
        result["stopped"] = f"cohort {cohort}: {d.decision}: {d.reason}"
        back()
        if d.decision == ROLLBACK:
            fr = freeze_on_rollback(store, epoch, version, cohort, d.reason, rollout_id, ctx.nodes, log)
            if fr is not None:
                result["freeze"] = fr
        return result
    store.set_current(version)
    result["ok"] = True
    return result


def live_table(store: Store, public_key_path: str, scratch: str):
    """The store's current table, verified (None when nothing is current)."""
    v = store.current()
    if v is None:
        return None
    man, table = signing.read_manifest(store.fetch(v, scratch), signing.load_public_key(public_key_path))
    return table
