"""What the edge's metrics cost the enforcer (issue 59): the accept-rate ratio (enforced listener /
plain listener, bench/kernel.py's accept_rate: export/build/ccs-loadgen interleaving batches of
connections on both, median of the per-round ratios) with the agent exporting its metrics and
node_exporter scraped every second, against the same agent without a metrics file and no scrape.

Both arms run the long-lived agent (`ccs-edge run`: transport log off, TTL watchdog), with bench/
kernel.py's 100,000-entry table and every load connection switching CC; the arms alternate, PAIRS
times, in one run, so both see the same background load. With metrics: `metrics_file` in
node_exporter's textfile directory (the agent rewrites it every 5 s) and Debian's
prometheus-node-exporter (textfile collector only) scraped over HTTP every second.

Writes bench/results/metrics_cost.json. Needs root, BPF, cgroup v2 and prometheus-node-exporter.
Run: .venv/bin/python bench/metrics_cost.py [--pairs N]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from kernel import CGROUP_ROOT, N_ENTRIES, BenchAgent, _write, accept_rate, free_port, make_entries, set_stats  # noqa: E402

from ccselect.export.artifact import signing  # noqa: E402

PAIRS = 3


class Scraper:
    """node_exporter on the textfile directory, GET /metrics every `every_s` seconds."""

    def __init__(self, textfile_dir: str, every_s: float = 1.0):
        self.port = free_port()
        self.proc = subprocess.Popen([shutil.which("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--collector.disable-defaults", "--collector.textfile",
                                      f"--collector.textfile.directory={textfile_dir}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.every_s, self.scrapes, self.stop = every_s, 0, threading.Event()
        self.ccs_series = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self._get():
            time.sleep(0.2)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _get(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return False
        self.ccs_series = sum(1 for line in body.splitlines() if line.startswith("ccs_edge_"))
        return True

    def _loop(self):
        while not self.stop.wait(self.every_s):
            self.scrapes += self._get()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main(pairs: int = PAIRS, seconds: float = 0.5, rounds: int = 20, batch: int = 1024) -> dict:
    if os.geteuid() != 0 or not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.procs")):
        print("bench/metrics_cost.py: skipped (needs root and cgroup v2 at /sys/fs/cgroup/unified)")
        return {}
    if shutil.which("prometheus-node-exporter") is None:
        print("bench/metrics_cost.py: skipped (prometheus-node-exporter is not installed: make sysdeps)")
        return {}
    result = {"table_entries": N_ENTRIES, "pairs": pairs, "loadavg_start": list(os.getloadavg()),
              "default_cc": open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()}
    if result["default_cc"] in ("cubic", "reno"):
        raise SystemExit(f"bench/metrics_cost.py: the default CC is {result['default_cc']}: the load's "
                         "connections would not all switch CC")
    bench = BenchAgent("ccs-bench-metrics")
    agent, cfg, cgroup, ports, tmp, key = bench.agent, bench.cfg, bench.cgroup, bench.ports, bench.tmp, bench.key
    textdir = os.path.join(tmp, "textfile")
    os.makedirs(textdir)
    arms = {"without": [], "with": []}
    scrapes = series = 0
    try:
        set_stats(False)
        agent.attach(cgroup)
        agent.load(signing.write_table(make_entries(N_ENTRIES), 1, "bench", int(time.time()) + 3600, tmp, key).manifest)
        for _ in range(pairs):
            for arm in ("without", "with"):
                cfg.metrics_file = os.path.join(textdir, "ccs.prom") if arm == "with" else ""
                agent.write_config(cfg)
                daemon = agent.run(os.path.join(tmp, "log"))
                scraper = Scraper(textdir) if arm == "with" else None
                try:
                    time.sleep(1.0)
                    arms[arm].append(accept_rate(agent, cgroup, ports, seconds, rounds, batch))
                finally:
                    if scraper is not None:
                        scraper.close()
                        scrapes += scraper.scrapes
                        series = scraper.ccs_series
                    agent.stop(daemon)
        med = {arm: round(statistics.median(r["ratio"] for r in runs), 4) for arm, runs in arms.items()}
        result.update({
            "ratio_without_metrics": med["without"], "ratio_with_metrics_scraped_1s": med["with"],
            "with_over_without": round(med["with"] / med["without"], 4),
            "scrapes": scrapes, "ccs_series_per_scrape": series,
            "runs": {arm: [{k: r[k] for k in ("ratio", "ratio_rounds_p25_p75", "enforced_mean_cps", "plain_mean_cps",
                                              "connections")} for r in runs] for arm, runs in arms.items()},
            "loadavg_end": list(os.getloadavg()),
        })
        assert series > 0, "the scrapes carried the agent's series"
    finally:
        bench.close()
    return _write(result, "metrics_cost.json")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(pairs=int(args[args.index("--pairs") + 1]) if "--pairs" in args else PAIRS)
