"""The enforcer's lookup (issue 29): binary search on prefix lengths over an exact-match hash with
markers (export/edge/ccs.h), checked on real connections against the table format's own longest
match (table_format.lookup), on tables whose prefix lengths are many and nested, where a marker's
best match is what decides."""
from __future__ import annotations

import ipaddress
import random
import socket

import pytest
from _edge_helpers import connect_accept, expected_cc, in_cgroup, listener, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import table_format as tf
from ccselect.export.edge.agent import Service

pytestmark = pytest.mark.kernel


def _nested_v4(rng, n, ccs):
    """n distinct prefixes inside 127.0.0.0/8 of every length /16../32, drawn so that they nest:
    each new prefix is cut from a random address under an earlier one (or anywhere in 127/8)."""
    out, seen = [], set()
    while len(out) < n:
        if out and rng.random() < 0.8:
            parent = rng.choice(out).prefix
            base = int(parent.network_address) + rng.randrange(parent.num_addresses)
            plen = rng.randrange(parent.prefixlen, 33)
        else:
            base = (127 << 24) | rng.randrange(1 << 24)
            plen = rng.randrange(16, 33)
        net = ipaddress.IPv4Network((base >> (32 - plen) << (32 - plen), plen))
        if net in seen:
            continue
        seen.add(net)
        r = rng.random()
        cc = "keep" if r < 0.05 else rng.choice(ccs)
        out.append(tf.Entry(net, cc, low_confidence=0.05 <= r < 0.1,
                            purity_permille=550 if 0.05 <= r < 0.1 else 1000))
    return out


def _sources(rng, entries, n):
    """Addresses inside the entries (at their edges too) and some anywhere in 127/8."""
    out = []
    for _ in range(n):
        if rng.random() < 0.85:
            p = rng.choice(entries).prefix
            k = rng.choice((0, p.num_addresses - 1, rng.randrange(p.num_addresses)))
            a = ipaddress.IPv4Address(int(p.network_address) + k)
        else:
            a = ipaddress.IPv4Address((127 << 24) | rng.randrange(1 << 24))
        # 127.0.0.0 and broadcast-like hosts bind fine on lo; skip only 127.255.255.255
        if str(a) != "127.255.255.255":
            out.append(str(a))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_binary_search_on_lengths_matches_the_longest_prefix(edge, seed):
    default = sysctl_cc()
    ccs = other_ccs(default)
    rng = random.Random(seed)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(backlog=1024))
    edge.configure([Service(ls.getsockname()[1], "video")])
    entries = _nested_v4(rng, 400, ccs)
    # IPv6 entries beside them (their own lengths, their own markers), and ::/0, which must never
    # decide for an IPv4 client
    entries += [tf.Entry("::/0", ccs[0]), tf.Entry("2001:db8::/32", ccs[-1]),
                tf.Entry("2001:db8:1::/48", ccs[0])]
    assert len({e.prefix.prefixlen for e in entries if e.prefix.version == 4}) >= 15
    edge.agent.load(edge.table(entries, 1).manifest)
    sources = _sources(rng, [e for e in entries if e.prefix.version == 4], 700)
    wrong = []
    decisions = {}
    for src in sources:
        c, a, _ = connect_accept(ls, src)
        want, dec = expected_cc(entries, src, default)
        decisions[dec] = decisions.get(dec, 0) + 1
        got = sock_cc(a)
        if got != want:
            wrong.append((src, got, want, dec))
        a.close()
        c.close()
    assert not wrong, f"{len(wrong)} of {len(sources)} wrong, e.g. {wrong[:5]}"
    # every kind of outcome was exercised
    assert decisions.get("table", 0) > 300 and decisions.get("fallback", 0) > 10 and \
        decisions.get("default", 0) > 10, decisions
    cnt = edge.agent.status()["counters"]
    assert cnt["lookups"] == len(sources) and cnt["setsockopt_err"] == 0, cnt


def test_ipv6_lengths_on_loopback(edge):
    """::1 against tables whose entries cover it at /0, /64, /100, /127 and /128, each table one
    length fewer from the top: the longest one left decides, through the markers that lengths of
    other entries put on the search path."""
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener(socket.AF_INET6, "::1"))
    edge.configure([Service(ls.getsockname()[1], "video")])
    covering = [("::/0", a), ("::/64", b), ("::/100", a), ("::/127", b), ("::1/128", a)]
    others = [tf.Entry("2001:db8::/32", b), tf.Entry("2001:db8:5::/48", a),
              tf.Entry("2001:db8:5:1::/64", b), tf.Entry("2001:db8::7/128", b),
              tf.Entry("10.0.0.0/8", a)]
    for v, k in enumerate(range(len(covering), 0, -1), start=1):
        entries = [tf.Entry(p, cc) for p, cc in covering[:k]] + others
        edge.agent.load(edge.table(entries, v).manifest)
        c, acc, _ = connect_accept(ls, "::1")
        want, _ = expected_cc(entries, "::1", default)
        assert want == covering[k - 1][1]
        assert sock_cc(acc) == want, f"table {v} (longest {covering[k - 1][0]}): {sock_cc(acc)}"
        acc.close()
        c.close()
