"""bench/canary: what the canary's sequential A/B (export/delivery/canary.py, issue 58) promises and does,
on replays of two arms with known effects (sim/ab_outcomes.py), looked at every minute.

- false rollbacks: runs of 20 tables in a row that change nothing (effect 1), repeated; the
  share of tables rolled back against the promised α, and of runs with at least one;
- the same tables judged by a fixed-sample z-test read at every look (the contrast: why the
  test is sequential);
- harmful tables (treatment retransmission ×1.1 … ×2, and stalls ×1.5): the share rolled back
  within the window and the minutes it took (median, p90);
- helpful tables (×0.7): promoted, never rolled back.

Writes bench/results/canary.json and prints it.

    .venv/bin/python bench/canary.py [--runs 30]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from statistics import NormalDist

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ccselect.settings import CanarySettings  # noqa: E402
from ccselect.export.delivery import canary  # noqa: E402
from ccselect.sim.ab_outcomes import ArmsSetting, replay  # noqa: E402


def judge(rng, s: CanarySettings, effect_retrans: float = 1.0, effect_stall: float = 1.0):
    c = canary.Canary(s)
    for minute, sums in replay(rng, int(s.max_minutes), effect_retrans, effect_stall):
        if c.look(minute, canary.cluster_moments(sums)) != canary.OBSERVE:
            return c.decision, minute
    return c.decision, int(s.max_minutes)


def peeking_z(rng, s: CanarySettings) -> bool:
    """A fixed-sample one-sided z-test at α (split over the metrics) read at every look."""
    z = NormalDist().inv_cdf(1 - s.alpha / len(s.metrics))
    for _, sums in replay(rng, int(s.max_minutes)):
        m = canary.cluster_moments(sums)
        for metric in s.metrics:
            c, t = m[metric]["control"], m[metric]["treatment"]
            se = math.sqrt(c.ratio_var() / c.ratio ** 2 + t.ratio_var() / t.ratio ** 2)
            if math.log(t.ratio / c.ratio) / se > z:
                return True
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="runs of 20 null tables")
    ap.add_argument("--out", default=str(REPO / "bench/results/canary.json"))
    a = ap.parse_args(argv)
    s, arms = CanarySettings(), ArmsSetting()
    rng = np.random.default_rng(2026)
    null = [[judge(rng, s) for _ in range(20)] for _ in range(a.runs)]
    flat = [d for run in null for d, _ in run]
    rolled = sum(d == canary.ROLLBACK for d in flat)
    peek_rng = np.random.default_rng(2027)
    peeks = [peeking_z(peek_rng, s) for _ in range(20 * a.runs)]
    harm = {}
    for eff in (1.1, 1.2, 1.5, 2.0):
        runs = [judge(rng, s, eff) for _ in range(40)]
        mins = [m for d, m in runs if d == canary.ROLLBACK]
        harm[f"retrans_x{eff}"] = {"tables": len(runs), "rolled_back": len(mins),
                                    "minutes_median": float(np.median(mins)) if mins else None,
                                    "minutes_p90": float(np.percentile(mins, 90)) if mins else None}
    runs = [judge(rng, s, 1.0, 1.5) for _ in range(40)]
    mins = [m for d, m in runs if d == canary.ROLLBACK]
    harm["stall_x1.5"] = {"tables": 40, "rolled_back": len(mins), "minutes_median": float(np.median(mins)) if mins else None}
    good = [judge(rng, s, 0.7, 0.7) for _ in range(40)]
    out = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "settings": {"alpha": s.alpha, "tau": s.tau, "harm_margin": s.harm_margin, "min_clusters": s.min_clusters,
                     "max_minutes": s.max_minutes, "metrics": list(s.metrics)},
        "arms": {"clients": arms.clients, "conns_per_minute": arms.conns_per_minute, "spread": arms.spread},
        "null_tables": {"tables": len(flat), "rolled_back": rolled, "false_rollback_rate": rolled / len(flat),
                        "runs_of_20_with_a_rollback": sum(any(d == canary.ROLLBACK for d, _ in run) for run in null),
                        "runs": a.runs, "promised_at_most": s.alpha},
        "peeking_fixed_sample_z": {"tables": len(peeks), "rolled_back": int(sum(peeks)),
                                   "false_rollback_rate": float(np.mean(peeks))},
        "harmful": harm,
        "helpful_x0.7": {"tables": len(good), "promoted": sum(d == canary.PROMOTE for d, _ in good),
                         "rolled_back": sum(d == canary.ROLLBACK for d, _ in good)},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
