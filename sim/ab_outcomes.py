"""A canary's two arms minute by minute, for judging the sequential test of export/delivery/canary.py
(issue 58) on many replays: clients split by address parity (the kernel's CRC32 split), each with
its own path (a retransmission rate, a stall share and a delivery rate drawn once per client, so
connections of one client are correlated, as the delta method's cluster unit assumes), returning
over the minutes; the treatment arm's rates multiplied by `effect_*` (1: a table that changes
nothing; for the delivery rate, an effect below 1 is a harm).

Not a fleet model: the per-client spreads are a stress setting (log-normal, σ 1 — wider than a
homogeneous pool, so the cluster variance matters), not a measurement. The fleet simulator
(sim/traffic.py) is what the rest of the project measures on."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArmsSetting:
    clients: int = 4000              # distinct client addresses behind the canary
    conns_per_minute: int = 600      # connections that end each minute
    retrans_median: float = 0.02     # per-client retransmission rate: log-normal around this
    stall_median: float = 0.01       # per-client stall share of play time
    spread: float = 1.0              # σ of the per-client log-normals
    segs_mean: float = 300.0         # data segments sent per connection (Poisson)
    play_ms: int = 60_000            # play time per connection
    rate_median: float = 500.0       # per-client delivery rate, bytes per ms of request time (4 Mbit/s;
                                     # a stress setting like the rest, not a measurement)
    mss: int = 1448                  # bytes per data segment


def replay(rng: np.random.Generator, minutes: int, effect_retrans: float = 1.0, effect_stall: float = 1.0,
           effect_delivery: float = 1.0, s: ArmsSetting = ArmsSetting()):
    """Yield (minute, {metric: {arm: (Y, X, connections)}}) cumulative after each minute 1..minutes:
    the per-client sums Y_i, X_i of the clients seen so far (export.delivery.canary.cluster_moments
    makes the delta method's moments of them)."""
    treated = np.arange(s.clients) % 2 == 1
    p_ret = np.minimum(s.retrans_median * np.exp(rng.normal(0, s.spread, s.clients)), 0.5)
    p_stall = np.minimum(s.stall_median * np.exp(rng.normal(0, s.spread, s.clients)), 0.5)
    p_ret = np.where(treated, np.minimum(p_ret * effect_retrans, 0.9), p_ret)
    p_stall = np.where(treated, np.minimum(p_stall * effect_stall, 0.9), p_stall)
    p_rate = s.rate_median * np.exp(rng.normal(0, s.spread, s.clients))
    p_rate = np.where(treated, p_rate * effect_delivery, p_rate)
    sums = {m: (np.zeros(s.clients), np.zeros(s.clients)) for m in ("retrans_rate", "rebuffer_rate", "delivery_rate")}
    conns = np.zeros(s.clients, dtype=np.int64)
    for minute in range(1, minutes + 1):
        who = rng.integers(0, s.clients, s.conns_per_minute)
        segs = rng.poisson(s.segs_mean, s.conns_per_minute) + 1
        ret = rng.binomial(segs, p_ret[who])
        stall = np.round(s.play_ms * np.minimum(rng.exponential(p_stall[who]), 1.0))
        sent = segs * s.mss                                      # bytes; request time around bytes / rate
        req_ms = np.maximum(1.0, np.round(sent / (p_rate[who] * rng.gamma(4.0, 0.25, len(who)))))
        np.add.at(conns, who, 1)
        for m, (y, x) in (("retrans_rate", (ret, segs)), ("rebuffer_rate", (stall, np.full(len(who), s.play_ms))),
                          ("delivery_rate", (sent, req_ms))):
            np.add.at(sums[m][0], who, y)
            np.add.at(sums[m][1], who, x)
        seen = conns > 0
        out = {}
        for m, (y, x) in sums.items():
            out[m] = {arm: (y[seen & sel], x[seen & sel], int(conns[seen & sel].sum()))
                      for arm, sel in (("control", ~treated), ("treatment", treated))}
        yield minute, out
