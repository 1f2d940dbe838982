"""One node-hour of traffic: connections, their HTTP requests and playback sessions, as the
three streams of the data contract plus the ground truth kept apart. Fully vectorized; each
node-hour has its own random stream, so output is identical for a seed whatever the order.
"""
from __future__ import annotations

import ipaddress
import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from ccselect.sim import congestion, follow, physics, stacks
from ccselect.sim.params import BROADBAND_PLANTS, CELLULAR_PLANTS, ISPS, REGIONS
from ccselect.sim.tables import CcTable
from ccselect.sim.world import World, unit

SERVICES = np.array(["video", "live", "image"])
SERVICE_P = np.array([0.55, 0.15, 0.30])
_MEAN_EXTRA_REQ = np.array([3.0, 5.0, 1.0])
#: `SimParams.client_window = "per_type_tables"` only (a stress knob kept for issue 55's before/after
#: comparison): the client's first window as this simulator drew it before 2026-11-28, from
#: per-(OS, access type) tables (values, probabilities; "our pick of common values", no source),
#: in the order the four draws were taken (Android cellular, Android Wi-Fi, PC, iOS).
PER_TYPE_WINDOWS = ((np.array([29200, 65160, 43690]), np.array([0.45, 0.35, 0.2])),   # Android cellular
                    (np.array([65160, 87380, 131072]), np.array([0.6, 0.2, 0.2])),   # Android Wi-Fi
                    (np.array([64240, 65535, 29200]), np.array([0.5, 0.3, 0.2])),    # PC
                    (np.array([65535, 131072]), np.array([0.7, 0.3])))               # iOS
CLIENT_WINDOWS = ("stacks", "per_type_tables")


def per_type_table_window(u: np.ndarray, android: np.ndarray, cell: np.ndarray, pc: np.ndarray) -> np.ndarray:
    """The pre-2026-11-28 window from the four rows of uniforms `u` [4, n]: row k is the k-th
    table's draw for every connection (numpy's `Generator.choice(len(v), n, p=p)` is the search of
    n uniforms in p's normalised cumulative sum, so this is that simulator's window exactly)."""
    def draw(k):
        values, probs = PER_TYPE_WINDOWS[k]
        cdf = np.cumsum(probs)
        return values[np.searchsorted(cdf / cdf[-1], u[k], side="right")]
    return np.where(android, np.where(cell, draw(0), draw(1)), np.where(pc, draw(2), draw(3)))


@dataclass
class NodeHour:
    transport: pl.DataFrame
    access: pl.DataFrame
    qoe: pl.DataFrame
    truth: pl.DataFrame
    #: the follow mode's account of its passes (sim/follow.py); None otherwise
    follow: dict | None = None


def _mss_profile(rng: np.random.Generator, isp: np.ndarray, cell: np.ndarray, plant_bb: np.ndarray,
                 plant_cell: np.ndarray) -> np.ndarray:
    """The MSS each client announces: its provincial access plant's (large ISPs, see
    params.BROADBAND_PLANTS) or its small ISP's own profile, for the connection's access type."""
    small = plant_bb < 0
    profile = np.where(small, 100 + 2 * isp + cell, np.where(cell, 10 + plant_cell, plant_bb))
    out = np.empty(len(isp), dtype=np.int64)
    for pid in np.unique(profile):
        if pid >= 100:
            spec = ISPS[(pid - 100) // 2]
            prof = spec.mss_cell if (pid - 100) % 2 else spec.mss_wifi
        else:
            prof = CELLULAR_PLANTS[pid - 10].mss if pid >= 10 else BROADBAND_PLANTS[pid].mss
        m = profile == pid
        vals = np.array([v for v, _ in prof])
        probs = np.array([q for _, q in prof])
        out[m] = vals[rng.choice(len(vals), size=int(m.sum()), p=probs / probs.sum())]
    return out


def _ip_text(family: np.ndarray, addr_hi: np.ndarray, addr_lo: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Client IP text and the CRC32 of its network-order bytes (ALICCS Appendix A bucketing)."""
    texts: list[str] = []
    crc = np.empty(len(family), dtype=np.int64)
    for i in range(len(family)):
        if family[i] == 4:
            b = int(addr_lo[i]).to_bytes(4, "big")
            texts.append(f"{b[0]}.{b[1]}.{b[2]}.{b[3]}")
        else:
            b = int(addr_hi[i]).to_bytes(8, "big") + int(addr_lo[i]).to_bytes(8, "big")
            texts.append(ipaddress.IPv6Address(b).compressed)
        crc[i] = zlib.crc32(b)
    return texts, crc


def generate_node_hour(world: World, node_idx: int, hour_idx: int, table: CcTable | None = None,
                       chooser: "follow.Chooser | None" = None) -> NodeHour:
    """One node-hour. `chooser` (sim/follow.py, the reacting fleet): each connection gets the CC
    the chooser gives it from what its node's agent sees at the accept (address, port, handshake,
    time) instead of `params.cc_mode`'s; without one the output is what it always was."""
    if chooser is None:
        return _generate(world, node_idx, hour_idx, table)
    return follow.generate(world, node_idx, hour_idx, chooser, _generate)


# A node-hour is made in stages, each drawing from the node-hour's stream `rng` in turn: who
# connects (`_clients`), the CC each gets (`_cc_choice`, no draws), the path (`_path`), the
# requests (`_requests`), the transfers (`_outcome`), their times (`_timing`), the TCP statistics
# the kernel logs (`_tcp_stats`), then the records (`_transport`, `_access`, `_qoe`, `_truth`).
# The stages run in this order and each takes its draws in the order they were always taken:
# every stream and every draw stays where it was (tests/test_sim_bytes.py pins the bytes).

def _generate(world: World, node_idx: int, hour_idx: int, table: CcTable | None = None,
              forced: "follow.Forced | None" = None) -> NodeHour:
    """`forced`: the CC, decision and table version of every connection, in generation order (the
    follow mode's passes, sim/follow.py), with retransmissions drawn per connection so that one
    connection's CC never moves another's draws."""
    p = world.p
    rng = np.random.default_rng([p.seed, 10, node_idx, hour_idx])
    c = _clients(world, node_idx, hour_idx, rng)
    cc, decision, version = _cc_choice(p, c, table, forced)
    pm = _path(world, node_idx, hour_idx, c, rng)
    req = _requests(rng, c.n)
    rate, loss, t_req, _, bytes_c, goodput = _outcome(pm, cc, req, rng)
    # counterfactuals for the ground truth: the same path under each CC (never in the logs)
    cf = {}
    for name, code in (("cubic", physics.CUBIC), ("bbr", physics.BBR)):
        r2, l2, _, _, _, g2 = _outcome(pm, np.full(c.n, code), req,
                                       np.random.default_rng([p.seed, 11, node_idx, hour_idx, code]))
        cf[name] = (g2, l2, physics.expected_rebuffer_rate(req.bitrate, g2, r2, l2))
    times = _timing(world, hour_idx, pm, req, t_req, rng)
    stats = _tcp_stats(world, node_idx, hour_idx, c, pm, cc, rate, loss, bytes_c, forced, rng)
    conn_id = _conn_ids(node_idx, hour_idx, c.n)
    node_id = world.nodes[node_idx].node_id
    transport = _transport(node_id, conn_id, c, pm, times, stats, cc, decision, version, bytes_c, rng)
    access = _access(world, node_idx, conn_id, c, req, times, t_req, rng)
    qoe = _qoe(node_id, conn_id, c, pm, req, times, t_req, rate, loss, goodput, rng)
    truth = _truth(world, node_idx, hour_idx, conn_id, c, pm, req, loss, goodput, cf)
    return NodeHour(transport, access, qoe, truth)


@dataclass
class _Clients:
    """Who connects in the node-hour: one entry per connection, in generation order."""
    n: int
    pref: np.ndarray          # the client's /24 (or /48): an index into world.prefixes(node)
    fam6: np.ndarray
    host: np.ndarray
    seg: np.ndarray           # the prefix's dominance segment at this hour
    month: float
    q_cell: np.ndarray        # the prefix's cellular share at this hour
    nat: np.ndarray
    cell: np.ndarray
    is5g: np.ndarray
    net_type: np.ndarray
    net: np.ndarray
    addr_hi: np.ndarray
    addr_lo: np.ndarray
    ip_text: list[str]
    crc: np.ndarray


def _clients(world: World, node_idx: int, hour_idx: int, rng: np.random.Generator) -> _Clients:
    """How many connect this hour (the diurnal curve), from which prefixes and hosts, on which
    access type, with which addresses."""
    p = world.p
    ps = world.prefixes(node_idx)
    lh = world.local_hour(hour_idx)
    diurnal = 0.45 + 0.55 * (0.5 + 0.5 * np.cos((lh - 21) / 24 * 2 * np.pi))
    n = int(rng.poisson(p.conns_per_node_hour * diurnal / 0.725))  # mean over a day ≈ knob

    pref = rng.choice(len(ps.weight), size=n, p=ps.weight)
    fam6 = ps.family[pref] == 6
    host = np.minimum((ps.n_hosts[pref] * rng.random(n) ** 1.5).astype(np.int64), ps.n_hosts[pref] - 1)
    seg = ps.segment[pref, hour_idx]
    month = world.month_fraction(hour_idx)
    q_cell = np.clip(ps.share_cell[pref, hour_idx] * (1 + p.month_cell_amplitude * (1 - 2 * month)), 0, 1)
    nat = unit(p.seed, 20, node_idx, pref, host) < p.nat_host_share
    u_type = np.where(nat, rng.random(n), unit(p.seed, 21, node_idx, pref, host, seg))
    cell = u_type < q_cell
    is5g = cell & (unit(p.seed, 22, node_idx, pref, host) < p.share_5g_of_cell)
    net_type = np.where(cell, np.where(is5g, "5g", "4g"), "wifi")

    # addresses: v4 host inside the /24; v6 /64 subscriber inside the /48 + a temporary IID
    net = ps.net[pref]
    v4_lo = (net << 8) | ((host * 37 + 1) % 254 + 1)
    iid = (rng.integers(1, 1 << 62, n) | 0x0200000000000000)
    v6_hi = (net << 16) | (host * 101 % 65536)
    addr_hi = np.where(fam6, v6_hi, 0)
    addr_lo = np.where(fam6, iid, v4_lo)
    ip_text, crc = _ip_text(np.where(fam6, 6, 4), addr_hi, addr_lo)
    return _Clients(n, pref, fam6, host, seg, month, q_cell, nat, cell, is5g, net_type, net, addr_hi, addr_lo,
                    ip_text, crc)


def _cc_choice(p, c: _Clients, table: CcTable | None, forced: "follow.Forced | None"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which CC each connection gets (ALICCS Appendix A A/B by CRC32 parity, or an exported
    table, or the follow mode's `forced`), with its logged decision and table version. No draws."""
    n = c.n
    odd = (c.crc & 1) == 1
    cc = np.zeros(n, dtype=np.int64)
    decision = np.full(n, "default", dtype=object)
    version = np.full(n, None, dtype=object)
    if forced is not None:
        cc, decision, version = forced.arrays(n)
    elif p.cc_mode == "ab":
        cc = np.where(odd, physics.BBR, physics.CUBIC)
        decision = np.where(odd, "table", "ab_control").astype(object)
        version = np.where(odd, "ab-bbr", "ab-cubic").astype(object)
    elif p.cc_mode == "table":
        if table is None:
            raise ValueError("cc_mode='table' needs a table")
        looked = table.lookup(np.where(c.fam6, 6, 4), c.addr_hi, c.addr_lo)
        hit = looked >= 0
        treat = odd if p.table_ab else np.ones(n, dtype=bool)
        cc = np.where(hit & treat, looked, physics.CUBIC)
        decision = np.where(~treat, "ab_control", np.where(hit, "table", "default")).astype(object)
        version = np.full(n, table.version, dtype=object)
    elif p.cc_mode != "default":
        raise ValueError(f"unknown cc_mode {p.cc_mode!r}")
    return cc, decision, version


@dataclass
class _Path:
    """Each connection's path (physics.Path), its congestion and its MSS."""
    path: physics.Path
    epoch_len: int
    epoch_of_conn: np.ndarray
    cong_sev: np.ndarray
    isp: np.ndarray
    mss_announced: np.ndarray
    mss: np.ndarray
    fault: np.ndarray
    mss_logged: np.ndarray


def _path(world: World, node_idx: int, hour_idx: int, c: _Clients, rng: np.random.Generator) -> _Path:
    """The path and the MSS of every connection: its /24's gateway, the congestion of its user
    group's aggregation in its epoch, the access plant's MSS and the planted MSS fault."""
    p = world.p
    node = world.nodes[node_idx]
    ps = world.prefixes(node_idx)
    n, pref, cell = c.n, c.pref, c.cell
    hour_ms = world.hour_start_ms(hour_idx)
    police_p = p.police_p_start + (p.police_p_end - p.police_p_start) * c.month
    day = world.day_index(hour_idx)
    day_eff = np.exp(0.07 * (unit(p.seed, 30, ps.region[pref], day) * 2 - 1) * 1.7)
    # the /24's pool at this hour (mobile if cellular-dominated) picks its gateway path
    pool = (ps.share_cell[pref, hour_idx] >= 0.5).astype(np.int64)
    rows = np.arange(n)
    # time-varying congestion of the user group's broadband aggregation (congestion.py, AutoPlex
    # §3.4): each connection lives inside one epoch of the hour (own stream, so every draw of
    # `rng` stays as it was)
    epoch_len = congestion.epoch_ms(p)
    epoch_of_conn = np.random.default_rng([p.seed, 14, node_idx, hour_idx]).integers(0, 3_600_000 // epoch_len, n)
    cong_sev = np.where(congestion.exposed(p, node_idx, pref, c.host, cell),
                        congestion.severity(p, ps.region[pref], ps.isp[pref], hour_ms // epoch_len + epoch_of_conn), 0.0)
    loss_mult, fair_share = congestion.on_path(p, cong_sev, cell)
    path = physics.draw_path(rng, cell, c.is5g, c.fam6, node.base_rtt_ms,
                             ps.dist_rtt_ms[pref] + ps.gw_rtt_ms[pref][rows, pool],
                             ps.cap_mult[pref], node.capacity_factor, node.competing_flows,
                             ps.path_jitter_ms[pref] + ps.gw_jitter_ms[pref][rows, pool], police_p, p.police_rate_mbps, day_eff,
                             ps.access_scale[pref], loss_mult, fair_share, node.buffer_mult)
    isp = ps.isp[pref]
    plant_bb, plant_cell = ps.plant_bb[pref], ps.plant_cell[pref]
    mss_announced = _mss_profile(rng, isp, cell, plant_bb, plant_cell)
    mss = np.minimum(np.minimum(mss_announced - np.where(c.fam6, 20, 0), ps.mss_clamp[pref]), ps.gw_clamp[pref][rows, pool])
    # planted fault (ALICCS §3.2's /16 whose MSS misled the model): the /16's IPv4 connections
    # are logged with an anomalous MSS; the path, the transfer and every other feature keep the
    # real MSS, so MSS is the only feature that is off
    fault = ((~c.fam6) & ((c.net >> 8) == world.fault_prefix16)) \
        if world.fault_prefix16 is not None and hour_idx >= p.fault_start_hour else np.zeros(n, dtype=bool)
    mss_logged = np.where(fault, p.fault_mss_bytes, mss)
    return _Path(path, epoch_len, epoch_of_conn, cong_sev, isp, mss_announced, mss, fault, mss_logged)


@dataclass
class _Requests:
    """The HTTP requests of the node-hour's connections, flattened (one entry per request), and
    each connection's service and video bitrate."""
    service_idx: np.ndarray   # per connection
    total_req: int
    conn_of_req: np.ndarray   # per request: its connection
    first_req: np.ndarray     # per connection: its first request's index
    req_rank: np.ndarray      # per request: its rank in its connection
    svc_r: np.ndarray         # per request: its service
    size: np.ndarray          # per request: the response's bytes
    bitrate: np.ndarray       # per connection: Mbps


def _requests(rng: np.random.Generator, n: int) -> _Requests:
    service_idx = rng.choice(3, size=n, p=SERVICE_P)
    n_req = 1 + rng.poisson(_MEAN_EXTRA_REQ[service_idx])
    total_req = int(n_req.sum())
    conn_of_req = np.repeat(np.arange(n), n_req)
    first_req = np.r_[0, np.cumsum(n_req)[:-1]]
    req_rank = np.arange(total_req) - first_req[conn_of_req]
    svc_r = service_idx[conn_of_req]
    # response sizes: short-video chunks peak near 104 KB and 330 KB (BBR-E2E §III)
    mix = rng.random(total_req)
    size = np.where(mix < 0.45, rng.lognormal(np.log(104e3), 0.30, total_req),
                    np.where(mix < 0.80, rng.lognormal(np.log(330e3), 0.25, total_req),
                             rng.lognormal(np.log(40e3), 1.1, total_req)))
    size = np.where(svc_r == 2, rng.lognormal(np.log(45e3), 1.0, total_req), size)
    size = np.clip(size, 300, 4e6).astype(np.int64)

    bitrate = np.clip(rng.lognormal(np.log(1.0), 0.5, n), 0.15, 6.0)  # >90% below 2 Mbps
    return _Requests(service_idx, total_req, conn_of_req, first_req, req_rank, svc_r, size, bitrate)


def _outcome(pm: _Path, cc_arr: np.ndarray, req: _Requests, r: np.random.Generator):
    """The transfers under the CCs `cc_arr`: (rate Mbps, retransmission ratio, each request's
    transfer time ms, each connection's busy time ms, its bytes, its goodput Mbps)."""
    path, mss = pm.path, pm.mss
    n = len(cc_arr)
    rate, loss = physics.rate_and_loss(path, cc_arr, mss, r)
    t_req = physics.transfer_time_ms(req.size, rate[req.conn_of_req], path.min_rtt_ms[req.conn_of_req],
                                     mss[req.conn_of_req], req.req_rank > 0)
    busy = np.bincount(req.conn_of_req, weights=t_req, minlength=n)
    bytes_c = np.bincount(req.conn_of_req, weights=req.size, minlength=n)
    goodput = bytes_c * 8 / np.maximum(busy, 1.0) / 1e3  # Mbps
    return rate, loss, t_req, busy, bytes_c, goodput


@dataclass
class _Times:
    play_r: np.ndarray        # per request: ms of video in the chunk
    gap: np.ndarray           # per request: idle before it + its transfer
    duration_ms: np.ndarray
    start_ms: np.ndarray
    end_ms: np.ndarray


def _timing(world: World, hour_idx: int, pm: _Path, req: _Requests, t_req: np.ndarray,
            rng: np.random.Generator) -> _Times:
    """When each connection starts and ends: players idle between chunks while the buffer plays;
    images have think time."""
    n = len(pm.mss)
    hour_ms = world.hour_start_ms(hour_idx)
    epoch_len = pm.epoch_len
    play_r = req.size * 8 / (req.bitrate[req.conn_of_req] * 1e3)  # ms of video in each chunk
    idle = np.where(req.svc_r == 2, rng.lognormal(np.log(1500), 1.0, req.total_req),
                    np.maximum(0.0, play_r - t_req) * rng.uniform(0.4, 0.9, req.total_req))
    idle = np.where(req.req_rank == 0, 0.0, idle)
    gap = idle + t_req
    duration_ms = np.minimum(np.bincount(req.conn_of_req, weights=gap, minlength=n) + pm.path.min_rtt_ms, 600_000)
    start_ms = hour_ms + pm.epoch_of_conn * epoch_len + (rng.random(n) * np.maximum(1.0, epoch_len - duration_ms - 1)
                                                         ).astype(np.int64)
    # a connection longer than an epoch (epochs under 10 minutes) still ends inside its hour
    start_ms = np.minimum(start_ms, hour_ms + np.maximum(0, 3_600_000 - duration_ms.astype(np.int64) - 1))
    end_ms = start_ms + duration_ms.astype(np.int64)
    return _Times(play_r, gap, duration_ms, start_ms, end_ms)


@dataclass
class _TcpStats:
    """What the kernel's tcp_info says of each connection at its close (ALICCS Table 4)."""
    segs: np.ndarray
    retrans: np.ndarray
    min_srtt: np.ndarray
    max_srtt: np.ndarray
    min_var: np.ndarray
    max_var: np.ndarray
    min_rto: np.ndarray
    conn_time: np.ndarray
    init_wnd: np.ndarray
    max_wnd: np.ndarray
    min_wnd: np.ndarray
    max_cwnd: np.ndarray
    max_inflight: np.ndarray


def _tcp_stats(world: World, node_idx: int, hour_idx: int, c: _Clients, pm: _Path, cc: np.ndarray,
               rate: np.ndarray, loss: np.ndarray, bytes_c: np.ndarray, forced: "follow.Forced | None",
               rng: np.random.Generator) -> _TcpStats:
    p = world.p
    ps = world.prefixes(node_idx)
    path, mss, cell, n = pm.path, pm.mss, c.cell, c.n
    segs = np.ceil(bytes_c / mss).astype(np.int64)
    # own stream: Poisson sampling consumes a variable number of draws
    if forced is None:
        retrans = np.random.default_rng([p.seed, 13, node_idx, hour_idx]).poisson(segs * loss)
    else:   # one stream per connection: a regenerated hour keeps every undisturbed connection's draws
        retrans = np.array([np.random.default_rng([p.seed, 13, node_idx, hour_idx, i]).poisson(lam)
                            for i, lam in enumerate(segs * loss)], dtype=np.int64)
    s = np.clip(bytes_c / np.maximum(1.0, rate * 1e3 / 8 * path.min_rtt_ms * 4), 0.0, 1.0)
    queue = np.where(cc == physics.BBR, path.min_rtt_ms * rng.uniform(0.1, 0.5, n),
                     path.buffer_ms * rng.uniform(0.4, 1.0, n))
    queue = np.minimum(queue, path.buffer_ms) * s
    min_srtt = path.min_rtt_ms * (1 + rng.lognormal(np.log(0.05), 0.5, n))
    max_srtt = min_srtt + queue + path.jitter_ms * rng.uniform(1.0, 3.0, n) + path.spike_ms
    min_var = path.jitter_ms * rng.uniform(0.2, 0.6, n)
    max_var = path.jitter_ms * rng.uniform(1.2, 3.0, n) + 0.3 * queue + 0.5 * path.spike_ms
    min_rto = min_srtt + np.maximum(4 * min_var, 200.0)  # Linux: srtt + max(4·mdev, rto_min)
    # connection time (SYN-ACK sent → ACK received): one RTT with little queueing, plus the
    # client's uplink access delay — an LTE uplink waits for a scheduling grant (SR period plus
    # grant, ~5-15 ms), NR's is shorter, Wi-Fi contends for the air only briefly. This radio-side
    # delay is the same on every path (ALICCS Table 4 "connection time"; §3.1 X_y).
    uplink = np.where(cell, np.where(c.is5g, rng.lognormal(np.log(4.0), 0.5, n), rng.lognormal(np.log(8.0), 0.5, n)),
                      rng.lognormal(np.log(0.8), 0.6, n))
    conn_time = path.min_rtt_ms * (1 + rng.lognormal(np.log(0.03), 0.6, n)) + uplink
    os_u = rng.random(n)
    android = os_u < ps.android_share[c.pref]
    pc = (~cell) & (os_u > 0.8 + 0.2 * ps.android_share[c.pref])
    # the client's first window from its stack's own rule (sim/stacks.py, docs/simulator.md "The
    # client's first window"): its OS and kernel, its receive buffer and its *own* MSS — the LAN's
    # 1500-byte MTU behind a home gateway (which clamps the MSS on the way, not the phone's
    # buffer), the PDN's MTU on a phone. Four rows of uniforms, as the four draws this replaced
    # took, so every later draw of the node-hour is unchanged.
    u_stack = rng.random((4, n))
    stack = np.where(android, np.where(u_stack[0] < p.android_legacy_kernel_share, stacks.ANDROID_LEGACY_KERNEL,
                                       stacks.ANDROID), np.where(pc, stacks.WINDOWS, stacks.IOS))
    legacy_radio = android & cell & (u_stack[1] < p.legacy_radio_buffer_share)
    client_mss = np.where(cell, pm.mss_announced, 1460) - np.where(c.fam6, 20, 0)
    init_wnd = stacks.established_window(stack, client_mss, legacy_radio)
    if p.client_window == "per_type_tables":       # the stress knob (issue 55's before/after only)
        init_wnd = per_type_table_window(u_stack, android, cell, pc)
    elif p.client_window != "stacks":
        raise ValueError(f"unknown client_window {p.client_window!r}; one of {', '.join(CLIENT_WINDOWS)}")
    rmem_max = np.where(android, np.where(cell, 4 << 20, 2 << 20), np.where(pc, 6 << 20, 4 << 20))
    growth = np.clip(np.log2(np.maximum(bytes_c, 1) / init_wnd), 0, 8) * rng.uniform(0.6, 1.0, n)
    max_wnd = np.minimum(rmem_max, init_wnd * 2.0 ** growth)
    min_wnd = np.where(rng.random(n) < 0.02, 0, init_wnd * rng.uniform(0.3, 1.0, n))
    bdp_segs = rate * 1e3 / 8 * path.min_rtt_ms / mss
    cwnd_cap = np.where(cc == physics.BBR, 2 * bdp_segs * rng.uniform(0.8, 1.1, n),
                        (bdp_segs + path.buffer_ms * rate * 1e3 / 8 / mss) * rng.uniform(0.6, 1.0, n))
    cwnd_cap = np.where(path.policed & (cc == physics.CUBIC), cwnd_cap * 2.5, cwnd_cap)
    max_cwnd = np.maximum(10, np.minimum(segs + 10, cwnd_cap)).astype(np.int64)
    max_inflight = np.maximum(1, (max_cwnd * rng.uniform(0.7, 1.0, n))).astype(np.int64)
    return _TcpStats(segs, retrans, min_srtt, max_srtt, min_var, max_var, min_rto, conn_time, init_wnd, max_wnd,
                     min_wnd, max_cwnd, max_inflight)


def _conn_ids(node_idx: int, hour_idx: int, n: int) -> np.ndarray:
    node_tag = f"{node_idx:03x}{hour_idx:05x}"
    return np.array([f"c{node_tag}{i:06x}" for i in range(n)])


def _us(ms):
    return np.maximum(1, np.round(ms * 1000)).astype(np.int64)


def _transport(node_id: str, conn_id: np.ndarray, c: _Clients, pm: _Path, t: _Times, st: _TcpStats,
               cc: np.ndarray, decision: np.ndarray, version: np.ndarray, bytes_c: np.ndarray,
               rng: np.random.Generator) -> pl.DataFrame:
    """The transport log: one record per closed connection, as the edge agent writes it."""
    n = c.n
    return pl.DataFrame({
        "conn_id": conn_id,
        "node_id": [node_id] * n,
        "ts_start_ms": t.start_ms,
        "ts_end_ms": t.end_ms,
        "client_ip": c.ip_text,
        "client_port": rng.integers(1024, 65536, n),
        "server_port": np.where(rng.random(n) < 0.9, 443, 80),
        "cc": np.array(["cubic", "bbr"])[cc],
        "decision": decision.astype(str),
        "table_version": pl.Series(version.tolist(), dtype=pl.Utf8),
        "mss_bytes": pm.mss_logged.astype(np.int64),
        "connection_time_us": _us(st.conn_time),
        "init_snd_wnd_bytes": st.init_wnd.astype(np.int64),
        "min_rtt_us": _us(pm.path.min_rtt_ms),
        "max_snd_wnd_bytes": st.max_wnd.astype(np.int64),
        "min_snd_wnd_bytes": st.min_wnd.astype(np.int64),
        "min_rtt_var_us": _us(st.min_var),
        "max_rtt_var_us": _us(st.max_var),
        "min_rto_us": _us(st.min_rto),
        "min_srtt_us": _us(st.min_srtt),
        "max_srtt_us": _us(st.max_srtt),
        "max_cwnd_segs": st.max_cwnd,
        "bytes_acked": bytes_c.astype(np.int64),
        "data_segs_out": st.segs + st.retrans,
        "total_retrans": st.retrans.astype(np.int64),
        "max_inflight_segs": st.max_inflight,
        "duration_us": _us(t.duration_ms),
    }).sort("ts_end_ms")


def _access(world: World, node_idx: int, conn_id: np.ndarray, c: _Clients, req: _Requests, t: _Times,
            t_req: np.ndarray, rng: np.random.Generator) -> pl.DataFrame:
    """The access log: one record per request; the reporting app's requests carry the network
    type with probability `label_prob` on a labelled node."""
    p = world.p
    node = world.nodes[node_idx]
    total_req, conn_of_req = req.total_req, req.conn_of_req
    conn_start_cum = np.r_[0.0, np.cumsum(t.gap)][req.first_req][conn_of_req]
    req_done = t.start_ms[conn_of_req] + (np.cumsum(t.gap) - conn_start_cum).astype(np.int64)
    req_done = np.minimum(req_done, t.end_ms[conn_of_req])
    labelled = node.labelled & (req.svc_r == 0) & (rng.random(total_req) < p.label_prob)
    status = np.where(rng.random(total_req) < 0.97, np.where(req.req_rank > 0, 206, 200),
                      rng.choice([304, 404, 499, 502], total_req))
    return pl.DataFrame({
        "conn_id": conn_id[conn_of_req],
        "node_id": [node.node_id] * total_req,
        "ts_ms": req_done,
        "client_ip": np.array(c.ip_text)[conn_of_req],
        "service": SERVICES[req.svc_r],
        "status": status,
        "bytes_sent": req.size,
        "request_time_ms": np.maximum(1, np.round(t_req)).astype(np.int64),
        "net_type": pl.Series(np.where(labelled, c.net_type[conn_of_req], None).tolist(), dtype=pl.Utf8),
    }).sort("ts_ms")


def _qoe(node_id: str, conn_id: np.ndarray, c: _Clients, pm: _Path, req: _Requests, t: _Times,
         t_req: np.ndarray, rate: np.ndarray, loss: np.ndarray, goodput: np.ndarray,
         rng: np.random.Generator) -> pl.DataFrame:
    """The QoE beacons: one playback session per video/live connection."""
    n = c.n
    play = req.service_idx != 2
    play_ms = np.bincount(req.conn_of_req, weights=t.play_r, minlength=n)
    reb_rate = physics.expected_rebuffer_rate(req.bitrate, goodput, rate, loss)
    realized = np.minimum(reb_rate * rng.gamma(0.5, 2.0, n), 0.9)
    reb_ms = (play_ms * realized).astype(np.int64)
    reb_ms = np.where(reb_ms < 50, 0, reb_ms)
    reb_cnt = np.where(reb_ms > 0, np.maximum(1, np.round(reb_ms / rng.lognormal(np.log(900), 0.5, n))), 0)
    first_t = t_req[req.first_req]
    startup = pm.path.min_rtt_ms * 2 + first_t * rng.uniform(0.3, 0.6, n)
    idx = np.flatnonzero(play)
    return pl.DataFrame({
        "session_id": np.char.add("s", np.char.lstrip(conn_id[idx], "c")),
        "conn_id": conn_id[idx],
        "node_id": [node_id] * len(idx),
        "client_ip": np.array(c.ip_text)[idx],
        "ts_ms": t.end_ms[idx],
        "play_ms": play_ms[idx].astype(np.int64),
        "rebuffer_ms": reb_ms[idx],
        "rebuffer_count": reb_cnt[idx].astype(np.int64),
        "startup_ms": np.maximum(1, startup[idx]).astype(np.int64),
    }, schema_overrides={"rebuffer_count": pl.Int64}).sort("ts_ms")


def _truth(world: World, node_idx: int, hour_idx: int, conn_id: np.ndarray, c: _Clients, pm: _Path,
           req: _Requests, loss: np.ndarray, goodput: np.ndarray, cf: dict) -> pl.DataFrame:
    """The ground truth, kept apart from the logs: each connection's hidden state and its
    outcome under either CC."""
    ps = world.prefixes(node_idx)
    path, n = pm.path, c.n
    return pl.DataFrame({
        "conn_id": conn_id,
        "node_id": [world.nodes[node_idx].node_id] * n,
        "hour_start_ms": np.full(n, world.hour_start_ms(hour_idx)),
        "net_type": c.net_type,
        "prefix": np.array([ps.cidr(i) for i in range(len(ps.weight))])[c.pref],
        "segment_id": c.seg,
        "share_cell": c.q_cell,
        "nat_host": c.nat,
        "isp_asn": np.array([s.asn for s in ISPS])[pm.isp],
        "region": np.array([r.name for r in REGIONS])[ps.region[c.pref]],
        "policed": path.policed,
        "capacity_mbps": path.capacity_mbps,
        "base_rtt_ms": path.min_rtt_ms,
        "congestion_severity": pm.cong_sev,
        "bitrate_mbps": req.bitrate,
        "goodput_mbps": goodput,
        "retrans_ratio": loss,
        "goodput_cubic_mbps": cf["cubic"][0], "goodput_bbr_mbps": cf["bbr"][0],
        "retrans_cubic": cf["cubic"][1], "retrans_bbr": cf["bbr"][1],
        "exp_rebuffer_cubic": cf["cubic"][2], "exp_rebuffer_bbr": cf["bbr"][2],
        "fault_mss": pm.fault,
    })
