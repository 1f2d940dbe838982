"""Helpers for the kernel tests: throwaway cgroups and network namespaces, sockets created inside
them, tables signed with a test key, and a transport-log record checker against the contract.
The kernel-marked tests outside tests/kernel/ import them as `kernel._edge_helpers`."""
from __future__ import annotations

import ipaddress
import os
import random
import socket
import struct
import subprocess
import threading
import time

from ccselect import contract

# cgroups, namespaces and sockets: the same helpers `make run`'s kernel probe uses
from ccselect.export.edge.probe import CGROUP_ROOT, CLONE_NEWNET, NetnsRunner, client, in_cgroup, listener, own_cgroup, sock_cc

SO_MAX_PACING_RATE = 47
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def edge_binary() -> str:
    """The agent under test: $CCS_EDGE_BINARY (another build, e.g. an older one), else this tree's,
    built by `make edge` (asserted)."""
    other = os.environ.get("CCS_EDGE_BINARY")
    if other:
        return other
    r = subprocess.run(["make", "-C", REPO, "-f", "export/edge/build.mk", "edge"], capture_output=True, text=True)
    assert r.returncode == 0, f"make edge failed:\n{r.stdout}\n{r.stderr}"
    return os.path.join(REPO, "export", "build", "ccs-edge")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_v4() -> set[str]:
    """The IPv4 addresses of this machine's (the root namespace's) interfaces."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def free_subnets(n: int) -> list[int]:
    """n third octets i with no 10.231.i.0/24 address on this machine (the netns fleets' veths)."""
    used = {int(a.split(".")[2]) for a in host_v4() if a.startswith("10.231.")}
    return [i for i in range(100, 250) if i not in used][:n]


def sysctl_cc(netns: str | None = None) -> str:
    cmd = ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def other_ccs(default: str) -> list[str]:
    """Two CCs different from the default, so table hits are told apart from misses."""
    return [c for c in ("cubic", "reno", "bbr") if c != default][:2]


def pacing_rate(s: socket.socket) -> int:
    return struct.unpack("Q", s.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 8))[0]


def connect_accept(ls: socket.socket, src: str, make_client=None):
    """One connection from `src` to listener `ls`; returns (client, accepted, peer)."""
    family = ls.family
    c = make_client(src) if make_client else client(src, family)
    c.connect(ls.getsockname()[:2])
    a, peer = ls.accept()
    return c, a, peer


def cc_of(ls: socket.socket, src: str, *, runner: NetnsRunner | None = None, to: tuple | None = None,
          timeout: float | None = None) -> str:
    """The CC of the socket `ls` accepts for one connection from `src`, checked to come from `src`.
    The client socket is made inside `runner`'s network namespace when given (else the calling
    thread's) and connects to `to` (default: `ls`'s own address); both sockets closed after."""
    c = runner.call(client, src, ls.family) if runner else client(src, ls.family)
    try:
        if timeout is not None:
            c.settimeout(timeout)
        c.connect(to or ls.getsockname()[:2])
        a, peer = ls.accept()
        try:
            assert ipaddress.ip_address(peer[0]) == ipaddress.ip_address(src), \
                f"{ls.getsockname()[:2]} accepted a connection from {peer[0]}, not {src}"
            return sock_cc(a)
        finally:
            a.close()
    finally:
        c.close()


def expected_cc(table_entries, ip: str, default: str) -> tuple[str, str]:
    """(cc, decision) the enforcer must give `ip` under a table (no A/B)."""
    from ccselect.export.artifact import table_format as tf
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


class Load:
    """Clients connecting to `ls` from random addresses of `net` (two threads, each pausing `pause`
    seconds between connections) and a server thread accepting and recording (peer, CC of the
    accepted socket) until stop()."""

    def __init__(self, ls, net: str, clients: int = 2, pause: float = 0.0):
        self.ls, self.net, self.pause = ls, ipaddress.ip_network(net), pause
        self.seen, self.failures = [], []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._server)] + [
            threading.Thread(target=self._client, args=(s,)) for s in range(clients)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _server(self):
        self.ls.settimeout(0.2)
        while not self._stop.is_set():
            try:
                acc, peer = self.ls.accept()
            except socket.timeout:
                continue
            with self._lock:
                self.seen.append((peer[0], sock_cc(acc)))
            acc.close()

    def _client(self, seed):
        rng = random.Random(seed)
        while not self._stop.is_set():
            src = str(self.net.network_address + rng.randrange(1, self.net.num_addresses - 1))
            try:
                c = client(src)
                c.settimeout(5)
                c.connect(self.ls.getsockname())
                c.close()
            except OSError as exc:
                with self._lock:
                    self.failures.append((src, repr(exc)))
            if self.pause:
                time.sleep(self.pause)

    def stop(self):
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            t.join()
        while True:  # connections whose handshake finished after the server thread stopped
            try:
                acc, peer = self.ls.accept()
            except (socket.timeout, BlockingIOError):
                break
            self.seen.append((peer[0], sock_cc(acc)))
            acc.close()


def ns_agent(edge, ns: str, *args) -> str:
    """`ccs-edge ARGS` of `edge`'s agent inside the network namespace `ns` (`nsenter --net`:
    `ip netns exec` remounts /sys and loses the cgroup and bpf mounts); asserts rc 0, returns stdout."""
    r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *edge.agent._argv(*args)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{args[0]} in {ns}: rc {r.returncode}, {r.stderr.strip()!r}"
    return r.stdout


def detach_in_ns_routes_off(edge, ns: str) -> None:
    """`edge`'s agent detached inside the network namespace `ns` (whatever state it is in), and its
    config put back to route CCs off, for the edge fixture's own detach in the root namespace."""
    subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *edge.agent._argv("detach")], capture_output=True)
    edge.config.route_table = edge.config.route_within = edge.config.route_spec = ""
    edge.config.route_ccs = "off"
    edge.agent.write_config(edge.config)
