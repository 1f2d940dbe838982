"""The canary's A/B on outcomes (issue 58): after a table is loaded on the canary, its treatment
arm (odd CRC32 of the client address: the table's CC) and control arm (even: the default CC),
the kernel's own split (ALICCS §4.3), are compared from the canary's own logs as the stream
ingests them, and the rollout promotes, keeps observing, or rolls back.

The metrics are the A/B split's ratio metrics (features/ab_moments.py's CANARY_METRICS): the
delivery rate (the access log's bytes sent over request time: the goodput), retransmitted over
sent segments, and stall over play time, each a ratio of sums with the client address as the
unit (the delta method on per-address cluster sums, `ArmMoments`). A rollout looks at the canary
every minute or so, as long as it likes, and stops at the first look that decides: a
fixed-sample test read that way rolls back good tables far more often than its α says. So the
test is sequential and *always valid* — the mixture sequential probability ratio test (mSPRT)
of Johari, Pekelis and Walsh, "Always Valid Inference: Continuous Monitoring of A/B Tests"
(Operations Research 70(3), 2022), §3, with the normal mixture over the log ratio
θ = log(R_t / R_c):

    Λ_n = sqrt(V / (V + τ²)) · exp(τ² θ̂² / (2 V (V + τ²))),

where θ̂ is the log ratio at the look and V its delta-method variance. P(Λ_n ≥ 1/α at any look)
≤ α when the table changes nothing, whatever the looks. Inverting it gives an always-valid
confidence sequence θ̂ ± h with h = sqrt(V (V + τ²) / τ² · (2 log(1/α) + log((V + τ²) / V))),
intersected over the looks so it only narrows.

Per table, with the metrics' α split evenly (Bonferroni: α_m = `alpha` / number of metrics),
one confidence sequence per metric. The metrics are of two kinds (`settings.primary`, the rest
guardrails), as progressive-delivery analyses split them, and there are three outcomes:

- **roll back** at the first look where any metric's interval — primary or guardrail — lies
  wholly on the harm side of 0 (treatment worse: lower delivery rate, more retransmission,
  more stalls);
- **promote** at the first look, from `bake_minutes` on (capped at `max_minutes`), where every
  *primary* metric's interval lies wholly on the good side of log(1 + `harm_margin`) (for
  delivery rate: above −log(1 + margin)): evidence that the table is no worse than the control
  arm by more than the margin on the primary metrics (a non-inferiority test, read at every
  look). A guardrail whose interval is still wider than the margin does not hold the table
  back; the promote's reason gives its interval. The bake gives the guardrails the window to
  show a harm: without it a table whose primary gains much is promoted in the first minutes,
  before any guardrail could see anything;
- **inconclusive** (not promoted, not rolled back) when `max_minutes` pass with neither: the
  rollout does not go on (the gate's `observe`: the cohort goes back to its previous table,
  nothing frozen; a node that had none keeps this one, export/delivery/rollout.rollback_node).
  Absence of evidence of harm is not evidence of safety: a table is never promoted because the
  window ran out;
- else **observe**. A look with fewer than `min_clusters` addresses in an arm judges nothing for
  that metric (so a metric short of clients can neither roll back nor, when primary, let a table
  be promoted).

What the rule promises, at any number and timing of looks (the confidence sequences cover every
metric's true log ratio at every look at once with probability ≥ 1 − α, as far as the delta
method's normal approximation holds; each wrong decision below needs one to miss):

- **false rollback** ≤ `alpha`: a table that harms no metric (true ratio no worse than 1 on each;
  a table that changes nothing, or a better one) is rolled back with probability at most
  `alpha` (the mSPRT's level, split over the metrics);
- **false promote** ≤ `alpha` / number of metrics: a table that harms a *primary* metric by more
  than `harm_margin` is promoted with probability at most α_m (the non-inferiority test on that
  metric's interval; the same confidence sequence).

What it does not promise:

- anything of the promotion of a table whose harm is on a guardrail alone: a guardrail rolls a
  table back only once its interval excludes 0, and at the canary's sample size a guardrail's
  interval can stay far wider than the harm (on the reacting-fleet drill, rebuffer's half-width
  at minute 30 was about 1.1 in log ratio: a tripling of stalls could not be excluded). Such a
  table can be promoted, and the next cohort's gate, with more clients, is the next chance to
  see it;
- that a good table is promoted within the window: promotion needs a primary interval
  narrower than the margin plus the table's gain, i.e. enough clients per arm within
  `max_minutes`; a table whose interval is still wider is held back (inconclusive);
- anything of a harm between 0 and the margin on a primary: such a table may be promoted or
  rolled back.

Pure Python on collected moments (`arm_moments` rows, `decide`), so the tests run it on numpy
sums; `canary_moments` is the Spark extract over silver.connections.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, functions as F

from ccselect.settings import CanarySettings
from ccselect.features.ab_moments import CANARY_METRICS, ArmMoments, arm_moments, metric_rows

#: per metric: is a higher treatment rate worse? (delivery rate: lower is worse)
HARM_IF_HIGHER = {"retrans_rate": True, "rebuffer_rate": True, "delivery_rate": False}
PROMOTE, OBSERVE, ROLLBACK = "promote", "observe", "rollback"
#: the window ended with neither harm nor non-inferiority shown on every metric: not promoted
INCONCLUSIVE = "inconclusive"


def msprt_lambda(theta: float, var: float, tau: float) -> float:
    """The normal-mixture likelihood ratio Λ of the log ratio `theta` with variance `var`."""
    t2 = tau * tau
    return math.sqrt(var / (var + t2)) * math.exp(min(t2 * theta * theta / (2 * var * (var + t2)), 700.0))


def cs_halfwidth(var: float, tau: float, alpha: float) -> float:
    """Half the width of the always-valid (1 − α) confidence sequence at a look with variance `var`."""
    t2 = tau * tau
    return math.sqrt(var * (var + t2) / t2 * (2 * math.log(1 / alpha) + math.log((var + t2) / var)))


@dataclass
class MetricState:
    """One metric's running interval of θ (intersected over the looks) and its last look."""
    lo: float = -math.inf
    hi: float = math.inf
    looks: int = 0
    last: dict = field(default_factory=dict)


@dataclass
class Canary:
    """The sequential state of one table on one canary: feed it the cumulative moments at each
    look (`look`), read `decision`."""
    settings: CanarySettings
    states: dict[str, MetricState] = field(default_factory=dict)
    decision: str = OBSERVE
    reason: str = "no look yet"

    def look(self, minute: float, moments: dict[str, dict[str, ArmMoments]]) -> str:
        """`moments`: metric → {"control": ArmMoments, "treatment": ArmMoments}, cumulative since
        the load; `minute`: minutes since the load. Returns (and keeps) the decision; once
        `promote`, `rollback` or `inconclusive`, later looks change nothing."""
        if self.decision != OBSERVE:
            return self.decision
        s = self.settings
        alpha = s.alpha / len(s.metrics)
        margin = math.log1p(s.harm_margin)
        judged, harm, safe = 0, [], []
        for metric in s.metrics:
            st = self.states.setdefault(metric, MetricState())
            arms = moments.get(metric, {})
            c, t = arms.get("control"), arms.get("treatment")
            if c is None or t is None or min(c.clusters, t.clusters) < s.min_clusters or not c.ratio or not t.ratio:
                st.last = {"minute": minute, "clusters": [c.clusters if c else 0, t.clusters if t else 0], "judged": False}
                continue
            vc, vt = c.ratio_var(), t.ratio_var()
            var = vc / c.ratio ** 2 + vt / t.ratio ** 2
            theta = math.log(t.ratio / c.ratio)
            if var <= 0:
                continue
            h = cs_halfwidth(var, s.tau, alpha)
            st.lo, st.hi, st.looks = max(st.lo, theta - h), min(st.hi, theta + h), st.looks + 1
            lam = msprt_lambda(theta, var, s.tau)
            st.last = {"minute": minute, "clusters": [c.clusters, t.clusters], "judged": True,
                       "control": c.ratio, "treatment": t.ratio, "rel_change": math.exp(theta) - 1,
                       "cs": [math.exp(st.lo) - 1, math.exp(st.hi) - 1], "lambda": lam, "alpha": alpha}
            judged += 1
            worse_if_higher = HARM_IF_HIGHER[metric]
            if (st.lo > 0) if worse_if_higher else (st.hi < 0):
                harm.append(metric)
            elif (st.hi < margin) if worse_if_higher else (st.lo > -margin):
                safe.append(metric)
        if harm:
            self.decision = ROLLBACK
            self.reason = "; ".join(f"{m}: treatment {self.states[m].last['rel_change']:+.1%} against control, "
                                    f"always-valid interval [{self.states[m].last['cs'][0]:+.1%}, "
                                    f"{self.states[m].last['cs'][1]:+.1%}] "
                                    f"{'above' if HARM_IF_HIGHER[m] else 'below'} 0" for m in harm)
        elif set(s.primary) <= set(safe) and minute >= min(s.bake_minutes, s.max_minutes):
            self.decision = PROMOTE
            self.reason = (f"the primary metric{'s' if len(s.primary) > 1 else ''} "
                           f"({', '.join(s.primary)}) within the {s.harm_margin:.0%} margin "
                           f"(export.canary.harm_margin) after {minute:g} min: "
                           + "; ".join(self._interval(m) for m in s.primary)
                           + (("; guardrails, no harm shown (an interval wider than the margin does not hold a "
                               "table back): " + "; ".join(self._interval(m) for m in s.guardrails))
                              if s.guardrails else ""))
        elif minute >= s.max_minutes:
            self.decision = INCONCLUSIVE
            self.reason = (f"not promoted: the window ({minute:g} min, export.canary.max_minutes) ended without "
                           f"evidence either way: " + "; ".join(self._open(m) for m in s.primary))
        else:
            self.reason = f"observing: {judged} of {len(s.metrics)} metrics judged at {minute:g} min"
        return self.decision

    def _interval(self, metric: str) -> str:
        """`metric`'s last change and always-valid interval, or that it was not judged."""
        st = self.states.get(metric)
        if st is None or not st.looks:
            return f"{metric} not judged (fewer than export.canary.min_clusters clients per arm)"
        return (f"{metric} {st.last.get('rel_change', math.nan):+.1%} "
                f"[{math.expm1(st.lo):+.1%}, {math.expm1(st.hi):+.1%}]")

    def _open(self, metric: str) -> str:
        """Why the primary `metric` does not let the table be promoted (at the window's end)."""
        s, st = self.settings, self.states.get(metric)
        if st is None or not st.looks:
            return (f"{metric} never had export.canary.min_clusters ({s.min_clusters}) clients in both arms "
                    f"({(st.last.get('clusters') if st else None) or [0, 0]})")
        lo, hi = math.expm1(st.lo), math.expm1(st.hi)
        if (st.hi < math.log1p(s.harm_margin)) if HARM_IF_HIGHER[metric] else (st.lo > -math.log1p(s.harm_margin)):
            return f"{metric} within the margin [{lo:+.1%}, {hi:+.1%}]"
        side = "below the +" if HARM_IF_HIGHER[metric] else "above the -"
        return (f"{metric} {st.last.get('rel_change', math.nan):+.1%}, always-valid interval [{lo:+.1%}, {hi:+.1%}] "
                f"not {side}{s.harm_margin:.0%} margin (export.canary.harm_margin)")

    def evidence(self) -> dict[str, Any]:
        return {"decision": self.decision, "reason": self.reason,
                "metrics": {m: st.last for m, st in self.states.items()}}

    def to_doc(self) -> dict[str, Any]:
        """The sequential state as JSON (a rollout in flight keeps it between looks made by
        different processes, export/delivery/inflight.py): each metric's running interval, its
        looks and last look, the decision and its reason. ±inf (no look yet) as None."""
        def f(x: float):
            return None if math.isinf(x) else x
        return {"decision": self.decision, "reason": self.reason,
                "states": {m: {"lo": f(st.lo), "hi": f(st.hi), "looks": st.looks, "last": st.last}
                           for m, st in self.states.items()}}

    @classmethod
    def from_doc(cls, settings: CanarySettings, doc: dict[str, Any]) -> "Canary":
        """`to_doc`'s state back: the intervals go on narrowing from where they were."""
        states = {m: MetricState(-math.inf if d["lo"] is None else float(d["lo"]),
                                 math.inf if d["hi"] is None else float(d["hi"]), int(d["looks"]), dict(d["last"]))
                  for m, d in (doc.get("states") or {}).items()}
        return cls(settings, states, str(doc.get("decision", OBSERVE)), str(doc.get("reason", "no look yet")))


def cluster_moments(sums: dict[str, dict[str, tuple]]) -> dict[str, dict[str, ArmMoments]]:
    """metric → arm → (Y_i, X_i, connections), per-client sums → the same keys with ArmMoments."""
    return {m: {arm: ArmMoments.of_clusters(y, x, conns) for arm, (y, x, conns) in arms.items()}
            for m, arms in sums.items()}


def moments_by_metric(rows: list[dict[str, Any]]) -> dict[str, dict[str, ArmMoments]]:
    """Collected `arm_moments` rows of the segment `all` → metric → arm → ArmMoments."""
    out: dict[str, dict[str, ArmMoments]] = {}
    for m in rows:
        if m["segment_kind"] != "all":
            continue
        out.setdefault(m["metric"], {})[m["arm"]] = ArmMoments(
            int(m["conns"]), int(m["clusters"]), *[float(m[k]) for k in ("sy", "sx", "syy", "sxx", "sxy")])
    return out


def canary_moments(conns: DataFrame, node_id: str, from_ms: int, to_ms: int) -> dict[str, dict[str, ArmMoments]]:
    """The canary's cumulative moments since its load: silver.connections rows of `node_id`
    that ended in [from_ms, to_ms) (Spark), by metric and arm (CANARY_METRICS)."""
    mine = conns.where((F.col("node_id") == node_id) & F.col("ts_end_ms").between(from_ms, to_ms - 1))
    return moments_by_metric([r.asDict() for r in arm_moments(metric_rows(mine, CANARY_METRICS)).collect()])
