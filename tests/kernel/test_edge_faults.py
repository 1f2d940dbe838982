"""The edge agent under an operator's bad day: restarts and policy updates under load, a load
killed half-way, the web server's cgroup recreated, far expiries, the address space of the two
families, replayed tables, and configs with typos.

Real connections in throwaway cgroups; assertions on getsockopt(TCP_CONGESTION) of the accepted
sockets, the program's counters and `ccs-edge status`. CCS_EDGE_BINARY=<path> runs them against
another build of the agent (e.g. the previous one, to see which of them it fails)."""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import time

import pytest
from _edge_helpers import Load, cc_of, client, expected_cc, in_cgroup, listener, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.edge.agent import EdgeAgentError, Service

pytestmark = pytest.mark.kernel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "infra", "edge", "ccs-edge.service")




def _agent(edge, *args):
    """The agent binary with the test's config: (returncode, stdout, stderr)."""
    r = subprocess.run(edge.agent._argv(*args), capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


# ---- 1. no enforcement gap when the policy is re-applied ---------------------------------------

def test_policy_and_attach_under_load_leave_no_gap(edge):
    """`policy` and `attach` re-apply the services while clients connect, the set of services
    changing between runs (a second port comes and goes): the served port is never unserved,
    so no connection the table covers keeps the default CC."""
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(backlog=1024))
        extra = edge.track(listener())
    port = ls.getsockname()[1]
    edge.configure([Service(port, "video")])
    edge.agent.load(edge.table([tf.Entry("127.51.0.0/16", a)], 1).manifest)
    before = edge.agent.status()["counters"]
    runs = 0
    with Load(ls, "127.51.0.0/16") as load:
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end or runs < 6:
            services = [Service(port, "video")] + ([Service(extra.getsockname()[1], "x", ab=True)]
                                                  if runs % 2 else [])
            edge.config.services = services
            edge.agent.write_config(edge.config)
            if runs % 3 == 2:
                edge.agent.attach(edge.cgroup)
            else:
                edge.agent.policy()
            runs += 1
    cnt = edge.agent.status()["counters"]
    on_default = [(ip, cc) for ip, cc in load.seen if cc != a]
    assert len(load.seen) >= 200, f"only {len(load.seen)} connections under load"
    assert load.failures == [], f"{len(load.failures)} failed connections: {load.failures[:3]}"
    assert cnt["not_served"] - before["not_served"] == 0, \
        f"{cnt['not_served'] - before['not_served']} connections found the served port unserved " \
        f"during {runs} policy/attach runs"
    assert on_default == [], f"{len(on_default)} of {len(load.seen)} covered connections kept " \
        f"another CC than the table's {a}, e.g. {on_default[:3]}"
    assert cnt["established"] - before["established"] == len(load.seen), \
        f"established {cnt['established'] - before['established']} vs {len(load.seen)} accepted"


# ---- restart under load with the systemd unit's own commands ----------------------------------

def _unit_commands(binary: str, config: str):
    """ExecStartPre= and ExecStart= of infra/edge/ccs-edge.service, with this checkout's binary
    and the test's config for /opt/ccselect/export/build/ccs-edge and ${CCS_EDGE_CONFIG}."""
    pre, start = [], None
    for line in open(UNIT):
        line = line.strip()
        key, _, val = line.partition("=")
        if key not in ("ExecStartPre", "ExecStart"):
            continue
        val = val.replace("${CCS_EDGE_CONFIG}", config)
        argv = [binary if w == "/opt/ccselect/export/build/ccs-edge" else w for w in shlex.split(val)]
        if key == "ExecStartPre":
            pre.append(argv)
        else:
            start = argv
    assert pre and start and binary in start, f"unit commands: {pre} {start}"
    return pre, start


def test_agent_restart_under_load_systemd_unit(edge, edge_binary):
    """Ten restarts of the service as systemd runs them (ExecStartPre: mount bpffs, `attach`;
    ExecStart: `run`, stopped with SIGTERM) while clients connect to the served port: every
    connection the table covers gets the table's CC, none finds the port unserved."""
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(backlog=1024))
    edge.config.log_dir = edge.logs
    edge.configure([Service(ls.getsockname()[1], "video")], sample_rate=0.01)
    edge.agent.load(edge.table([tf.Entry("127.56.0.0/16", a)], 1).manifest)
    pre, start = _unit_commands(edge_binary, edge.agent.config_path)
    before = edge.agent.status()["counters"]
    restarts, t0 = 0, time.monotonic()
    with Load(ls, "127.56.0.0/16") as load:
        for restarts in range(1, 11):
            for argv in pre:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, f"restart {restarts}: {argv[-1]} -> {r.returncode}: {r.stderr}"
            proc = subprocess.Popen(start, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            edge.procs.append(proc)
            time.sleep(0.3)
            assert proc.poll() is None, f"restart {restarts}: `run` exited: {proc.communicate()}"
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=10)
    wall = time.monotonic() - t0
    cnt = edge.agent.status()["counters"]
    on_default = sum(1 for _, cc in load.seen if cc == default)
    not_served = cnt["not_served"] - before["not_served"]
    print(f"\nrestart-under-load: {restarts} restarts in {wall:.1f} s, {len(load.seen)} connections, "
          f"{on_default} on the default CC ({default}), not_served {not_served}, "
          f"failed connects {len(load.failures)}")
    assert len(load.seen) >= 200, f"only {len(load.seen)} connections under load"
    assert load.failures == [], f"{len(load.failures)} failed connections: {load.failures[:3]}"
    assert not_served == 0, f"{not_served} connections found the port unserved during restarts"
    assert on_default == 0, f"{on_default} of {len(load.seen)} covered connections on the default CC"
    assert all(cc == a for _, cc in load.seen), "every connection got the table's CC"


# ---- 2. a load killed between installing the index and writing its metadata ---------------------

def _bpf_calls(log_path):
    return [ln for ln in open(log_path) if ln.startswith("bpf(")]


def _install_index(calls) -> int:
    """1-based index of the bpf() call that puts the new index into ccs_tables."""
    fd = None
    for i, ln in enumerate(calls, 1):
        m = re.match(r'bpf\(BPF_OBJ_GET, \{pathname="[^"]*/ccs_tables".*\) = (\d+)', ln)
        if m:
            fd = m.group(1)
        elif fd and ln.startswith(f"bpf(BPF_MAP_UPDATE_ELEM, {{map_fd={fd},"):
            return i
    raise AssertionError("no update of ccs_tables in the traced load")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_load_killed_after_trie_install_rollback_tells_truth(edge, tmp_path):
    """strace kills `load` at the bpf() call right after the new index went into the idle slot
    (before its metadata): the slot must not pass for the table it held before. `rollback` then
    either refuses, or names the table whose CC the connections actually get."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    src = "127.57.0.9"
    ccs = {600: a, 650: default, 700: b}   # 650 says "keep": the default CC
    tables = {v: edge.table([tf.Entry("127.57.0.0/16", cc if cc != default else "keep")], v)
              for v, cc in ccs.items()}
    edge.agent.load(tables[600].manifest)
    # a traced load of the same shape (650) tells which bpf() call installs the index
    log = str(tmp_path / "load650.strace")
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-o", log,
                        *edge.agent._argv("load", tables[650].manifest)], capture_output=True, text=True)
    assert r.returncode == 0, f"traced load of 650: {r.stderr}"
    k = _install_index(_bpf_calls(log)) + 1
    assert cc_of(ls, src) == ccs[650], "650 live"
    log = str(tmp_path / "load700.strace")
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-e",
                        f"inject=bpf:error=EIO:signal=KILL:when={k}", "-o", log,
                        *edge.agent._argv("load", tables[700].manifest)], capture_output=True, text=True)
    calls = _bpf_calls(log)
    assert r.returncode != 0 and "killed by SIGKILL" in open(log).read(), \
        f"load of 700 killed by the injected fault: rc {r.returncode}"
    assert _install_index(calls) == k - 1 and calls[k - 2].rstrip().endswith("= 0"), \
        "the kill came right after the index of 700 was installed"
    st = edge.agent.status()
    assert st["table"]["version"] == 650, f"the interrupted load did not swap: live {st['table']}"
    assert cc_of(ls, src) == ccs[650], "650 still enforced after the killed load"

    rc, out, err = _agent(edge, "rollback")
    live = edge.agent.status()["table"]
    got = cc_of(ls, src)
    if rc == 0:
        m = re.search(r"rolled back to table (\d+)", out)
        named = int(m.group(1)) if m else None
        assert named == live["version"] and got == ccs.get(named), \
            f"rollback said {out.strip()!r}: status says {live['version']}, connections get {got} " \
            f"(table 700's is {ccs[700]}, table {named}'s {ccs.get(named)})"
    else:
        assert "did not finish" in err or "inconsistent" in err, f"rollback refused, why: {err!r}"
        assert live["version"] == 650 and got == ccs[650], f"after the refusal: {live}, {got}"
    # the slot is usable again: 700 loads, and rollback goes back to 650, truthfully
    edge.agent.load(tables[700].manifest)
    assert cc_of(ls, src) == ccs[700], "700 enforced once loaded whole"
    out = edge.agent.rollback()
    assert "table 650" in out and cc_of(ls, src) == ccs[650], f"rollback to 650: {out!r}"


def _meta_write_index(calls) -> int:
    """1-based index of the bpf() update of ccs_meta that writes a load's metadata: the last one
    before the flip of ccs_ctl (the one after it marks the slot made live)."""
    fds, last = {}, None
    for i, ln in enumerate(calls, 1):
        m = re.match(r'bpf\(BPF_OBJ_GET, \{pathname="[^"]*/(ccs_meta|ccs_ctl)".*\) = (\d+)', ln)
        if m:
            fds[m.group(1)] = m.group(2)
        elif "ccs_ctl" in fds and ln.startswith(f"bpf(BPF_MAP_UPDATE_ELEM, {{map_fd={fds['ccs_ctl']},"):
            break
        elif "ccs_meta" in fds and ln.startswith(f"bpf(BPF_MAP_UPDATE_ELEM, {{map_fd={fds['ccs_meta']},"):
            last = i
    assert last, "no update of ccs_meta in the traced load"
    return last


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_metadata_write_failure_is_reported(edge, tmp_path):
    """The metadata update of a load fails (injected EIO): the agent says so and exits non-zero,
    the live table stays, and the half-changed slot is not offered to rollback."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    t = {v: edge.table([tf.Entry("127.57.0.0/16", cc)], v) for v, cc in ((1, a), (2, b), (3, a))}
    edge.agent.load(t[1].manifest)
    log = str(tmp_path / "load2.strace")
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-o", log,
                        *edge.agent._argv("load", t[2].manifest)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = _meta_write_index(_bpf_calls(log))
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-e", f"inject=bpf:error=EIO:when={m}",
                        "-o", str(tmp_path / "load3.strace"),
                        *edge.agent._argv("load", t[3].manifest)], capture_output=True, text=True)
    assert r.returncode != 0, "a failed metadata write fails the load"
    assert "ccs_meta" in r.stderr and "Input/output error" in r.stderr, \
        f"the failure is reported: stderr {r.stderr.strip()!r}"
    st = edge.agent.status()
    assert st["table"]["version"] == 2 and cc_of(ls, "127.57.0.1") == b, f"table 2 still live: {st['table']}"
    rc, out, err = _agent(edge, "rollback")
    assert rc != 0 and "did not finish" in err, f"rollback to the half-written slot: {out!r} {err!r}"
    assert cc_of(ls, "127.57.0.2") == b, "still table 2"


def _flip_index(calls) -> int:
    """1-based index of the bpf() call that flips ccs_ctl.live in a traced load: after its metadata."""
    fd, last = None, None
    for i, ln in enumerate(calls, 1):
        m = re.match(r'bpf\(BPF_OBJ_GET, \{pathname="[^"]*/ccs_ctl".*\) = (\d+)', ln)
        if m:
            fd = m.group(1)
        elif fd and ln.startswith(f"bpf(BPF_MAP_UPDATE_ELEM, {{map_fd={fd},"):
            last = i
    assert last, "no update of ccs_ctl in the traced load"
    return last


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_load_killed_between_metadata_and_flip_is_not_rolled_back_to(edge, tmp_path):
    """strace kills `load` at its flip of ccs_ctl.live, after the new table's metadata is written
    (issue 56, item 8): the slot holds a whole table that was never made live. `rollback` must
    refuse it, saying so, and the live table stays; loaded again whole, it goes live, and rollback
    then goes back to the table before it."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    src = "127.58.0.9"
    t = {v: edge.table([tf.Entry("127.58.0.0/16", cc)], v) for v, cc in ((1, a), (2, b), (3, a))}
    edge.agent.load(t[1].manifest)
    log = str(tmp_path / "load2.strace")
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-o", log,
                        *edge.agent._argv("load", t[2].manifest)], capture_output=True, text=True)
    assert r.returncode == 0, f"traced load of 2: {r.stderr}"
    k = _flip_index(_bpf_calls(log))
    assert cc_of(ls, src) == b, "2 live"
    log = str(tmp_path / "load3.strace")
    r = subprocess.run(["strace", "-qq", "-e", "trace=bpf", "-e",
                        f"inject=bpf:error=EIO:signal=KILL:when={k}", "-o", log,
                        *edge.agent._argv("load", t[3].manifest)], capture_output=True, text=True)
    calls = _bpf_calls(log)
    assert r.returncode != 0 and "killed by SIGKILL" in open(log).read(), \
        f"load of 3 killed by the injected fault: rc {r.returncode}"
    assert _flip_index(calls) == k and _meta_write_index(calls) < k, \
        "the kill came at the flip, after table 3's metadata was written"
    st = edge.agent.status()
    assert st["table"]["version"] == 2 and cc_of(ls, src) == b, f"2 still live: {st['table']}"
    rc, out, err = _agent(edge, "rollback")
    live = edge.agent.status()["table"]
    assert rc != 0, f"rollback made the never-live table live: {out.strip()!r}, live {live['version']}, " \
                    f"connections get {cc_of(ls, src)}"
    assert "did not finish" in err and "never made live" in err, f"rollback refused, why: {err!r}"
    assert live["version"] == 2 and cc_of(ls, src) == b, f"after the refusal: {live}"
    assert st["previous"] is None and st["slot_state"][0] == "incomplete", \
        f"status offers the unfinished table 3: previous {st['previous']}, slots {st['slot_state']}"
    edge.agent.load(t[3].manifest)
    assert cc_of(ls, src) == a and edge.agent.status()["table"]["version"] == 3, "3 live once loaded whole"
    out = edge.agent.rollback()
    assert "table 2" in out and cc_of(ls, src) == b, f"rollback to 2: {out!r}"
    out = edge.agent.rollback()
    assert "table 3" in out and cc_of(ls, src) == a, f"rollback to 3, made live before: {out!r}"


# ---- 3. the web server's cgroup recreated; attach to another cgroup -----------------------------

def test_cgroup_recreated_status_and_attach_heal(edge):
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = listener()
    port = ls.getsockname()[1]
    other = edge.cgroup + "-other"
    os.makedirs(other)
    try:
        with in_cgroup(other):
            ls_other = edge.track(listener())
        edge.configure([Service(port, "video"), Service(ls_other.getsockname()[1], "other")])
        edge.agent.load(edge.table([tf.Entry("127.58.0.0/16", a)], 1).manifest)
        assert cc_of(ls, "127.58.0.1") == a, "enforced before the restart"
        # the web server restarts: its cgroup is removed and made again, a new listener in it
        ls.close()
        os.rmdir(edge.cgroup)
        os.mkdir(edge.cgroup)
        with in_cgroup(edge.cgroup):
            ls = edge.track(listener(port=port))
        assert cc_of(ls, "127.58.0.2") == default, "test setup: nothing enforces the new cgroup"
        st = edge.agent.status()
        assert st["attached"] is False, f"status after the cgroup was recreated: attached {st['attached']}"
        # the kernel severs the link when it releases the removed cgroup (asynchronously): until
        # then the link still names the old cgroup's id, which is not the path's any more
        assert st.get("link") in ("severed", "elsewhere"), f"link state {st.get('link')}"
        assert st["table"]["enforced"] is False, f"table reported enforced: {st['table']}"
        # attach (the unit's ExecStartPre) heals it
        rc, out, err = _agent(edge, "attach")
        assert rc == 0, f"attach over a severed link: {rc} {err.strip()}"
        assert cc_of(ls, "127.58.0.3") == a, "enforced again after attach"
        st = edge.agent.status()
        assert st["attached"] and st["table"]["enforced"], f"status after the heal: {st}"
        assert st["cgroup_id"] == os.stat(edge.cgroup).st_ino, \
            f"link on cgroup id {st['cgroup_id']}, the cgroup is {os.stat(edge.cgroup).st_ino}"
        # attach --cgroup OTHER while attached: the program moves there
        rc, out, err = _agent(edge, "attach", "--cgroup", other)
        assert rc == 0, f"attach --cgroup OTHER: {err.strip()}"
        assert cc_of(ls_other, "127.58.0.4") == a, "enforced in the other cgroup"
        assert cc_of(ls, "127.58.0.5") == default, "no longer in the first cgroup"
        rc, out, _ = _agent(edge, "status", "--json", "--cgroup", other)
        st = json.loads(out)
        assert st["attached"] and st["cgroup_id"] == os.stat(other).st_ino, f"status --cgroup OTHER: {st}"
        st = edge.agent.status()   # the config still names the first cgroup
        assert st["attached"] is False and st.get("link") == "elsewhere", f"status for the config's cgroup: {st}"
    finally:
        for _ in range(50):
            try:
                os.rmdir(other)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


# ---- 4. far expiries --------------------------------------------------------------------------

def test_far_expiry_saturates(edge):
    """An expiry whose nanoseconds do not fit 64 bits (~585 years ahead): the table stays
    enforced and not expired, also on a second load; an expiry of 2^64-1 loads too."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    now = int(time.time())
    # (expires - now) * 1e9 is 2^64 + ~1.5 s: wrapped, it would expire 1-2 s from now
    far = 2**64 // 10**9 + 2
    edge.agent.load(edge.table([tf.Entry("127.59.0.0/16", a)], 1, expires_in=far, created=now).manifest)
    edge.agent.load(edge.table([tf.Entry("127.59.0.0/16", b)], 2, expires_in=far, created=now).manifest)
    time.sleep(3.0)
    st = edge.agent.status()
    assert st["table"]["version"] == 2 and not st["table"]["expired"], f"status {st['table']}"
    assert st["table"]["enforced"] and st["table"]["expires_in_s"] > 1e9, f"status {st['table']}"
    assert cc_of(ls, "127.59.0.1") == b, "a table 585 years from expiry is enforced"
    assert st["counters"]["expired"] == 0, f"expired counter {st['counters']['expired']}"
    edge.agent.rollback()
    assert cc_of(ls, "127.59.0.2") == a, "the previous far-expiry table too"
    top = edge.table([tf.Entry("127.59.0.0/16", b)], 3, expires_in=2**64 - 1 - now, created=now)
    edge.agent.load(top.manifest)
    assert cc_of(ls, "127.59.0.3") == b, "expiry 2^64-1 enforced"
    assert not edge.agent.status()["table"]["expired"], "expiry 2^64-1 not expired"


# ---- 6. one address space rule for both families -----------------------------------------------

def _write_raw_table(edge, version, entries, patch):
    """A signed table whose binary is `entries` encoded, then patch(blob): bypasses the Python
    validation, to see what the agent itself refuses."""
    now = int(time.time())
    blob = bytearray(tf.encode(tf.Table(version, now, now + 3600, tuple(entries))))
    patch(blob)
    blob = bytes(blob)
    t = struct.unpack_from(tf.HEADER_FMT, blob, 0)
    os.makedirs(edge.tables, exist_ok=True)
    name = f"table-{version}.bin"
    man = signing.manifest_bytes(blob, name, version, "raw", now, now + 3600, t[9], t[10])
    path = os.path.join(edge.tables, f"table-{version}.manifest.json")
    open(os.path.join(edge.tables, name), "wb").write(blob)
    open(path, "wb").write(man)
    open(path + signing.SIG_SUFFIX, "wb").write(signing.sign(man, edge.keys["private"]))
    assert hashlib.sha256(blob).hexdigest() in man.decode()
    return path


def test_v6_entries_never_decide_v4_clients(edge):
    """::/0 (and any IPv6 entry covering ::ffff:0:0/96) applies to IPv6 clients only: an IPv4
    client outside the IPv4 entries misses, on an IPv4 and on a dual-stack listener, as
    table_format.lookup says. An IPv6 entry inside ::ffff:0:0/96 is refused at load."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        v4 = edge.track(listener())
        dual = edge.track(listener(socket.AF_INET6, "::"))
    edge.configure([Service(v4.getsockname()[1], "v4"), Service(dual.getsockname()[1], "dual")])
    entries = [tf.Entry("127.60.0.0/16", a), tf.Entry("::/0", b), tf.Entry("::/8", b)]
    edge.agent.load(edge.table(entries, 1).manifest)
    checks = []
    for src in ("127.60.0.1", "127.61.0.1", "127.0.0.1"):
        checks.append((src, "v4", cc_of(v4, src)))
        c = client(src)
        c.connect(("127.0.0.1", dual.getsockname()[1]))
        acc, peer = dual.accept()
        assert peer[0] == "::ffff:" + src, f"dual-stack peer {peer[0]}"
        checks.append((peer[0], "dual", sock_cc(acc)))
        acc.close(), c.close()
    c = client("::1", socket.AF_INET6)
    c.connect(("::1", dual.getsockname()[1]))
    acc, _ = dual.accept()
    checks.append(("::1", "dual", sock_cc(acc)))
    acc.close(), c.close()
    misses = 0
    for ip, where, got in checks:
        want, dec = expected_cc(entries, ip, default)
        misses += dec == "default"
        assert got == want, f"{ip} on the {where} listener: kernel gave {got}, table_format.lookup says {want} ({dec})"
    assert misses == 4, "test setup: four IPv4 clients outside the IPv4 entries"
    cnt = edge.agent.status()["counters"]
    assert cnt["miss"] == misses, f"miss counter {cnt['miss']} vs {misses}"
    # an IPv6 entry inside ::ffff:0:0/96, written past the Python validation: refused at load
    mapped = ipaddress.IPv6Address("::ffff:127.61.0.0").packed

    def to_mapped(blob):
        off = tf.HEADER_SIZE + tf.ENTRY_SIZE  # the v6 entry follows the one v4 entry
        blob[off + 16:off + 32] = mapped

    path = _write_raw_table(edge, 2, [tf.Entry("127.60.0.0/16", a), tf.Entry("2001:db8::/112", b)], to_mapped)
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(path)
    assert "inside ::ffff:0:0/96" in err.value.stderr, f"refusal: {err.value.stderr.strip()!r}"
    assert cc_of(v4, "127.61.0.9") == default, "the mapped entry never reached the kernel"
    assert edge.agent.status()["table"]["version"] == 1, "table 1 still live"


# ---- 7. versions only go forward ----------------------------------------------------------------

def test_versions_only_go_forward(edge, tmp_path):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    t10 = edge.table([tf.Entry("127.62.0.0/16", a)], 10)
    t11 = edge.table([tf.Entry("127.62.0.0/16", b)], 11)
    edge.agent.load(t10.manifest)
    edge.agent.load(t11.manifest)
    # replay: an older, validly signed, unexpired table
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(t10.manifest)
    assert "versions only go forward" in err.value.stderr, f"replay refusal: {err.value.stderr.strip()!r}"
    assert cc_of(ls, "127.62.0.1") == b, "table 11 still enforced after the replay"
    # the same version with other contents
    now = int(time.time())
    other11 = signing.write_table([tf.Entry("127.62.0.0/16", a)], 11, "m", now + 3600,
                                  str(tmp_path / "other"), edge.keys["private"], created=now)
    with pytest.raises(EdgeAgentError, match="another sha256"):
        edge.agent.load(other11.manifest)
    # the same table again: nothing to do
    out = edge.agent.load(t11.manifest)
    assert out.get("unchanged") is True, f"reload of the live table: {out}"
    st = edge.agent.status()
    assert st["version_floor"] == 11 and st["overrides"]["count"] == 0, f"status {st}"
    # the explicit override: named version only, logged, counted
    rc, _, err2 = _agent(edge, "load", t10.manifest, "--allow-downgrade", "9")
    assert rc != 0 and "does not name" in err2, f"override naming another version: {err2!r}"
    rc, out, err2 = _agent(edge, "load", t10.manifest, "--json", "--allow-downgrade", "10")
    assert rc == 0 and json.loads(out)["override"] is True, f"override load: {rc} {err2}"
    assert "version rule overridden" in err2 and "table 10" in err2, f"override logged: {err2!r}"
    assert cc_of(ls, "127.62.0.2") == a, "table 10 live through the override"
    st = edge.agent.status()
    assert st["version_floor"] == 11, "the floor does not move down"
    assert st["overrides"]["count"] == 1 and st["overrides"]["last"]["from"] == 11 \
        and st["overrides"]["last"]["to"] == 10, f"override recorded: {st['overrides']}"
    # forward again, then the agent's own rollback to the older slot: an override, logged
    edge.agent.load(edge.table([tf.Entry("127.62.0.0/16", b)], 12).manifest)
    rc, out, err2 = _agent(edge, "rollback")
    assert rc == 0 and "table 10" in out and "version rule overridden (rollback)" in err2, \
        f"rollback: {out!r} {err2!r}"
    assert edge.agent.status()["overrides"]["count"] == 2, "rollback counted as an override"
    assert cc_of(ls, "127.62.0.3") == a, "rolled back to table 10"


# ---- 8. the config: strict reader, JSON-escaped output -------------------------------------------

def test_config_rejects_what_it_does_not_understand(edge, tmp_path):
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    port = ls.getsockname()[1]
    edge.configure([Service(port, "video")], sample_rate=1.0)
    edge.agent.load(edge.table([tf.Entry("127.63.0.0/16", a)], 1).manifest)
    head = f"cgroup: {edge.cgroup}\npin_dir: {edge.pin_dir}\npublic_key: {edge.keys['public_path']}\n"
    many = "services:\n" + "".join(f"  - {{port: {p}, name: s{p}}}\n" for p in range(1000, 1257))
    bad = [
        ("pin-dir: /sys/fs/bpf/elsewhere\n", 4, 'unknown key "pin-dir"'),
        (f"services:\n  - {{port: {port}x, name: video}}\n", 5, f'"{port}x" is not an integer'),
        (f"services:\n  - {{port: {port}, ab: ture}}\n", 5, '"ture" is not a boolean'),
        (f"services:\n  - {{port: {port}, ab: true, cap: true}}\n", 5, 'unknown service key "cap"'),
        (f"services:\n  - {{port: {port}, flow_mode: always}}\n", 5,
         'flow_mode "always" is not one of off, fill, combine, flow, prior'),
        (f"services:\n  - {{port: {port}, flow_mode: fill, flow_mode: flow}}\n", 5,
         'service key "flow_mode" given twice'),
        ("sample_rate: 1%\n", 4, "not a number"),
        ("sample_rate: 0.5 0.1\n", 4, "not a number"),
        (many, 261, "more than 256 services"),
        (f"services:\n  - {{port: {port}}}\n  - {{port: {port}}}\n", 6, f"port {port} is already a service"),
        # the caps on one table (issue 58): above the compiled bound is an error, not a cap lowered
        ("max_entries: 4000001\n", 4, "max_entries: 4000001 is out of range 1..4000000"),
        ("max_tree_nodes: 600\n", 4, "max_tree_nodes: 600 is out of range 2..512"),
        ("max_artifact_bytes: 160008241\n", 4, "max_artifact_bytes: 160008241 is out of range 1..160008240"),
        ("max_growth: 0.5\n", 4, "max_growth: 0.5 is below 1"),
        ("max_growth: 2x\n", 4, "not a number"),
    ]
    for i, (tail, line, msg) in enumerate(bad):
        path = str(tmp_path / f"bad{i}.yaml")
        open(path, "w").write(head + tail)
        r = subprocess.run([edge.agent.binary, "--config", path, "policy"], capture_output=True, text=True)
        assert r.returncode != 0, f"config {tail.splitlines()[-1]!r}: accepted (rc 0)"
        assert f"{path}:{line}:" in r.stderr and msg in r.stderr, \
            f"config {tail.splitlines()[-1][:40]!r}: message {r.stderr.strip()!r}, want line {line} and {msg!r}"
    assert cc_of(ls, "127.63.0.1") == a, "the refused configs changed nothing"
    # strings the agent writes are JSON-escaped: a node_id with a quote and a backslash
    path = str(tmp_path / "quote.yaml")
    open(path, "w").write(head + f'node_id: edge"01\\x\nsample_rate: 1\nservices:\n  - {{port: {port}, name: video}}\n')
    rc = subprocess.run([edge.agent.binary, "--config", path, "status", "--json"], capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    try:
        st = json.loads(rc.stdout)
    except ValueError as exc:
        pytest.fail(f"status --json with a quote in node_id is not JSON: {exc}: {rc.stdout[:120]!r}")
    assert st["node_id"] == 'edge"01\\x', f"node_id {st['node_id']!r}"
    cc_of(ls, "127.63.0.2")
    time.sleep(0.1)
    r = subprocess.run([edge.agent.binary, "--config", path, "log", "--out", edge.logs, "--drain"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for d, _, fs in os.walk(edge.logs) for f in fs for ln in open(os.path.join(d, f))]
    assert lines, "transport log written"
    for ln in lines:
        try:
            rec = json.loads(ln)
        except ValueError as exc:
            pytest.fail(f"transport log line is not JSON: {exc}: {ln[:120]!r}")
        assert rec["node_id"] == 'edge"01\\x' and rec["conn_id"].startswith('edge"01\\x-'), rec
