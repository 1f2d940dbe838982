"""Route CCs on by default (issue 56): with no route key in the config (route_ccs auto) the agent
takes a route table of its own (from its pin dir), the nexthop of the namespace's default route,
every prefix but those another route of table main covers, and marks the cgroup's listeners that
were already listening when it attached (an iter/tcp pass); where the namespace cannot carry route
CCs (no default route) they are off, status says why, and the program switches every connection.

Two namespaces of the test's own joined by a veth pair: the server's (the agent, under
`nsenter --net`; its default route via the client side) and the clients' (their addresses, in
198.18.1.0/24 and 198.18.2.0/24, behind that default route). Nothing touches the root
namespace's routes or rules."""
from __future__ import annotations

import json
import socket
import subprocess

import pytest
from _edge_helpers import cc_of, in_cgroup, listener, ns_agent, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service
from ccselect.export.edge.probe import netns as make_netns

pytestmark = pytest.mark.kernel

SERVER, GW = "10.99.0.1", "10.99.0.2"   # the veth pair: server side, client side (the gateway)
NETS = ("198.18.1", "198.18.2")         # client addresses, on the client side's lo


def _ip(ns, *args):
    subprocess.run(["ip", "-n", ns, *args], check=True)


@pytest.fixture
def wired(edge, netns):
    """(server ns, its runner, client ns, its runner): a veth pair, the server's default route via
    the client side, the client addresses routed back over the pair."""
    srv, srv_run = netns
    was = edge.config.route_ccs
    with make_netns("ccs-cli") as (cli, cli_run):
        a, b = "ccsa", "ccsb"   # names of each namespace's own
        _ip(srv, "link", "add", a, "type", "veth", "peer", "name", b, "netns", cli)
        _ip(srv, "addr", "add", f"{SERVER}/30", "dev", a)
        _ip(srv, "link", "set", a, "up")
        _ip(srv, "route", "add", "default", "via", GW, "dev", a)
        _ip(cli, "addr", "add", f"{GW}/30", "dev", b)
        for net in NETS:
            _ip(cli, "addr", "add", f"{net}.1/24", "dev", "lo")
        _ip(cli, "link", "set", b, "up")
        try:
            yield srv, srv_run, cli, cli_run
        finally:
            subprocess.run(["nsenter", f"--net=/run/netns/{srv}", *edge.agent._argv("detach")],
                           capture_output=True)
            edge.config.route_ccs = was
            edge.agent.write_config(edge.config)


def _agent(edge, ns, *args):
    r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *edge.agent._argv(*args)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def _cc(cli_run, ls, src):
    """The CC of the socket `ls` accepts for one connection from `src` (a client-side address),
    over the veth pair."""
    return cc_of(ls, src, runner=cli_run, to=(SERVER, ls.getsockname()[1]), timeout=5)


def test_route_ccs_on_by_default_with_the_default_routes_nexthop(edge, wired):
    srv, srv_run, cli, cli_run = wired
    default = sysctl_cc(srv)
    a, b = other_ccs(default)
    # listening before the agent attaches: the enforced one and a second service outside the cgroup
    with in_cgroup(edge.cgroup):
        served = edge.track(srv_run.call(listener, socket.AF_INET, "0.0.0.0"))
    second = edge.track(srv_run.call(listener, socket.AF_INET, "0.0.0.0"))
    edge.config.route_ccs = "auto"   # the default: the key left out of the config
    edge.configure([Service(served.getsockname()[1], "video"),
                    Service(second.getsockname()[1], "other")], attach=False)
    with open(edge.agent.config_path) as f:
        keys = [ln.split(":")[0] for ln in f.read().splitlines()]
    assert not [k for k in keys if k.startswith("route")], f"the config says nothing of routes: {keys}"
    rc, out, err = _agent(edge, srv, "attach", "--cgroup", edge.cgroup)
    assert rc == 0, f"attach: {err}"
    assert "1 listener already listening marked" in out, \
        f"the enforced listener (and not the second service) marked at attach: {out!r}"
    assert "IPv6" in err and "no default route" in err, f"IPv6 has no default route, said: {err!r}"

    st = json.loads(ns_agent(edge, srv, "status", "--json"))
    rc_ = st["route_ccs"]
    table = int(rc_["table"])
    assert 1000 <= table < 1001000, f"a table of the agent's own: {rc_}"
    assert rc_["within"] == "0.0.0.0/0,::/0" and rc_["mark"] == 0xcc500000 | (table & 0xfffff), rc_
    assert "IPv6" in st["route_ccs_off"] and "IPv4" not in st["route_ccs_off"], st["route_ccs_off"]

    entries = [tf.Entry(f"{NETS[0]}.0/24", a), tf.Entry(f"{NETS[1]}.0/24", b),
               tf.Entry("10.99.0.0/24", a),      # covers the veth's connected /30: no route
               tf.Entry("2001:db8::/48", b)]     # IPv6: no default route, no route
    out = json.loads(ns_agent(edge, srv, "load", edge.table(entries, 1).manifest, "--json"))
    assert out["routes"] == 2, f"two routes (the connected subnet's entry and IPv6 left out): {out}"
    routes = subprocess.run(["ip", "-n", srv, "-4", "route", "show", "table", str(table), "proto", "204"],
                            capture_output=True, text=True, check=True).stdout
    assert f"{NETS[0]}.0/24 via {GW} dev" in routes and f"congctl {a}" in routes, routes
    assert f"{NETS[1]}.0/24 via {GW} dev" in routes and f"congctl {b}" in routes, routes
    assert "10.99.0.0" not in routes, f"no route over the connected subnet: {routes}"
    rules = subprocess.run(["ip", "-n", srv, "rule", "show", "lookup", str(table)],
                           capture_output=True, text=True).stdout
    assert f"fwmark {hex(0xcc500000 | (table & 0xfffff))}" in rules, rules

    def counters():
        return json.loads(ns_agent(edge, srv, "status", "--json"))["counters"]

    c0 = counters()
    assert _cc(cli_run, served, f"{NETS[0]}.7") == a, "the listener from before attach: the route's CC"
    assert _cc(cli_run, served, f"{NETS[1]}.7") == b, "the listener from before attach: the route's CC"
    c1 = counters()
    assert c1["cc_preset"] - c0["cc_preset"] == 2, "both CCs came from the routes, no switch"
    assert _cc(cli_run, served, GW) == a, "the connected subnet's entry: switched by the program"
    assert counters()["cc_preset"] == c1["cc_preset"], "no route gave that one"
    # outside the cgroup, or outgoing: the namespace's own CC
    assert _cc(cli_run, second, f"{NETS[0]}.8") == default, "a second service keeps its CC"
    far = edge.track(cli_run.call(listener, socket.AF_INET, f"{NETS[0]}.1"))
    with in_cgroup(edge.cgroup):
        out_sock = edge.track(srv_run.call(socket.socket, socket.AF_INET, socket.SOCK_STREAM))
    out_sock.settimeout(5)
    out_sock.connect(far.getsockname())
    assert sock_cc(out_sock) == default, "an outgoing connection from the cgroup to a routed prefix"
    far.accept()[0].close()

    ns_agent(edge, srv, "detach")
    assert subprocess.run(["ip", "-n", srv, "-4", "route", "show", "table", str(table), "proto", "204"],
                          capture_output=True, text=True).stdout.strip() == "", "detach flushed them"


def test_route_ccs_off_where_the_namespace_cannot_carry_them(edge, netns):
    ns, runner = netns   # lo only: no default route to take a nexthop from
    was = edge.config.route_ccs
    default = sysctl_cc(ns)
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(runner.call(listener))
    edge.config.route_ccs = "on"
    edge.configure([Service(ls.getsockname()[1], "video")], attach=False)
    try:
        rc, out, err = _agent(edge, ns, "attach", "--cgroup", edge.cgroup)
        assert rc == 1 and "route_ccs: on" in err and "no default route" in err, \
            f"route_ccs on where they cannot work: rc {rc}, {err!r}"
        edge.config.route_ccs = "auto"
        edge.agent.write_config(edge.config)
        rc, out, err = _agent(edge, ns, "attach", "--cgroup", edge.cgroup)
        assert rc == 0 and "route CCs off" in err and "no default route" in err, \
            f"auto falls back, saying why: rc {rc}, {err!r}"
        st = json.loads(ns_agent(edge, ns, "status", "--json"))
        assert st["route_ccs"] is None and "IPv4: no default route" in st["route_ccs_off"], st
        out = json.loads(ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", a)], 1).manifest,
                                  "--json"))
        assert out["routes"] == 0, out
        rules = subprocess.run(["ip", "-n", ns, "rule", "show"], capture_output=True, text=True).stdout
        assert "fwmark" not in rules, f"no rule written: {rules!r}"
        assert runner.call(cc_of, ls, "127.60.1.9") == a, "the program switches the connection (the sock_ops path)"
        cnt = json.loads(ns_agent(edge, ns, "status", "--json"))["counters"]
        assert cnt["hit_" + a] >= 1 and cnt["cc_preset"] == 0, cnt
        # a bad value is a config error naming it (auto, the default, is not written)
        text = open(edge.agent.config_path).read()
        assert "\nroute_ccs:" not in text, text
        with open(edge.agent.config_path, "w") as f:
            f.write('route_ccs: "sometimes"\n' + text)
        rc, out, err = _agent(edge, ns, "status")
        assert rc != 0 and "route_ccs" in err and "sometimes" in err, f"rc {rc}, {err!r}"
    finally:
        edge.config.route_ccs = was
        edge.agent.write_config(edge.config)
        subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *edge.agent._argv("detach")],
                       capture_output=True)
