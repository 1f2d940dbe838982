"""The topology's process supervisor (topology/supervise.py): a server that exits is started
again after a back-off; a stop signal goes to the server, and nothing is restarted after it."""
from __future__ import annotations

import signal
import subprocess
import sys
import time


def _supervise(*cmd: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ccselect.topology.supervise", "--name", "t", "--", *cmd],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait(pred, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_a_server_that_exits_is_started_again(tmp_path):
    runs = tmp_path / "runs"
    sup = _supervise("sh", "-c", f"echo run >> {runs}; exit 3")
    try:
        assert _wait(lambda: runs.exists() and len(runs.read_text().split()) >= 3), "not restarted twice"
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(timeout=10)
    n = len(runs.read_text().split())
    time.sleep(2.5)                       # longer than the next back-off: nothing restarts after the stop
    assert len(runs.read_text().split()) == n
    log = sup.stderr.read()
    assert "t exited with 3" in log and "restart 2 in 2 s" in log, log


def test_a_stop_signal_reaches_the_server_and_ends_the_supervisor(tmp_path):
    started = tmp_path / "started"
    sup = _supervise("sh", "-c", f"trap 'echo term > {tmp_path}/got; exit 0' TERM; touch {started}; "
                                 "while true; do sleep 0.1; done")
    assert _wait(started.exists), "the server did not start"
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=10) == 0, "the supervisor exits with the server's status"
    assert (tmp_path / "got").read_text().strip() == "term", "SIGTERM was not forwarded to the server"
