"""Versions an operator can live with (issue 56, item 3): the agent orders tables by a signed
(epoch, version), keeps that floor on disk (state_dir, export/edge/floor.c) and lets no table
use up the space; the fleet rollout follows the same rule (tests/kernel/test_rollout.py has the
fleet's part). docs/edge-versions.md describes the rule.

Each test is one failure of issue 56's item 3, seen on the agent before the epoch (run with
CCS_EDGE_BINARY=<an older build> to see it): a new lake's versions need a blanket override, a
signed version of 2^64-1 locks every later table out, and `detach --purge` (or a reboot, which
empties the bpffs the same way) reopens the replay of an older table."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

import pytest
from _edge_helpers import cc_of, in_cgroup, listener, other_ccs, sysctl_cc

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.edge.agent import EdgeAgentError, Service

pytestmark = pytest.mark.kernel


def _agent(edge, *args):
    r = subprocess.run(edge.agent._argv(*args), capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def _served(edge):
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    return ls


def _raw_table(edge, entries, version, out, epoch=None):
    """A table signed with the test key whose manifest the signing module would not write (a
    version past 2^53 - 1): the .bin and the manifest made by hand, as a careless or hostile
    signer could."""
    now = int(time.time())
    blob = tf.encode(tf.Table(version, now, now + 3600, tuple(entries), None))
    os.makedirs(out, exist_ok=True)
    name = f"table-{version}.bin"
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)
    t = tf.decode(blob)
    man = {"format": tf.FORMAT, **({"epoch": epoch} if epoch is not None else {}), "version": version,
           "model_version": "m", "created": now, "expires": now + 3600,
           "entries": {"v4": t.n_v4, "v6": t.n_v6}, "table": name,
           "sha256": hashlib.sha256(blob).hexdigest(), "tree": {"model": "", "nodes": 0}}
    path = os.path.join(out, f"table-{version}.manifest.json")
    edge.resign(path, json.dumps(man, indent=2) + "\n")
    return path


def test_a_new_epoch_restarts_the_versions_without_an_override(edge, tmp_path):
    """A new lake numbers from 1: signed in the next epoch, its tables load in order with no
    override, and the old epoch's tables are refused from then on."""
    a, b = other_ccs(sysctl_cc())
    ls = _served(edge)
    old = str(tmp_path / "old-lake")
    edge.agent.load(edge.table([tf.Entry("127.80.0.0/16", a)], 7, out=old).manifest)
    new = str(tmp_path / "new-lake")
    # the new lake's first table in the old epoch: still a replay
    v1_old_epoch = edge.table([tf.Entry("127.80.0.0/16", b)], 1, out=str(tmp_path / "no-epoch"))
    with pytest.raises(EdgeAgentError, match="versions only go forward"):
        edge.agent.load(v1_old_epoch.manifest)
    # opened by the operator: epoch 1, versions from 1, no override
    for version, cc in ((1, b), (2, a)):
        out = edge.agent.load(edge.table([tf.Entry("127.80.0.0/16", cc)], version, out=new,
                                         epoch=1).manifest)
        assert out["override"] is False and out["epoch"] == 1 and out["version"] == version, out
        assert cc_of(ls, "127.80.0.1") == cc, f"table (1, {version}) enforced"
    st = edge.agent.status()
    assert (st["epoch_floor"], st["version_floor"]) == (1, 2) and st["overrides"]["count"] == 0, st
    # the old epoch is closed: even a version above its last one
    with pytest.raises(EdgeAgentError, match=r"older than table 2 \(epoch 1\)"):
        edge.agent.load(edge.table([tf.Entry("127.80.0.0/16", b)], 8, out=old).manifest)
    # epochs go up one at a time
    with pytest.raises(EdgeAgentError, match="epochs go up by one"):
        edge.agent.load(edge.table([tf.Entry("127.80.0.0/16", b)], 1, out=str(tmp_path / "e3"),
                                   epoch=3).manifest)
    assert cc_of(ls, "127.80.0.2") == a, "table (1, 2) still enforced after the refusals"
    fl = edge.agent.floor()
    assert fl["present"] and (fl["epoch"], fl["version"]) == (1, 2), fl


def test_no_single_table_uses_up_the_versions(edge, tmp_path):
    """A signed version of 2^64-1 is refused (the ceiling is 2^53 - 1), and within an epoch no
    table may pass the floor by more than version_max_step, nor open an epoch above it: the
    versions after it still load."""
    a, b = other_ccs(sysctl_cc())
    ls = _served(edge)
    edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", a)], 5).manifest)
    top = _raw_table(edge, [tf.Entry("127.81.0.0/16", b)], 2**64 - 1, str(tmp_path / "top"))
    rc, _, err = _agent(edge, "load", top, "--json")
    assert rc != 0 and "out of range 0..9007199254740991" in err, f"2^64-1: rc {rc} {err!r}"
    assert cc_of(ls, "127.81.0.1") == a, "table 5 still live"
    edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", b)], 6).manifest)
    assert cc_of(ls, "127.81.0.2") == b, "the next version loads"
    # the step bound: version_max_step 10 in the config
    edge.config.version_max_step = 10
    edge.agent.write_config(edge.config)
    with pytest.raises(EdgeAgentError, match=r"11 versions past table 6.*version_max_step \(10\)"):
        edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", a)], 17).manifest)
    edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", a)], 16).manifest)
    assert cc_of(ls, "127.81.0.3") == a, "a step of 10 loads"
    # a new epoch's versions start again, within the bound
    with pytest.raises(EdgeAgentError, match="a new epoch's versions start again"):
        edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", b)], 11, out=str(tmp_path / "e1"),
                                   epoch=1).manifest)
    edge.agent.load(edge.table([tf.Entry("127.81.0.0/16", b)], 10, out=str(tmp_path / "e1"),
                               epoch=1).manifest)
    st = edge.agent.status()
    assert (st["epoch_floor"], st["version_floor"]) == (1, 10), st


def test_first_table_epoch_is_bounded(edge, tmp_path):
    """An agent with no floor takes its first table at any version, but not at an epoch that would
    leave no room for the next ones."""
    a, _ = other_ccs(sysctl_cc())
    _served(edge)
    far = _raw_table(edge, [tf.Entry("127.82.0.0/16", a)], 1, str(tmp_path / "far"), epoch=2**53 - 1)
    rc, _, err = _agent(edge, "load", far)
    assert rc != 0 and "a first table's epoch is at most 1048576" in err, f"{rc} {err!r}"
    edge.agent.load(edge.table([tf.Entry("127.82.0.0/16", a)], 2**53 - 1).manifest)


def test_purge_and_restart_do_not_reopen_replay(edge, tmp_path):
    """The floor outlives the pinned maps: after `detach --purge` (all a reboot leaves of the pin
    dir: nothing) the older table is still a replay; the floor's own table loads again. A floor
    file the agent cannot read stops loads, naming it."""
    a, b = other_ccs(sysctl_cc())
    ls = _served(edge)
    t5 = edge.table([tf.Entry("127.83.0.0/16", a)], 5)
    t6 = edge.table([tf.Entry("127.83.0.0/16", b)], 6)
    edge.agent.load(t5.manifest)
    edge.agent.load(t6.manifest)
    edge.agent.detach(purge=True)
    assert not os.path.exists(os.path.join(edge.pin_dir, "ccs_version")), "purge unpinned the maps"
    edge.agent.attach(edge.cgroup)
    with pytest.raises(EdgeAgentError, match="versions only go forward"):
        edge.agent.load(t5.manifest)
    out = edge.agent.load(t6.manifest)
    assert out["override"] is False and cc_of(ls, "127.83.0.1") == b, out
    st = edge.agent.status()
    assert st["version_floor"] == 6 and st["overrides"]["count"] == 0, st
    # the override survives a purge too: counted in the file
    edge.agent.load(t5.manifest, allow_downgrade=True)
    edge.agent.detach(purge=True)
    edge.agent.attach(edge.cgroup)
    st = edge.agent.status()
    assert st["version_floor"] == 6 and st["overrides"]["count"] == 1, st
    assert st["overrides"]["last"]["from"] == 6 and st["overrides"]["last"]["to"] == 5, st
    # a damaged floor: no load, the file named
    path = os.path.join(edge.state_dir, "version-floor.json")
    with open(path, "w") as f:
        f.write("{\"epoch\": 0, \"version\": ")
    rc, _, err = _agent(edge, "load", t6.manifest)
    assert rc != 0 and path in err and "damaged" in err, f"{rc} {err!r}"
