"""The servers of the one-machine topology as processes: start one in its own session with its log
and pid file under `<data_root>/cluster/<name>/`, wait until it listens, stop it (its whole process
group: SIGTERM, then SIGKILL), and say what runs.

Every part of `ccs cluster` (topology/) goes through these, so `down` and `status` find each
server from its pid file alone, whoever started it, and nothing is left behind."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Server:
    """One long-running server process of the topology."""
    name: str                 # e.g. "postgres", "spark-worker-1"
    home: Path                # <data_root>/cluster/<name>: its data, log and pid file
    port: int | None = None   # the port it listens on (127.0.0.1 or the address it binds)
    host: str = "127.0.0.1"

    @property
    def log(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def pidfile(self) -> Path:
        return self.home / f"{self.name}.pid"

    def pid(self) -> int | None:
        """The pid from the pid file when that process is alive, else None."""
        try:
            pid = int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def start(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
              timeout: float = 120.0, ready=None) -> int:
        """Start `argv` detached (its own session, so it outlives the caller and `stop` can kill its
        whole group), append its output to `log`, write the pid file, then wait until it listens on
        `port` (and `ready()` is true, when given). A server already running is left alone."""
        if (pid := self.pid()) is not None:
            return pid
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=cwd, start_new_session=True)
        self.pidfile.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{self.name} exited with {proc.returncode} while starting; "
                                   f"last lines of {self.log}:\n{tail(self.log)}")
            if (self.port is None or listening(self.host, self.port)) and (ready is None or ready()):
                return proc.pid
            time.sleep(0.25)
        self.stop()
        raise ClusterError(f"{self.name} did not come up within {timeout:.0f} s; last lines of {self.log}:\n"
                           f"{tail(self.log)}")

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM its process group, then SIGKILL what is left after `timeout`; → whether it ran."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        kill_group(pid, timeout)
        self.pidfile.unlink(missing_ok=True)
        return True

    def status(self) -> dict:
        pid = self.pid()
        return {"name": self.name, "pid": pid, "running": pid is not None,
                "address": f"{self.host}:{self.port}" if self.port else None,
                "listening": bool(pid and self.port and listening(self.host, self.port)),
                "log": str(self.log)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not a server
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid` (a server and what it forked)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d))
    return out


def kill_group(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the process group led by `pid`, wait up to `timeout` for all of it, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_members(pid):
                return
            time.sleep(0.2)
    if left := group_members(pid):
        raise ClusterError(f"processes {left} of group {pid} survived SIGKILL")


def listening(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url` answers 200 (a server's health endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def free_port(host: str, port: int) -> None:
    """Refuse to start a server on a port something else already holds."""
    if listening(host, port):
        raise ClusterError(f"{host}:{port} is already in use by another process")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
