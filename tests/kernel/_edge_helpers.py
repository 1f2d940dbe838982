"""Helpers for the kernel tests: throwaway cgroups and network namespaces, sockets created inside
them, tables signed with a test key, and a transport-log record checker against the contract."""
from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import struct
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

from ccselect import contract

CGROUP_ROOT = "/sys/fs/cgroup/unified"
CLONE_NEWNET = 0x40000000
SO_MAX_PACING_RATE = 47

_cg_lock = threading.Lock()


def own_cgroup() -> str:
    for line in open("/proc/self/cgroup"):
        if line.startswith("0::"):
            return line[3:].strip()
    return "/"


@contextlib.contextmanager
def in_cgroup(path: str):
    """Move this process into `path` for the block; sockets created inside belong to it."""
    with _cg_lock:
        back = os.path.join(CGROUP_ROOT, own_cgroup().lstrip("/"))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            yield
        finally:
            with open(os.path.join(back, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))


def sysctl_cc(netns: str | None = None) -> str:
    cmd = ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def other_ccs(default: str) -> list[str]:
    """Two CCs different from the default, so table hits are told apart from misses."""
    return [c for c in ("cubic", "reno", "bbr") if c != default][:2]


class NetnsRunner:
    """A single worker thread that has joined a network namespace: sockets created through
    `call` live in that namespace (the netns of a socket is its creating thread's)."""

    def __init__(self, name: str):
        libc = ctypes.CDLL(None, use_errno=True)

        def join():
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)

        self.pool = ThreadPoolExecutor(max_workers=1, initializer=join)

    def call(self, fn, *a, **kw):
        return self.pool.submit(fn, *a, **kw).result()

    def close(self):
        self.pool.shutdown(wait=True)


def listener(family=socket.AF_INET, addr="127.0.0.1", backlog=512) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(backlog)
    return s


def client(src: str, family=socket.AF_INET) -> socket.socket:
    c = socket.socket(family, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.bind((src, 0))
    return c


def sock_cc(s: socket.socket) -> str:
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


def pacing_rate(s: socket.socket) -> int:
    return struct.unpack("Q", s.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8))[0]


def connect_accept(ls: socket.socket, src: str, make_client=None):
    """One connection from `src` to listener `ls`; returns (client, accepted, peer)."""
    family = ls.family
    c = make_client(src) if make_client else client(src, family)
    c.connect(ls.getsockname()[:2])
    a, peer = ls.accept()
    return c, a, peer


def expected_cc(table_entries, ip: str, default: str) -> tuple[str, str]:
    """(cc, decision) the enforcer must give `ip` under a table (no A/B)."""
    from export import table_format as tf
    e = tf.lookup(tf.Table(1, 0, 1, tuple(table_entries)), ip)
    if e is None:
        return default, "default"
    if e.cc == "keep" or e.low_confidence:
        return default, "fallback"
    return e.cc, "table"


def validate_transport_record(rec: dict) -> list[str]:
    """Every contract field present, of its type, in its range, with a known cc/decision/ip.
    Stands in for `ccs ingest` until that lands (issue 3). Returns the problems found."""
    problems = []
    fields = contract.TRANSPORT_FIELDS
    nullable = contract.NULLABLE["transport"]
    extra = set(rec) - set(fields)
    if extra:
        problems.append(f"unknown fields {sorted(extra)}")
    for name, typ in fields.items():
        if name not in rec:
            problems.append(f"missing {name}")
            continue
        v = rec[name]
        if v is None:
            if name not in nullable:
                problems.append(f"{name} is null")
            continue
        if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
            problems.append(f"{name}={v!r} not int")
        elif typ is str and not isinstance(v, str):
            problems.append(f"{name}={v!r} not str")
        elif name in contract.RANGES:
            lo, hi = contract.RANGES[name]
            if not lo <= v <= hi:
                problems.append(f"{name}={v} outside [{lo}, {hi}]")
    if rec.get("cc") not in contract.CCS:
        problems.append(f"cc {rec.get('cc')!r} unknown")
    if rec.get("decision") not in contract.DECISIONS:
        problems.append(f"decision {rec.get('decision')!r} unknown")
    try:
        ipaddress.ip_address(rec.get("client_ip", ""))
    except ValueError:
        problems.append(f"client_ip {rec.get('client_ip')!r} not an address")
    if isinstance(rec.get("ts_start_ms"), int) and isinstance(rec.get("ts_end_ms"), int):
        if rec["ts_end_ms"] < rec["ts_start_ms"]:
            problems.append("ts_end_ms before ts_start_ms")
    return problems
