"""A fleet that reacts (issue 58): simulated traffic whose CCs follow the tables the rollout
really deployed.

`FollowFleet` stands a simulated fleet (sim/, its `follow` mode) behind a real one (a fleet file's
agents): on a simulated clock, each node's connections get the CC its agent would give them
(export/delivery/mirror.py, the agent's decision order over the table and flow tree) under the
table live on that node at the connection's accept — read from the node's agent (`status`: the
live version) and the artifact store (the signed table, verified as the agent does). The rollout
code and its gates run unchanged: `gates.CanaryVerdict(..., moments=ff.moments, clock=ff.now,
sleep=ff.sleep)` looks at the canary's arms as the simulated minutes pass, and a rollback by the
gate reaches the simulated clients at the next minute, because the agent's live table changed.

The simulated clock stands still between a gate's looks (a load, a rollback take no simulated
time); a table becomes live in the simulation when the clock is next read (`now`, which polls
every node's agent). A table's expiry keeps its remaining life at that moment.

`moments` computes what `export.delivery.canary.canary_moments` computes from silver (the arm by
the CRC-32 parity of the client address, the client address as the cluster, retransmitted over
sent segments, stall over play time from the QoE beacon of the connection, and the delivery rate:
the bytes sent over the request time of the connection's access-log records, summed per
connection as silver's access join does), from the simulated logs directly: the drill does not
run the stream (tests/test_stream_canary.py checks the stream's path to the same moments).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.delivery import mirror
from ccselect.export.delivery.rollout import Fleet, _live_version
from ccselect.export.delivery.store import Store
from ccselect.features.ab_moments import CANARY_METRICS, ArmMoments
from ccselect.sim.follow import Choice, Connections
from ccselect.sim.params import SimParams
from ccselect.sim.traffic import generate_node_hour
from ccselect.sim.world import World


@dataclass
class Span:
    """A table live on a node from `from_ms` (simulated), until the next span."""
    from_ms: int
    version: int | None
    table: tf.Table | None
    expires_ms: int | None
    index: Any = field(default=None, repr=False, compare=False)   # its mirror.LookupIndex, made once


@dataclass
class FollowNode:
    node_id: str           # the fleet file's node
    sim_idx: int           # the simulated node whose clients it serves
    services: dict         # served port → Service (ab, flow_mode)
    port_map: dict         # the simulated clients' server port → the node's served port
    spans: list[Span] = field(default_factory=list)
    hours: dict = field(default_factory=dict)     # hour index → (spans signature, NodeHour)


def dominance_entries(world: World, sim_idx: int, hour_idx: int, invert: bool = False, coverage: float = 1.0,
                      rng: np.random.Generator | None = None) -> list[tf.Entry]:
    """A table that decides as ALICCS's rule does on the truth (a prefix dominated by cellular
    clients at `hour_idx` → bbr, else cubic): what a model that knew each prefix's network type
    would export. `invert`: every decision the other way (the planted bad table: the model's
    decisions inverted). `coverage`: the share of the node's prefixes given an entry (a random
    subset), so that successive good tables differ as retrained ones do."""
    ps = world.prefixes(sim_idx)
    cell = ps.share_cell[:, hour_idx] >= 0.5
    keep = np.ones(len(cell), dtype=bool) if coverage >= 1 else (rng or np.random.default_rng()).random(len(cell)) < coverage
    return [tf.Entry(ps.cidr(i), "bbr" if cell[i] != invert else "cubic", purity_permille=1000)
            for i in np.flatnonzero(keep)]


class FollowFleet:
    """The reacting fleet (module doc). `params`: the simulated fleet (its `hours` must cover the
    drill); `fleet`: the fleet file's nodes, each serving the simulated node of the same index
    (`sim_nodes` to choose others); `store`, `public_key`: where a node's live table is read
    from and how it is verified. `port_map`: simulated server port → served port (default: the
    node's first service takes 443 and 80)."""

    def __init__(self, params: SimParams, fleet: Fleet, store: Store, public_key: str, scratch: str,
                 sim_nodes: list[int] | None = None, start_hour: int = 0, default_cc: str = "cubic",
                 port_map: dict[int, int] | None = None):
        self.world = World(params)
        self.fleet, self.store, self.scratch = fleet, store, scratch
        self.pub = signing.load_public_key(public_key)
        self.default_cc = default_cc
        self.t = self.world.hour_start_ms(start_hour)
        self.nodes: dict[str, FollowNode] = {}
        for i, n in enumerate(fleet.nodes):
            svcs = {s.port: s for s in n.config.services}
            first = n.config.services[0].port
            self.nodes[n.node_id] = FollowNode(n.node_id, (sim_nodes or list(range(len(fleet.nodes))))[i], svcs,
                                               dict(port_map or {443: first, 80: first}))
        self.generated = 0
        self._odd: dict[str, bool] = {}
        self.sync()

    # ---- the clock the gate runs on ------------------------------------------------------------
    def now(self) -> int:
        """Simulated ms; every node's live table is read first (a load or rollback since the last
        read starts now)."""
        self.sync()
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += int(round(seconds * 1000))

    def sync(self) -> None:
        for n in self.fleet.nodes:
            a = n.agent()
            try:
                st = a.status()
            finally:
                a.close()
            fn = self.nodes[n.node_id]
            v = _live_version(st)
            if fn.spans and fn.spans[-1].version == v:
                continue
            table, expires = None, None
            if v is not None:
                man, table = signing.read_manifest(self.store.fetch(v, os.path.join(self.scratch, n.node_id)), self.pub)
                expires = self.t + int((man["expires"] - time.time()) * 1000)
            if fn.spans and fn.spans[-1].from_ms == self.t:
                fn.spans[-1] = Span(self.t, v, table, expires)
            else:
                fn.spans.append(Span(self.t, v, table, expires))

    # ---- traffic ---------------------------------------------------------------------------------
    def chooser(self, fn: FollowNode, spans: list[Span]):
        def choose(conns: Connections) -> Choice:
            n = len(conns.client_ip)
            cc = np.full(n, self.default_cc, dtype=object)
            dec = np.full(n, "default", dtype=object)
            ver = np.full(n, None, dtype=object)
            starts = np.array([s.from_ms for s in spans], dtype=np.int64)
            which = np.searchsorted(starts, conns.accept_ms, side="right") - 1
            port = np.array([fn.port_map.get(int(p), -1) for p in conns.server_port], dtype=np.int64)
            hs = np.stack([np.asarray(getattr(conns, f), dtype=np.int64) for f in tf.TREE_FEATURES], axis=1)
            for k in np.unique(which):
                m = which == k
                if k < 0:      # before the first read of the node: as at the first read
                    k = 0
                s = spans[k]
                expired = (conns.accept_ms[m] >= s.expires_ms) if s.expires_ms is not None else False
                c, d, v = mirror.decisions(s.table, expired, fn.services, list(conns.client_ip[m]), port[m],
                                           hs[m], self.default_cc, self._index(s), self._odd)
                if (d == mirror.NOT_SERVED).any():
                    raise ValueError(f"{fn.node_id}: simulated connections on ports no service of the node "
                                     f"serves ({sorted(set(conns.server_port[m][d == mirror.NOT_SERVED]))}): "
                                     "give port_map")
                cc[m], dec[m], ver[m] = c, d, v
            return Choice(cc, dec, ver)
        return choose

    def _index(self, span: Span):
        if span.table is None:
            return None
        if span.index is None:
            span.index = mirror.LookupIndex(span.table)
        return span.index

    def hour(self, node_id: str, hour_idx: int):
        """The node-hour under the spans known now; regenerated only when a span starts inside or
        before its end that it was not made with (a swap never rewrites what was accepted before)."""
        fn = self.nodes[node_id]
        end = self.world.hour_start_ms(hour_idx + 1) if hour_idx + 1 < self.world.p.hours else 2 ** 62
        spans = [s for s in fn.spans if s.from_ms < end]
        sig = tuple((s.from_ms, s.version) for s in spans)
        got = fn.hours.get(hour_idx)
        if got is None or got[0] != sig:
            nh = generate_node_hour(self.world, fn.sim_idx, hour_idx, chooser=self.chooser(fn, spans))
            self.generated += 1
            got = fn.hours[hour_idx] = (sig, nh)
        return got[1]

    def hours_between(self, from_ms: int, to_ms: int) -> range:
        """The simulated hours that [from_ms, to_ms) touches."""
        h0 = self.world.hour_start_ms(0)
        last = (to_ms - 1 - h0) // 3_600_000
        if last >= self.world.p.hours:
            raise ValueError(f"the simulated clock passed the fleet's {self.world.p.hours} hours: give SimParams more")
        return range(max(0, (from_ms - h0) // 3_600_000), last + 1)

    def logs(self, node_id: str, from_ms: int, to_ms: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The node's transport and QoE records that ended in [from_ms, to_ms): its logs so far
        (to_ms not after `now`)."""
        tr, qo = [], []
        for h in self.hours_between(from_ms, to_ms):
            nh = self.hour(node_id, h)
            tr.append(nh.transport.filter(pl.col("ts_end_ms").is_between(from_ms, to_ms - 1)))
            qo.append(nh.qoe.filter(pl.col("ts_ms").is_between(from_ms, to_ms - 1)))
        return pl.concat(tr), pl.concat(qo)

    def moments(self, node_id: str, from_ms: int, to_ms: int) -> dict[str, dict[str, ArmMoments]]:
        """metric → arm → ArmMoments of the node's connections that ended in [from_ms, to_ms)
        (the gate's `Moments`; module doc)."""
        tr, qo = self.logs(node_id, from_ms, to_ms)
        q = qo.group_by("conn_id").agg(pl.col("play_ms").sum(), pl.col("rebuffer_ms").sum())
        # a connection's requests are in its own node-hour (sim/traffic.py): by conn_id, whatever
        # their own time, as jobs/silver.access_labels sums them
        acc = pl.concat([self.hour(node_id, h).access for h in self.hours_between(from_ms, to_ms)])
        acc = acc.group_by("conn_id").agg(pl.col("bytes_sent").sum(), pl.col("request_time_ms").sum())
        t = tr.join(q, on="conn_id", how="left").join(acc, on="conn_id", how="left")
        odd = mirror.ab_odd(t["client_ip"].to_list(), self._odd)
        t = t.with_columns(pl.Series("arm", np.where(odd, "treatment", "control")))
        out: dict[str, dict[str, ArmMoments]] = {}
        for metric, (y, x) in CANARY_METRICS.items():
            rows = t.filter(pl.col(x).is_not_null() & (pl.col(x) > 0) & pl.col(y).is_not_null())
            per = rows.group_by("arm", "client_ip").agg(pl.len().alias("conns"), pl.col(y).sum().alias("y"),
                                                        pl.col(x).sum().alias("x"))
            out[metric] = {}
            for arm in ("control", "treatment"):
                a = per.filter(pl.col("arm") == arm)
                if a.height:
                    out[metric][arm] = ArmMoments.of_clusters(a["y"].to_numpy(), a["x"].to_numpy(),
                                                              int(a["conns"].sum()))
        return out

    def versions_seen(self, node_id: str) -> list[int | None]:
        """Every table version that was live on the node in the simulation, in order."""
        return [s.version for s in self.nodes[node_id].spans]

