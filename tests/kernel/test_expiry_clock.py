"""The expiry check's clock (issue 56): a connection completed by the handshake's last segment
reads its child socket's tcp_clock_cache; a TCP Fast Open child (created at the SYN, fastopen_rsk
set, its cache copied from the listener) takes bpf_ktime_get_coarse_ns(). Both paths must see the
table live before its expiry and stale after it.

In a network namespace of the test's own, whose net.ipv4.tcp_fastopen (a per-namespace sysctl)
is 0x207: clients send data in the SYN without a cookie, the server accepts it without one. The
program is the edge fixture's, on its cgroup; the listener is made in the namespace, in the
cgroup."""
from __future__ import annotations

import socket
import subprocess
import time

from _edge_helpers import cc_of, client, in_cgroup, listener, other_ccs, sock_cc, sysctl_cc
import pytest

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel

TCP_FASTOPEN = 23
MSG_FASTOPEN = 0x20000000


def _tfo_listener() -> socket.socket:
    s = listener()
    s.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN, 16)
    return s


def _tfo_connect(src: str, to) -> socket.socket:
    c = client(src)
    c.sendto(b"x", MSG_FASTOPEN, to)
    return c


def _passive_fast_opens(ns: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/netstat"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    for names, values in zip(out[::2], out[1::2]):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:])))["TCPFastOpenPassive"]
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def test_fast_open_and_plain_children_see_the_expiry(netns, edge):
    ns, runner = netns
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_fastopen=0x207"], check=True)
    default = sysctl_cc(ns)
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(runner.call(_tfo_listener))
    edge.configure([Service(ls.getsockname()[1], "video")])

    def fast_open_cc(src: str) -> str:
        c = runner.call(_tfo_connect, src, ls.getsockname()[:2])
        try:
            acc, peer = ls.accept()
            try:
                assert peer[0] == src and acc.recv(1) == b"x", f"from {peer[0]}"
                return sock_cc(acc)
            finally:
                acc.close()
        finally:
            c.close()

    edge.agent.load(edge.table([tf.Entry("127.60.0.0/16", a)], 1, expires_in=3).manifest)
    passive0 = _passive_fast_opens(ns)
    assert fast_open_cc("127.60.1.1") == a, "a Fast Open child before expiry: the table's CC"
    assert _passive_fast_opens(ns) == passive0 + 1, "the connection was a passive Fast Open"
    assert cc_of(ls, "127.60.1.2", runner=runner) == a, "a plain child before expiry: the table's CC"
    assert edge.agent.status()["counters"]["expired"] == 0
    time.sleep(max(0.0, edge.agent.status()["table"]["expires_in_s"]) + 0.3)
    assert fast_open_cc("127.60.1.3") == default, "a Fast Open child after expiry: the default CC"
    assert _passive_fast_opens(ns) == passive0 + 2, "the second was a passive Fast Open too"
    assert cc_of(ls, "127.60.1.4", runner=runner) == default, "a plain child after expiry: the default CC"
    st = edge.agent.status()
    assert st["table"]["expired"] and st["counters"]["expired"] == 2, f"status {st['table']}, {st['counters']}"
