"""A fleet on this machine, for `make run` and the kernel tests: the cgroups and bpffs the agents
need, attaching every node's agent, and a probe that opens real TCP connections from client
addresses a table decides for and reads back which CC the kernel gave each accepted socket.

The probe's traffic stays inside a network namespace it creates (lo only): the client addresses
are put on that namespace's lo, and each node's listener is created inside the namespace and inside
the node's cgroup, so the node's sock_ops program sees the accepted connections. Needs root.
"""
from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import itertools
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import EdgeAgentError

CGROUP_ROOT = "/sys/fs/cgroup/unified"
BPFFS = "/sys/fs/bpf"
CLONE_NEWNET = 0x40000000

_cg_lock = threading.Lock()
_ns_seq = itertools.count()


# ---- cgroups, namespaces, sockets ---------------------------------------------------------------

def own_cgroup() -> str:
    for line in open("/proc/self/cgroup"):
        if line.startswith("0::"):
            return line[3:].strip()
    return "/"


@contextlib.contextmanager
def in_cgroup(path: str):
    """Move this process into `path` for the block; sockets created inside belong to it."""
    with _cg_lock:
        back = os.path.join(CGROUP_ROOT, own_cgroup().lstrip("/"))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            yield
        finally:
            with open(os.path.join(back, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))


class NetnsRunner:
    """A single worker thread that has joined a network namespace: sockets created through
    `call` live in that namespace (the netns of a socket is its creating thread's)."""

    def __init__(self, name: str):
        libc = ctypes.CDLL(None, use_errno=True)

        def join():
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)

        self.pool = ThreadPoolExecutor(max_workers=1, initializer=join)

    def call(self, fn, *a, **kw):
        return self.pool.submit(fn, *a, **kw).result()

    def close(self):
        self.pool.shutdown(wait=True)


@contextlib.contextmanager
def netns(prefix: str = "ccs"):
    """A throwaway network namespace with lo up; yields (name, runner-thread inside it)."""
    name = f"{prefix}-{os.getpid()}-{next(_ns_seq)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    runner = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        runner = NetnsRunner(name)
        yield name, runner
    finally:
        if runner:
            runner.close()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def listener(family=socket.AF_INET, addr="127.0.0.1", port=0, backlog=512) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(backlog)
    return s


def client(src: str, family=socket.AF_INET) -> socket.socket:
    c = socket.socket(family, socket.SOCK_STREAM)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.bind((src, 0))
    return c


def sock_cc(s: socket.socket) -> str:
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


def system_cc() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


# ---- the fleet ----------------------------------------------------------------------------------

def kernel_ready() -> str | None:
    """None when this machine can run the enforcer, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "no kernel BTF at /sys/kernel/btf/vmlinux"
    if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.procs")):
        return f"no cgroup v2 hierarchy at {CGROUP_ROOT}"
    if not os.path.ismount(BPFFS):
        r = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True)
        if r.returncode != 0:
            return f"cannot mount bpffs on {BPFFS}"
    return None


def ensure_attached(fleet, log=print) -> dict:
    """Every node's cgroup exists and its agent's sock_ops program is attached (pinned); nodes
    already attached are left as they are (their live table stays). → {node_id: "attached"|"was"}."""
    out = {}
    for node in fleet.nodes:
        cg = node.config.cgroup
        if cg and not os.path.isdir(cg):
            os.makedirs(cg)
        agent = node.agent()
        try:
            if agent.status().get("attached"):
                out[node.node_id] = "was attached"
                continue
            agent.attach(cg or None)
            out[node.node_id] = "attached"
            log(f"{node.node_id}: enforcer attached to {cg}")
        finally:
            agent.close()
    return out


def probe_addresses(table, per_cc: int = 2, default_cc: str | None = None) -> list[tuple[str, str, str]]:
    """Client addresses to open connections from: for each family and each CC in the table, up to
    `per_cc` entries, one address inside each, with the CC the table gives it (longest-prefix
    match, so an address under a more specific entry gets that entry's CC). → [(ip, prefix, cc)]."""
    picks, seen = [], {}
    for e in sorted(table.entries, key=lambda e: (-e.requests, str(e.prefix))):
        if e.cc == "keep" or e.low_confidence:
            continue
        key = (e.family, e.cc)
        if seen.get(key, 0) >= per_cc:
            continue
        net = e.prefix
        ip = net.network_address + (1 if net.num_addresses > 2 else 0)
        hit = tf.lookup(table, str(ip))
        if hit is None or hit.cc == "keep" or hit.low_confidence:
            continue
        if ipaddress.ip_address(ip).is_loopback:
            continue
        seen[key] = seen.get(key, 0) + 1
        picks.append((str(ip), str(hit.prefix), hit.cc))
    return picks


def probe(fleet, table, per_cc: int = 2, log=print) -> dict:
    """Connections from simulated client addresses (both families) to every node, on the node's
    first service port, inside a namespace of our own. → per node: connections, how many got the
    table's CC, and the agent's counters after. Every node sees every address."""
    picks = probe_addresses(table, per_cc)
    result = {"addresses": len(picks), "nodes": {}}
    if not picks:
        return result
    with netns("ccs-probe") as (name, ns):
        for ip, _, _ in picks:
            plen = 128 if ":" in ip else 32
            subprocess.run(["ip", "-n", name, "addr", "add", f"{ip}/{plen}", "dev", "lo"]
                           + (["nodad"] if plen == 128 else []), check=True)
        for node in fleet.nodes:
            port = node.config.services[0].port if node.config.services else 443
            with in_cgroup(node.config.cgroup):
                ls = ns.call(listener, socket.AF_INET6, "::", port)
            got = {"connections": 0, "as_table": 0, "mismatches": []}
            try:
                for ip, prefix, cc in picks:
                    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
                    c = ns.call(client, ip, fam)
                    try:
                        ns.call(c.connect, ("::1" if fam == socket.AF_INET6 else "127.0.0.1", port))
                        acc, _ = ls.accept()
                        cc_got = sock_cc(acc)
                        acc.close()
                    finally:
                        c.close()
                    got["connections"] += 1
                    if cc_got == cc:
                        got["as_table"] += 1
                    else:
                        got["mismatches"].append(f"{ip} in {prefix}: kernel gave {cc_got}, table says {cc}")
            finally:
                ls.close()
            agent = node.agent()
            try:
                got["counters"] = agent.status().get("counters", {})
            finally:
                agent.close()
            log(f"{node.node_id}: {got['as_table']}/{got['connections']} probe connections got the table's CC")
            result["nodes"][node.node_id] = got
    return result


def remove_cgroup(cg: str | None, tries: int = 50) -> None:
    """rmdir a node's cgroup, retrying while its last sockets and processes leave it."""
    for _ in range(tries):
        try:
            if cg and os.path.isdir(cg):
                os.rmdir(cg)
            return
        except OSError:
            time.sleep(0.1)


def undeploy(fleet, log=print) -> dict:
    """Take a fleet's enforcement off this machine (`ccs undeploy`, which `make clean` runs): the
    rest first and the canaries last (deploy's order reversed), each node's agent detached with
    its pins purged (`ccs-edge detach --purge`: the program off its cgroup, its route CCs
    flushed, every pinned map unpinned; nothing to do where nothing is attached), then its
    cgroup removed once no process is left in it. Nodes in a network namespace of their own are
    `ccs cluster down`'s. → {node_id: {"was": [...], "left": [...]}}: what was there, and what is
    still there (a cgroup a process still uses, a detach the agent refused)."""
    out = {}
    for node in fleet.rest + fleet.canaries:
        if node.netns:
            out[node.node_id] = {"was": [], "left": [], "skipped": f"in netns {node.netns}: ccs cluster down"}
            continue
        paths = (("pin dir", node.config.pin_dir), ("cgroup", node.config.cgroup))
        was = [what for what, path in paths if path and os.path.isdir(path)]
        left = []
        agent = node.agent()
        try:
            agent.detach(purge=True)
        except (EdgeAgentError, OSError, subprocess.SubprocessError) as exc:
            left.append(f"detach: {exc}")
        finally:
            agent.close()
        remove_cgroup(node.config.cgroup)
        left += [f"{what} {path}" for what, path in paths if path and os.path.isdir(path)]
        out[node.node_id] = {"was": was, "left": left}
        if was or left:
            log(f"{node.node_id}: " + (f"still there: {'; '.join(left)}" if left else f"removed {' and '.join(was)}"))
    return out


def teardown(fleet, log=print) -> None:
    """`undeploy` for throwaway fleets: a pin dir a refused detach left is removed by hand too
    (the link's pin gone, the program comes off its cgroup); what still stays is only said."""
    undeploy(fleet, log)
    for node in fleet.nodes:
        if not node.netns and node.config.pin_dir and os.path.isdir(node.config.pin_dir):
            shutil.rmtree(node.config.pin_dir, ignore_errors=True)
