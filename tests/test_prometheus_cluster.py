"""Prometheus and Alertmanager in the one-machine topology (issue 59, topology/monitoring.py):
two edge hosts in network namespaces of their own (topology/edges.py), each with its agent
rewriting its metrics file and node_exporter serving it on the node's address; Prometheus on this
machine scrapes both over their veths with infra/prometheus/rules.yml and sends to Alertmanager.

Read back through Prometheus's HTTP API: the series of a table load, a miss, a hit and an A/B
control on one node. Fault drills on the other node, each alert firing through Prometheus's alerts
API and reaching Alertmanager's, for that node only: its table left to expire (a TTL of seconds:
CcsTableExpired), its log volume full (a tmpfs with no room left under its log folder, records
to write: CcsLogErrors), and the node detached (its program off the cgroup: CcsNodeDetached, after
the rule's minute). The stream killed: the stream's metrics writer (flows/stream_metrics.py, what
`ccs stream --metrics-file` runs) in a process of its own, writing into the platform exporter's
textfile folder, is killed with SIGKILL while the detached node's minute runs; its heartbeat stops
and CcsStreamDown (a minute without one) fires through Alertmanager in the same wait. `ccs fleet status` over both nodes names the same. Scrape and evaluation every second. The fleet is infra/fleet-netns.yaml with this run's
names, subnets and ports, so a `ccs cluster up` beside it is not touched.

A `cluster` test (make test-cluster) that needs root, BPF and the Debian packages; skipped with the
reason otherwise, except under CI=true."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from ccs_testing import REPO
from kernel._edge_helpers import cc_of, edge_binary, free_port, free_subnets

pytestmark = [pytest.mark.cluster, pytest.mark.kernel]


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"the monitoring topology test cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _config(tmp_path, binary: str | None):
    """cluster-local.yaml under tmp_path: this run's fleet (two hosts, a plain and an A/B service
    each), Prometheus and Alertmanager on free ports, everything every second."""
    from ccselect.config import load_config
    doc = yaml.safe_load((REPO / "infra" / "fleet-netns.yaml").read_text())
    tag = os.getpid() % 100000
    for i, (node, octet) in enumerate(zip(doc["nodes"], free_subnets(len(doc["nodes"])))):
        node["node_id"] = f"{node['node_id']}-m{tag}"
        node["netns"] = f"ccsm{tag}-{i}"
        node["address"] = f"10.231.{octet}.2/24"
        node["store_endpoint"] = f"http://10.231.{octet}.1:9"
        if binary:
            node["binary"] = binary
        a = node["agent"]
        a["cgroup"] = f"{a['cgroup']}-m{tag}"
        a["pin_dir"] = f"{a['pin_dir']}-m{tag}"
        a["services"] = [{"port": 443, "name": "video", "ab": False}, {"port": 80, "name": "web", "ab": True}]
        a["sample_rate"] = 1.0 if i == 1 else 0.0      # the drill node logs every connection
        a["state_dir"] = str(tmp_path / f"state-{i}")  # the version floor: not under /var/lib
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc))
    raw = yaml.safe_load((REPO / "infra" / "conf" / "cluster-local.yaml").read_text())
    raw["cluster"].update(home=str(tmp_path / "cluster"), prometheus=f"http://127.0.0.1:{free_port()}",
                          alertmanager=f"http://127.0.0.1:{free_port()}", scrape_interval_s=1,
                          platform_exporter=f"http://127.0.0.1:{free_port()}")
    raw["export"].update(out=str(tmp_path / "export"), keys_dir=str(tmp_path / "keys"))
    raw["pipeline"]["fleet"] = str(tmp_path / "fleet.yaml")
    (tmp_path / "ccs.yaml").write_text(yaml.safe_dump(raw))
    return load_config(tmp_path / "ccs.yaml")


@contextlib.contextmanager
def _full_volume(path: Path):
    """A tmpfs at path with no room left (a ballast file takes it all), unmounted on the way out."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "ccs-test-full", str(path)], check=True)
    try:
        try:
            with open(path / "ballast", "wb") as f:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass        # ENOSPC: the volume is full
        yield path
    finally:
        if subprocess.run(["umount", str(path)]).returncode != 0:
            subprocess.run(["umount", "-l", str(path)])


def _firing(cfg, alertname: str) -> list[str]:
    """The nodes `alertname` fires for, in Prometheus and in Alertmanager (both must agree)."""
    prom = [a["labels"].get("node") for a in _get(f"{cfg.settings.cluster.prometheus}/api/v1/alerts")["data"]["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]
    am = [a["labels"].get("node") for a in _get(f"{cfg.settings.cluster.alertmanager}/api/v2/alerts?" + urllib.parse.urlencode(
        {"filter": f'alertname="{alertname}"'})) if a["status"]["state"] == "active"]
    return sorted(prom) if sorted(prom) == sorted(am) else []


# the stream's metrics writer as `ccs stream --metrics-file` runs it, without the stream's Spark
# work (the drill needs its heartbeat, not its batches): argv path, input folder, export folder
STREAM_WRITER = """
import sys, time
from ccselect.flows.stream_metrics import StreamMetrics
with StreamMetrics(sys.argv[1], sys.argv[2], sys.argv[3], lambda m: print(m, flush=True), every_s=1.0):
    print("writing", flush=True)
    while True:
        time.sleep(60)
"""


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _query(cfg, promql: str) -> dict:
    """{node: value} of an instant query through Prometheus's HTTP API."""
    url = f"{cfg.settings.cluster.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    d = _get(url)
    assert d["status"] == "success", d
    return {r["metric"].get("node"): float(r["value"][1]) for r in d["data"]["result"]}


def _wait(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@pytest.mark.timeout(480)
def test_prometheus_scrapes_the_edge_hosts_and_fault_drills_fire(tmp_path):
    if os.geteuid() != 0:
        _unavailable("needs root (eBPF, cgroups, network namespaces)")
    from ccselect.export.edge.probe import kernel_ready
    if why := kernel_ready():
        _unavailable(why)
    for tool in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter", "nsenter", "ip"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed (make sysdeps)")
    binary = edge_binary()

    from ccselect.topology import edges, env as cluster_env, monitoring
    from ccselect.export.artifact import signing, table_format as tf
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.edge.probe import NetnsRunner, in_cgroup, listener, system_cc

    cfg = _config(tmp_path, binary)
    priv, pub = key_paths(cfg)
    os.makedirs(os.path.dirname(priv), exist_ok=True)
    key = signing.generate_key()
    signing.save_keypair(key, priv, pub)
    live_node, drill_node = edges.nodes(cfg)
    runners, socks, procs = [], [], []
    stack = contextlib.ExitStack()
    try:
        # the drill node's log folder (edges.up: <host dir>/log) on a full volume
        stack.enter_context(_full_volume(Path(edges.host_dir(cfg, drill_node.node_id)) / "log"))
        edges.up(cfg, cluster_env(cfg))
        monitoring.up(cfg, cluster_env(cfg))
        writer = subprocess.Popen(
            [sys.executable, "-c", STREAM_WRITER, str(monitoring.platform_textfile_dir(cfg) / "ccs-stream.prom"),
             str(tmp_path / "segments"), str(tmp_path / "export")], cwd=REPO, stdout=subprocess.PIPE, text=True)
        procs.append(writer)

        default = system_cc()
        other = next(c for c in ("cubic", "reno", "bbr") if c != default)
        now = int(time.time())
        # the node under traffic: a table for an hour; the drill node: one that expires in 8 s
        for node, version, ttl in ((live_node, 11, 3600), (drill_node, 12, 8)):
            m = signing.write_table([tf.Entry("127.60.0.0/16", other)], version, "m-1", now + ttl,
                                    str(tmp_path / "tables" / node.node_id), key, created=now)
            node.config.public_key = pub     # as edges.up gives it to the running agent
            a = node.agent()
            try:
                a.load(m.manifest)
            finally:
                a.close()

        ns = NetnsRunner(live_node.netns)
        runners.append(ns)
        with in_cgroup(live_node.config.cgroup):
            plain = ns.call(listener, socket.AF_INET, "127.0.0.1", 443)
            ab = ns.call(listener, socket.AF_INET, "127.0.0.1", 80)
        socks += [plain, ab]
        assert cc_of(plain, "127.60.0.9", runner=ns) == other, "setup: a hit gets the table's CC"
        assert cc_of(plain, "127.61.0.9", runner=ns) == default, "setup: a miss keeps the default"
        even = next(s for s in (f"127.60.2.{i}" for i in range(1, 60)) if not tf.ab_bucket_odd(s))
        assert cc_of(ab, even, runner=ns) == default, "setup: an A/B control keeps the default"
        # records for the drill node's full log volume
        dns = NetnsRunner(drill_node.netns)
        runners.append(dns)
        with in_cgroup(drill_node.config.cgroup):
            dls = dns.call(listener, socket.AF_INET, "127.0.0.1", 443)
        socks.append(dls)
        for i in range(1, 21):
            cc_of(dls, f"127.62.0.{i}", runner=dns)
        # then the drill node detached (its program off the web server's cgroup: CcsNodeDetached
        # after its minute), once the program has handed over the 20 records
        da = drill_node.agent()
        try:
            _wait("the drill node's 20 records emitted", lambda: da.status()["counters"]["log_emitted"] == 20)
            da.detach()
        finally:
            da.close()

        # both targets up, as Prometheus sees them
        nodes = {live_node.node_id, drill_node.node_id}
        _wait("both edge hosts scraped", lambda: _query(cfg, 'up{job="ccs-edge"}') == {n: 1.0 for n in nodes})
        _wait("the platform's node_exporter scraped (the stream's textfile folder)",
              lambda: _query(cfg, 'up{job="ccs-platform"}') == {None: 1.0})
        # the stream killed: its heartbeat scraped fresh, then the writer killed outright (no
        # shutdown, no last write); CcsStreamDown fires in CcsNodeDetached's wait below
        assert writer.stdout.readline().strip() == "writing", "the stream's metrics writer started"
        _wait("the stream's heartbeat scraped", lambda: _query(
            cfg, 'time() - ccs_stream_heartbeat_timestamp_seconds{job="ccs-platform"} < 10'))
        assert _firing(cfg, "CcsStreamDown") == [], "a live stream is not down"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        # the series of the load, the hit, the miss and the A/B control, read back from Prometheus
        # (the kernel's counters per service: the hit and the miss on video, the control on web)
        want = {
            f'ccs_edge_table_version{{slot="live",node="{live_node.node_id}"}}': 11.0,
            f'ccs_edge_lookup_hits_total{{entry="{other}",service="video",node="{live_node.node_id}"}}': 1.0,
            f'ccs_edge_lookup_misses_total{{service="video",node="{live_node.node_id}"}}': 1.0,
            f'ccs_edge_ab_control_total{{service="web",node="{live_node.node_id}"}}': 1.0,
            f'sum by (node) (ccs_edge_ab_control_total{{node="{live_node.node_id}"}})': 1.0,
            f'ccs_edge_table_enforced{{node="{live_node.node_id}"}}': 1.0,
        }
        for q, v in want.items():
            _wait(q, lambda q=q, v=v: _query(cfg, q) == {live_node.node_id: v} or None, timeout=30)
        assert _query(cfg, 'ccs_edge_table_version{slot="live"}') == {live_node.node_id: 11.0,
                                                                      drill_node.node_id: 12.0}

        # the drill: the short table expires; its node's alert fires, the other node's does not
        prom = cfg.settings.cluster.prometheus
        firing = _wait("CcsTableExpired firing in Prometheus", lambda: [
            a for a in _get(f"{prom}/api/v1/alerts")["data"]["alerts"]
            if a["labels"]["alertname"] == "CcsTableExpired" and a["state"] == "firing"], timeout=60)
        assert [a["labels"]["node"] for a in firing] == [drill_node.node_id], firing
        am = cfg.settings.cluster.alertmanager
        got = _wait("CcsTableExpired in Alertmanager", lambda: [
            a for a in _get(f"{am}/api/v2/alerts?" + urllib.parse.urlencode(
                {"filter": 'alertname="CcsTableExpired"'}))], timeout=30)
        assert [(a["labels"]["node"], a["status"]["state"], a["labels"]["severity"]) for a in got] == \
            [(drill_node.node_id, "active", "page")], got
        assert got[0]["annotations"]["runbook_url"] == "docs/operations-alerts.md#ccstableexpired"
        assert _query(cfg, f'ccs_edge_table_enforced{{node="{drill_node.node_id}"}}') == {drill_node.node_id: 0.0}
        # the full log volume: the log degraded, CcsLogErrors for that node only
        assert _wait("CcsLogErrors firing", lambda: _firing(cfg, "CcsLogErrors"), timeout=60) == [drill_node.node_id]
        assert _query(cfg, "ccs_edge_log_degraded") == {live_node.node_id: 0.0, drill_node.node_id: 1.0}

        # the same two nodes through `ccs fleet status` (their agents, in their namespaces)
        from typer.testing import CliRunner

        from ccselect.app.cli import app
        r = CliRunner().invoke(app, ["fleet", "status", "--fleet", str(tmp_path / "fleet.yaml"),
                                     "--config", str(cfg.path), "--json"])
        rows = {row["node"]: row for row in json.loads(r.output)}
        assert r.exit_code == 3, r.output
        assert (rows[live_node.node_id]["version"], rows[live_node.node_id]["attention"]) == (11, [])
        assert rows[drill_node.node_id]["attention"][:2] == ["not attached (link none)", "live table expired"], rows
        assert "transport log degraded" in rows[drill_node.node_id]["attention"], rows
        # the detached node, after CcsNodeDetached's minute
        assert _wait("CcsNodeDetached firing", lambda: _firing(cfg, "CcsNodeDetached"), timeout=120) == \
            [drill_node.node_id]
        # the killed stream: its last heartbeat more than a minute old (node_exporter still serves
        # the file), the alert in Prometheus and Alertmanager, with no node (the platform's)
        assert _wait("CcsStreamDown firing", lambda: _firing(cfg, "CcsStreamDown"), timeout=60) == [None]
        assert writer.returncode == -signal.SIGKILL
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for s in socks:
            s.close()
        for r in runners:
            r.close()
        for s in reversed(monitoring.servers(cfg)):
            s.stop()
        try:
            edges.down(cfg)
        finally:
            stack.close()
    assert not any(s.running() for s in monitoring.servers(cfg)), "every monitoring server stopped"
