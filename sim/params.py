"""Every knob of the fleet simulator, with the paper figure or section it is calibrated against
(`../shared/CALIBRATION.md`). Where a paper gives a shape but no number, the value here is our
pick and docs/simulator.md says so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ccselect.settings import SimulateSettings


@dataclass(frozen=True)
class Region:
    name: str
    share_4g: float  # share of cellular connections (ALICCS §5.3: Henan 4G-heavy, Qinghai light)


@dataclass(frozen=True)
class Isp:
    asn: int
    name: str
    weight: float          # share of client prefixes
    cellular_bias: float   # multiplies the region's cellular share for this ISP's prefixes
    # MSS the client announces, per access type (values, probabilities). Large ISPs: PPPoE
    # broadband (1452/1460) vs GTP-tunnelled cellular (1360-1400), M-Lab range 1364-1460.
    # Small ISPs differ (ALICCS §3.1 "Diversified features for smaller ISPs").
    mss_wifi: tuple[tuple[int, float], ...]
    mss_cell: tuple[tuple[int, float], ...]
    small: bool = False


@dataclass(frozen=True)
class AccessPlant:
    """How one provincial branch of a large ISP delivers an access type, as far as the MSS its
    clients announce is concerned (the MTU left after the plant's encapsulation, minus 40)."""

    name: str
    mss: tuple[tuple[int, float], ...]


REGIONS = (
    Region("henan", 0.44), Region("guangdong", 0.32), Region("zhejiang", 0.26),
    Region("sichuan", 0.34), Region("beijing", 0.22), Region("shanghai", 0.20),
    Region("hubei", 0.30), Region("qinghai", 0.12),
)

_LARGE_WIFI = ((1460, 0.45), (1452, 0.45), (1440, 0.10))
_LARGE_CELL = ((1400, 0.50), (1380, 0.30), (1360, 0.20))
# The domain shift across nodes (ALICCS §2, §3.1 Fig. 5: X = f(Y, Z), the feature↔type relation
# differs across nodes and prefixes through hidden path state Z; §3.1 "significant deviations in
# feature distribution ... in particular for smaller ISPs"). Chinese ISPs run their access
# networks per province, so three things a classifier can latch onto are properties of the
# provincial branch or of the node's topology, not of the access type:
# 1. MSS (here): most broadband is PPPoE (MTU 1492 → MSS 1452, or 1460 where the CPE clamps to
#    1500-40), but some branches deliver it over a DS-Lite softwire (IPv4 in IPv6, RFC 6333:
#    MTU 1460 → MSS 1420) or L2TP/GRE wholesale tunnels (MSS 1380-1400, the range of
#    GTP-tunnelled cellular); most mobile cores hand UEs an MTU of 1400-1440, but cores whose
#    transport network carries jumbo frames announce MTU 1500 (MSS 1460, the PPPoE range).
# 2. access RTT level (`access_branch_sigma`): how loaded a branch's radio network or PON/DSL
#    plant is — a congested rural LTE branch vs an urban one, DSL vs FTTH.
# 3. the path through the BRAS or the mobile gateway (World._gateways): RTT, jitter and MSS clamp
#    differ by pool, and which is nearer depends on where the node sits (`in_carrier_node_share`).
# What keeps its meaning everywhere (X_y) is radio-side: the uplink scheduling delay inside the
# handshake (traffic.py, connection time) and RTT variation of the radio link (the client's
# first window follows its stack's rule, sim/stacks.py, not the access type). A plain model
# fitted on a few nodes leans on 1-3 and misses on nodes whose branches differ; prefix-group
# invariance (§3.1) is meant to drop them.
BROADBAND_PLANTS = (
    AccessPlant("pppoe", _LARGE_WIFI),
    AccessPlant("ds-lite", ((1420, 0.8), (1412, 0.2))),
    AccessPlant("l2tp-wholesale", ((1400, 0.6), (1380, 0.4))),
)
CELLULAR_PLANTS = (
    AccessPlant("gtp", _LARGE_CELL),
    AccessPlant("ue-mtu-1500", ((1460, 0.7), (1440, 0.3))),
)

ISPS = (
    Isp(4134, "chinanet", 0.36, 0.85, _LARGE_WIFI, _LARGE_CELL),
    Isp(4837, "unicom", 0.26, 1.00, _LARGE_WIFI, _LARGE_CELL),
    Isp(9808, "cmcc", 0.26, 1.45, _LARGE_WIFI, _LARGE_CELL),
    # Small ISPs: shifted MSS (tunnelled broadband, odd cellular cores).
    Isp(4538, "cernet", 0.04, 0.50, ((1400, 0.7), (1380, 0.3)), ((1440, 0.6), (1420, 0.4)), True),
    Isp(17816, "unicom-gd-metro", 0.03, 1.00, ((1420, 0.8), (1412, 0.2)), ((1420, 0.5), (1400, 0.5)), True),
    Isp(58453, "cmi-small", 0.03, 1.20, ((1380, 0.6), (1360, 0.4)), ((1452, 0.7), (1460, 0.3)), True),
    Isp(24400, "cmcc-sh-small", 0.02, 1.10, ((1360, 0.5), (1340, 0.5)), ((1400, 1.0),), True),
)


@dataclass(frozen=True)
class SimParams:
    """Knobs of `ccs simulate`. Defaults reproduce CALIBRATION.md; see README "The simulator"."""

    nodes: int = 12
    hours: int = 24
    start: str = "2026-11-01T00:00:00"
    seed: int = 7
    #: mean connections per node and hour; modulated by a diurnal curve (peak 21:00).
    conns_per_node_hour: int = 1500
    #: share of traffic from IPv6 /48s (issue 2: "roughly a third").
    ipv6_share: float = 0.33
    #: client /24s (and /48s) a node serves, per 1000 connections an hour (Zipf popularity).
    prefixes_per_kconn: int = 120
    zipf_alpha: float = 1.05

    # --- purity and dynamics of prefixes (ALICCS §3.3, Fig. 7, Observation IV) ---
    #: share of prefix segments that are "pure" (purity drawn in [pure_lo, 1]); Fig. 7: 90% of
    #: the busiest /24s above 91% purity.
    pure_share: float = 0.92
    pure_lo: float = 0.95
    mixed_lo: float = 0.55
    mixed_hi: float = 0.90
    #: dominance segment length ~ lognormal(mu, sigma) hours, fitted so that P(>2h)=0.87 and
    #: P(>=15h)=0.10 (§3.3 "a /24 stays dominated >2h with 87% probability, >=15h with 10%").
    dominance_mu: float = 1.636
    dominance_sigma: float = 0.837
    #: share of client hosts behind NAT whose connections mix types (§3.3 "even /32s").
    nat_host_share: float = 0.08
    #: share of cellular connections that are 5G rather than 4G (our pick).
    share_5g_of_cell: float = 0.15
    #: the client's first window (sim/stacks.py; docs/simulator.md "The client's first window").
    #: Stress knob, swept there: the share of Android clients on kernels older than 4.19 (60 × the
    #: phone's own MSS instead of 64 KB); Android 12 made 4.19 the oldest kernel a new device may
    #: launch with, so it is the share of phones launched before that still in use.
    android_legacy_kernel_share: float = 0.1
    #: named knob, off by default: the share of Android cellular clients whose radio's receive
    #: buffer is a 2G/3G one (AOSP config_tcp_buffers, EDGE tcp_rmem default 26,280), the one
    #: way the access type reaches the first window on current Android (LTE, NR and Wi-Fi share
    #: 1 MiB, above the 64 KB cap).
    legacy_radio_buffer_share: float = 0.0
    #: stress knob, kept only for the before/after comparison of issue 55
    #: (docs/results/window-before-after.md): "stacks" (the default, the grounded window above) or
    #: "per_type_tables", the simulator's window before 2026-11-28: drawn from per-(OS, access
    #: type) tables, 43,690 only for Android on cellular, 87,380 only on Wi-Fi ("our pick of
    #: common values", no source), from the same four rows of uniforms, so that it is that
    #: simulator's window exactly and every other draw of a node-hour is the default's.
    client_window: str = "stacks"
    #: share of (region, large ISP) branches whose broadband is not PPPoE (DS-Lite or L2TP), and
    #: whose mobile core gives UEs MTU 1500 (our pick; see BROADBAND_PLANTS above).
    odd_broadband_share: float = 0.3
    odd_cellular_share: float = 0.3
    #: spread (lognormal sigma) of the access RTT between provincial branches, per access type.
    #: 0.5 puts the extreme of 112 branches near 3× the median (a loaded DSL or rural radio
    #: plant); 1.0 put it near 10× and a whole province's broadband above its own 4G (a Wi-Fi
    #: median access RTT of 53 ms against 19.5 ms on 4G), against BBR-E2E §III
    access_branch_sigma: float = 0.5
    #: median extra RTT from a node to an ISP's BRAS and to its mobile gateway (World._gateways)
    bras_rtt_ms: float = 3.0
    mobile_gw_rtt_ms: float = 15.0
    #: share of nodes hosted in a large ISP's IDC next to its mobile gateway (World._gateways)
    in_carrier_node_share: float = 0.25
    #: a node's base RTT to its clients' region: lognormal(ln node_rtt_median_ms, node_rtt_sigma), clipped to
    #: 1.5..node_rtt_max_ms (our pick for a fleet inside China's provinces)
    node_rtt_median_ms: float = 9.0
    node_rtt_sigma: float = 0.75
    node_rtt_max_ms: float = 90.0
    #: share of nodes where a tunnel clamps the MSS on many paths (1360-1400, applied per prefix)
    node_tunnel_share: float = 0.25
    #: per-node multiplier of the bottleneck buffer depth, lognormal(0, node_buffer_sigma): ALICCS
    #: §3.1 names "buffer sizes and the number of competing flows across CDN nodes"; 0: none
    node_buffer_sigma: float = 0.0

    # --- monthly and daily cycles (ALICCS §5.1 Fig. 9, Observation III) ---
    #: the cellular share is multiplied by 1+amp at the month's start, 1-amp at its end.
    month_cell_amplitude: float = 0.15
    #: probability that a cellular connection is policed (token bucket), first → last day.
    police_p_start: float = 0.05
    police_p_end: float = 0.45
    police_rate_mbps: tuple[float, float] = (0.8, 2.5)

    # --- congestion of a user group's broadband aggregation (AutoPlex §3.4, Figs. 2, 3;
    # sim/congestion.py) ---
    #: length of a congestion epoch: AutoPlex §3.4 measures at T = 15 minutes.
    congestion_epoch_minutes: int = 15
    #: share of broadband hosts behind oversubscribed aggregation (our pick: the 75-90th
    #: percentile band of a user group's retransmission ratio falls on them when it is busy).
    congested_host_share: float = 0.4
    #: probability that a user group's aggregation is busy in an epoch, and the lognormal σ of
    #: its severity then (our picks).
    congestion_busy_p: float = 0.5
    congestion_sigma: float = 0.7
    #: loss on an exposed connection × c·(1 + gain·severity), c keeping the broadband mean loss:
    #: 50 puts good paths at ≈0.07× and busy bad ones at several × the mean (Fig. 2: better
    #: sessions retransmit ~0.03%, worse ~2.9%).
    congestion_loss_gain: float = 50.0
    #: capacity of an exposed connection is capped at fair_share/severity Mbps: what the busy
    #: uplink leaves each flow (our pick: 4 Mbps keeps broadband rebuffering below cellular's,
    #: BBR-E2E §III; 1 Mbps or less, near the video bitrate, makes broadband players stall more).
    congestion_fair_share_mbps: float = 4.0

    # --- labels (ALICCS §3 "Labeled data acquisition", Observation IV) ---
    #: share of nodes whose short-video app reports the access network type.
    label_node_share: float = 0.7
    #: probability that a request of the reporting app ("video") carries `net_type`; with the
    #: app's share of requests this gives 5-10% of requests fleet-wide.
    label_prob: float = 0.16

    # --- CC assignment ---
    #: "ab": CRC32(client IP) odd → bbr, even → cubic (ALICCS Appendix A);
    #: "default": all cubic; "table": a prefix→CC table file (`table_path`), misses on cubic.
    cc_mode: str = "ab"
    table_path: str | None = None
    #: with cc_mode="table": even CRC32 stays on the default as control (ALICCS §5.3).
    table_ab: bool = False

    # --- planted faults for diagnostics (issue 5) ---
    #: a /16 (e.g. "58.14.0.0/16" or "auto") whose MSS is anomalous while other features stay
    #: normal (ALICCS §3.2: one /16 made the model lean on MSS): a middlebox on its access network
    #: clamps every IPv4 client's MSS to `fault_mss_bytes`, whatever the access type.
    fault_mss_prefix16: str | None = None
    #: the clamped MSS: 536 is TCP's default MSS (RFC 879), what a misconfigured clamp or a client
    #: that lost its MTU announces; no healthy access plant here is below 1340 (M-Lab 1364-1460).
    fault_mss_bytes: int = 536
    #: the fleet hour (0-based) from which the fault is present: a model trained before it and
    #: deployed after it meets the anomaly, as in ALICCS §3.2's initial deployment
    fault_start_hour: int = 0

    extra: dict[str, Any] = field(default_factory=dict)
    #: the named preset these knobs came from (PRESETS), or None
    preset: str | None = None

    @classmethod
    def from_settings(cls, s: SimulateSettings, preset: str | None = None, shift_severity: float | None = None,
                      **overrides: Any) -> "SimParams":
        """The fleet of the configuration's `simulate:` section (its size, first hour and seed);
        every other knob keeps its default here unless the named `preset` (PRESETS), the stress
        knob `shift_severity` (`shift_knobs`: the strong-shift preset's knobs scaled; recorded
        in `extra`) or `overrides` give it (overrides win)."""
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown simulator preset {preset!r}; one of {sorted(PRESETS)}")
        if preset is not None and shift_severity is not None:
            raise ValueError("give a preset or a shift severity, not both")
        knobs = PRESETS[preset] if preset else {}
        if shift_severity is not None:
            knobs = {**shift_knobs(shift_severity), "extra": {"shift_severity": float(shift_severity)}}
        return cls(**{"nodes": s.nodes, "hours": s.hours, "start": s.start, "seed": s.seed,
                      "conns_per_node_hour": s.conns_per_node_hour, "client_window": s.client_window,
                      **knobs, "preset": preset, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Nodes that differ as production's do (issue 28): a fleet reaching beyond one country's
#: provinces (ALICCS §1 serves ~400 nodes "in China and Southeast Asia"), where what depends on
#: the node's position and access plant varies far more than in the default fleet. The
#: `strong_shift` preset, and severity 1 of the stress knob `shift_knobs`.
STRONG_SHIFT: dict[str, float] = {
    # Configanator §5: p95 RTT 100-180 ms in the GlobalCDN, MAWI and Pantheon traces against
    # ~60 ms in the US-based FCC and CAIDA ones: node RTT levels 2-3x apart, up to 180 ms, a
    # median node farther from its clients than a provincial one (20 ms against 9)
    "node_rtt_median_ms": 20.0,
    "node_rtt_sigma": 1.2,
    "node_rtt_max_ms": 180.0,
    # ALICCS §3.1: buffer sizes differ across CDN nodes; lognormal σ 0.7 puts the extremes of
    # 20 nodes ~4x apart (our pick)
    "node_buffer_sigma": 0.7,
    # tunnels and odd access plants on half the nodes and branches rather than a quarter to a
    # third (ALICCS §3.1 "significant deviations in feature distribution"; our pick)
    "node_tunnel_share": 0.5,
    "odd_broadband_share": 0.5,
    "odd_cellular_share": 0.5,
    # the branch access-RTT spread of the default before its cap (σ 0.8; the cap against 5G
    # keeps BBR-E2E §III's ordering: cellular slower than broadband in every branch)
    "access_branch_sigma": 0.8,
    # half the nodes in a carrier's IDC (regional CDNs rent carrier racks; our pick)
    "in_carrier_node_share": 0.5,
}

#: knobs of STRONG_SHIFT that are shares of nodes or branches: kept inside [0, 1]
_SHARES = ("node_tunnel_share", "odd_broadband_share", "odd_cellular_share", "in_carrier_node_share")


def shift_knobs(severity: float) -> dict[str, float]:
    """The node-level shift as one stress knob (issue 55; docs/simulator.md "Presets"): each knob
    of STRONG_SHIFT at (1 − severity) · the default fleet's value + severity · the preset's.
    Severity 0 is the default fleet's knobs, 1 the `strong_shift` preset exactly; above 1 the
    knobs go on along the same line (shares clipped to 1). Most of these knobs are our picks, so
    the severity is declared a stress knob and swept (bench/shift_sweep.py), never tuned to a bar."""
    if not severity >= 0:
        raise ValueError(f"shift severity must be ≥ 0, got {severity}")
    default = {f.name: f.default for f in fields(SimParams)}
    s = float(severity)
    out = {k: (1.0 - s) * default[k] + s * v for k, v in STRONG_SHIFT.items()}
    return {k: min(1.0, v) if k in _SHARES else v for k, v in out.items()}


#: Named sets of knobs (`ccs simulate --preset NAME`); docs/simulator.md "Presets" gives each
#: value's source. The default fleet is no preset.
PRESETS: dict[str, dict[str, Any]] = {"strong_shift": shift_knobs(1.0)}
