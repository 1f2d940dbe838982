"""Kernel tests: build the agent once, then give each test its own cgroup, pin dir and agent.

Without root, BPF, bpffs or cgroup v2 the tests skip with the reason -- except under CI=true,
where that is a failure (CI runs them as root for real)."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from _edge_helpers import CGROUP_ROOT  # noqa: E402

from ccselect.export.artifact import signing
from ccselect.export.edge.agent import EdgeAgent, EdgeConfig

BINARY = os.path.join(REPO, "export", "build", "ccs-edge")
_seq = itertools.count()


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"kernel tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _check_environment():
    if os.geteuid() != 0:
        _unavailable("kernel tests need root (BPF, cgroups, network namespaces)")
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        _unavailable("no kernel BTF at /sys/kernel/btf/vmlinux")
    if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.procs")):
        _unavailable(f"no cgroup v2 hierarchy at {CGROUP_ROOT}")
    for tool in ("clang", "bpftool", "ip"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} not installed (make sysdeps)")
    if not os.path.ismount("/sys/fs/bpf"):
        r = subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], capture_output=True)
        if r.returncode != 0:
            _unavailable("cannot mount bpffs on /sys/fs/bpf")


@pytest.fixture(scope="session")
def edge_binary():
    _check_environment()
    other = os.environ.get("CCS_EDGE_BINARY")
    if other:  # another build of the agent (e.g. an older one, to show what a test catches)
        return other
    r = subprocess.run(["make", "-C", REPO, "-f", "export/edge/build.mk", "edge"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make edge failed:\n{r.stdout}\n{r.stderr}", pytrace=False)
    return BINARY


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    key = signing.generate_key()
    signing.save_keypair(key, str(d / "priv.pem"), str(d / "pub.pem"))
    other = signing.generate_key()
    return {"private": key, "public_path": str(d / "pub.pem"), "other": other}


class Edge:
    """One test's enforcer: a throwaway cgroup, a private pin dir, an agent, a table dir."""

    def __init__(self, binary, keys, tmp_path):
        n = next(_seq)
        self.name = f"ccs-test-{os.getpid()}-{n}"
        self.cgroup = os.path.join(CGROUP_ROOT, self.name)
        self.pin_dir = f"/sys/fs/bpf/{self.name}"
        self.keys = keys
        self.tables = str(tmp_path / "tables")
        self.logs = str(tmp_path / "logs")
        os.makedirs(self.cgroup)
        # the version floor (floor.c), the test's own; CCS_EDGE_NO_STATE_DIR=1 leaves it out of
        # the config, for an agent older than it (with CCS_EDGE_BINARY)
        self.state_dir = str(tmp_path / "state")
        # route CCs off: the agent runs in the root network namespace here, whose routes and rules
        # no test writes; the route tests turn them on in a namespace of their own (ns_edge).
        # With CCS_EDGE_BINARY (an agent from before route_ccs) the key is left out: off there
        self.config = EdgeConfig(node_id="test-node", cgroup=self.cgroup, pin_dir=self.pin_dir,
                                 public_key=keys["public_path"], sample_rate=0.0,
                                 route_ccs="auto" if os.environ.get("CCS_EDGE_BINARY") else "off",
                                 state_dir="" if os.environ.get("CCS_EDGE_NO_STATE_DIR") else self.state_dir)
        self.agent = EdgeAgent(config=self.config, binary=binary)
        self.sockets = []
        self.procs = []

    def configure(self, services, sample_rate=0.0, attach=True):
        self.config.services = list(services)
        self.config.sample_rate = sample_rate
        self.agent.write_config(self.config)
        if attach:
            self.agent.attach(self.cgroup)

    def table(self, entries, version, expires_in=3600, created=None, key=None, model_version=None,
              tree=None, tree_model="", epoch=0, out=None):
        now = int(time.time())
        return signing.write_table(entries, version, model_version or f"test-model-{version}",
                                   (created or now) + expires_in, out or self.tables,
                                   key or self.keys["private"], created=created or now,
                                   tree=tree, tree_model=tree_model, epoch=epoch)

    def resign(self, manifest, text):
        """Replace a manifest's bytes and sign them with the test key: the signature holds, so
        what the agent refuses is the JSON itself."""
        data = text.encode()
        with open(manifest, "wb") as f:
            f.write(data)
        with open(manifest + signing.SIG_SUFFIX, "wb") as f:
            f.write(signing.sign(data, self.keys["private"]))

    def track(self, *socks):
        self.sockets.extend(socks)
        return socks[0] if len(socks) == 1 else socks

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass
        try:
            self.agent.detach(purge=True)
        except Exception as exc:  # keep cleaning up
            print(f"detach failed: {exc}")
        subprocess.run(["rm", "-rf", self.pin_dir])
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        self.agent.close()


@pytest.fixture
def edge(edge_binary, keys, tmp_path):
    e = Edge(edge_binary, keys, tmp_path)
    try:
        yield e
    finally:
        e.cleanup()


@pytest.fixture
def netns():
    """A network namespace with lo up; yields (name, runner-thread inside it)."""
    from ccselect.export.edge.probe import netns as make_netns
    with make_netns("ccs-test") as ns:
        yield ns
