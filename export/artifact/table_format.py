"""Python mirror of export/edge/ccs_table.h: the binary prefix table the edge enforcer loads.

Little-endian, packed: a 64-byte header then 40-byte entries, all IPv4 entries first, then IPv6.
Addresses are in network byte order; an IPv4 address sits in the first 4 of the 16 address bytes.
See the header file for the field-by-field description and the manifest/signature layout
(export/artifact/signing.py writes and verifies those).

Address space rule (the kernel's too, ccs_table.h): an IPv4 client -- also an IPv4-mapped IPv6
address, ::ffff:a.b.c.d -- is decided only by IPv4 entries, an IPv6 client only by IPv6 entries.
So an IPv6 entry may not lie inside ::ffff:0:0/96 (`Entry` refuses it, hence `encode`, `decode`
and signing.write_table do); one that covers it (::/0, ::/8, ...) applies to IPv6 clients only.

`ab_bucket_odd(ip)` is the A/B split of ALICCS section 5.3 exactly as the kernel computes it:
CRC-32/IEEE (zlib.crc32) over the address bytes in network order (4 bytes for IPv4, also for an
IPv4-mapped IPv6 address; 16 for IPv6); odd -> treatment (table), even -> control (default CC).

Format 2 (issue 27) adds an optional flow tree after the entries: `Tree` of `TreeNode`s over the
handshake features (`TREE_FEATURES` = contract.HANDSHAKE_FEATURES, the kernel's CCS_FEAT_* ids),
and `decide` is the one Python copy of the kernel's decision from an entry, the tree and a flow's
handshake (ccs.bpf.c `on_established`), per flow mode (`FLOW_MODES`). Format 1 is refused.
"""
from __future__ import annotations

import hashlib
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ccselect.contract import HANDSHAKE_FEATURES

MAGIC = 0x31534343  # b"CCS1" as a little-endian u32
FORMAT = 2

HEADER_FMT = "<IHHHHIQQQIIHHHH8s"
ENTRY_FMT = "<BBBBHHII16sQ"
NODE_FMT = "<BBHHHII"
HEADER_SIZE = struct.calcsize(HEADER_FMT)
ENTRY_SIZE = struct.calcsize(ENTRY_FMT)
NODE_SIZE = struct.calcsize(NODE_FMT)
assert HEADER_SIZE == 64 and ENTRY_SIZE == 40 and NODE_SIZE == 16

#: (field name, offset) in C declaration order, checked against offsetof() by a test.
HEADER_FIELDS = (
    ("magic", 0), ("format", 4), ("header_size", 6), ("entry_size", 8), ("reserved0", 10),
    ("flags", 12), ("version", 16), ("created_unix", 24), ("expires_unix", 32), ("n_v4", 40),
    ("n_v6", 44), ("tree_nodes", 48), ("tree_node_size", 50), ("tree_min_purity_permille", 52),
    ("tree_min_leaf_permille", 54), ("reserved", 56),
)
ENTRY_FIELDS = (
    ("family", 0), ("prefix_len", 1), ("cc", 2), ("flags", 3), ("purity_permille", 4),
    ("reserved", 6), ("requests", 8), ("cwnd_clamp_segs", 12), ("addr", 16),
    ("pacing_rate_bps", 32),
)
NODE_FIELDS = (
    ("feature", 0), ("cc", 1), ("conf_permille", 2), ("left", 4), ("right", 6), ("threshold", 8),
    ("reserved", 12),
)

CC_IDS = {"keep": 0, "cubic": 1, "bbr": 2, "reno": 3}
CC_NAMES = {v: k for k, v in CC_IDS.items()}
FLAG_LOW_CONF = 0x01

V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

#: the flow tree (ccs_table.h CCS_TREE_*): node.feature is an index into TREE_FEATURES or TREE_LEAF
TREE_FEATURES = HANDSHAKE_FEATURES
TREE_LEAF = 0xFF
TREE_MAX_DEPTH = 8                          # leaves at depth <= 8 (the root has depth 0)
TREE_MAX_NODES = (1 << (TREE_MAX_DEPTH + 1)) - 1   # 511: a full tree of that depth
#: the service's flow mode (edge config `flow_mode:`, ccs_policy.flow_mode)
FLOW_MODES = ("off", "fill", "combine", "flow", "prior")
#: decision sources, as the transport log writes them (contract.DECISIONS)
SOURCES = ("table", "flow", "table+flow", "fallback", "default")


class TableFormatError(ValueError):
    """A table that does not follow ccs_table.h."""


@dataclass(frozen=True)
class Entry:
    """One prefix -> CC decision. `prefix` is an ip_network (or its text, e.g. "10.1.0.0/16")."""

    prefix: ipaddress.IPv4Network | ipaddress.IPv6Network
    cc: str
    purity_permille: int = 1000
    requests: int = 0
    low_confidence: bool = False
    pacing_rate_bps: int = 0
    cwnd_clamp_segs: int = 0

    def __post_init__(self):
        p = self.prefix
        if isinstance(p, str):
            p = ipaddress.ip_network(p, strict=True)
            object.__setattr__(self, "prefix", p)
        if not isinstance(p, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            raise TableFormatError(f"prefix must be an ip network, got {p!r}")
        if p.version == 6 and p.subnet_of(V4_MAPPED):
            raise TableFormatError(f"IPv6 prefix {p} lies inside {V4_MAPPED} (IPv4-mapped "
                                   "addresses are IPv4 clients: write an IPv4 entry)")
        if self.cc not in CC_IDS:
            raise TableFormatError(f"unknown cc {self.cc!r} (one of {sorted(CC_IDS)})")
        if not 0 <= self.purity_permille <= 1000:
            raise TableFormatError(f"purity_permille out of 0..1000: {self.purity_permille}")
        for name, hi in (("requests", U32_MAX), ("cwnd_clamp_segs", U32_MAX),
                         ("pacing_rate_bps", U64_MAX)):
            v = getattr(self, name)
            if not 0 <= v <= hi:
                raise TableFormatError(f"{name} out of range: {v}")

    @property
    def family(self) -> int:
        return self.prefix.version


@dataclass(frozen=True)
class TreeNode:
    """One node of the flow tree. An internal node sends a flow whose handshake feature
    TREE_FEATURES[feature] is <= threshold (unsigned 32-bit) to node `left`, else to `right`; a
    leaf (feature == TREE_LEAF) names a CC id (1..CC_MAX: cubic, bbr, reno) and its confidence,
    the share of the leaf's training flows of the type that CC serves, in permille."""

    feature: int
    threshold: int = 0
    left: int = 0
    right: int = 0
    cc: int = 0
    conf_permille: int = 0

    @property
    def is_leaf(self) -> bool:
        return self.feature == TREE_LEAF


@dataclass(frozen=True)
class Tree:
    """The flow tree a table carries: nodes[0] is the root, every child comes after its parent.
    An entry with purity below min_purity_permille is "mixed" (flow modes fill, combine, prior);
    a leaf with confidence below min_leaf_permille is "unsure" (flow mode prior)."""

    nodes: tuple[TreeNode, ...]
    min_purity_permille: int = 1000
    min_leaf_permille: int = 0

    def __post_init__(self):
        validate_tree(self)

    def depth(self) -> int:
        d = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            if not n.is_leaf:
                d[n.left] = d[n.right] = d[i] + 1
        return max(d)


CC_MAX = max(CC_IDS.values())


def validate_tree(tree: Tree) -> None:
    """The agent's checks (table.c check_tree), in the same order and words: a tree the kernel
    walks with a bounded loop must be a tree (each node but the root has exactly one parent, which
    comes before it: no cycle), of depth <= TREE_MAX_DEPTH, splitting on known features, ending in
    leaves that name a CC."""
    nodes = tree.nodes
    n = len(nodes)
    if not 1 <= n <= TREE_MAX_NODES:
        raise TableFormatError(f"tree: {n} nodes (1..{TREE_MAX_NODES})")
    if not 0 <= tree.min_purity_permille <= 1000:
        raise TableFormatError(f"tree: min_purity_permille {tree.min_purity_permille} out of 0..1000")
    if not 0 <= tree.min_leaf_permille <= 1000:
        raise TableFormatError(f"tree: min_leaf_permille {tree.min_leaf_permille} out of 0..1000")
    parents = [0] * n
    depth = [0] * n
    for i, nd in enumerate(nodes):
        if nd.is_leaf:
            if not 1 <= nd.cc <= CC_MAX:
                raise TableFormatError(f"tree node {i}: leaf with unknown cc id {nd.cc}")
            if not 0 <= nd.conf_permille <= 1000:
                raise TableFormatError(f"tree node {i}: leaf confidence {nd.conf_permille} out of 0..1000")
            if nd.left or nd.right or nd.threshold:
                raise TableFormatError(f"tree node {i}: leaf with children or a threshold")
            continue
        if not 0 <= nd.feature < len(TREE_FEATURES):
            raise TableFormatError(f"tree node {i}: bad feature id {nd.feature}")
        if not 0 <= nd.threshold <= U32_MAX:
            raise TableFormatError(f"tree node {i}: threshold {nd.threshold} out of the u32 range")
        if nd.cc or nd.conf_permille:
            raise TableFormatError(f"tree node {i}: split with a cc")
        for child in (nd.left, nd.right):
            if not 0 <= child < n:
                raise TableFormatError(f"tree node {i}: child {child} out of range (0..{n - 1})")
            if child <= i:
                raise TableFormatError(f"tree node {i}: child {child} not after its parent (a cycle)")
            parents[child] += 1
            depth[child] = depth[i] + 1
            if depth[child] > TREE_MAX_DEPTH:
                raise TableFormatError(f"tree node {child}: depth {depth[child]} over the bound {TREE_MAX_DEPTH}")
    for i in range(1, n):
        if parents[i] != 1:
            raise TableFormatError(f"tree node {i}: {parents[i]} parents (a tree has exactly one)")


@dataclass(frozen=True)
class Table:
    version: int
    created_unix: int
    expires_unix: int
    entries: tuple[Entry, ...] = field(default_factory=tuple)
    tree: Tree | None = None

    @property
    def n_v4(self) -> int:
        return sum(1 for e in self.entries if e.family == 4)

    @property
    def n_v6(self) -> int:
        return sum(1 for e in self.entries if e.family == 6)


def _sorted_entries(entries) -> list[Entry]:
    v4 = [e for e in entries if e.family == 4]
    v6 = [e for e in entries if e.family == 6]
    key = lambda e: (int(e.prefix.network_address), e.prefix.prefixlen)  # noqa: E731
    return sorted(v4, key=key) + sorted(v6, key=key)


def encode_entry(e: Entry) -> bytes:
    addr = e.prefix.network_address.packed.ljust(16, b"\0")
    flags = FLAG_LOW_CONF if e.low_confidence else 0
    return struct.pack(ENTRY_FMT, e.family, e.prefix.prefixlen, CC_IDS[e.cc], flags,
                       e.purity_permille, 0, e.requests, e.cwnd_clamp_segs, addr,
                       e.pacing_rate_bps)


def encode_node(nd: TreeNode) -> bytes:
    return struct.pack(NODE_FMT, nd.feature, nd.cc, nd.conf_permille, nd.left, nd.right,
                       nd.threshold, 0)


def encode(table: Table) -> bytes:
    """The binary table (header + entries, v4 first, each family sorted by address, then the
    flow tree's nodes when it has one)."""
    entries = _sorted_entries(table.entries)
    seen = set()
    for e in entries:
        if e.prefix in seen:
            raise TableFormatError(f"duplicate prefix {e.prefix}")
        seen.add(e.prefix)
    for name in ("version", "created_unix", "expires_unix"):
        if not 0 <= getattr(table, name) <= U64_MAX:
            raise TableFormatError(f"{name} out of range")
    n4 = sum(1 for e in entries if e.family == 4)
    tree = table.tree
    nodes = tree.nodes if tree is not None else ()
    hdr = struct.pack(HEADER_FMT, MAGIC, FORMAT, HEADER_SIZE, ENTRY_SIZE, 0, 0, table.version,
                      table.created_unix, table.expires_unix, n4, len(entries) - n4, len(nodes),
                      NODE_SIZE if nodes else 0, tree.min_purity_permille if tree is not None else 0,
                      tree.min_leaf_permille if tree is not None else 0, b"\0" * 8)
    return hdr + b"".join(encode_entry(e) for e in entries) + b"".join(encode_node(n) for n in nodes)


def content_sha256(data: bytes) -> str:
    """sha256 of a binary table without its two clock fields (created_unix, expires_unix): what two
    exports of the same decisions share, wherever and whenever they ran (the manifest's `sha256`
    covers the whole .bin, clock included, which is what the agent checks)."""
    decode(data)                                   # only a well-formed table has a content
    offs = dict(HEADER_FIELDS)
    blob = bytearray(data)
    for name in ("created_unix", "expires_unix"):
        blob[offs[name]:offs[name] + 8] = bytes(8)
    return hashlib.sha256(bytes(blob)).hexdigest()


def decode(data: bytes) -> Table:
    """Parse and validate a binary table; raises TableFormatError on anything off-format."""
    if len(data) < HEADER_SIZE:
        raise TableFormatError(f"short table: {len(data)} bytes")
    (magic, fmt, hsize, esize, _r0, _flags, version, created, expires, n4, n6, n_nodes,
     node_size, min_purity, min_leaf, _res) = struct.unpack_from(HEADER_FMT, data, 0)
    if magic != MAGIC:
        raise TableFormatError(f"bad magic {magic:#x}")
    if fmt != FORMAT:
        raise TableFormatError(f"unsupported format {fmt}: this reader takes format {FORMAT} only "
                               "(re-export the table)")
    if hsize != HEADER_SIZE or esize != ENTRY_SIZE or node_size != (NODE_SIZE if n_nodes else 0):
        raise TableFormatError(f"unsupported format {fmt} (header {hsize}, entry {esize}, "
                               f"tree node {node_size})")
    want = HEADER_SIZE + (n4 + n6) * ENTRY_SIZE + n_nodes * NODE_SIZE
    if len(data) != want:
        raise TableFormatError(f"size {len(data)} != {want} for {n4}+{n6} entries")
    entries = []
    for i in range(n4 + n6):
        (fam, plen, cc, flags, purity, _r, req, clamp, addr,
         pacing) = struct.unpack_from(ENTRY_FMT, data, HEADER_SIZE + i * ENTRY_SIZE)
        if fam != (4 if i < n4 else 6):
            raise TableFormatError(f"entry {i}: family {fam} out of order")
        if cc not in CC_NAMES:
            raise TableFormatError(f"entry {i}: unknown cc id {cc}")
        try:
            if fam == 4:
                if any(addr[4:]):
                    raise TableFormatError(f"entry {i}: nonzero bytes after an IPv4 address")
                net = ipaddress.IPv4Network((addr[:4], plen), strict=True)
            else:
                net = ipaddress.IPv6Network((addr, plen), strict=True)
        except ValueError as exc:
            raise TableFormatError(f"entry {i}: {exc}") from None
        try:
            entries.append(Entry(net, CC_NAMES[cc], purity, req, bool(flags & FLAG_LOW_CONF),
                                 pacing, clamp))
        except TableFormatError as exc:
            raise TableFormatError(f"entry {i}: {exc}") from None
    tree = None
    if n_nodes:
        base = HEADER_SIZE + (n4 + n6) * ENTRY_SIZE
        nodes = []
        for i in range(n_nodes):
            feat, cc, conf, left, right, thr, res = struct.unpack_from(NODE_FMT, data, base + i * NODE_SIZE)
            if res:
                raise TableFormatError(f"tree node {i}: nonzero reserved bytes")
            nodes.append(TreeNode(feat, thr, left, right, cc, conf))
        tree = Tree(tuple(nodes), min_purity, min_leaf)
    elif min_purity or min_leaf:
        raise TableFormatError("tree min purity or min leaf confidence without a tree")
    return Table(version, created, expires, tuple(entries), tree)


def ab_address_bytes(ip: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """The bytes the A/B CRC is taken over: 4 for IPv4 (and IPv4-mapped IPv6), else 16."""
    a = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if a.version == 6 and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return a.packed


def ab_crc(ip) -> int:
    return zlib.crc32(ab_address_bytes(ip)) & 0xFFFFFFFF


def ab_bucket_odd(ip) -> bool:
    """True -> treatment (the table is applied); False -> control (default CC)."""
    return bool(ab_crc(ip) & 1)


def lookup(table: Table, ip) -> Entry | None:
    """Longest-prefix match, as the kernel's trie does: an IPv4 client (also a v4-mapped v6
    address) only among the IPv4 entries, an IPv6 client only among the IPv6 ones (an IPv6 entry
    covering ::ffff:0:0/96, e.g. ::/0, never decides for an IPv4 client)."""
    a = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if a.version == 6 and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    best = None
    for e in table.entries:
        if e.family == a.version and a in e.prefix:
            if best is None or e.prefix.prefixlen > best.prefix.prefixlen:
                best = e
    return best


# ---- the decision (ccs.bpf.c on_established, after the A/B split) -------------------------------

def tree_leaves(tree: Tree, x) -> np.ndarray:
    """The leaf index each row of x [N, len(TREE_FEATURES)] (unsigned 32-bit values) reaches:
    the kernel's bounded walk (TREE_MAX_DEPTH steps; a validated tree is at a leaf by then)."""
    x = np.asarray(x, dtype=np.int64).reshape(-1, len(TREE_FEATURES))
    if ((x < 0) | (x > U32_MAX)).any():
        raise ValueError("handshake features must be u32 values, as the kernel reads them")
    feat = np.array([n.feature for n in tree.nodes], dtype=np.int64)
    thr = np.array([n.threshold for n in tree.nodes], dtype=np.int64)
    left = np.array([n.left for n in tree.nodes], dtype=np.int64)
    right = np.array([n.right for n in tree.nodes], dtype=np.int64)
    idx = np.zeros(len(x), dtype=np.int64)
    rows = np.arange(len(x))
    for _ in range(TREE_MAX_DEPTH):
        f = feat[idx]
        inner = f != TREE_LEAF
        if not inner.any():
            break
        v = x[rows, np.where(inner, f, 0)]
        idx = np.where(inner, np.where(v <= thr[idx], left[idx], right[idx]), idx)
    return idx


def decide(hit, entry_cc, low_conf, purity, tree: Tree | None, x, mode: str):
    """The kernel's decision for treatment connections of a live, unexpired table (the A/B
    control, stale and no-table paths come before it and never reach the tree).

    hit: the LPM lookup matched (bool [N]); entry_cc: the entry's CC id (0 keep); low_conf: the
    entry's CCS_ENTRY_LOW_CONF flag; purity: its purity in permille; x: the handshake features
    [N, 3] in TREE_FEATURES order; mode: the service's flow mode (FLOW_MODES). Scalars broadcast.

    A "confident" entry names a CC, is not low-confidence, and has purity >= the tree's
    min_purity_permille. off (or no tree): the table alone (miss -> default, keep/low-confidence
    -> fallback). fill: the tree's leaf where the entry is not confident (a miss too). combine:
    as fill, and on a confident entry the leaf's CC wins when it differs and the leaf's confidence
    exceeds the entry's purity ("table+flow"; ALICCS's prefix prior refined by the flow, as
    Disco [47] decides from the handshake alone). flow: the leaf always. prior: the leaf, except
    where a confident entry meets an unsure leaf (confidence below the tree's min_leaf_permille):
    there the entry ("table") — the flow first, the prefix's history where the flow says little.

    Returns (cc ids [N], 0 = the default CC; sources [N] of SOURCES)."""
    if mode not in FLOW_MODES:
        raise ValueError(f"flow mode {mode!r} not one of {FLOW_MODES}")
    x = np.asarray(x, dtype=np.int64).reshape(-1, len(TREE_FEATURES))
    n = len(x)
    hit = np.broadcast_to(np.asarray(hit, dtype=bool), (n,))
    ecc = np.broadcast_to(np.asarray(entry_cc, dtype=np.int64), (n,))
    low = np.broadcast_to(np.asarray(low_conf, dtype=bool), (n,))
    pur = np.broadcast_to(np.asarray(purity, dtype=np.int64), (n,))
    table_cc = hit & (ecc >= 1) & (ecc <= CC_MAX) & ~low
    cc = np.where(table_cc, ecc, 0)
    src = np.where(table_cc, "table", np.where(hit, "fallback", "default")).astype(object)
    if mode == "off" or tree is None:
        return cc, src
    leaf = tree_leaves(tree, x)
    lcc = np.array([nd.cc for nd in tree.nodes], dtype=np.int64)[leaf]
    lconf = np.array([nd.conf_permille for nd in tree.nodes], dtype=np.int64)[leaf]
    confident = table_cc & (pur >= tree.min_purity_permille)
    if mode == "flow":
        use_leaf = np.ones(n, dtype=bool)
    elif mode == "prior":
        use_leaf = ~confident | (lconf >= tree.min_leaf_permille)
    else:
        use_leaf = ~confident
    cc = np.where(use_leaf, lcc, cc)
    src = np.where(use_leaf, "flow", src).astype(object)
    if mode == "combine":
        override = confident & (lcc != ecc) & (lconf > pur)
        cc = np.where(override, lcc, cc)
        src = np.where(override, "table+flow", src).astype(object)
    return cc, src
