"""Two agents with route CCs in one network namespace (issue 56, item 7): each agent's routes live
in its own route table, and an agent's load, rollback, attach or detach flushes only its own,
never the other's; a config that moves an agent to another table leaves none in the old one.

Both agents run inside a network namespace of the test's own (`nsenter --net`), each with its
own cgroup, pin dir and listener; assertions on the routes of protocol 204 per table."""
from __future__ import annotations

import subprocess

import pytest
from _edge_helpers import cc_of, in_cgroup, listener, ns_agent, other_ccs, sysctl_cc
from conftest import Edge

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel


def _routes(ns, table):
    out = subprocess.run(["ip", "-n", ns, "-4", "route", "show", "table", table, "proto", "204"],
                         capture_output=True, text=True).stdout
    return sorted(ln.strip() for ln in out.splitlines() if ln.strip())


def _routed(e, ns, runner, table, within):
    e.config.route_table, e.config.route_spec, e.config.route_within = table, "type local dev lo", within
    e.config.route_ccs = "on"
    with in_cgroup(e.cgroup):
        ls = e.track(runner.call(listener))
    e.configure([Service(ls.getsockname()[1], "video")], attach=False)
    ns_agent(e, ns, "attach", "--cgroup", e.cgroup)
    return ls


def test_agents_flush_only_their_own_routes(edge, edge_binary, keys, tmp_path, netns):
    ns, runner = netns
    a, b = other_ccs(sysctl_cc(ns))
    other = Edge(edge_binary, keys, tmp_path / "other")
    try:
        _routed(edge, ns, runner, "100", "127.60.0.0/16")
        ls_b = _routed(other, ns, runner, "101", "127.61.0.0/16")
        ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", a)], 1).manifest)
        ns_agent(other, ns, "load", other.table([tf.Entry("127.61.1.0/24", b)], 1).manifest)
        assert len(_routes(ns, "100")) == 1 and len(_routes(ns, "101")) == 1, "each agent's route in its table"
        mine = _routes(ns, "101")

        ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.2.0/24", a)], 2).manifest)
        assert _routes(ns, "101") == mine, "the first agent's load left the second's route"
        ns_agent(edge, ns, "rollback")
        assert _routes(ns, "101") == mine and _routes(ns, "100") == [], "its rollback flushed only its own"
        ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.3.0/24", a)], 3).manifest)
        # moved to another table: the routes of the old one go with the next load
        edge.config.route_table = "102"
        edge.config.route_ccs = "on"
        edge.agent.write_config(edge.config)
        ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.3.0/24", a)], 4).manifest)
        assert _routes(ns, "100") == [] and len(_routes(ns, "102")) == 1, \
            f"moved to table 102: 100 {_routes(ns, '100')}, 102 {_routes(ns, '102')}"
        assert _routes(ns, "101") == mine, "and the second agent's route stays"
        # route CCs turned off: attach flushes its own, and only its own
        edge.config.route_table = edge.config.route_within = edge.config.route_spec = ""
        edge.config.route_ccs = "off"
        edge.agent.write_config(edge.config)
        ns_agent(edge, ns, "attach", "--cgroup", edge.cgroup)
        assert _routes(ns, "102") == [] and _routes(ns, "101") == mine, "attach with route CCs off"
        edge.config.route_table, edge.config.route_within, edge.config.route_spec = \
            "100", "127.60.0.0/16", "type local dev lo"
        edge.config.route_ccs = "on"
        edge.agent.write_config(edge.config)
        ns_agent(edge, ns, "attach", "--cgroup", edge.cgroup)
        ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.4.0/24", a)], 5).manifest)
        ns_agent(edge, ns, "detach")
        assert _routes(ns, "100") == [], "detach flushed the first agent's routes"
        assert _routes(ns, "101") == mine, f"the second agent's route after the first's detach: {_routes(ns, '101')}"
        st = ns_agent(other, ns, "status", "--json")
        assert '"routes": 1,' in st, f"the second agent counts its own routes: {st[st.find('route_ccs'):][:120]}"
        assert runner.call(cc_of, ls_b, "127.61.1.7") == b, "the second agent still enforces"
        ns_agent(other, ns, "detach")
        assert _routes(ns, "101") == [], "the second agent's detach"
    finally:
        for e in (edge, other):
            subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *e.agent._argv("detach")],
                           capture_output=True)
            e.config.route_table = e.config.route_within = e.config.route_spec = ""
            e.config.route_ccs = "off"
            e.agent.write_config(e.config)
        other.cleanup()

