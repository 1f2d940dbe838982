"""Restart a server that exits, as systemd's `Restart=on-failure` or a Kubernetes pod would:
`python -m ccselect.topology.supervise --name NAME -- ARGV...`.

Airflow's scheduler and DAG processor exit when their database goes away under them (Postgres
restarted: `OperationalError ... the database system is shutting down`); Airflow leaves bringing
them back to the process supervisor. This is the topology's supervisor: it runs ARGV, and when
ARGV exits without having been asked to, starts it again after a back-off (1 s, doubling up to
30 s; back to 1 s after a minute of running), logging each restart. SIGTERM or SIGINT to the
supervisor goes to ARGV, which it then waits for, and it exits with ARGV's status. It runs in the
server's session (topology/proc.py), so `Server.stop` ends both."""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

BACKOFF_S = (1.0, 30.0)      # first and largest wait before a restart
STABLE_S = 60.0              # a run this long resets the back-off


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command to supervise")
    stopping = False
    child: subprocess.Popen | None = None

    def forward(sig, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    wait, restarts = BACKOFF_S[0], 0
    while True:
        t0 = time.monotonic()
        child = subprocess.Popen(cmd)
        code = child.wait()
        if stopping:
            return code
        ran = time.monotonic() - t0
        wait = BACKOFF_S[0] if ran >= STABLE_S else wait
        restarts += 1
        print(f"supervise: {a.name} exited with {code} after {ran:.1f} s; restart {restarts} in {wait:.0f} s",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + wait
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)
        if stopping:
            return code
        wait = min(wait * 2, BACKOFF_S[1])


if __name__ == "__main__":
    raise SystemExit(main())
