"""The log transport's costs (issue 60, first phase): the project's Kafka broker (topology/kafka.py)
started RUNS times in a fresh folder each (seconds from launch until the broker is registered in
its own metadata and the stream topics exist; its resident memory then and after the shipping
below; seconds to stop), and the edge's shipper (export/edge/shipper.py) publishing a simulated
fleet's hour: wall time and the process's CPU time (librdkafka's threads included) per record,
beside the CPU time Python takes to write the same lines into segment files (a reference for the
file the records come from, not the C agent's writer).

Writes bench/results/kafka_transport.json.
Run: .venv/bin/python bench/kafka_transport.py [--runs 3] [--conns 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from ccselect.topology.kafka import HEAP, Broker, jars  # noqa: E402
from ccselect.export.edge.shipper import Shipper, find  # noqa: E402
from ccselect.sim.fleet import simulate  # noqa: E402
from ccselect.sim.params import SimParams  # noqa: E402

OUT = os.path.join(REPO, "bench", "results", "kafka_transport.json")


def write_cost(files, out_dir: str) -> float:
    """CPU seconds to write every line of `files` again as segment files (open, write, close)."""
    data = [(i, open(f.path, "rb").read()) for i, f in enumerate(files)]
    t0 = time.process_time()
    for i, body in data:
        with open(os.path.join(out_dir, f"{i}.jsonl"), "wb") as fh:
            for line in body.splitlines(keepends=True):
                fh.write(line)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--conns", type=int, default=2000, help="connections per node-hour")
    a = ap.parse_args()
    jars()                                        # resolved before timing anything
    work = tempfile.mkdtemp(prefix="kafka-bench-")
    try:
        fleet = os.path.join(work, "fleet")
        simulate(SimParams(nodes=a.nodes, hours=1, conns_per_node_hour=a.conns, seed=7), fleet, workers=1,
                 progress=False)
        runs = []
        for i in range(a.runs):
            b = Broker(os.path.join(work, f"broker-{i}"))
            t0 = time.monotonic()
            b.up(log=lambda _m: None)
            start_s = time.monotonic() - t0
            rss_up = b.status()["rss_mib"]
            root = os.path.join(work, f"ship-{i}")
            shutil.copytree(fleet, root)
            sh = Shipper(root, b.bootstrap())
            w0, c0 = time.monotonic(), time.process_time()
            sent = sh.ship()["sent"]
            sh.close()
            wall, cpu = time.monotonic() - w0, time.process_time() - c0
            rss_shipped = b.status()["rss_mib"]
            t1 = time.monotonic()
            b.down()
            runs.append({"start_s": round(start_s, 2), "rss_mib_up": round(rss_up, 1),
                         "rss_mib_after_shipping": round(rss_shipped, 1), "stop_s": round(time.monotonic() - t1, 2),
                         "records": sent, "ship_wall_s": round(wall, 3),
                         "ship_cpu_us_per_record": round(cpu / sent * 1e6, 2),
                         "ship_records_per_s": round(sent / wall)})
            print(json.dumps(runs[-1]), flush=True)
        files = find(fleet)[0]
        wdir = os.path.join(work, "rewrite")
        os.makedirs(wdir)
        records = sum(r["records"] for r in runs) // len(runs)
        write_us = write_cost(files, wdir) / records * 1e6
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("start_s", "rss_mib_up", "rss_mib_after_shipping", "stop_s", "ship_cpu_us_per_record",
                         "ship_records_per_s")}
        res = {"fleet": {"nodes": a.nodes, "hours": 1, "conns_per_node_hour": a.conns, "records": records},
               "heap": HEAP, "runs": runs, "median": med,
               "write_lines_cpu_us_per_record": round(write_us, 2),
               "load_average": os.getloadavg(), "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as fh:
            json.dump(res, fh, indent=1)
        print(json.dumps({"median": med, "write_lines_cpu_us_per_record": res["write_lines_cpu_us_per_record"],
                          "load_average": res["load_average"]}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
