"""The agent's decision for a batch of connections, in Python (issue 58's reacting fleet): what
CC, decision and table version the kernel program gives each accepted connection of a node,
given the table live there (with its flow tree), its expiry and the node's services — in the
order export/edge/README.md "Decisions" documents:

0. the local port is not a service → not decided: the listener's CC (the node's default) and
   `not_served` (the kernel logs no such connection; `decisions` says so and leaves it to the caller);
1. no live table → `default`; 2. the live table expired → `stale` (the default CC);
3. an A/B service and an even CRC-32 of the client's address → `ab_control` (the default CC);
4. the longest-prefix lookup (miss → `default`, keep or low confidence → `fallback`, else the
   entry's CC → `table`), then 5. the flow tree by the service's `flow_mode`
   (`table_format.decide`: `flow`, `table+flow`).

Building blocks are the artifact's own mirrors of the kernel: `table_format.ab_bucket_odd`
(CRC-32/IEEE over the address's network-order bytes), `table_format.lookup`'s longest match and
address-space rule (an index by prefix length here, the same answer: tests/test_rollout_follow.py
checks it against `lookup`) and `table_format.decide` (the kernel's decision after the split,
checked against the kernel by tests/kernel/test_flow_tree_kernel.py).
"""
from __future__ import annotations

import ipaddress
from typing import Sequence

import numpy as np

from ccselect.export.artifact import table_format as tf

NOT_SERVED = "not_served"


class LookupIndex:
    """`table_format.lookup` for many addresses: the table's entries by (family, prefix length),
    probed longest first; IPv4-mapped IPv6 clients are IPv4 clients (the address space rule)."""

    def __init__(self, table: tf.Table):
        self.by_len: dict[int, list[tuple[int, dict[int, tf.Entry]]]] = {4: [], 6: []}
        groups: dict[tuple[int, int], dict[int, tf.Entry]] = {}
        for e in table.entries:
            groups.setdefault((e.family, e.prefix.prefixlen), {})[int(e.prefix.network_address)] = e
        for (fam, plen), d in sorted(groups.items(), key=lambda kv: -kv[0][1]):
            self.by_len[fam].append((plen, d))
        self._memo: dict[str, tf.Entry | None] = {}

    def __call__(self, ip: str) -> tf.Entry | None:
        if ip in self._memo:
            return self._memo[ip]
        a = ipaddress.ip_address(ip)
        if a.version == 6 and a.ipv4_mapped is not None:
            a = a.ipv4_mapped
        bits = 32 if a.version == 4 else 128
        v, hit = int(a), None
        for plen, d in self.by_len[a.version]:
            key = (v >> (bits - plen)) << (bits - plen) if plen else 0
            if key in d:
                hit = d[key]
                break
        self._memo[ip] = hit
        return hit


def ab_odd(client_ip: Sequence[str], memo: dict[str, bool] | None = None) -> np.ndarray:
    """`table_format.ab_bucket_odd` of each address (remembered in `memo`: clients come back)."""
    memo = {} if memo is None else memo
    out = np.empty(len(client_ip), dtype=bool)
    for i, ip in enumerate(client_ip):
        v = memo.get(ip)
        if v is None:
            v = memo[ip] = tf.ab_bucket_odd(ip)
        out[i] = v
    return out


def decisions(table: tf.Table | None, expired: np.ndarray | bool, services: dict[int, object],
              client_ip: Sequence[str], server_port: np.ndarray, handshake: np.ndarray,
              default_cc: str = "cubic", index: LookupIndex | None = None, memo: dict[str, bool] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per connection: (CC name, decision, table version as logged: str, or None without a
    table). `services`: served port → the agent config's Service (`ab`, `flow_mode`);
    `expired`: per connection, was the live table past its expiry at the accept; `handshake`
    [N, 3]: `table_format.TREE_FEATURES` as logged; `memo`: `ab_odd`'s. A keep/fallback/default decision gives
    `default_cc` (the listener's CC: the namespace's default)."""
    n = len(client_ip)
    port = np.asarray(server_port, dtype=np.int64)
    cc = np.full(n, default_cc, dtype=object)
    version = np.full(n, None if table is None else str(table.version), dtype=object)
    served = np.array([int(p) in services for p in port], dtype=bool)
    dec = np.where(served, "default", NOT_SERVED).astype(object)
    if table is None:
        version[:] = None
        return cc, dec, version
    expired = np.broadcast_to(np.asarray(expired, dtype=bool), (n,))
    dec[served & expired] = "stale"
    ab = np.array([bool(getattr(services.get(int(p)), "ab", False)) for p in port], dtype=bool)
    odd = ab_odd(client_ip, memo)
    control = served & ~expired & ab & ~odd
    dec[control] = "ab_control"
    looked = served & ~expired & ~control
    if not looked.any():
        return cc, dec, version
    index = index or LookupIndex(table)
    idx = np.flatnonzero(looked)
    entries = [index(client_ip[i]) for i in idx]
    hit = np.array([e is not None for e in entries], dtype=bool)
    ecc = np.array([tf.CC_IDS[e.cc] if e else 0 for e in entries], dtype=np.int64)
    low = np.array([bool(e and e.low_confidence) for e in entries], dtype=bool)
    pur = np.array([e.purity_permille if e else 0 for e in entries], dtype=np.int64)
    x = np.asarray(handshake, dtype=np.int64).reshape(-1, len(tf.TREE_FEATURES))[idx]
    modes = np.array([getattr(services[int(port[i])], "flow_mode", "off") for i in idx], dtype=object)
    for mode in set(modes):
        m = modes == mode
        ids, src = tf.decide(hit[m], ecc[m], low[m], pur[m], table.tree, x[m], mode)
        sel = idx[m]
        dec[sel] = src
        cc[sel] = np.where(ids == 0, default_cc, np.array([tf.CC_NAMES[int(i)] for i in ids], dtype=object))
    return cc, dec, version
