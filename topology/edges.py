"""The edge hosts of the one-machine topology: every node of the fleet file (`pipeline.fleet`, e.g.
infra/fleet-netns.yaml) that names a `netns` becomes a host of its own.

A host is a network namespace linked to this machine by a veth pair, the way a remote edge is
linked to the network the object store is on:
  this machine  <netns> (the veth's host side, named as the namespace) at the address of the
                node's `store_endpoint` (10.231.<i>.1/24)
  the node      eth0 at its `address` (10.231.<i>.2/24), lo up, no other route: from there the
                store's address is the only one of this machine it can reach (IPv6 off on both
                ends, so no link-local way around it either)
and its agent: the node's cgroup, its program attached (`ccs-edge attach`, pins under its pin dir)
and the long-running `ccs-edge run` (transport log, TTL watchdog, its metrics file under `metrics/`
for the node's node_exporter: topology/monitoring.py) in the namespace, with its
config, log and pid file under `<cluster.home>/edges/<node_id>/`, beside the tables the node
pulls (export/delivery/rollout.py `pull`). The rollout then reaches each node only through the
agent's commands in its namespace and the store.

What the node reaches is whatever of this machine listens on the host side's address: s3proxy,
which listens on every address; the topology's other servers listen on 127.0.0.1 only.

`servers(cfg)` are the agents; `up` makes what is missing (idempotent); `down` stops the agents,
detaches and unpins the programs, removes the cgroups, the veths and the namespaces, and says what
it could not remove.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from ccselect.config import Config
from ccselect.export.delivery.rollout import NetnsAgent, Node, host_dir, load_fleet, netns_argv
from ccselect.export.edge.agent import DEFAULT_BINARY
from ccselect.export.edge.probe import kernel_ready, remove_cgroup

from ccselect.topology.proc import ClusterError, Server
# Imported inside the functions that use them (heavy, not needed to import this module):
# export.delivery.publish (its guards load pyspark), for the signing key's path.

#: the node's side of its veth, inside its namespace
NODE_IF = "eth0"


def nodes(cfg: Config) -> list[Node]:
    """The fleet's nodes that stand for hosts of their own (those with `netns`)."""
    return [n for n in load_fleet(cfg.settings.pipeline.fleet, cfg).nodes if n.netns]


def link(node: Node) -> tuple[str, str, str]:
    """(host-side interface, host-side address/len, node-side address/len) of a node's veth: the
    host side is the address the node reaches the store at, in the node's subnet."""
    if len(node.netns) > 15:
        raise ClusterError(f"{node.node_id}: netns {node.netns!r} is longer than 15 characters "
                           "(it also names the veth's host side)")
    if not node.address or not node.store_endpoint:
        raise ClusterError(f"{node.node_id}: a node with netns needs `address` and `store_endpoint`")
    iface = ipaddress.ip_interface(node.address)
    host = urlparse(node.store_endpoint).hostname or ""
    try:
        host_ip = ipaddress.ip_address(host)
    except ValueError:
        raise ClusterError(f"{node.node_id}: store_endpoint {node.store_endpoint!r} must name an address "
                           f"in {iface.network} (the host side of the node's veth)") from None
    if host_ip not in iface.network or host_ip == iface.ip:
        raise ClusterError(f"{node.node_id}: store_endpoint's {host_ip} is not another address of "
                           f"{iface.network} (the node's `address` {node.address})")
    return node.netns, f"{host_ip}/{iface.network.prefixlen}", str(iface)


def textfile_dir(cfg: Config, node: Node) -> Path:
    """The folder a node's agent rewrites its metrics in (`metrics_file`, export/edge/metrics.c),
    which the node's node_exporter reads (topology/monitoring.py)."""
    return Path(host_dir(cfg, node.node_id)) / "metrics"


def servers(cfg: Config) -> list[Server]:
    return [Server(n.node_id, Path(host_dir(cfg, n.node_id))) for n in nodes(cfg)]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def links() -> set[str]:
    """The names of this (the host's) network namespace's interfaces."""
    return set(os.listdir("/sys/class/net"))


def _host_up(node: Node) -> None:
    ns, (host_if, host_addr, node_addr) = node.netns, link(node)
    if ns not in namespaces():
        _ip("netns", "add", ns)
    _ip("-n", ns, "link", "set", "lo", "up")
    if host_if not in links():
        _ip("link", "add", host_if, "type", "veth", "peer", "name", NODE_IF, "netns", ns)
    for where, dev in (([], host_if), (["-n", ns], NODE_IF)):
        r = subprocess.run(["ip", *where, "link", "show", dev], capture_output=True)
        if r.returncode != 0:
            raise ClusterError(f"{node.node_id}: {dev} is missing {'in ' + ns if where else 'here'} "
                               "(a half-made link: `ccs cluster down`, then up)")
    # IPv6 off on both ends: no link-local path besides the one address the node is given
    with open(f"/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6", "w") as f:
        f.write("1")
    subprocess.run(netns_argv(ns) + ["sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{NODE_IF}/disable_ipv6"],
                   check=True)
    _ip("addr", "replace", host_addr, "dev", host_if)
    _ip("link", "set", host_if, "up")
    _ip("-n", ns, "addr", "replace", node_addr, "dev", NODE_IF)
    _ip("-n", ns, "link", "set", NODE_IF, "up")


def _agent(node: Node) -> NetnsAgent:
    return NetnsAgent(node.netns, config=node.config, binary=node.binary or DEFAULT_BINARY)


def up(cfg: Config, env: dict[str, str]) -> None:
    """Each namespaced node: its namespace and veth, its cgroup, its program attached, its agent
    running (`ccs-edge run` in the namespace). What already stands is left as it is."""
    from ccselect.export.delivery.publish import key_paths
    todo = nodes(cfg)
    if not todo:
        return
    if why := kernel_ready():
        raise ClusterError(f"edge hosts need the kernel enforcer: {why}")
    _, pub = key_paths(cfg)
    for node, srv in zip(todo, servers(cfg)):
        binary = node.binary or DEFAULT_BINARY
        if not os.path.exists(binary):
            raise ClusterError(f"{binary} is missing: `make edge` builds the agent")
        _host_up(node)
        if node.config.cgroup:
            os.makedirs(node.config.cgroup, exist_ok=True)
        node.config.public_key = node.config.public_key or pub
        if not node.config.metrics_file:
            textfile_dir(cfg, node).mkdir(parents=True, exist_ok=True)
            node.config.metrics_file = str(textfile_dir(cfg, node) / "ccs.prom")
        agent = _agent(node)
        try:
            if not agent.status().get("attached"):
                agent.attach(node.config.cgroup or None)
        finally:
            agent.close()
        srv.home.mkdir(parents=True, exist_ok=True)
        conf = srv.home / "edge.yaml"          # the host's /etc/ccs/edge.yaml
        conf.write_text(node.config.to_yaml())
        out = srv.home / "log"
        srv.start(netns_argv(node.netns) + [binary, "--config", str(conf), "run", "--out", str(out)],
                  env=env, timeout=30,
                  ready=lambda out=out, nid=node.config.node_id: (out / "transport" / nid).is_dir())


def down(cfg: Config) -> None:
    """Undo `up` for every namespaced node, last first; raise naming whatever is left."""
    left = []
    for node, srv in reversed(list(zip(nodes(cfg), servers(cfg)))):
        srv.stop()
        pin = node.config.pin_dir
        if pin and os.path.isdir(pin):
            agent = _agent(node) if node.netns in namespaces() else None
            try:
                if agent is not None:
                    agent.detach(purge=True)
            except Exception as exc:  # noqa: BLE001 — unpin by hand below, say if that fails too
                left.append(f"{node.node_id}: detach: {exc}")
            finally:
                if agent is not None:
                    agent.close()
            shutil.rmtree(pin, ignore_errors=True)
        cg = node.config.cgroup
        remove_cgroup(cg)
        # the veth pair first: it goes at once, where a deleted namespace's devices go only when
        # the kernel gets to freeing the namespace
        host_if = node.netns
        if host_if in links():
            _ip("link", "del", host_if, check=False)
        if node.netns in namespaces():
            _ip("netns", "del", node.netns, check=False)
        for what, gone in ((f"pin dir {pin}", not (pin and os.path.exists(pin))),
                           (f"cgroup {cg}", not (cg and os.path.exists(cg))),
                           (f"netns {node.netns}", node.netns not in namespaces()),
                           (f"veth {host_if}", host_if not in links()),
                           (f"agent pid {srv.pid()}", srv.pid() is None)):
            if not gone:
                left.append(f"{node.node_id}: {what} is still there")
    if left:
        raise ClusterError("edge hosts not fully removed: " + "; ".join(left))
