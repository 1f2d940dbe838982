"""Time-varying congestion of a user group's broadband aggregation: stable good paths and volatile
bad ones (AutoPlex §3.4, Figs. 2 and 3).

AutoPlex sorts a user group's sessions by retransmission ratio and finds the better ones (5-20th
percentile, ~0.03% retransmitted) an order of magnitude cleaner than the worse ones (75-90th,
~2.9%; Fig. 2), and *steadier*: between adjacent periods their goodput changes 25-30% as much,
their max_cwnd 3.0-5.1× and max_inflight 1.3-3.0× less (Fig. 3). So retransmissions are not
sprinkled evenly over sessions: they concentrate on paths whose congestion comes and goes.

Here that is one mechanism, applied on top of the per-connection path of `physics.draw_path`:

- a share of a user group's broadband subscribers (`congested_host_share`, per client host, our
  pick) sit behind oversubscribed aggregation (BRAS/OLT uplink ports). Cellular clients are left
  out: radio link layers retransmit locally and cellular buffers are deep, so congestion there shows
  up as delay rather than as TCP retransmissions (physics.draw_path: "RLC ARQ");
- per user group (region × ISP, the grouping AutoPlex uses) and epoch of `congestion_epoch_minutes`
  (15: the interval of AutoPlex §3.4's measurement) that aggregation is busy with probability
  `congestion_busy_p`, at a lognormal severity s (σ = `congestion_sigma`), drawn independently per
  epoch — a congested link's load has no memory beyond a quarter of an hour here (our pick);
- on an exposed connection, loss is multiplied by c·(1 + g·s) (g = `congestion_loss_gain`) and
  capacity capped at F/s Mbps (F = `congestion_fair_share_mbps`, the busy uplink's fair share).
  The constant c = 1 / E[1 + g·s] over broadband connections keeps each access type's mean loss
  where it was, so ALICCS's cellular/Wi-Fi retransmission ratios (§4.2) and the policer's ×20
  (Observation III) stay as calibrated: the loss is moved from good paths (c ≈ 0.07) onto busy
  bad ones, not added.

Everything is a function of (seed, region, ISP, epoch) or (seed, node, prefix, host), so every
node and worker sees the same congestion for a user group at a given time.
"""
from __future__ import annotations

import numpy as np

from ccselect.sim.params import SimParams
from ccselect.sim.world import unit


def epoch_ms(p: SimParams) -> int:
    return int(p.congestion_epoch_minutes * 60_000)


def _std_normal(*parts: np.ndarray | int) -> np.ndarray:
    """A deterministic standard normal per element (Box-Muller over two hashed uniforms)."""
    u1 = np.maximum(unit(*parts, 0), 1e-300)
    u2 = unit(*parts, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def severity(p: SimParams, region: np.ndarray, isp: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    """Congestion severity of each (region, ISP) group's aggregation in each epoch: 0 when idle,
    else lognormal(0, σ)."""
    busy = unit(p.seed, 41, region, isp, epoch) < p.congestion_busy_p
    return np.where(busy, np.exp(p.congestion_sigma * _std_normal(p.seed, 42, region, isp, epoch)), 0.0)


def exposed(p: SimParams, node_idx: int, pref: np.ndarray, host: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """Broadband connections of hosts behind congestion-prone aggregation (fixed per host)."""
    return (~cell) & (unit(p.seed, 23, node_idx, pref, host) < p.congested_host_share)


def on_path(p: SimParams, sev: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(loss multiplier, fair-share ceiling in Mbps) per connection, from the severity s of its
    aggregation (0 when not exposed or idle). Broadband loss is renormalised so that its mean over
    hosts and epochs is unchanged: E[1 + g·s] = 1 + g·share·busy_p·e^{σ²/2} (E[s | busy] of a
    lognormal(0, σ))."""
    g = p.congestion_loss_gain
    mean_s = p.congested_host_share * p.congestion_busy_p * np.exp(p.congestion_sigma ** 2 / 2)
    loss_mult = np.where(cell, 1.0, (1.0 + g * sev) / (1.0 + g * mean_s))
    fair_share = np.where(sev > 0, p.congestion_fair_share_mbps / np.maximum(sev, 1e-9), np.inf)
    return loss_mult, fair_share
