"""The fleet push as a fleet has it: signed tables on the object store (s3proxy, topology/
objectstore.py), two edge hosts in network namespaces of their own (topology/edges.py), each
pulling over its veth from the store's address as it sees it, its agent verifying before anything
reaches its kernel; canary-first rollout, a tampered table refused by the canary, rollback; then
everything down and nothing left.

The fleet is infra/fleet-netns.yaml with this run's names (namespaces, cgroups, pin dirs, subnets
and the store's port made unique), so a `ccs cluster up` running beside it is not touched.
The two tests that start s3proxy are `cluster` tests (make test-cluster); the push needs root
(eBPF, namespaces): skipped with the reason otherwise, except under CI=true, where it must run."""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import subprocess
import time

import pytest
import yaml

from ccs_testing import REPO, processes_naming
from kernel._edge_helpers import cc_of, free_port, free_subnets, host_v4


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"the netns fleet test cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _fleet_file(tmp_path, port: int) -> str:
    """infra/fleet-netns.yaml with this run's names, subnets and store port."""
    doc = yaml.safe_load((REPO / "infra" / "fleet-netns.yaml").read_text())
    tag = os.getpid() % 100000
    for i, (node, octet) in enumerate(zip(doc["nodes"], free_subnets(len(doc["nodes"])))):
        old_host = node["store_endpoint"].split("//")[1].split(":")[0]
        assert node["address"].startswith(old_host.rsplit(".", 1)[0] + "."), node
        node["node_id"] = f"{node['node_id']}-{tag}"
        node["netns"] = f"ccst{tag}-{i}"
        node["address"] = f"10.231.{octet}.2/24"
        node["store_endpoint"] = f"http://10.231.{octet}.1:{port}"
        a = node["agent"]
        a["cgroup"] = f"{a['cgroup']}-{tag}"
        a["pin_dir"] = f"{a['pin_dir']}-{tag}"
    path = tmp_path / "fleet-netns.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _config(tmp_path, port: int):
    """infra/conf/cluster-local.yaml with cluster.home, keys and the fleet under tmp_path."""
    from ccselect.config import load_config
    raw = yaml.safe_load((REPO / "infra" / "conf" / "cluster-local.yaml").read_text())
    raw["cluster"]["home"] = str(tmp_path / "cluster")
    raw["object_store"]["endpoint"] = f"http://127.0.0.1:{port}"
    raw["airflow"]["home"] = str(tmp_path / "airflow")
    raw["export"].update(out=str(tmp_path / "export"), keys_dir=str(tmp_path / "keys"))
    raw["export"]["rollout"]["health_wait_s"] = 0.3
    raw["pipeline"]["fleet"] = _fleet_file(tmp_path, port)
    path = tmp_path / "ccs.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _table(key, out: str, version: int, cc: str):
    """127.0.0.0/8 (clients inside a node) and 10.231.0.0/16 (clients over the veth) say `cc`; 2000
    /24s besides, so the .bin (~80 kB) stands out in the veth's byte counters."""
    from ccselect.export.artifact import signing, table_format as tf
    filler = [tf.Entry(f"11.{i >> 8}.{i & 255}.0/24", "cubic") for i in range(2000)]
    now = int(time.time())
    return signing.write_table([tf.Entry("127.0.0.0/8", cc), tf.Entry("10.231.0.0/16", cc)] + filler,
                               version, "1", now + 3600, out, key, created=now, extra={"coverage": 1.0})


def _tx_bytes(iface: str) -> int:
    """Bytes this machine sent into a node's veth (the store's answers to the node's requests)."""
    with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
        return int(f.read())


def _size(paths) -> int:
    return sum(os.path.getsize(p) for p in (paths.table, paths.manifest, paths.signature))


def _status(node) -> dict:
    a = node.agent()
    try:
        return a.status()
    finally:
        a.close()


class _Node:
    """One edge host's listener on its service port: in its namespace and its cgroup."""

    def __init__(self, node):
        from ccselect.export.edge.probe import NetnsRunner, in_cgroup, listener
        self.node = node
        self.ns = NetnsRunner(node.netns)
        with in_cgroup(node.config.cgroup):
            self.ls = self.ns.call(listener, socket.AF_INET, "0.0.0.0", node.config.services[0].port)
        self.ip = str(ipaddress.ip_interface(node.address).ip)
        self.host_ip = node.store_endpoint.split("//")[1].split(":")[0]

    def cc_inside(self, src="127.70.1.2", dst="127.0.0.1") -> str:
        """A client inside the node (on its lo, from `src`) to the node's service at `dst`."""
        return cc_of(self.ls, src, runner=self.ns, to=(dst, self.ls.getsockname()[1]))

    def cc_over_veth(self) -> str:
        """A client on this machine (the veth's host side) to the node's address."""
        return cc_of(self.ls, self.host_ip, to=(self.ip, self.ls.getsockname()[1]))

    def reaches(self, addr: str, port: int) -> str:
        """'connected', or the error a TCP connect from inside the node ends with."""
        def attempt():
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect((addr, port))
                return "connected"
            except OSError as exc:
                return type(exc).__name__ + (f" errno {exc.errno}" if exc.errno else "")
            finally:
                s.close()
        return self.ns.call(attempt)

    def close(self):
        self.ls.close()
        self.ns.close()


def test_fleet_netns_file_names_hosts(cfg):
    """The shipped file: two hosts, a canary first, each its own namespace, subnet and store address."""
    from ccselect.topology import edges
    from ccselect.export.delivery.rollout import load_fleet
    fleet = load_fleet(str(REPO / "infra" / "fleet-netns.yaml"), cfg)
    assert [(n.node_id, n.canary) for n in fleet.nodes] == [("edge-ns-canary", True), ("edge-ns-01", False)]
    assert [edges.link(n) for n in fleet.nodes] == [
        ("edge-ns-canary", "10.231.1.1/24", "10.231.1.2/24"), ("edge-ns-01", "10.231.2.1/24", "10.231.2.2/24")]
    assert all(n.store_endpoint.endswith(":19000") for n in fleet.nodes), "s3proxy's port in cluster-local"
    assert len({n.config.cgroup for n in fleet.nodes} | {n.config.pin_dir for n in fleet.nodes}) == 4


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_s3_store_keeps_the_layout_and_state(tmp_path, monkeypatch):
    """The s3:// store on s3proxy: the directory store's layout and semantics, state.json one
    object replaced by each PUT (no temporary key), the credentials from the environment only."""
    import shutil
    if shutil.which("java") is None:
        _unavailable("java is not installed (s3proxy)")
    from ccselect.topology import env as cluster_env, objectstore
    from ccselect.export.artifact import signing
    from ccselect.export.delivery.store import Store, StoreError, store_for
    port = free_port()
    cfg = _config(tmp_path, port)
    key = signing.generate_key()
    signing.save_keypair(key, str(tmp_path / "k.pem"), str(tmp_path / "p.pem"))
    try:
        objectstore.up(cfg, cluster_env(cfg))
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(Exception, match="credentials|AccessDenied|InvalidAccessKeyId|Forbidden|403"):
            store_for(cfg).current()
        for k, v in objectstore.client_env(cfg).items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_ENDPOINT_URL")        # the endpoint comes from the configuration
        store = store_for(cfg)
        assert store.current() is None and store.previous() is None
        with pytest.raises(StoreError, match="not in the store"):
            store.set_current(1)
        for v in (1, 2):
            assert store.publish(_table(key, str(tmp_path / "out"), v, "bbr").manifest) == v
            store.set_current(v)
        assert store.current() == 2 and store.previous() == 1 and store.state()["history"] == [1, 2]
        keys = sorted(o["Key"] for o in objectstore.client(cfg).list_objects_v2(
            Bucket="ccselect-artifacts")["Contents"])
        layout = [f"cc-tables/tables/{n}" for v in (1, 2) for n in Store.names(v)]
        assert keys == ["cc-tables/state.json"] + layout, f"one state object, no temporary key: {keys}"
        m = store.fetch(2, str(tmp_path / "node"))
        man, table = signing.read_manifest(m, signing.load_public_key(str(tmp_path / "p.pem")))
        assert man["version"] == 2 and table.entries[0].cc == "bbr"
        assert sorted(os.listdir(tmp_path / "node")) == sorted(Store.names(2)), "no .part left"
        assert store.manifest(1)["version"] == 1
        with pytest.raises(StoreError, match="not in the store"):
            store.fetch(9, str(tmp_path / "node"))
    finally:
        objectstore.servers(cfg)[0].stop()


@pytest.mark.cluster
@pytest.mark.kernel
@pytest.mark.timeout(600)
def test_fleet_push_over_netns(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        _unavailable("needs root (eBPF, cgroups, network namespaces)")
    from ccselect.export.edge.probe import kernel_ready
    if why := kernel_ready():
        _unavailable(why)
    import shutil
    for tool in ("java", "nsenter", "ip"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed")
    r = subprocess.run(["make", "-C", str(REPO), "-f", "export/edge/build.mk", "edge"], capture_output=True, text=True)
    assert r.returncode == 0, f"make edge failed:\n{r.stdout}\n{r.stderr}"

    from typer.testing import CliRunner

    from ccselect.app.cli import app
    from ccselect.topology import edges, env as cluster_env, objectstore
    from ccselect.export.artifact import signing
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.delivery.rollout import Health, deploy, load_fleet, pull
    from ccselect.export.delivery.store import StoreError, store_for
    from ccselect.export.edge.probe import system_cc

    port = free_port()
    cfg = _config(tmp_path, port)
    hosts = edges.nodes(cfg)
    assert [n.canary for n in hosts] == [True, False]
    assert not {n.netns for n in hosts} & edges.namespaces(), "this run's namespaces exist already"
    key = signing.generate_key()
    priv, pub = key_paths(cfg)
    os.makedirs(os.path.dirname(priv))
    signing.save_keypair(key, priv, pub)
    times, listeners = {}, []
    agent_pids, store_pid = [], None
    default = system_cc()
    a, b = [c for c in ("cubic", "reno", "bbr") if c != default][:2]
    health = Health(wait_s=0.3, min_rate_ratio=0.5)
    try:
        t = time.monotonic()
        objectstore.up(cfg, cluster_env(cfg))
        times["objectstore_up_s"] = time.monotonic() - t
        store_pid = objectstore.servers(cfg)[0].pid()
        for k, v in objectstore.client_env(cfg).items():   # the credentials: the SDK's variables only
            monkeypatch.setenv(k, v)
        t = time.monotonic()
        edges.up(cfg, cluster_env(cfg))
        times["edges_up_s"] = time.monotonic() - t
        agent_pids = [s.pid() for s in edges.servers(cfg)]
        assert all(agent_pids), f"every edge host runs its agent: {edges.servers(cfg)}"
        edges.up(cfg, cluster_env(cfg))
        assert [s.pid() for s in edges.servers(cfg)] == agent_pids, "a second up leaves the hosts as they are"
        fleet = load_fleet(cfg.settings.pipeline.fleet, cfg, public_key=pub)
        store = store_for(cfg)
        assert store.url == "s3://ccselect-artifacts/cc-tables" and store.endpoint == f"http://127.0.0.1:{port}"
        listeners = [_Node(n) for n in fleet.nodes]
        canary, other = listeners

        # -- each host's only way out is its veth to the store's address ------------------------
        for h in listeners:
            routes = subprocess.run(["ip", "-n", h.node.netns, "-4", "route"], capture_output=True,
                                    text=True, check=True).stdout.strip().splitlines()
            assert len(routes) == 1 and routes[0].startswith(str(ipaddress.ip_interface(h.node.address).network)) \
                and "dev eth0" in routes[0], f"{h.node.node_id}: routes {routes}"
            assert h.reaches(h.host_ip, port) == "connected", f"{h.node.node_id} reaches the store at {h.host_ip}"
            assert h.reaches("127.0.0.1", port).startswith("ConnectionRefused"), \
                f"{h.node.node_id}: 127.0.0.1:{port} inside the node is the node's own, not the host's store"
            for addr in sorted(host_v4() - {"127.0.0.1", h.host_ip}):
                assert h.reaches(addr, port) != "connected", f"{h.node.node_id} reaches {addr}:{port}"
        # the same puller, told the host's 127.0.0.1, finds no store from inside a node
        local = dataclasses.replace(fleet.nodes[0], store_endpoint=f"http://127.0.0.1:{port}")

        # -- versions 1 and 2: canary first, each node pulling over its own veth ------------------
        for version, cc in ((1, a), (2, b)):
            paths = _table(key, str(tmp_path / "export"), version, cc)
            store.publish(paths.manifest)
            if version == 1:
                with pytest.raises(StoreError, match="pull in .* failed") as refused:
                    pull(local, store, 1, timeout=60)
                print("pull from the host's 127.0.0.1 inside a node:", refused.value)
            before = [_tx_bytes(h.node.netns) for h in listeners]
            t = time.monotonic()
            res = deploy(fleet, store, version, health, log=print)
            times[f"deploy_v{version}_s"] = time.monotonic() - t
            assert res["ok"], res
            assert list(res["nodes"]) == [n.node_id for n in fleet.nodes], "canary first"
            assert store.current() == version
            for h, b0 in zip(listeners, before):
                nid = h.node.node_id
                rep = res["nodes"][nid]
                assert rep["pull"]["endpoint"] == h.node.store_endpoint, rep
                times[f"pull_v{version}_{'canary' if h.node.canary else 'rest'}_s"] = rep["pull"]["s"]
                sent = _tx_bytes(h.node.netns) - b0
                assert sent >= _size(paths), f"{nid}: {sent} bytes went down its veth, < the table's {_size(paths)}"
                assert os.path.exists(os.path.join(h.node.table_dir, f"table-{version}.bin")), nid
                st = _status(h.node)
                assert st["table"]["version"] == version and st["table"]["enforced"], f"{nid}: {st['table']}"
                assert h.cc_inside() == cc, f"{nid}: a client inside the node gets version {version}'s {cc}"
                assert h.cc_over_veth() == cc, f"{nid}: a client over the veth gets version {version}'s {cc}"

        # -- a table altered in the store: the canary refuses it, nothing else moves ----------------
        paths3 = _table(key, str(tmp_path / "export"), 3, a)
        store.publish(paths3.manifest)
        s3 = objectstore.client(cfg)
        obj = "cc-tables/tables/table-3.bin"
        blob = bytearray(s3.get_object(Bucket="ccselect-artifacts", Key=obj)["Body"].read())
        blob[-1] ^= 0x01
        s3.put_object(Bucket="ccselect-artifacts", Key=obj, Body=bytes(blob))
        st_before = [_status(h.node) for h in listeners]
        other_tx = _tx_bytes(other.node.netns)
        res = deploy(fleet, store, 3, health, log=print)
        assert not res["ok"], res
        print("tampered table 3:", res["stopped"])
        assert "load refused" in res["stopped"] and "sha256" in res["stopped"] \
            and fleet.nodes[0].node_id in res["stopped"], res["stopped"]
        assert other.node.node_id not in res["nodes"], "the rest must not be touched after a refused canary"
        assert _tx_bytes(other.node.netns) - other_tx < os.path.getsize(paths3.table), "the rest pulled nothing"
        assert not os.path.exists(os.path.join(other.node.table_dir, "table-3.bin"))
        assert store.current() == 2
        for h, s0 in zip(listeners, st_before):
            st = _status(h.node)
            nid = h.node.node_id
            assert st["table"]["version"] == 2 and st["table"]["enforced"], f"{nid}: {st['table']}"
            assert (st["table"]["sha256"], st["previous"]["version"], st["slot_state"], st["version_floor"]) == \
                (s0["table"]["sha256"], 1, s0["slot_state"], 2), f"{nid}: nothing of table 3 reached its kernel"
            assert h.cc_inside() == b, f"{nid}: the live table 2 still decides"

        # -- `ccs rollback`: the store's previous version (1) back on the fleet, canary first ------
        t = time.monotonic()
        r = CliRunner().invoke(app, ["rollback", "--fleet", cfg.settings.pipeline.fleet, "--config", str(cfg.path)])
        times["rollback_s"] = time.monotonic() - t
        assert r.exit_code == 0, r.output + str(r.exception)
        assert store.current() == 1
        for h in listeners:
            st = _status(h.node)
            assert st["table"]["version"] == 1 and st["overrides"]["count"] == 1, f"{h.node.node_id}: {st}"
            assert h.cc_inside() == a and h.cc_over_veth() == a, f"{h.node.node_id} back on version 1's {a}"
    finally:
        for h in listeners:
            h.close()
        t = time.monotonic()
        try:
            edges.down(cfg)
        finally:
            objectstore.servers(cfg)[0].stop()
        times["down_s"] = time.monotonic() - t
        print("times:", {k: round(v, 2) for k, v in times.items()})

    # -- nothing left ----------------------------------------------------------------------------
    assert not {n.netns for n in hosts} & edges.namespaces(), "namespaces left"
    assert not {n.netns for n in hosts} & edges.links(), "veths left"
    for n in hosts:
        assert not os.path.exists(n.config.cgroup), f"cgroup {n.config.cgroup} left"
        assert not os.path.exists(n.config.pin_dir), f"pins {n.config.pin_dir} left"
    from ccselect.topology.proc import alive
    assert not [p for p in agent_pids + [store_pid] if p and alive(p)], "agent or store processes left"
    assert not processes_naming([str(tmp_path)]), "processes of this test left"
