"""The eBPF enforcer and the ccs-edge agent, on real connections in a throwaway cgroup.

Assertions are on getsockopt(TCP_CONGESTION) / SO_MAX_PACING_RATE of the accepted socket and on
the program's own counters (after the kernel's selftests/bpf)."""
from __future__ import annotations

import collections
import glob
import json
import os
import random
import signal
import socket
import threading
import time

import pytest
from ccselect.hours import hour_of_ms
from _edge_helpers import (
    client,
    connect_accept,
    expected_cc,
    in_cgroup,
    listener,
    other_ccs,
    pacing_rate,
    sock_cc,
    sysctl_cc,
    validate_transport_record,
)

from ccselect import contract
from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import EdgeAgentError, Service

pytestmark = pytest.mark.kernel


def _v4_sources(rng, prefixes_and_counts):
    out = []
    for net, n in prefixes_and_counts:
        net = tf.ipaddress.ip_network(net)
        for _ in range(n):
            host = rng.randrange(1, net.num_addresses - 1) if net.num_addresses > 2 else 0
            out.append(str(net.network_address + host))
    return out


def _connect_check(edge, ls, sources, entries, default, family=socket.AF_INET, runner=None):
    """Connect from each source; return list of (src, got_cc, want_cc, want_decision)."""
    out = []
    for src in sources:
        if runner is not None:
            c = runner.call(client, src, family)
            runner.call(c.connect, ls.getsockname()[:2])
            a, _ = ls.accept()
        else:
            c, a, _ = connect_accept(ls, src)
        want, dec = expected_cc(entries, src, default)
        out.append((src, sock_cc(a), want, dec))
        a.close()
        c.close()
    return out


def test_lpm_ipv4_counters_and_unserved_port(edge):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        served = edge.track(listener())
        unserved = edge.track(listener())
    edge.configure([Service(served.getsockname()[1], "video")])
    entries = [
        tf.Entry("127.10.0.0/16", a), tf.Entry("127.10.5.0/24", b),
        tf.Entry("127.10.5.7/32", a), tf.Entry("127.11.0.0/16", b),
        tf.Entry("127.12.0.0/15", a), tf.Entry("127.12.128.0/17", b),
        tf.Entry("127.20.0.0/16", "keep"),
        tf.Entry("127.30.0.0/16", a, purity_permille=550, low_confidence=True),
        tf.Entry("2001:db8::/32", b),
    ]
    edge.agent.load(edge.table(entries, 1).manifest)
    rng = random.Random(8)
    sources = _v4_sources(rng, [("127.10.0.0/16", 12), ("127.10.5.0/24", 8), ("127.11.0.0/16", 8),
                                ("127.12.0.0/15", 10), ("127.12.128.0/17", 6),
                                ("127.20.0.0/16", 5), ("127.30.0.0/16", 5),
                                ("127.99.0.0/16", 10)]) + ["127.10.5.7", "127.0.0.1"]
    results = _connect_check(edge, served, sources, entries, default)
    for src, got, want, dec in results:
        assert got == want, f"{src}: accepted socket has {got}, table says {want} ({dec})"

    unserved_ccs = _connect_check(edge, unserved, sources[:10], [], default)
    for src, got, want, _ in unserved_ccs:
        assert got == default, f"{src} on an unserved port got {got}, not the default {default}"

    st = edge.agent.status()
    cnt = st["counters"]
    decisions = collections.Counter(d for *_, d in results)
    hits = collections.Counter(w for _, _, w, d in results if d == "table")
    n_keep = sum(1 for s in sources if tf.ipaddress.ip_address(s) in
                 tf.ipaddress.ip_network("127.20.0.0/16"))
    assert cnt["established"] == len(sources), f"established counter {cnt['established']}"
    assert cnt["lookups"] == len(sources), f"lookups counter {cnt['lookups']}"
    assert cnt["miss"] == decisions["default"], f"miss {cnt['miss']} vs {decisions['default']}"
    assert cnt["hit_keep"] == n_keep, f"hit_keep {cnt['hit_keep']} vs {n_keep}"
    assert cnt["hit_lowconf"] == decisions["fallback"] - n_keep, f"hit_lowconf {cnt['hit_lowconf']}"
    for cc in ("cubic", "bbr", "reno"):
        assert cnt[f"hit_{cc}"] == hits[cc], f"hit_{cc} {cnt[f'hit_{cc}']} vs {hits[cc]}"
    assert cnt["not_served"] == len(unserved_ccs), f"not_served {cnt['not_served']}"
    for k in ("setsockopt_err", "no_table", "expired", "ab_control", "storage_err"):
        assert cnt[k] == 0, f"counter {k} = {cnt[k]}"
    assert st["table"]["version"] == 1 and st["table"]["enforced"], f"status table {st['table']}"
    assert st["table"]["entries"] == {"v4": 8, "v6": 1}, f"entries {st['table']['entries']}"


def test_lpm_ipv6_in_netns(edge, netns):
    name, runner = netns
    default = sysctl_cc(name)
    a, b = other_ccs(default)
    addrs = {
        "2001:db8:1::10": None, "2001:db8:1:7::1": None, "2001:db8:1:2::5": None,
        "2001:db8:1:2::9": None, "2001:db8:2::1": None, "fd00:cc50::1": None,
    }
    for ad in list(addrs) + ["fd00::1"]:
        os.system(f"ip -n {name} -6 addr add {ad}/128 dev lo nodad")
    with in_cgroup(edge.cgroup):
        ls = edge.track(runner.call(listener, socket.AF_INET6, "fd00::1"))
    edge.configure([Service(ls.getsockname()[1], "video6")])
    entries = [tf.Entry("2001:db8:1::/48", a), tf.Entry("2001:db8:1:2::/64", b),
               tf.Entry("2001:db8:1:2::9/128", a), tf.Entry("127.0.0.0/8", b)]
    edge.agent.load(edge.table(entries, 3).manifest)
    results = _connect_check(edge, ls, list(addrs), entries, default, socket.AF_INET6, runner)
    for src, got, want, dec in results:
        assert got == want, f"{src}: accepted socket has {got}, table says {want} ({dec})"
    cnt = edge.agent.status()["counters"]
    want_miss = sum(1 for *_, d in results if d == "default")
    assert want_miss == 2, "test setup: two v6 sources outside the table"
    assert cnt["miss"] == want_miss, f"v6 miss counter {cnt['miss']}"
    assert cnt["lookups"] == len(results), f"v6 lookups counter {cnt['lookups']}"


def test_ab_split_and_caps(edge):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ab_ls = edge.track(listener())
        caps_ls = edge.track(listener())
        nocaps_ls = edge.track(listener())
    edge.configure([Service(ab_ls.getsockname()[1], "ab", ab=True),
                    Service(caps_ls.getsockname()[1], "caps", caps=True),
                    Service(nocaps_ls.getsockname()[1], "nocaps", caps=False)])
    entries = [tf.Entry("127.40.0.0/16", a),
               tf.Entry("127.41.0.0/16", b, pacing_rate_bps=80_000_000, cwnd_clamp_segs=20),
               tf.Entry("127.42.0.0/16", a, pacing_rate_bps=0, cwnd_clamp_segs=8)]
    edge.agent.load(edge.table(entries, 5).manifest)

    sources = [f"127.40.{i}.{j}" for i in range(4) for j in range(1, 17)]
    odd = even = 0
    for src in sources:
        c, acc, _ = connect_accept(ab_ls, src)
        got = sock_cc(acc)
        treat = tf.ab_bucket_odd(src)
        want = a if treat else default
        odd += treat
        even += not treat
        assert got == want, f"A/B {src}: crc32 parity {'odd' if treat else 'even'}, got {got}"
        acc.close()
        c.close()
    assert odd and even, "test setup: both A/B buckets populated"
    cnt = edge.agent.status()["counters"]
    assert cnt["ab_control"] == even, f"ab_control counter {cnt['ab_control']} vs {even} even"
    assert cnt["lookups"] == odd, f"lookups counter {cnt['lookups']} vs {odd} odd"

    c, acc, _ = connect_accept(caps_ls, "127.41.0.9")
    assert sock_cc(acc) == b, "caps port: table CC applied"
    assert pacing_rate(acc) == 10_000_000, f"SO_MAX_PACING_RATE {pacing_rate(acc)} != 80 Mbit/s"
    c.close(), acc.close()
    c, acc, _ = connect_accept(caps_ls, "127.42.0.9")
    assert pacing_rate(acc) == 2**64 - 1, "no pacing cap when the entry has none"
    c.close(), acc.close()
    c, acc, _ = connect_accept(nocaps_ls, "127.41.0.9")
    assert sock_cc(acc) == b, "no-caps port: table CC still applied"
    assert pacing_rate(acc) == 2**64 - 1, "no-caps service: pacing untouched"
    c.close(), acc.close()
    cnt = edge.agent.status()["counters"]
    assert cnt["pacing_set"] == 1, f"pacing_set counter {cnt['pacing_set']}"
    assert cnt["clamp_set"] == 2, f"clamp_set counter {cnt['clamp_set']}"
    assert cnt["caps_err"] == 0, f"caps_err counter {cnt['caps_err']}"


def test_swap_under_load(edge):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(backlog=1024))
    edge.configure([Service(ls.getsockname()[1], "video")])
    # every /24 of 127.50/16 is in both tables, with the CC flipped between them
    ea = [tf.Entry(f"127.50.{i}.0/24", (a, b)[i % 2]) for i in range(16)]
    eb = [tf.Entry(f"127.50.{i}.0/24", (b, a)[i % 2]) for i in range(16)]
    # versions only go forward: each swap loads the next version, the contents alternating
    tables = [edge.table((ea, eb)[v % 2], 10 + v) for v in range(160)]
    edge.agent.load(tables[0].manifest)

    stop = threading.Event()
    failures, seen = [], []
    lock = threading.Lock()

    def server():
        ls.settimeout(0.2)
        while not stop.is_set():
            try:
                acc, peer = ls.accept()
            except socket.timeout:
                continue
            with lock:
                seen.append((peer[0], sock_cc(acc)))
            acc.close()

    def clients(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            src = f"127.50.{rng.randrange(16)}.{rng.randrange(1, 255)}"
            try:
                c = client(src)
                c.settimeout(5)
                c.connect(ls.getsockname())
                c.close()
            except OSError as exc:
                with lock:
                    failures.append((src, repr(exc)))

    threads = [threading.Thread(target=server)] + [
        threading.Thread(target=clients, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    # SWAPS loads however long they take (a count, not a rate: a loaded machine swaps slower), with
    # the clients connecting throughout; then the clients go on until CONNS connections were seen
    # (HANG_S only ends a test that would otherwise hang)
    SWAPS, CONNS, HANG_S = 20, 200, 120
    swaps, during = 0, 0
    try:
        while swaps < SWAPS:
            edge.agent.load(tables[swaps + 1].manifest)
            swaps += 1
            time.sleep(0.05)
        with lock:
            during = len(seen)
        hang = time.monotonic() + HANG_S
        while time.monotonic() < hang:
            with lock:
                if len(seen) >= CONNS or failures:
                    break
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    while True:  # connections the handshake finished but the server thread did not accept
        try:
            acc, peer = ls.accept()
        except socket.timeout:
            break
        seen.append((peer[0], sock_cc(acc)))
        acc.close()
    old_new = {e.prefix: e.cc for e in ea}
    new_old = {e.prefix: e.cc for e in eb}
    bad = []
    for ip, cc in seen:
        net = tf.ipaddress.ip_network(ip + "/24", strict=False)
        if cc not in (old_new[net], new_old[net]):
            bad.append((ip, cc))
    assert during >= SWAPS, f"only {during} connections during {SWAPS} swaps"
    assert len(seen) >= CONNS, f"only {len(seen)} connections in {HANG_S} s"
    assert failures == [], f"{len(failures)} failed connections, e.g. {failures[:3]}"
    assert bad == [], f"{len(bad)} connections got a CC from neither table, e.g. {bad[:3]}"
    cnt = edge.agent.status()["counters"]
    assert cnt["miss"] == 0 and cnt["no_table"] == 0, f"misses during swaps: {cnt}"
    assert cnt["established"] == len(seen), f"established {cnt['established']} vs {len(seen)}"


def test_refused_tables_ttl_and_rollback(edge, keys):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    good = [tf.Entry("127.60.0.0/16", a)]
    edge.agent.load(edge.table(good, 20).manifest)

    def cc_of(src="127.60.1.1"):
        c, acc, _ = connect_accept(ls, src)
        got = sock_cc(acc)
        c.close(), acc.close()
        return got

    # one byte of the binary table changed
    t = edge.table([tf.Entry("127.60.0.0/16", b)], 21)
    blob = bytearray(open(t.table, "rb").read())
    blob[-3] ^= 0x01
    open(t.table, "wb").write(bytes(blob))
    with pytest.raises(EdgeAgentError, match="sha256"):
        edge.agent.load(t.manifest)
    # one byte of the manifest changed
    t = edge.table([tf.Entry("127.60.0.0/16", b)], 22)
    man = open(t.manifest, "rb").read().replace(b'"version": 22', b'"version": 23')
    open(t.manifest, "wb").write(man)
    with pytest.raises(EdgeAgentError, match="signature"):
        edge.agent.load(t.manifest)
    # signed with another key
    t = edge.table([tf.Entry("127.60.0.0/16", b)], 24, key=keys["other"])
    with pytest.raises(EdgeAgentError, match="signature"):
        edge.agent.load(t.manifest)
    # expired before it arrives
    t = edge.table([tf.Entry("127.60.0.0/16", b)], 25, expires_in=60,
                   created=int(time.time()) - 3600)
    with pytest.raises(EdgeAgentError, match="expired"):
        edge.agent.load(t.manifest)
    st = edge.agent.status()
    assert st["table"]["version"] == 20, f"live table changed by a refused load: {st['table']}"
    assert cc_of() == a, "live table still enforced after the refusals"

    # a table that expires in 2 s: enforced, then not (default CC), status says so
    edge.agent.load(edge.table([tf.Entry("127.60.0.0/16", b)], 26, expires_in=2).manifest)
    assert cc_of() == b, "short-lived table enforced before expiry"
    time.sleep(max(0.0, edge.agent.status()["table"]["expires_in_s"]) + 0.3)
    assert cc_of() == default, "expired table not enforced: default CC"
    st = edge.agent.status()
    assert st["table"]["version"] == 26 and st["table"]["expired"], f"status: {st['table']}"
    assert st["table"]["enforced"] is False, "status reports the expired table as not enforced"
    assert st["counters"]["expired"] == 1, f"expired counter {st['counters']['expired']}"
    edge.agent.rollback()
    assert edge.agent.status()["table"]["version"] == 20, "rollback made table 20 live"
    assert cc_of() == a, "rolled-back table enforced"


@pytest.mark.parametrize("model_version", ["v4", "v6", "table", "sha256"])
def test_manifest_model_version_named_like_a_key(edge, model_version):
    """The agent reads the manifest with a JSON parser: a model_version that is the name of
    another key (a text search for the key finds the value instead) loads, and status shows it."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    edge.agent.load(edge.table([tf.Entry("127.61.0.0/16", a)], 60, model_version="base").manifest)
    entries = [tf.Entry("127.61.0.0/16", b), tf.Entry("2001:db8:61::/48", b)]
    out = edge.agent.load(edge.table(entries, 61, model_version=model_version).manifest)
    assert out["loaded"] and out["version"] == 61, f"load {out}"
    st = edge.agent.status()
    assert st["table"]["version"] == 61, f"live table {st['table']}"
    assert st["table"]["model_version"] == model_version, f"status model_version {st['table']['model_version']!r}"
    assert st["table"]["entries"] == {"v4": 1, "v6": 1}, f"entries {st['table']['entries']}"
    assert st["previous"]["version"] == 60 and st["previous"]["model_version"] == "base", f"previous {st['previous']}"
    c, acc, _ = connect_accept(ls, "127.61.0.7")
    assert sock_cc(acc) == b, f"new table enforced: {sock_cc(acc)} != {b}"
    c.close(), acc.close()


def _dup_key(text):
    return text.replace('"version": 71,', '"version": 71,\n  "version": 171,')


def _nested_object(text):
    return text.replace('"version": 71,', '"version": {"version": 71},')


def _float_for_int(text):
    exp = json.loads(text)["expires"]
    return text.replace(f'"expires": {exp},', f'"expires": {exp}.0,')


def _truncated(text):
    return text[: len(text) // 2]


@pytest.mark.parametrize("mutate, message", [
    (_dup_key, 'duplicate key "version"'),
    (_nested_object, 'field "version" must be an integer, not an object'),
    (_float_for_int, 'field "expires" must be an integer, not a float'),
    (_truncated, "not valid JSON"),
], ids=["duplicate-key", "nested-object", "float-for-int", "truncated"])
def test_malformed_manifest_refused(edge, mutate, message):
    """A correctly signed manifest whose JSON is wrong: refused with a message naming the
    problem, non-zero exit, and the previous table stays live."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    edge.agent.load(edge.table([tf.Entry("127.62.0.0/16", a)], 70, model_version="good").manifest)
    t = edge.table([tf.Entry("127.62.0.0/16", b)], 71, model_version="bad")
    text = open(t.manifest).read()
    bad = mutate(text)
    assert bad != text, "test setup: the manifest changed"
    edge.resign(t.manifest, bad)
    with pytest.raises(EdgeAgentError) as err:
        edge.agent.load(t.manifest)
    assert err.value.returncode != 0, f"exit status {err.value.returncode}"
    assert message in err.value.stderr, f"message {err.value.stderr.strip()!r}, want {message!r}"
    st = edge.agent.status()
    assert st["table"]["version"] == 70 and st["table"]["model_version"] == "good", \
        f"live table changed by a refused load: {st['table']}"
    c, acc, _ = connect_accept(ls, "127.62.0.9")
    assert sock_cc(acc) == a, "previous table still enforced"
    c.close(), acc.close()


def test_agent_restart_keeps_enforcement(edge):
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")], sample_rate=1.0)
    edge.agent.load(edge.table([tf.Entry("127.70.0.0/16", a)], 30).manifest)
    proc = edge.agent.run(edge.logs)
    edge.procs.append(proc)
    time.sleep(0.3)
    assert proc.poll() is None, "agent daemon running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    c, acc, _ = connect_accept(ls, "127.70.0.3")
    assert sock_cc(acc) == a, "enforcement survives the agent being killed"
    c.close(), acc.close()
    # a new agent picks up the pinned state: same table, re-attach replaces the program in place
    proc = edge.agent.run(edge.logs)
    edge.procs.append(proc)
    out = edge.agent.attach(edge.cgroup)
    assert "replaced" in out, f"re-attach reuses the pinned link: {out!r}"
    st = edge.agent.status()
    assert st["attached"] and st["table"]["version"] == 30, f"status after restart {st}"
    c, acc, _ = connect_accept(ls, "127.70.0.4")
    assert sock_cc(acc) == a, "enforcement after agent restart and re-attach"
    c.close(), acc.close()
    time.sleep(1.0)
    edge.agent.stop(proc)
    recs = [json.loads(x) for f in glob.glob(os.path.join(edge.logs, "transport", "*", "*.jsonl"))
            for x in open(f)]
    assert {r["client_ip"] for r in recs} >= {"127.70.0.4"}, "restarted agent logs connections"


def test_transport_log_records(edge, spark, tmp_path):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    port = ls.getsockname()[1]
    edge.configure([Service(port, "video", caps=True)], sample_rate=1.0)
    entries = [tf.Entry("127.80.0.0/16", a), tf.Entry("127.81.0.0/16", b, cwnd_clamp_segs=4),
               tf.Entry("127.82.0.0/16", a, low_confidence=True)]
    edge.agent.load(edge.table(entries, 40).manifest)
    sent = {}
    plan = [("127.80.0.1", 1000), ("127.80.0.2", 200_000), ("127.81.0.1", 500_000),
            ("127.82.0.1", 30_000), ("127.83.0.1", 64_000)]
    t0 = int(time.time() * 1000)
    for src, n in plan:
        c, acc, peer = connect_accept(ls, src)
        c.sendall(b"GET /x\r\n")
        assert acc.recv(64) == b"GET /x\r\n", "request received"
        t_start = time.monotonic()
        acc.sendall(os.urandom(n))
        got = 0
        while got < n:
            chunk = c.recv(1 << 20)
            assert chunk, "client got the whole response"
            got += len(chunk)
        acc.shutdown(socket.SHUT_WR)
        assert c.recv(1) == b"", "server FIN"
        c.close()
        sent[(src, peer[1])] = (n, sock_cc(acc), time.monotonic() - t_start)
        acc.close()
    time.sleep(0.3)
    t1 = int(time.time() * 1000)
    n_rec = edge.agent.log(edge.logs)
    assert n_rec == len(plan), f"{n_rec} records drained for {len(plan)} connections"
    d = contract.stream_dir(edge.logs, "transport", "test-node")
    files = sorted(os.listdir(d))
    assert files and all(contract.FILE_NAME.match(f) for f in files), f"the contract's file names: {files}"
    recs = [(f, json.loads(x)) for f in files for x in open(os.path.join(d, f))]
    for f, r in recs:
        assert contract.FILE_NAME.match(f).group(1) == hour_of_ms(r["ts_end_ms"]), \
            f"record in a file of its hour: {r['ts_end_ms']} in {f}"
    recs = [r for _, r in recs]
    for r in recs:
        problems = validate_transport_record(r)
        assert problems == [], f"record {r['client_ip']} breaks the contract: {problems}"
    assert len({r["conn_id"] for r in recs}) == len(recs), "conn_id unique"
    by_key = {(r["client_ip"], r["client_port"]): r for r in recs}
    for (src, cport), (n, cc, wall) in sent.items():
        r = by_key.get((src, cport))
        assert r is not None, f"record for {src}:{cport}"
        want_cc, want_dec = expected_cc(entries, src, default)
        assert r["cc"] == cc == want_cc, f"{src}: record cc {r['cc']}, socket {cc}, table {want_cc}"
        assert r["decision"] == want_dec, f"{src}: decision {r['decision']} != {want_dec}"
        assert r["server_port"] == port, f"{src}: server_port {r['server_port']}"
        assert r["table_version"] == "40", f"{src}: table_version {r['table_version']}"
        assert n <= r["bytes_acked"] <= n + 1, f"{src}: bytes_acked {r['bytes_acked']} for {n} sent"
        assert r["data_segs_out"] >= 1, f"{src}: data_segs_out {r['data_segs_out']}"
        assert 1 <= r["min_rtt_us"] <= r["max_srtt_us"] <= 1_000_000, f"{src}: rtts {r}"
        assert r["min_srtt_us"] <= r["max_srtt_us"], f"{src}: min_srtt <= max_srtt"
        assert r["min_rtt_var_us"] <= r["max_rtt_var_us"], f"{src}: rttvar min <= max"
        assert r["min_snd_wnd_bytes"] <= r["max_snd_wnd_bytes"], f"{src}: snd_wnd min <= max"
        assert r["min_rto_us"] >= 200_000, f"{src}: min_rto_us {r['min_rto_us']} (RTO floor 200 ms)"
        assert t0 - 5 <= r["ts_start_ms"] <= r["ts_end_ms"] <= t1 + 5, f"{src}: timestamps {r}"
        assert 0 < r["duration_us"] <= (t1 - t0 + 10) * 1000, f"{src}: duration {r['duration_us']}"
        if src.startswith("127.81."):
            assert r["max_cwnd_segs"] <= 10, f"{src}: cwnd clamp 4 keeps cwnd at IW, got {r['max_cwnd_segs']}"
    cnt = edge.agent.status()["counters"]
    assert cnt["log_emitted"] == len(plan), f"log_emitted counter {cnt['log_emitted']}"
    assert cnt["log_dropped"] == 0, f"log_dropped counter {cnt['log_dropped']}"
    # the pipeline's own ingest accepts every record the agent wrote (nothing quarantined)
    from ccs_testing import write_config
    from ccselect.config import load_config
    from ccselect.jobs import ingest
    res = ingest.run(spark, load_config(write_config(tmp_path)), edge.logs, silver=False)
    t = res["streams"]["transport"]
    assert (t["lines_read"], t["accepted"], t["quarantined"]) == (len(plan), len(plan), 0), f"ingest: {res}"


def test_example_config_policy(edge, edge_binary):
    """infra/edge/edge.yaml, as the C agent reads it, lands in the policy map."""
    import subprocess
    cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                       "infra", "edge", "edge.yaml")
    r = subprocess.run([edge_binary, "--config", cfg, "--pin-dir", edge.pin_dir, "--cgroup",
                        edge.cgroup, "attach"], capture_output=True, text=True)
    assert r.returncode == 0, f"attach with the example config: {r.stderr}"

    def policy(port):
        out = subprocess.run(["bpftool", "-j", "map", "lookup", "pinned",
                              f"{edge.pin_dir}/ccs_policy", "key", "hex",
                              *port.to_bytes(4, "little").hex(" ").split()],
                             capture_output=True, text=True, check=True).stdout
        v = json.loads(out)["value"]
        return [int(x, 16) for x in v[:4]]

    assert policy(443) == [1, 0, 1, 4], "443: served, no A/B, caps, flow_mode prior (4)"
    assert policy(80) == [1, 1, 0, 0], "80: served, A/B, no caps, flow_mode off (default)"
    assert policy(8080) == [0, 0, 0, 0], "8080: not served"


def test_v4_mapped_dual_stack_and_sampling(edge):
    """A v4 client on a dual-stack (AF_INET6) listener is looked up as IPv4 (::ffff:a.b.c.d
    matches the v4 entries, A/B CRC over its 4 bytes), and sample_rate 0.5 logs about half."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(socket.AF_INET6, "::"))
        ab = edge.track(listener(socket.AF_INET6, "::"))
    edge.configure([Service(ls.getsockname()[1], "dual"),
                    Service(ab.getsockname()[1], "dual-ab", ab=True)], sample_rate=0.5)
    entries = [tf.Entry("127.90.0.0/16", a), tf.Entry("127.90.3.0/24", b)]
    edge.agent.load(edge.table(entries, 50).manifest)
    n = 0
    for i in range(200):
        src = f"127.90.{i % 6}.{1 + i // 6}"
        c = client(src)
        c.connect(("127.0.0.1", ls.getsockname()[1]))
        acc, peer = ls.accept()
        assert peer[0] == "::ffff:" + src, f"dual-stack peer {peer[0]}"
        want = b if src.startswith("127.90.3.") else a
        assert sock_cc(acc) == want, f"v4-mapped {src}: got {sock_cc(acc)}, want {want}"
        acc.close(), c.close()
        n += 1
    for i in range(40):
        src = f"127.90.9.{i + 1}"
        c = client(src)
        c.connect(("127.0.0.1", ab.getsockname()[1]))
        acc, _ = ab.accept()
        want = a if tf.ab_bucket_odd(src) else default
        assert sock_cc(acc) == want, f"A/B on a mapped peer {src}: CRC over the 4 v4 bytes"
        acc.close(), c.close()
        n += 1
    cnt = edge.agent.status()["counters"]
    assert 0.35 * n <= cnt["log_sampled"] <= 0.65 * n, f"sample_rate 0.5: {cnt['log_sampled']}/{n}"
    time.sleep(0.2)
    assert cnt["log_sampled"] == cnt["log_emitted"] or edge.agent.status()["counters"][
        "log_emitted"] == cnt["log_sampled"], "every sampled connection emits on close"


def test_table_cc_equal_to_socket_cc(edge):
    """The program skips bpf_setsockopt(TCP_CONGESTION) when the accepted socket already runs the
    table's CC. What counts is the socket's own CC, not the sysctl default: a listener set to
    another CC hands that CC to its children, and a table entry naming the default must still
    switch them."""
    default = sysctl_cc()
    a, _ = other_ccs(default)
    with in_cgroup(edge.cgroup):
        plain = edge.track(listener())
        custom = edge.track(listener())
    custom.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, a.encode())
    edge.configure([Service(plain.getsockname()[1], "plain"),
                    Service(custom.getsockname()[1], "custom")])
    entries = [tf.Entry("127.40.0.0/16", default), tf.Entry("127.41.0.0/16", a)]
    edge.agent.load(edge.table(entries, 1).manifest)
    want = collections.Counter()
    for ls, inherited in ((plain, default), (custom, a)):
        for src, cc in (("127.40.0.9", default), ("127.41.0.9", a), ("127.42.0.9", None)):
            c, s, _ = connect_accept(ls, src)
            got = sock_cc(s)
            s.close()
            c.close()
            assert got == (cc or inherited), f"{src} on {inherited} listener: {got}, want {cc}"
            if cc:
                want[cc] += 1
    cnt = edge.agent.status()["counters"]
    assert cnt["established"] == 6 and cnt["lookups"] == 6 and cnt["miss"] == 2, cnt
    for cc in ("cubic", "bbr", "reno"):
        assert cnt[f"hit_{cc}"] == want[cc], f"hit_{cc} {cnt[f'hit_{cc}']} vs {want[cc]}"
    assert cnt["setsockopt_err"] == 0 and cnt["hit_keep"] == 0, cnt
