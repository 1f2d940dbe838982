"""bench/train_threads: how many torch threads training should use on a shared 2-core machine.

`make run`'s training set is small (about 5,000 labelled rows, the network a few thousand
weights), and the machine it runs on is busy with other work: in `make run` Spark and the stream
beside it, in CI the cluster suite beside `make test`. torch's intra-op pool, one thread per core
by default, then waits on threads the other work has preempted. This bench times
`models.train.fit` (through bench/train.py, the same rows, variant `aliccs`, `--epochs` fixed)
with each thread count in turn, `--pairs` times interleaved in one sitting, the load average
beside each run, and reports the medians and their ratio.

    .venv/bin/python bench/train_threads.py --fleet var/raw [--rows 5227] [--epochs 30] [--threads 1,2] [--pairs 3]

The fleet is any `ccs simulate` folder (make run's var/raw). Writes bench/results/train_threads.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(fleet: str, rows: int, epochs: int, threads: int) -> dict:
    """bench/train.py once in its own process; → its fit's wall seconds and the load around it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "train.json")
        load_before = os.getloadavg()
        subprocess.run([sys.executable, str(REPO / "bench" / "train.py"), "--fleet", fleet, "--rows", str(rows),
                        "--epochs", str(epochs), "--threads", str(threads), "--variants", "aliccs", "--out", out],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        res = json.load(open(out))
    return {"threads": threads, "fit_wall_s": res["variants"]["aliccs"]["wall_s"], "rows": res["rows"],
            "epochs": res["variants"]["aliccs"]["epochs"], "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleet", required=True, help="a `ccs simulate` folder (make run's var/raw)")
    ap.add_argument("--rows", type=int, default=5227, help="make run's training rows (train_job's training_rows)")
    ap.add_argument("--epochs", type=int, default=30, help="about make run's: pipeline.min_steps 600 at batch 256")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "train_threads.json"))
    a = ap.parse_args()
    counts = [int(t) for t in a.threads.split(",")]
    runs = []
    for i in range(a.pairs):
        for t in counts:
            r = one_run(a.fleet, a.rows, a.epochs, t)
            r["pair"] = i
            runs.append(r)
            print(json.dumps(r))
    med = {str(t): statistics.median(r["fit_wall_s"] for r in runs if r["threads"] == t) for t in counts}
    res = {
        "bench": "train_threads",
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": "python bench/train_threads.py " + " ".join(sys.argv[1:]),
        "goal": "the torch thread count for training on a shared 2-core machine (models/train.py TrainParams.threads)",
        "rows": a.rows, "epochs": a.epochs, "pairs": a.pairs,
        "median_fit_wall_s": med,
        "ratio_vs_first": {t: round(med[t] / med[str(counts[0])], 2) for t in med},
        "runs": runs,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("median_fit_wall_s", "ratio_vs_first")}))


if __name__ == "__main__":
    main()
