"""Per-connection path, TCP features and outcomes, vectorized over numpy arrays.

Shapes and sources:
- access RTT and jitter: cellular srtt and rtt_var above Wi-Fi (BBR-E2E §III); RTT with rare
  very high outliers (ALICCS §4.2 "Data cleaning");
- RTO = srtt + max(4·rttvar, 200 ms), Linux's rule (M-Lab: 430 ms at srtt 229 ms);
- CUBIC throughput follows the Mathis bound under random loss and fills buffers; BBR paces at
  the bottleneck rate but under-estimates it on Wi-Fi (frame aggregation, ALICCS Obs. III);
- a 4G token-bucket policer collapses CUBIC's throughput and multiplies its retransmissions
  while BBR tracks the token rate (ALICCS Observation III: 8728 → 1472 kbps, ×73 retrans).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CUBIC, BBR = 0, 1
#: median access RTT (ms) before the branch's multiplier: Wi-Fi, 4G, 5G (BBR-E2E §III)
ACCESS_MEDIAN_MS = {"wifi": 5.0, "4g": 34.0, "5g": 16.0}


@dataclass
class Path:
    """Hidden per-connection path state (written to the ground truth, never to the logs)."""

    min_rtt_ms: np.ndarray
    jitter_ms: np.ndarray
    capacity_mbps: np.ndarray
    buffer_ms: np.ndarray
    loss: np.ndarray
    policed: np.ndarray
    police_mbps: np.ndarray
    bbr_eff: np.ndarray
    spike_ms: np.ndarray
    #: congestion of the user group's aggregation on this path (congestion.on_path)
    loss_mult: np.ndarray


def draw_path(rng: np.random.Generator, cell: np.ndarray, is5g: np.ndarray, fam6: np.ndarray,
              base_rtt_ms: np.ndarray, dist_rtt_ms: np.ndarray, cap_mult: np.ndarray,
              capacity_factor: float, competing: int, path_jitter_ms: np.ndarray,
              police_p: float, police_rate: tuple[float, float], bbr_day_effect: np.ndarray,
              access_scale: np.ndarray, loss_mult: np.ndarray | float = 1.0,
              fair_share_mbps: np.ndarray | float = np.inf, buffer_mult: float = 1.0) -> Path:
    """`access_scale` [n, 2]: the access RTT multiplier of the client's provincial branch for
    broadband and cellular (world.World._access_plants). `loss_mult`, `fair_share_mbps`: the
    aggregation's congestion in the connection's epoch (congestion.on_path). `buffer_mult`: the
    node's bottleneck buffer depth relative to the fleet's (world.Node.buffer_mult)."""
    n = len(cell)
    ln = rng.lognormal
    med = ACCESS_MEDIAN_MS
    access = np.where(cell, np.where(is5g, ln(np.log(med["5g"]), 0.45, n), ln(np.log(med["4g"]), 0.45, n)),
                      ln(np.log(med["wifi"]), 0.6, n))
    access = access * np.where(cell, access_scale[:, 1], access_scale[:, 0])
    # rare, very long RTT spikes (radio stalls, bufferbloat) that skew mean RTTs towards seconds
    spike = np.where(rng.random(n) < 0.004, ln(np.log(800.0), 0.8, n), 0.0)
    min_rtt = base_rtt_ms + dist_rtt_ms + access
    jitter = np.where(cell, 0.32 * access * ln(0.0, 0.4, n), (0.6 + 0.08 * min_rtt) * ln(0.0, 0.5, n))
    jitter = jitter + path_jitter_ms * ln(0.0, 0.5, n)
    cap = np.where(cell, np.where(is5g, ln(np.log(60.0), 0.6, n), ln(np.log(11.0), 0.7, n)),
                   ln(np.log(24.0), 0.7, n))
    cap = np.clip(np.minimum(cap * cap_mult * capacity_factor / (1.0 + 0.12 * competing), fair_share_mbps), 0.1, 300.0)
    buffer_ms = np.where(cell, ln(np.log(160.0), 0.5, n), ln(np.log(30.0), 0.6, n)) * buffer_mult
    # cellular link layers retransmit locally (RLC ARQ), so end-to-end random loss stays low;
    # cellular/Wi-Fi mean retransmission ratio ≈2.1× on IPv4, ≈2.9× on IPv6 (ALICCS §4.2)
    loss = np.where(cell, ln(np.log(0.0010), 0.8, n) * np.where(fam6, 2.2, 1.0),
                    ln(np.log(0.0006), 0.5, n))
    loss = np.clip(loss, 1e-5, 0.05)
    policed = cell & (rng.random(n) < police_p)
    police_mbps = rng.uniform(police_rate[0], police_rate[1], n)
    agg = np.where(cell, 1.0, np.clip(ln(np.log(0.74), 0.08, n), 0.5, 1.0))  # Wi-Fi aggregation
    bbr_eff = np.clip(0.93 * agg * bbr_day_effect, 0.3, 0.99)
    return Path(min_rtt, jitter, cap, buffer_ms, loss, policed, police_mbps, bbr_eff, spike,
                np.broadcast_to(np.asarray(loss_mult, dtype=float), (n,)))


def rate_and_loss(path: Path, cc: np.ndarray, mss: np.ndarray, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Steady-state sending rate (Mbps) and retransmission ratio for the given CC per connection."""
    n = len(cc)
    rtt_s = path.min_rtt_ms / 1000.0
    shallow = 1.0 / (1.0 + path.buffer_ms / path.min_rtt_ms)
    # CUBIC: self-induced overflow loss plus random loss; a loss-bound rate of the Mathis form
    # C·MSS/(RTT·√p) with C=1.8 rather than Reno's 1.22 (CUBIC regrows its window faster).
    # both loss terms scale with the aggregation's congestion (congestion.py)
    p_cubic = (path.loss + 0.004 * shallow) * path.loss_mult
    mathis = 1.8 * mss * 8 / (rtt_s * np.sqrt(p_cubic)) / 1e6
    rate_cubic = np.minimum(path.capacity_mbps * 0.92, mathis)
    # BBR: rate-based, loss-insensitive, but 2·BDP in flight overflows shallow buffers.
    p_bbr = (path.loss + 0.005 * shallow) * path.loss_mult
    rate_bbr = path.capacity_mbps * path.bbr_eff
    # Token-bucket policer (Observation III): CUBIC bursts into the empty bucket and collapses.
    pol = path.policed
    rate_cubic = np.where(pol, np.minimum(rate_cubic, path.police_mbps * rng.uniform(0.45, 0.75, n)), rate_cubic)
    p_cubic = np.where(pol, np.clip(rng.lognormal(np.log(0.06), 0.35, n), 0.01, 0.45), p_cubic)
    rate_bbr = np.where(pol, np.minimum(rate_bbr, path.police_mbps * rng.uniform(0.85, 0.97, n)), rate_bbr)
    p_bbr = np.where(pol, np.clip(rng.lognormal(np.log(0.015), 0.4, n), 0.002, 0.1), p_bbr)
    rate = np.where(cc == BBR, rate_bbr, rate_cubic)
    loss = np.where(cc == BBR, p_bbr, p_cubic)
    return np.maximum(rate, 0.05), np.clip(loss, 0.0, 0.5)


def transfer_time_ms(bytes_: np.ndarray, rate_mbps: np.ndarray, rtt_ms: np.ndarray,
                     mss: np.ndarray, warm: np.ndarray) -> np.ndarray:
    """Time to deliver one response: slow-start rounds from IW10 (fewer on a warm connection)
    plus serialization at the sending rate."""
    segs = np.maximum(1.0, bytes_ / mss)
    bdp_segs = np.maximum(10.0, rate_mbps * 1e6 / 8 * rtt_ms / 1000 / mss)
    rounds = np.log2(np.minimum(segs, bdp_segs) / 10.0 + 1.0)
    rounds = np.where(warm, rounds * 0.3, rounds)
    return rtt_ms * (1.0 + rounds) + bytes_ * 8 / (rate_mbps * 1e3)


def expected_rebuffer_rate(bitrate_mbps: np.ndarray, goodput_mbps: np.ndarray, rate_mbps: np.ndarray,
                           retrans_ratio: np.ndarray) -> np.ndarray:
    """Expected share of play time spent stalled: grows with bitrate/throughput (a buffer that
    drains when the network is slower than the video) and with loss bursts. The throughput a
    player sees mixes the connection's goodput (slow-start bound for short chunks) and the
    steady rate its CC sustains once the buffer runs low (geometric mean of the two)."""
    rho = bitrate_mbps / np.maximum(np.sqrt(goodput_mbps * rate_mbps), 1e-3)
    return np.clip(0.015 * rho ** 2 + 0.08 * retrans_ratio, 0.0, 0.8)
