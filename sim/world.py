"""The simulated fleet's static side, rebuilt identically from the seed in every worker: regions,
ISPs and their address blocks, edge nodes with hidden path state, and each node's client
prefixes with their network-type dominance timeline (ALICCS §3.1, §3.3, Fig. 5, Fig. 7).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from ccselect.sim import physics
from ccselect.sim.params import BROADBAND_PLANTS, ISPS, REGIONS, SimParams

# Public first octets per ISP family of blocks (none is reserved or bogon space).
_V4_OCTETS = {
    "chinanet": (58, 59, 60, 61, 113, 114, 115, 116, 118, 121, 122, 125, 180, 182, 218, 219, 220, 222),
    "unicom": (27, 42, 101, 106, 110, 123, 124, 139, 140, 175, 210, 211),
    "cmcc": (36, 39, 111, 112, 117, 120, 183, 223),
    "small": (43, 45, 49, 103, 150, 163, 202, 203),
}
# IPv6 /20s (as the top 32 bits of their first /32) per ISP; small ISPs take /32s in 2400::/12.
_V6_BASE = {"chinanet": 0x240E0000, "unicom": 0x24088000, "cmcc": 0x24098000}
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(*parts: np.ndarray | int) -> np.ndarray:
    """splitmix64 over the given integer arrays: a deterministic hash → uint64 per element."""
    acc = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        return _mix(parts, acc)


def _mix(parts: tuple[np.ndarray | int, ...], acc: np.uint64) -> np.ndarray:
    out: np.ndarray | None = None
    for part in parts:
        x = np.asarray(part).astype(np.uint64, copy=False)
        h = (x if out is None else out ^ x) + acc
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out = h ^ (h >> np.uint64(31))
    assert out is not None
    return out


def unit(*parts: np.ndarray | int) -> np.ndarray:
    """A deterministic uniform in [0, 1) per element."""
    return (mix64(*parts) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass
class Node:
    idx: int
    node_id: str
    region: int
    # hidden path state (ALICCS §3.1: the feature↔type relation differs across nodes)
    base_rtt_ms: float
    capacity_factor: float
    competing_flows: int
    jitter_ms: float
    mss_clamp: int
    labelled: bool
    #: a node hosted in one large ISP's IDC, next to its mobile gateway (index into ISPS; -1: none)
    host_isp: int = -1
    #: the node's bottleneck buffer depth relative to the fleet's (SimParams.node_buffer_sigma)
    buffer_mult: float = 1.0


@dataclass
class PrefixSet:
    """A node's client prefixes, as parallel arrays (one element per /24 or /48)."""

    family: np.ndarray        # 4 or 6
    net: np.ndarray           # v4: /24 network as int; v6: /48 as int (top 48 bits)
    isp: np.ndarray           # index into ISPS
    region: np.ndarray        # index into REGIONS
    weight: np.ndarray        # popularity, sums to 1
    dist_rtt_ms: np.ndarray   # client-side distance beyond the node's own base RTT
    cap_mult: np.ndarray      # access capacity multiplier
    path_jitter_ms: np.ndarray  # queueing jitter of the path from the node to this prefix
    mss_clamp: np.ndarray     # MSS clamp of a tunnel/middlebox on this prefix's path (65535: none)
    n_hosts: np.ndarray       # active hosts (v4) or /64 subscribers (v6)
    android_share: np.ndarray
    share_cell: np.ndarray    # [prefix, hour] share of cellular connections (the dominance)
    segment: np.ndarray       # [prefix, hour] id of the dominance segment in force
    plant_bb: np.ndarray      # index into BROADBAND_PLANTS (-1: a small ISP's own profile)
    plant_cell: np.ndarray    # index into CELLULAR_PLANTS (-1: a small ISP's own profile)
    access_scale: np.ndarray  # [prefix, (broadband, cellular)] access RTT multiplier of its branch
    # [prefix, (broadband pool, mobile pool)]: the path through the ISP's BRAS or mobile gateway
    gw_rtt_ms: np.ndarray
    gw_jitter_ms: np.ndarray
    gw_clamp: np.ndarray

    def cidr(self, i: int) -> str:
        if self.family[i] == 4:
            return f"{ipaddress.IPv4Address(int(self.net[i]) << 8)}/24"
        return f"{ipaddress.IPv6Address(int(self.net[i]) << 80)}/48"


@dataclass
class Block:
    family: int
    net: int      # v4 /16 as int (top 16 bits) or v6 /32 as int (top 32 bits)
    isp: int
    region: int

    @property
    def cidr(self) -> str:
        if self.family == 4:
            return f"{ipaddress.IPv4Address(self.net << 16)}/16"
        return f"{ipaddress.IPv6Address(self.net << 96)}/32"


class World:
    """Everything static about the fleet, derived from `params.seed` alone."""

    def __init__(self, params: SimParams):
        self.p = params
        self.start = datetime.fromisoformat(params.start).replace(tzinfo=timezone.utc)
        self.start_ms = int(self.start.timestamp() * 1000)
        self.blocks = self._address_plan()
        self.plants, self.access_scale = self._access_plants()
        self.nodes = self._nodes()
        self._prefix_cache: dict[int, PrefixSet] = {}
        self.fault_prefix16 = self._fault_block()

    # -- address plan ----------------------------------------------------------------------
    def _address_plan(self) -> list[Block]:
        rng = np.random.default_rng([self.p.seed, 1])
        used4: set[int] = set()
        used6: set[int] = set()
        blocks: list[Block] = []
        for ii, isp in enumerate(ISPS):
            octets = _V4_OCTETS["small" if isp.small else isp.name]
            for ri in range(len(REGIONS)):
                for _ in range(1 if isp.small else 2):
                    while True:
                        net16 = int(rng.choice(octets)) << 8 | int(rng.integers(0, 256))
                        if net16 not in used4:
                            used4.add(net16)
                            break
                    blocks.append(Block(4, net16, ii, ri))
                while True:
                    if isp.small:
                        net32 = 0x24000000 | int(rng.integers(0x0100, 0xFFFF))
                    else:
                        net32 = _V6_BASE[isp.name] | int(rng.integers(0, 0x1000))
                    if net32 not in used6:
                        used6.add(net32)
                        break
                blocks.append(Block(6, net32, ii, ri))
        return blocks

    def _access_plants(self) -> tuple[np.ndarray, np.ndarray]:
        """[region, isp, (broadband, cellular)] → plant index, and the branch's access RTT
        multiplier: each provincial branch runs its own access network (params.BROADBAND_PLANTS:
        encapsulation; and how loaded its PON/DSL or radio network is). Small ISPs keep their
        own MSS profile."""
        rng = np.random.default_rng([self.p.seed, 4])
        plants = np.full((len(REGIONS), len(ISPS), 2), -1, dtype=np.int64)
        scale = rng.lognormal(0.0, self.p.access_branch_sigma, (len(REGIONS), len(ISPS), 2))
        # cellular srtt stays above Wi-Fi's in every branch (BBR-E2E §III, "consistently"): a
        # branch's broadband median access RTT is capped at its 5G median (the lowest cellular);
        # the cap changes no random draw
        med = physics.ACCESS_MEDIAN_MS
        scale[..., 0] = np.minimum(scale[..., 0], scale[..., 1] * med["5g"] / med["wifi"])
        for ri in range(len(REGIONS)):
            for ii, isp in enumerate(ISPS):
                if isp.small:
                    continue
                odd_bb = rng.random() < self.p.odd_broadband_share
                plants[ri, ii, 0] = int(rng.integers(1, len(BROADBAND_PLANTS))) if odd_bb else 0
                plants[ri, ii, 1] = 1 if rng.random() < self.p.odd_cellular_share else 0
        return plants, scale

    def reference_rows(self) -> list[dict[str, object]]:
        """The IP→ASN/region table the pipeline joins (`reference/ip_asn_region.csv`)."""
        return [{"cidr": b.cidr, "asn": ISPS[b.isp].asn, "isp": ISPS[b.isp].name,
                 "region": REGIONS[b.region].name} for b in self.blocks]

    def _fault_block(self) -> int | None:
        f = self.p.fault_mss_prefix16
        if not f:
            return None
        if f == "auto":  # the busiest large-ISP /16 of the nodes that carry labels (diagnosable)
            w = np.zeros(1 << 16)
            for node in self.nodes:
                if not node.labelled:
                    continue
                ps = self.prefixes(node.idx)
                v4 = (ps.family == 4) & (ps.isp < 3)
                np.add.at(w, (ps.net[v4] >> 8).astype(np.int64), ps.weight[v4])
            return int(np.argmax(w))
        net = ipaddress.ip_network(f, strict=False)
        if net.version != 4 or net.prefixlen != 16:
            raise ValueError(f"fault_mss_prefix16 must be an IPv4 /16, got {f}")
        return int(net.network_address) >> 16

    # -- nodes -------------------------------------------------------------------------------
    def _nodes(self) -> list[Node]:
        rng = np.random.default_rng([self.p.seed, 2])
        n = self.p.nodes
        labelled = np.zeros(n, dtype=bool)
        k = max(1, int(round(self.p.label_node_share * n)))
        labelled[rng.permutation(n)[:k]] = True
        per_region: dict[int, int] = {}
        rng_host = np.random.default_rng([self.p.seed, 6])  # own stream: the other draws stay as they were
        rng_buf = np.random.default_rng([self.p.seed, 8])   # likewise
        nodes = []
        for i in range(n):
            region = i % len(REGIONS)
            per_region[region] = per_region.get(region, 0) + 1
            competing = int(rng.integers(0, 9))
            nodes.append(Node(
                idx=i,
                node_id=f"edge-{REGIONS[region].name}-{per_region[region]:02d}",
                region=region,
                base_rtt_ms=float(np.clip(rng.lognormal(np.log(self.p.node_rtt_median_ms), self.p.node_rtt_sigma), 1.5,
                                          self.p.node_rtt_max_ms)),
                capacity_factor=float(rng.lognormal(0.0, 0.35)),
                competing_flows=competing,
                jitter_ms=float(0.4 + 0.7 * competing * rng.lognormal(0.0, 0.4)),
                # a tunnel on many of the node's paths clamping MSS (applied per prefix)
                mss_clamp=int(rng.choice([1360, 1380, 1400])) if rng.random() < self.p.node_tunnel_share else 65535,
                labelled=bool(labelled[i]),
                host_isp=int(rng_host.integers(0, 3)) if rng_host.random() < self.p.in_carrier_node_share else -1,
                buffer_mult=float(rng_buf.lognormal(0.0, self.p.node_buffer_sigma)) if self.p.node_buffer_sigma > 0 else 1.0,
            ))
        return nodes

    # -- client prefixes -------------------------------------------------------------------
    def prefixes(self, node_idx: int) -> PrefixSet:
        if node_idx not in self._prefix_cache:
            self._prefix_cache[node_idx] = self._make_prefixes(self.nodes[node_idx])
        return self._prefix_cache[node_idx]

    def _make_prefixes(self, node: Node) -> PrefixSet:
        p = self.p
        rng = np.random.default_rng([p.seed, 3, node.idx])
        n_total = max(20, int(p.prefixes_per_kconn * p.conns_per_node_hour / 1000))
        n6 = int(round(n_total * p.ipv6_share))
        family = np.array([4] * (n_total - n6) + [6] * n6)
        isp_w = np.array([i.weight for i in ISPS])
        isp_mix = rng.dirichlet(isp_w * 25)  # nodes differ in their ISP mix
        isp = rng.choice(len(ISPS), size=n_total, p=isp_mix)
        local = rng.random(n_total) < 0.85
        region = np.where(local, node.region, rng.integers(0, len(REGIONS), n_total))
        net = np.zeros(n_total, dtype=np.int64)
        by_key: dict[tuple[int, int, int], list[Block]] = {}
        by_isp: dict[tuple[int, int], list[Block]] = {}
        for b in self.blocks:
            by_key.setdefault((b.family, b.isp, b.region), []).append(b)
            by_isp.setdefault((b.family, b.isp), []).append(b)
        seen: set[tuple[int, int]] = set()
        taken: dict[tuple[int, int, int], int] = {}
        for i in range(n_total):
            key3 = (int(family[i]), int(isp[i]), int(region[i]))
            cands = by_key[key3]
            # A busy node can want more /24s of one ISP in one region than its /16 blocks hold
            # (a small ISP has one /16, 256 /24s, per region): then the prefix comes from the ISP's
            # blocks in any region (a non-local prefix). Smaller fleets never get here, so their
            # draws, and files, are unchanged.
            shift = 8 if key3[0] == 4 else 16
            if taken.get(key3, 0) >= len(cands) << shift:
                cands = by_isp[key3[:2]]
                used = sum(taken.get(k, 0) for k in {(b.family, b.isp, b.region) for b in cands})
                if used >= len(cands) << shift:
                    raise ValueError(f"node {node.node_id}: {n_total} prefixes are more than the address "
                                     f"plan holds for ISP {ISPS[key3[1]].name}; lower conns_per_node_hour")
            while True:
                b = cands[int(rng.integers(0, len(cands)))]
                sub = int(rng.integers(0, 1 << (8 if b.family == 4 else 16)))
                key = (b.family, b.net << (8 if b.family == 4 else 16) | sub)
                if key not in seen:
                    seen.add(key)
                    break
            taken[(b.family, b.isp, b.region)] = taken.get((b.family, b.isp, b.region), 0) + 1
            region[i] = b.region
            net[i] = key[1]
        # Zipf popularity over a random order, so families and ISPs mix among the busiest.
        ranks = rng.permutation(n_total) + 1
        weight = ranks.astype(float) ** -p.zipf_alpha
        weight /= weight.sum()
        dist = rng.lognormal(np.log(3.0), 1.0, n_total) + np.where(local, 0.0, 22.0)
        cap_mult = rng.lognormal(0.0, 0.3, n_total)
        # hidden path state varies per prefix too (ALICCS §3.1: "buffer sizes and the number of
        # competing flows across CDN nodes and IP prefixes"); nodes differ in its mixture.
        path_jitter = node.jitter_ms * rng.lognormal(0.0, 0.8, n_total)
        clamp_share = 0.6 if node.mss_clamp < 65535 else 0.08
        clamp_value = node.mss_clamp if node.mss_clamp < 65535 else 1400
        mss_clamp = np.where(rng.random(n_total) < clamp_share, clamp_value, 65535)
        n_hosts = np.clip((weight * p.conns_per_node_hour * 3).astype(int), 4, 250)
        share_cell, segment = self._dominance(rng, node, isp, region)
        android = np.clip(rng.normal(0.7, 0.1, n_total), 0.3, 0.95)
        gw_rtt, gw_jitter, gw_clamp = self._gateways(node)
        return PrefixSet(family, net, isp, region, weight, dist, cap_mult, path_jitter, mss_clamp, n_hosts, android,
                         share_cell, segment, plant_bb=self.plants[region, isp, 0],
                         plant_cell=self.plants[region, isp, 1], access_scale=self.access_scale[region, isp],
                         gw_rtt_ms=gw_rtt[region, isp], gw_jitter_ms=gw_jitter[region, isp],
                         gw_clamp=gw_clamp[region, isp])

    def _gateways(self, node: Node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (region, ISP) and pool (broadband, mobile), the path from this node to the ISP's
        BRAS or mobile gateway (P-GW + CGNAT): extra RTT, queueing jitter, and the MSS clamp its
        firewall applies (65535: none). A /24 is routed through one or the other depending on
        the pool it is assigned to at the time (its dominance segment, §3.3), so on each node the
        path features of cellular and Wi-Fi traffic differ — but how they differ is the node's
        own topology: one node sits next to a mobile gateway and far from the BRAS, another the
        other way round (ALICCS §3.1, Fig. 5: hidden path state Z, X = f(Y, Z))."""
        p = self.p
        rng = np.random.default_rng([p.seed, 5, node.idx])
        shape = (len(REGIONS), len(ISPS))
        # usually the BRAS is metro-near and the mobile core (P-GW, CGNAT) sits in the provincial
        # capital, a backhaul away; a node hosted in a carrier's IDC sits next to that carrier's
        # mobile gateway in its own region and reaches broadband (every ISP's) via interconnects
        bras = rng.lognormal(np.log(p.bras_rtt_ms), 0.6, shape)
        mobile = rng.lognormal(np.log(p.mobile_gw_rtt_ms), 0.5, shape)
        if node.host_isp >= 0:
            bras = rng.lognormal(np.log(p.mobile_gw_rtt_ms), 0.5, shape)
            mobile[node.region, node.host_isp] = rng.lognormal(np.log(1.0), 0.5)
        rtt = np.clip(np.stack([bras, mobile], axis=-1), 0.3, 80.0)
        jitter = rng.lognormal(np.log(1.5), 0.9, (*shape, 2))
        clamp = np.stack([rng.choice([65535, 1452, 1440, 1412], size=shape, p=[0.5, 0.3, 0.1, 0.1]),
                          rng.choice([65535, 1420, 1400, 1380], size=shape, p=[0.4, 0.2, 0.2, 0.2])], axis=-1)
        return rtt, jitter, clamp

    def _dominance(self, rng: np.random.Generator, node: Node, isp: np.ndarray,
                   region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per prefix and hour: the share of cellular connections, piecewise constant over
        dominance segments of lognormal length (ALICCS §3.3, Observation IV)."""
        p = self.p
        n, hours = len(isp), p.hours
        base_cell = np.array([REGIONS[r].share_4g for r in region]) * np.array(
            [ISPS[i].cellular_bias for i in isp])
        base_cell = np.clip(base_cell, 0.03, 0.9)
        share = np.zeros((n, hours))
        seg = np.zeros((n, hours), dtype=np.int64)
        seg_counter = node.idx << 32
        for i in range(n):
            # start mid-segment (stationary renewal process): skip a random part of the first one
            t = -rng.random() * rng.lognormal(p.dominance_mu, p.dominance_sigma)
            while t < hours:
                length = max(1.0, float(rng.lognormal(p.dominance_mu, p.dominance_sigma)))
                lo, hi = max(0, int(round(t))), min(hours, int(round(t + length)))
                cell_dom = rng.random() < base_cell[i]
                purity = (rng.uniform(p.pure_lo, 1.0) if rng.random() < p.pure_share
                          else rng.uniform(p.mixed_lo, p.mixed_hi))
                if hi > lo:
                    share[i, lo:hi] = purity if cell_dom else 1.0 - purity
                    seg[i, lo:hi] = seg_counter
                seg_counter += 1
                t += length
        return share, seg

    # -- time ------------------------------------------------------------------------------
    def hour_start_ms(self, hour_idx: int) -> int:
        return self.start_ms + hour_idx * 3_600_000

    def month_fraction(self, hour_idx: int) -> float:
        """0 at the first hour of the month, 1 at its last (ALICCS Fig. 9 monthly cycle)."""
        t = datetime.fromtimestamp(self.hour_start_ms(hour_idx) / 1000, tz=timezone.utc)
        nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=timezone.utc)
        first = datetime(t.year, t.month, 1, tzinfo=timezone.utc)
        return (t - first).total_seconds() / max(1.0, (nxt - first).total_seconds() - 3600)

    def local_hour(self, hour_idx: int) -> int:
        """Hour of day in China (UTC+8), for the diurnal load curve."""
        t = datetime.fromtimestamp(self.hour_start_ms(hour_idx) / 1000, tz=timezone.utc)
        return (t.hour + 8) % 24

    def day_index(self, hour_idx: int) -> int:
        return int((self.hour_start_ms(hour_idx) // 86_400_000))
