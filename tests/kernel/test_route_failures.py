"""Route CCs when something fails (issue 56, items 5 and 6): an `ip` that fails or dies before
reading its batch, a bad `route_within`, and a table that expires. Every failure is a non-zero
exit naming the step, never a silent rc 0 nor the agent killed by SIGPIPE; `detach` flushes the
routes before it removes the program, and refuses to remove it when they cannot go; the running
agent flushes the routes of a table that expired.

Everything route-related runs inside a network namespace of the test's own (the agent runs there
under `nsenter --net`, its listener is created there), so no route of the root namespace is
touched; a failing `ip` is a script first on the agent's PATH."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
from _edge_helpers import cc_of, in_cgroup, listener, other_ccs, sysctl_cc

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel

WITHIN = "127.60.0.0/16"


def _ns_agent(edge, ns, *args, ip_fails=None):
    """The agent with the test's config inside netns `ns`: (rc, stdout, stderr). ip_fails: a
    folder whose failing `ip` comes first on its PATH."""
    path = os.environ["PATH"] if ip_fails is None else f"{ip_fails}:{os.environ['PATH']}"
    r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "env", f"PATH={path}", *edge.agent._argv(*args)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def _ns_routes(ns):
    out = subprocess.run(["ip", "-n", ns, "-4", "route", "show", "table", "all", "proto", "204"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(ln.strip() for ln in out.splitlines() if ln.strip())


def _failing_ip(tmp_path):
    """A folder with an `ip` that exits 1 at once, reading none of its batch."""
    d = tmp_path / "ip-fails"
    d.mkdir()
    (d / "ip").write_text("#!/bin/sh\necho 'ip: injected failure' >&2\nexit 1\n")
    (d / "ip").chmod(0o755)
    return str(d)


@pytest.fixture
def ns_edge(edge, netns):
    """The edge with route CCs on (table local, within 127.60.0.0/16), a listener in the test's
    netns and cgroup, attached from inside the netns; its routes left nowhere at the end."""
    name, runner = netns
    edge.config.route_table = "local"
    edge.config.route_ccs = "on"
    edge.config.route_spec = "type local dev lo"
    edge.config.route_within = WITHIN
    with in_cgroup(edge.cgroup):
        ls = edge.track(runner.call(listener))
    edge.configure([Service(ls.getsockname()[1], "video")], attach=False)
    rc, out, err = _ns_agent(edge, name, "attach", "--cgroup", edge.cgroup)
    assert rc == 0, f"attach in {name}: {err}"
    try:
        yield name, runner, ls
    finally:
        _ns_agent(edge, name, "detach")
        # the fixture's own detach runs in the root namespace: with route CCs off it flushes none
        edge.config.route_table = edge.config.route_within = edge.config.route_spec = ""
        edge.config.route_ccs = "off"
        edge.agent.write_config(edge.config)


def _cc(runner, ls, src):
    return runner.call(cc_of, ls, src)


def _big_table(edge, version, cc, n=4000):
    """n /32 entries inside route_within saying cc: a batch far over a pipe's 64 KiB."""
    return edge.table([tf.Entry(f"127.60.{i // 256}.{i % 256}/32", cc) for i in range(n)], version)


def test_route_failures_exit_nonzero_naming_the_step(ns_edge, edge, tmp_path):
    ns, runner, ls = ns_edge
    default = sysctl_cc(ns)
    a, b = other_ccs(default)
    fails = _failing_ip(tmp_path)
    src = "127.60.1.9"

    rc, out, err = _ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", a)], 1).manifest)
    assert rc == 0 and len(_ns_routes(ns)) == 1, f"table 1 and its route: rc {rc} {err} {_ns_routes(ns)}"

    # ip dies before reading its batch: the agent is not killed by SIGPIPE, says which step failed
    rc, out, err = _ns_agent(edge, ns, "load", _big_table(edge, 2, b).manifest, ip_fails=fails)
    assert rc == 1, f"load with a failing ip: rc {rc} (-13 is SIGPIPE), stderr {err[-300:]!r}"
    assert "step 7" in err and "ip -4 -batch" in err and "injected failure" in err, \
        f"the step and ip's own message named: {err[-400:]!r}"
    assert _ns_agent(edge, ns, "status", "--json")[0] == 0 and _cc(runner, ls, src) == b, \
        "the swap stands (the program switches)"

    # a rollback whose flush fails leaves stale routes: it says so and fails
    rc, out, err = _ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", b)], 3).manifest)
    assert rc == 0 and any(f"congctl {b}" in r for r in _ns_routes(ns)), f"table 3's route: {err}"
    rc, out, err = _ns_agent(edge, ns, "rollback", ip_fails=fails)
    assert rc == 1, f"rollback with the stale route of table 3 left: rc {rc}, {out!r}"
    assert "step 2" in err and "stale" in err, f"rollback names the step: {err!r}"
    assert any(f"congctl {b}" in r for r in _ns_routes(ns)), "the stale route is there, as said"
    assert _cc(runner, ls, src) == b, "table 2 (rolled back to) decides over the stale route"

    # detach: the routes go first; when they cannot, the program stays
    rc, out, err = _ns_agent(edge, ns, "detach", ip_fails=fails)
    assert rc == 1 and "step 1" in err, f"detach with a failing ip: rc {rc}, {err!r}"
    st = _ns_agent(edge, ns, "status", "--json")
    assert '"attached": true' in st[1], f"the program still attached after the refused detach: {st[1][:200]}"
    assert _cc(runner, ls, "127.60.1.10") == b, "and still enforcing"
    rc, out, err = _ns_agent(edge, ns, "detach")
    assert rc == 0 and _ns_routes(ns) == [], f"detach with ip working: rc {rc} {err}, routes {_ns_routes(ns)}"
    assert _cc(runner, ls, "127.60.1.11") == default, "detached: the default CC"


@pytest.mark.parametrize("within,why", [
    ("127.60.0.0/33", '"127.60.0.0/33" is not a prefix'),
    ("127.60.0.0", "need prefixes as address/length"),
    ("127.60.0.0/", '"127.60.0.0/" is not a prefix'),
])
def test_bad_route_within_refused_before_anything_changes(ns_edge, edge, within, why):
    ns, runner, ls = ns_edge
    a, _ = other_ccs(sysctl_cc(ns))
    rc, _, err = _ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", a)], 1).manifest)
    assert rc == 0, err
    edge.config.route_within = within
    edge.agent.write_config(edge.config)
    t2 = edge.table([tf.Entry("127.60.1.0/24", a)], 2)
    rc, out, err = _ns_agent(edge, ns, "load", t2.manifest)
    edge.config.route_within = WITHIN
    edge.agent.write_config(edge.config)
    assert rc != 0, f"route_within {within!r}: load rc {rc}, {out!r}"
    assert "route_within" in err and why in err and edge.agent.config_path in err, \
        f"the config file and the key named: {err!r}"
    rc, out, _ = _ns_agent(edge, ns, "status", "--json")
    assert '"version": 1,' in out, "table 1 still live: the bad config changed nothing"


def test_routes_flushed_when_the_table_expires(ns_edge, edge):
    """The running agent's watchdog flushes the routes of a table that expired: connections
    outside the cgroup no longer follow it."""
    ns, runner, ls = ns_edge
    a, _ = other_ccs(sysctl_cc(ns))
    rc, _, err = _ns_agent(edge, ns, "load", edge.table([tf.Entry("127.60.1.0/24", a)], 1,
                                                       expires_in=4).manifest)
    assert rc == 0 and len(_ns_routes(ns)) == 1, err
    outside = runner.call(listener)       # not in the cgroup: only the route decides its CC
    edge.track(outside)
    assert runner.call(cc_of, outside, "127.60.1.5") == a, "before expiry the route gives its CC outside"
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", *edge.agent._argv("run", "--out", edge.logs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    edge.procs.append(proc)
    time.sleep(4 + 2.5)
    routes = _ns_routes(ns)
    got = runner.call(cc_of, outside, "127.60.1.6")
    _, err = edge.agent.stop(proc)
    assert routes == [], f"routes of the expired table still there 2.5 s after it expired: {routes}; {err!r}"
    assert got == sysctl_cc(ns), f"outside the cgroup after expiry: {got}"
    assert "expired" in err and "route" in err, f"the watchdog says it: {err!r}"
