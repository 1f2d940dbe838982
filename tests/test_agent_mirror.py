"""export/delivery/mirror.py: the agent's decision order in Python for the reacting fleet (issue 58),
case by case as export/edge/README.md "Decisions" lists them, and its lookup index against
table_format.lookup (the kernel's mirror, checked against the kernel by tests/kernel/test_lookup.py)."""
from __future__ import annotations

import ipaddress

import numpy as np

from ccselect.export.artifact import table_format as tf
from ccselect.export.delivery import mirror
from ccselect.export.edge.agent import Service


def _table(entries, tree=None):
    return tf.Table(7, 0, 1, tuple(entries), tree)


def test_the_index_finds_what_lookup_finds():
    rng = np.random.default_rng(1)
    entries = [tf.Entry("81.0.0.0/8", "bbr"), tf.Entry("81.20.0.0/16", "cubic"), tf.Entry("81.20.7.0/24", "bbr"),
               tf.Entry("81.20.7.128/25", "keep"), tf.Entry("2001:db8::/32", "bbr"), tf.Entry("2001:db8:5::/48", "cubic"),
               tf.Entry("::/0", "reno"), tf.Entry("0.0.0.0/0", "cubic")]
    t = _table(entries)
    idx = mirror.LookupIndex(t)
    ips = ["81.20.7.200", "81.20.7.3", "81.20.9.1", "81.99.0.1", "9.9.9.9", "::ffff:81.20.7.200",
           "2001:db8:5::1", "2001:db8:6::1", "2a00::1"]
    ips += [str(ipaddress.IPv4Address(int(x))) for x in rng.integers(81 << 24, 82 << 24, 300)]
    ips += [str(ipaddress.IPv6Address((0x20010db8 << 96) | int(x) << 64)) for x in rng.integers(0, 1 << 20, 100)]
    assert [idx(ip) for ip in ips] == [tf.lookup(t, ip) for ip in ips]
    assert idx("::ffff:81.20.7.200").cc == "keep" and idx("2a00::1").cc == "reno"


def test_the_decision_order():
    tree = tf.Tree((tf.TreeNode(0, threshold=1400, left=1, right=2),          # mss_bytes <= 1400: bbr
                    tf.TreeNode(tf.TREE_LEAF, cc=2, conf_permille=900), tf.TreeNode(tf.TREE_LEAF, cc=1, conf_permille=900)),
                   min_purity_permille=900, min_leaf_permille=750)
    t = _table([tf.Entry("81.20.0.0/16", "bbr"), tf.Entry("81.21.0.0/16", "keep"),
                tf.Entry("81.22.0.0/16", "bbr", low_confidence=True), tf.Entry("81.23.0.0/16", "bbr", purity_permille=600)],
               tree)
    odd = [ip for ip in (f"81.{b}.0.{h}" for b in (20, 21, 22, 23, 30) for h in range(1, 60)) if tf.ab_bucket_odd(ip)]
    even = next(ip for ip in (f"81.20.0.{h}" for h in range(1, 60)) if not tf.ab_bucket_odd(ip))
    pick = {b: next(ip for ip in odd if ip.startswith(f"81.{b}.")) for b in (20, 21, 22, 23, 30)}
    ab = {443: Service(443, "video", ab=True), 80: Service(80, "image", ab=True, flow_mode="fill")}

    def one(ip, port=443, table=t, expired=False, services=ab, mss=1460):
        cc, dec, ver = mirror.decisions(table, expired, services, [ip], np.array([port]),
                                        np.array([[mss, 65535, 20000]]), "cubic")
        return cc[0], dec[0], ver[0]
    assert one(pick[20], port=8080) == ("cubic", "not_served", "7")          # 0. not a service
    assert one(pick[20], table=None) == ("cubic", "default", None)           # 1. no live table
    assert one(pick[20], expired=True) == ("cubic", "stale", "7")            # 2. expired
    assert one(even) == ("cubic", "ab_control", "7")                         # 3. the control arm
    assert one(even, services={443: Service(443)}) == ("bbr", "table", "7")  # no A/B: every client
    assert one(pick[20]) == ("bbr", "table", "7")                            # 4. lookup
    assert one(pick[30]) == ("cubic", "default", "7")                        #    miss
    assert one(pick[21]) == ("cubic", "fallback", "7")                       #    keep
    assert one(pick[22]) == ("cubic", "fallback", "7")                       #    low confidence
    assert one(pick[21], port=80, mss=1400) == ("bbr", "flow", "7")          # 5. fill: the leaf where not confident
    assert one(pick[23], port=80, mss=1500) == ("cubic", "flow", "7")        #    purity 600 < 900: not confident
    assert one(pick[20], port=80, mss=1400) == ("bbr", "table", "7")         #    confident: the entry
