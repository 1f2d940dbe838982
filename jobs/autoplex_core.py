"""AutoPlex's computation, once, for both engines: the Spark job (jobs/autoplex.py, window
functions over silver) and the in-process engine (jobs/autoplex_arrow.py, NumPy over Delta's
files). Plain Python: no Spark, no Arrow, no files. (autoplex-nai22.txt: Algorithm 1 and §3.4.)

- What the job reads: the metrics a policy may sort by and the silver columns each reads
  (`METRIC_INPUTS`), the band means of Algorithm 1 line 6 (`VALUES`), the columns a run reads
  (`input_columns`).
- The user-defined policies P_usr (`Policy`, validated: `PolicyError`), the settings' policies
  (`load_policies`) and §3.4's better and worse bands (`similarity_bands`).
- The rules both engines apply, each on its own rows (Spark columns or NumPy arrays, the same
  arithmetic): the bands that share one sort (`orderings`), a session's membership of a band from
  its position k among the n sessions with the metric (`in_band`), Algorithm 1 line 8's cwnd cap
  (`max_cwnd_last`), eq. (1) (`f_cap`).
- Time: a run covers a `ccselect.hours.Window` of whole periods; the hour key of silver's partitions
  (`hour_key`), the `period` and `window` partition labels of the gold tables.
- §3.4's summary from the mean change rate per value and band (`similarity_summary`), and its plot.

The engines differ only in how they rank, count and sum: Spark's window over (ordering, group,
period) against NumPy's stable lexsort in the same order (tests/test_autoplex.py compares them
row for row, tests/test_autoplex_sim.py the tables they write).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ccselect.hours import Window
from ccselect.settings import AutoplexSettings, PolicySettings
# Imported inside the functions that use them (heavy, not needed to import this module): matplotlib.

#: AutoPlex's goodput is the rate a session delivered at while sending: it becomes the next
#: period's pacing rate (Algorithm 1 line 7), so it is silver's `delivery_rate_bps` (response bytes
#: over the time spent serving them), not `goodput_bps` (bytes over the connection's whole life,
#: the player's idle time included — for a video session about its bitrate, however good the path).
GOODPUT = "delivery_rate_bps"
#: the metrics a policy may sort by → the silver columns each reads (`retrans_ratio`; and
#: `goodput_per_srtt`: goodput / srtt in Mbps per second, as AutoPlex Fig. 2 reports it)
METRIC_INPUTS = {"retrans_ratio": ("retrans_ratio",), "goodput_per_srtt": (GOODPUT, "min_srtt_us", "max_srtt_us")}
#: the band means of Algorithm 1 line 6: output name → silver column
VALUES = {"goodput_bps": GOODPUT, "max_inflight_segs": "max_inflight_segs", "max_cwnd_segs": "max_cwnd_segs"}


class PolicyError(ValueError):
    """A user-defined policy that cannot be run (refused before any work)."""


@dataclass(frozen=True)
class Policy:
    """A user-defined QoS policy P_usr of Algorithm 1: sort by `metric` (`ascending` or not) and
    keep the [band_lo, band_hi) percentile band; groups with fewer sessions get no parameters."""

    name: str
    metric: str
    ascending: bool
    band_lo: float
    band_hi: float
    min_sessions: int

    @classmethod
    def from_settings(cls, s: PolicySettings) -> "Policy":
        """A policy of `autoplex.policies`, validated."""
        direction = str(s.direction).lower()
        if direction not in ("asc", "ascending", "desc", "descending"):
            raise PolicyError(f"policy {s.name}: direction must be asc or desc, got {s.direction!r}")
        try:
            p = cls(name=str(s.name), metric=str(s.metric), ascending=direction in ("asc", "ascending"),
                    band_lo=float(s.band[0]), band_hi=float(s.band[1]), min_sessions=int(s.min_sessions))
        except (TypeError, IndexError, ValueError) as e:
            raise PolicyError(f"policy {s!r}: {e}") from e
        p.validate()
        return p

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Policy":
        """A policy written as in the YAML (the defaults of PolicySettings fill what it omits)."""
        try:
            s = PolicySettings(**d)
        except TypeError as e:
            raise PolicyError(f"policy {d!r}: {e}") from e
        return cls.from_settings(s)

    def validate(self) -> None:
        if self.metric not in METRIC_INPUTS:
            raise PolicyError(f"policy {self.name}: unknown metric {self.metric!r}; known: {sorted(METRIC_INPUTS)}")
        if not (0 <= self.band_lo < self.band_hi <= 100):
            raise PolicyError(f"policy {self.name}: band [{self.band_lo}, {self.band_hi}] must satisfy 0 <= lo < hi <= 100")
        if self.min_sessions < 1:
            raise PolicyError(f"policy {self.name}: min_sessions must be at least 1, got {self.min_sessions}")


def load_policies(s: AutoplexSettings) -> list[Policy]:
    """The policies of `autoplex.policies`, all validated (PolicyError) before any work."""
    return [Policy.from_settings(p) for p in s.policies]


def similarity_bands(s: AutoplexSettings) -> tuple[Policy, Policy]:
    """AutoPlex §3.4's better- and worse-performed sessions: retransmission-ratio percentile bands
    (`autoplex.similarity_better_band` / `_worse_band`), validated."""
    better = Policy("better", "retrans_ratio", True, *s.similarity_better_band, 5)
    worse = Policy("worse", "retrans_ratio", True, *s.similarity_worse_band, 5)
    better.validate(), worse.validate()
    return better, worse


def input_columns(group_cols: list[str], metrics) -> list[str]:
    """The silver columns the bands of `metrics` and their means read: the group columns, then the
    rest sorted."""
    cols = {"conn_id", "ts_end_ms", *VALUES.values(), *(c for m in metrics for c in METRIC_INPUTS[m])}
    return [*group_cols, *sorted(cols - set(group_cols))]


# ---- the rules both engines apply -----------------------------------------------------------------

def orderings(bands: list[tuple[str, Policy]]) -> list[list[tuple[str, Policy]]]:
    """`bands` (label, policy) grouped by (metric, direction): each group is ranked by one sort
    order (by group, period, the metric with sessions without it last, conn_id)."""
    by: dict[tuple[str, bool], list[tuple[str, Policy]]] = {}
    for label, p in bands:
        by.setdefault((p.metric, p.ascending), []).append((label, p))
    return list(by.values())


def in_band(k, n, p: Policy):
    """Algorithm 1's Extract: the session at position k (0-based, in the policy's order) among the n
    sessions of its group and period that have the metric is in `p`'s band when
    lo·n/100 <= k < hi·n/100 (double arithmetic; since hi <= 100, only sessions with the metric
    are). `k` and `n` are Spark columns or NumPy arrays."""
    return (k >= n * (p.band_lo / 100.0)) & (k < n * (p.band_hi / 100.0))


def max_cwnd_last(mean_max_inflight, mean_max_cwnd):
    """Algorithm 1 line 8: max_cwnd_last = (max_inflight + max_cwnd) / 2 of the band's means
    (Spark columns or NumPy arrays). The pacing rate (line 7) is the band's mean goodput."""
    return (mean_max_inflight + mean_max_cwnd) / 2


def f_cap(a: float, b: float) -> float:
    """AutoPlex eq. (1): f(a, b) = a if a <= b else (a + b) / 2 — the computed value a
    (BBR's pacing_gain·max_bw, or its inflight cap) is kept when below the last period's
    better-session value b, and pulled half-way towards b when above it."""
    return a if a <= b else (a + b) / 2


def similarity_summary(means: list[tuple[str, str, float | None]]) -> list[dict[str, Any]]:
    """§3.4's summary from (value, band, mean change rate) rows: per value (sorted), the better and
    the worse band's mean and better/worse (the paper sees 25-30%; None without both or over 0)."""
    by: dict[str, dict[str, float | None]] = {}
    for value, band, mean in means:
        by.setdefault(value, {})[band] = mean
    out = []
    for v in sorted(by):
        b, w = by[v].get("better"), by[v].get("worse")
        out.append({"value": v, "better": b, "worse": w,
                    "better_over_worse": None if b is None or w is None or w == 0 else b / w})
    return out


# ---- time ---------------------------------------------------------------------------------------

def _utc(ms: int, fmt: str) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime(fmt)


def hour_key(ms: int) -> str:
    """The hour (silver's `hour` partition) a time in ms lies in."""
    return _utc(ms, "%Y-%m-%dT%H")


def period_label(ms: int) -> str:
    """gold.autoplex_params' `period` partition of the period starting at `ms`."""
    return _utc(ms, "%Y-%m-%dT%H:%M")


def period_labels(window: Window, period_minutes: int) -> list[str]:
    """gold.autoplex_params' `period` partitions of the window's periods."""
    return [period_label(ms) for ms in window.periods(period_minutes)]


def similarity_window(window: Window, period_minutes: int) -> str:
    """gold.autoplex_similarity's `window` partition of the window's periods."""
    labels = period_labels(window, period_minutes)
    return f"{labels[0]}..{labels[-1]}"


def plot_similarity(summary: list[dict[str, Any]], path: str) -> str:
    """§3.4's summary as a bar plot at `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path), exist_ok=True)
    names = [s["value"] for s in summary]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([i - 0.2 for i in x], [s["better"] or 0 for s in summary], 0.4, label="better (retrans 5-20 pct)")
    ax.bar([i + 0.2 for i in x], [s["worse"] or 0 for s in summary], 0.4, label="worse (retrans 75-90 pct)")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("mean change rate between periods")
    ax.set_title("AutoPlex §3.4: period-to-period change")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
