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
"""
from __future__ import annotations

import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = 0x31534343  # b"CCS1" as a little-endian u32
FORMAT = 1

HEADER_FMT = "<IHHHHIQQQII16s"
ENTRY_FMT = "<BBBBHHII16sQ"
HEADER_SIZE = struct.calcsize(HEADER_FMT)
ENTRY_SIZE = struct.calcsize(ENTRY_FMT)
assert HEADER_SIZE == 64 and ENTRY_SIZE == 40

#: (field name, offset) in C declaration order, checked against offsetof() by a test.
HEADER_FIELDS = (
    ("magic", 0), ("format", 4), ("header_size", 6), ("entry_size", 8), ("reserved0", 10),
    ("flags", 12), ("version", 16), ("created_unix", 24), ("expires_unix", 32), ("n_v4", 40),
    ("n_v6", 44), ("reserved", 48),
)
ENTRY_FIELDS = (
    ("family", 0), ("prefix_len", 1), ("cc", 2), ("flags", 3), ("purity_permille", 4),
    ("reserved", 6), ("requests", 8), ("cwnd_clamp_segs", 12), ("addr", 16),
    ("pacing_rate_bps", 32),
)

CC_IDS = {"keep": 0, "cubic": 1, "bbr": 2, "reno": 3}
CC_NAMES = {v: k for k, v in CC_IDS.items()}
FLAG_LOW_CONF = 0x01

V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


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
class Table:
    version: int
    created_unix: int
    expires_unix: int
    entries: tuple[Entry, ...] = field(default_factory=tuple)

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


def encode(table: Table) -> bytes:
    """The binary table (header + entries, v4 first, each family sorted by address)."""
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
    hdr = struct.pack(HEADER_FMT, MAGIC, FORMAT, HEADER_SIZE, ENTRY_SIZE, 0, 0, table.version,
                      table.created_unix, table.expires_unix, n4, len(entries) - n4, b"\0" * 16)
    return hdr + b"".join(encode_entry(e) for e in entries)


def decode(data: bytes) -> Table:
    """Parse and validate a binary table; raises TableFormatError on anything off-format."""
    if len(data) < HEADER_SIZE:
        raise TableFormatError(f"short table: {len(data)} bytes")
    (magic, fmt, hsize, esize, _r0, _flags, version, created, expires, n4, n6,
     _res) = struct.unpack_from(HEADER_FMT, data, 0)
    if magic != MAGIC:
        raise TableFormatError(f"bad magic {magic:#x}")
    if fmt != FORMAT or hsize != HEADER_SIZE or esize != ENTRY_SIZE:
        raise TableFormatError(f"unsupported format {fmt} (header {hsize}, entry {esize})")
    want = HEADER_SIZE + (n4 + n6) * ENTRY_SIZE
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
    return Table(version, created, expires, tuple(entries))


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
