"""Route CCs (issue 29, export/edge/routes.c): the live table's CCs also as routes (`congctl`),
which the kernel applies when it creates the child socket; the program stays the authority.
And the swap under load: 50 swaps alternating the load's CC, with and without route CCs, lose no
connection and give none a CC of neither table.

Everything runs in a network namespace of the test's own (the agent under `nsenter --net`, the
sockets created by a thread inside it): the routes go in that namespace's table local, never the
root namespace's."""
from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest
from _edge_helpers import (cc_of, client, detach_in_ns_routes_off, in_cgroup, listener, ns_agent, other_ccs, sock_cc,
                           sysctl_cc)

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel

PROTO = "204"


def _our_routes(ns):
    out = subprocess.run(["ip", "-n", ns, "-4", "route", "show", "table", "all", "proto", PROTO],
                         capture_output=True, text=True, check=True).stdout
    return sorted(ln.strip() for ln in out.splitlines() if ln.strip())


class _InNs:
    """The edge's agent commands inside namespace ns (as EdgeAgent's, through ns_agent)."""

    def __init__(self, edge, ns):
        self.edge, self.ns = edge, ns

    def attach(self):
        return ns_agent(self.edge, self.ns, "attach", "--cgroup", self.edge.cgroup)

    def load(self, manifest):
        return json.loads(ns_agent(self.edge, self.ns, "load", manifest, "--json"))

    def status(self):
        return json.loads(ns_agent(self.edge, self.ns, "status", "--json"))

    def rollback(self):
        return ns_agent(self.edge, self.ns, "rollback")

    def detach(self):
        return ns_agent(self.edge, self.ns, "detach")


@pytest.fixture
def in_ns(edge, netns):
    """(agent commands in the namespace, its socket-making thread); the agent detached in it at
    the end, its config back to route CCs off for the fixture's own detach (root namespace)."""
    ns, runner = netns
    try:
        yield _InNs(edge, ns), runner
    finally:
        detach_in_ns_routes_off(edge, ns)


def _route_mode(edge, within):
    edge.config.route_table = "local"
    edge.config.route_ccs = "on"
    edge.config.route_spec = "type local dev lo"
    edge.config.route_within = within


def test_routes_carry_the_table_and_the_program_stays_the_authority(edge, in_ns):
    agent, runner = in_ns
    ns = agent.ns
    default = sysctl_cc(ns)
    a, b = other_ccs(default)
    _route_mode(edge, "127.60.0.0/16")
    with in_cgroup(edge.cgroup):
        served, unserved, ab = (edge.track(runner.call(listener)) for _ in range(3))
    edge.configure([Service(served.getsockname()[1], "video"),
                    Service(ab.getsockname()[1], "ab", ab=True)], attach=False)
    agent.attach()
    entries = [tf.Entry("127.60.1.0/24", a), tf.Entry("127.60.2.0/24", b),
               tf.Entry("127.60.3.0/24", "keep"),
               tf.Entry("127.60.4.0/24", a, purity_permille=550, low_confidence=True),
               tf.Entry("127.61.0.0/16", b)]          # outside route_within: no route
    out = agent.load(edge.table(entries, 1).manifest)
    assert out["routes"] == 2, out
    routes = _our_routes(ns)
    assert len(routes) == 2 and all("congctl" in r for r in routes), routes
    assert agent.status()["route_ccs"] == {"table": "local", "within": "127.60.0.0/16",
                                                "routes": 2, "mark": 0xcc5000ff}
    assert any(r.startswith("local 127.60.1.0/24") and f"congctl {a}" in r for r in routes), routes
    assert any(r.startswith("local 127.60.2.0/24") and f"congctl {b}" in r for r in routes), routes

    before = agent.status()["counters"]
    # the route gave the CC: nothing to switch
    assert runner.call(cc_of, served, "127.60.1.9") == a and runner.call(cc_of, served, "127.60.2.9") == b
    # no route (outside route_within): the program switches
    assert runner.call(cc_of, served, "127.61.0.9") == b
    # keep, low confidence and miss: the default, with or without a route
    assert runner.call(cc_of, served, "127.60.3.9") == default and runner.call(cc_of, served, "127.60.4.9") == default
    assert runner.call(cc_of, served, "127.60.99.9") == default
    # an unserved port in the cgroup: the route's CC put back to the default
    assert runner.call(cc_of, unserved, "127.60.1.10") == default
    cnt = agent.status()["counters"]
    d = {k: cnt[k] - before[k] for k in ("cc_preset", "cc_reset", "setsockopt_err", "hit_" + a,
                                         "hit_" + b)}
    assert d["cc_preset"] == 2 and d["cc_reset"] == 1 and d["setsockopt_err"] == 0, d

    # A/B control (even CRC32 of the address) keeps the default over the route's CC
    got = {src: runner.call(cc_of, ab, src) for src in (f"127.60.1.{i}" for i in range(20, 40))}
    import zlib
    for src, cc in got.items():
        want = default if zlib.crc32(socket.inet_aton(src)) % 2 == 0 else a
        assert cc == want, f"A/B {src}: {cc}, want {want}"

    # a route that disagrees with the table (here: stale, written by hand): the table wins
    subprocess.run(["ip", "-n", ns, "route", "replace", "local", "127.60.2.0/24", "dev", "lo", "table", "local",
                    "proto", PROTO, "congctl", a], check=True)
    assert runner.call(cc_of, served, "127.60.2.11") == b
    # a new table moves the routes; a rollback takes them away (the program switches)
    entries2 = [tf.Entry("127.60.1.0/24", b), tf.Entry("127.60.2.0/24", a)]
    agent.load(edge.table(entries2, 2).manifest)
    routes = _our_routes(ns)
    assert len(routes) == 2 and any("127.60.1.0/24" in r and f"congctl {b}" in r for r in routes), routes
    assert runner.call(cc_of, served, "127.60.1.12") == b
    agent.rollback()
    assert _our_routes(ns) == []
    assert runner.call(cc_of, served, "127.60.1.13") == a and runner.call(cc_of, served, "127.60.2.13") == b
    agent.load(edge.table(entries2, 3).manifest)
    assert len(_our_routes(ns)) == 2
    # detached, no route of ours is left to enforce without the program
    agent.detach()
    assert _our_routes(ns) == []


@pytest.mark.parametrize("routes", [False, True], ids=["program", "route_ccs"])
def test_swap_under_load(edge, in_ns, routes):
    """A load on loopback (two client threads, connections from 127.62.x.y) while 50 tables swap
    in, alternating the load's CC: no connection fails, every one has the CC of one of the two
    tables, and both are seen."""
    agent, runner = in_ns
    default = sysctl_cc(agent.ns)
    a, b = other_ccs(default)
    if routes:
        _route_mode(edge, "127.62.0.0/16")
    with in_cgroup(edge.cgroup):
        ls = edge.track(runner.call(listener, backlog=4096))
    edge.configure([Service(ls.getsockname()[1], "video")], attach=False)
    agent.attach()
    tables = [edge.table([tf.Entry("127.62.0.0/16", (a, b)[v % 2]),
                          tf.Entry("10.0.0.0/8", a)], v + 1) for v in range(50)]
    agent.load(tables[0].manifest)
    stop = threading.Event()
    errors, ccs = [], []

    def server():
        ls.settimeout(0.5)
        while True:
            try:
                acc, _ = ls.accept()
            except socket.timeout:
                if stop.is_set():
                    return
                continue
            ccs.append(sock_cc(acc))
            acc.close()

    def load(k):
        i = 0
        while not stop.is_set():
            i += 1
            src = f"127.62.{(i >> 8) & 0xff}.{1 + (i * 7 + k) % 250}"
            try:
                c = runner.call(client, src)
                c.connect(ls.getsockname()[:2])
                c.close()
            except OSError as exc:
                errors.append(f"{src}: {exc}")

    srv = threading.Thread(target=server)
    clients = [threading.Thread(target=load, args=(k,)) for k in range(2)]
    srv.start()
    for t in clients:
        t.start()
    try:
        for t in tables[1:]:
            time.sleep(0.02)
            agent.load(t.manifest)
        time.sleep(0.1)
    finally:
        stop.set()
        for t in clients:
            t.join()
        srv.join()
    assert not errors, f"{len(errors)} failed connections, e.g. {errors[:3]}"
    seen = {cc: ccs.count(cc) for cc in set(ccs)}
    assert set(seen) <= {a, b}, f"a CC of neither table: {seen}"
    assert len(ccs) > 500 and seen.get(a, 0) > 50 and seen.get(b, 0) > 50, seen
    cnt = agent.status()["counters"]
    assert cnt["setsockopt_err"] == 0, cnt
    if routes:
        assert cnt["cc_preset"] > 0, cnt
