"""Route CCs confined to the enforced cgroup (issue 56, items 4 and the confinement): the agent's
routes live in a table of its own that only sockets with its mark look up (`ip rule fwmark`), and
the program marks only its cgroup's listeners. So a second service outside the cgroup and an
outgoing connection of the same namespace keep their own CC while the enforced listener's clients
get the route's CC with no switch; a listener that chose reno keeps reno for its misses, `keep`
entries and unserved ports; after the namespace's sysctl changes, a new listener's misses follow
the new default.

Everything runs in a network namespace of the test's own (the agent under `nsenter --net`). Its
table local's rule is moved after the agent's (pref 100): the clients are loopback addresses, which
table local, looked up first by every socket, would otherwise route before the agent's table."""
from __future__ import annotations

import socket
import subprocess

import pytest
from _edge_helpers import (cc_of, client, detach_in_ns_routes_off, in_cgroup, listener, ns_agent, other_ccs, sock_cc,
                           sysctl_cc)

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel

TABLE, WITHIN = "100", "127.60.0.0/16"


def _ns_sysctl_cc(ns, cc):
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}"],
                   check=True)


def _bound(cc=None):
    """A socket bound to 127.0.0.1 (a port), not listening yet: it listens once the program is
    attached, as a service started after the agent does. cc: chosen by TCP_CONGESTION first."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if cc:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    s.bind(("127.0.0.1", 0))
    return s


def _outgoing_cc(ls, src):
    """The CC of an outgoing connection from src to listener ls (the connecting socket's)."""
    c = client(src)
    try:
        c.connect(ls.getsockname())
        a, _ = ls.accept()
        a.close()
        return sock_cc(c)
    finally:
        c.close()


def _counter(edge, ns, name):
    import json
    return json.loads(ns_agent(edge, ns, "status", "--json"))["counters"][name]


@pytest.fixture
def confined(edge, netns):
    ns, runner = netns
    for cmd in (["rule", "add", "pref", "200", "lookup", "local"], ["rule", "del", "pref", "0"]):
        subprocess.run(["ip", "-n", ns, *cmd], check=True)
    edge.config.route_table, edge.config.route_spec, edge.config.route_within = \
        TABLE, "type local dev lo", WITHIN
    edge.config.route_ccs = "on"
    try:
        yield ns, runner
    finally:
        detach_in_ns_routes_off(edge, ns)


def test_route_ccs_reach_only_the_enforced_listener(edge, confined):
    ns, runner = confined
    default = sysctl_cc(ns)
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        served, unserved = (edge.track(runner.call(_bound)) for _ in range(2))
        reno = edge.track(runner.call(_bound, "reno"))
    second = edge.track(runner.call(listener))            # a second service, outside the cgroup
    far = edge.track(runner.call(listener, socket.AF_INET, "127.60.1.1"))  # what an outgoing connection reaches
    edge.configure([Service(served.getsockname()[1], "video"),
                    Service(reno.getsockname()[1], "video")], attach=False)
    ns_agent(edge, ns, "attach", "--cgroup", edge.cgroup)
    for s in (served, unserved, reno):
        runner.call(s.listen, 64)
    entries = [tf.Entry("127.60.1.0/24", a), tf.Entry("127.60.1.128/25", "keep"),
               tf.Entry("127.60.2.0/24", b)]
    ns_agent(edge, ns, "load", edge.table(entries, 1).manifest)
    routes = subprocess.run(["ip", "-n", ns, "route", "show", "table", TABLE, "proto", "204"],
                            capture_output=True, text=True).stdout
    assert routes.count("congctl") == 2, f"two routes in table {TABLE}: {routes!r}"
    rules = subprocess.run(["ip", "-n", ns, "rule", "show", "lookup", TABLE], capture_output=True,
                           text=True).stdout
    assert "fwmark 0x" in rules, f"the agent's rule selects by mark: {rules!r}"

    preset = _counter(edge, ns, "cc_preset")
    assert runner.call(cc_of, served, "127.60.1.9") == a, "the enforced listener's client: the table's CC"
    assert runner.call(cc_of, served, "127.60.2.9") == b, "the enforced listener's client: the table's CC"
    assert _counter(edge, ns, "cc_preset") == preset + 2, "both CCs came from the route, no switch"
    assert runner.call(cc_of, served, "127.60.1.200") == default, "a keep entry under a route: the default"
    assert runner.call(cc_of, unserved, "127.60.1.9") == default, "an unserved port: the default"

    # outside the cgroup, or outgoing: the namespace's own CC, never a route's
    assert runner.call(cc_of, second, "127.60.1.9") == default, "a second service keeps its CC"
    with in_cgroup(edge.cgroup):
        got = runner.call(_outgoing_cc, far, "127.0.0.5")
    assert got == default, f"an outgoing connection from the cgroup to a client prefix: {got}"
    assert runner.call(_outgoing_cc, far, "127.0.0.6") == default, "an outgoing connection outside it"

    # a listener that chose reno: its misses, keep entries and a hit's CC
    assert runner.call(cc_of, reno, "127.60.9.9") == "reno", "a reno listener's miss stays reno"
    assert runner.call(cc_of, reno, "127.60.1.200") == "reno", "a reno listener's keep stays reno"
    assert runner.call(cc_of, reno, "127.60.1.9") == a, "a reno listener's hit: the table's CC"

    # the namespace's default changes, no attach since: a new listener (unserved port) follows it
    _ns_sysctl_cc(ns, b)
    with in_cgroup(edge.cgroup):
        fresh = edge.track(runner.call(_bound))
    runner.call(fresh.listen, 64)
    assert runner.call(cc_of, fresh, "127.60.1.9") == b, "after the sysctl: the new default over a route"
    assert runner.call(cc_of, fresh, "127.60.9.9") == b, "after the sysctl: a miss gets the new default"
    assert runner.call(cc_of, second, "127.60.1.9") == b, "after the sysctl: the second service too"

    ns_agent(edge, ns, "detach")
    rules = subprocess.run(["ip", "-n", ns, "rule", "show", "lookup", TABLE], capture_output=True,
                           text=True).stdout
    assert rules.strip() == "", f"detach took the agent's rule out: {rules!r}"
