"""bench/simulate: connections generated per second (all three streams written) and peak memory.

Goal (issue 2): one million connections across all three streams in under a minute on 2 cores.
Memory must stay flat as nodes × hours grow: the same run at a quarter of the size is measured
alongside, and the ratio of peak memories is reported. Writes bench/results/simulate.json.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = """
import json, resource, sys, time
from ccselect.sim.fleet import simulate
from ccselect.sim.params import SimParams
nodes, hours, conns, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t = time.perf_counter()
m = simulate(SimParams(nodes=nodes, hours=hours, conns_per_node_hour=conns, seed=1), out, workers=2, progress=False)
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "counts": m["counts"],
                  "peak_rss_main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def run(nodes: int, hours: int, conns: int) -> dict:
    out = tempfile.mkdtemp(prefix="ccs-bench-sim-")
    try:
        res = subprocess.run([sys.executable, "-c", _CHILD, str(nodes), str(hours), str(conns), out],
                             capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        r["bytes_written"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    c = r["counts"]
    r.update(nodes=nodes, hours=hours, conns_per_node_hour=conns,
             connections_per_s=c["transport"] / r["wall_s"],
             records_per_s=(c["transport"] + c["access"] + c["qoe"]) / r["wall_s"],
             seconds_per_million_connections=r["wall_s"] / c["transport"] * 1e6)
    return r


def main() -> None:
    big = run(20, 25, 2000)     # ≈ 1.0 M connections
    small = run(5, 25, 2000)    # a quarter of the node-hours, same per-hour size
    result = {
        "bench": "simulate",
        "cores": os.cpu_count(),
        "goal": "1M connections (all three streams) in < 60 s on 2 cores",
        "million_run": big,
        "quarter_run": small,
        "meets_goal": big["seconds_per_million_connections"] < 60,
        "peak_worker_memory_ratio_4x_size": big["peak_rss_worker_mb"] / small["peak_rss_worker_mb"],
    }
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "simulate.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
