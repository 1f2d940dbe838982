"""Client-address parsing on every connection, in the JVM: `with_ip` calls `ccs_ip`
(jvm/src/ccselect/udf/IpAddress.java, one pass over the text; no Python worker).

`with_ip(df, col)` adds a struct:
  family      4 or 6 (null when the text is not an address)
  text        the canonical text: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack
              listener logs for an IPv4 client) as its dotted quad; any other address as written
  packed      the address's network-order bytes (4 or 16) — what CRC32 is taken over
  hex         those bytes as lowercase hex (8 or 32 characters)
  v4_int      IPv4 as an unsigned 32-bit integer (bigint), null for IPv6
  prefix16/24 IPv4 `a.b.0.0/16`, `a.b.c.0/24`
  prefix48/64 IPv6 `2408:833e:d113::/48`, in Python's `ipaddress` compressed form

`ab_bucket` is CRC32 (IEEE, as zlib.crc32) of `packed`; odd = treatment (ALICCS Appendix A).
The forms accepted are the ones `ipaddress.ip_address` accepts, minus IPv6 zone ids: IPv4 dotted
quads without leading zeros, IPv6 with at most one `::` and an optional dotted-quad tail.
(It was Spark built-ins — regexes, and array functions Spark runs interpreted — until a JVM
function was possible without a Python worker; measured on silver's 1 M connections, warm, into a
`noop` sink: 18.7 s with them, 12.3 s with no address parsing at all.)

One address form from ingest to the kernel: an IPv4-mapped address (`::ffff:0:0/96`) *is* its
IPv4 address — family 4, four packed bytes (so the A/B bucket is the CRC32 the kernel takes over
4 bytes), IPv4 prefixes, and the dotted quad as `text` (so joins by address meet the access log's
plain form). The table's address-space rule says the same (export/edge/README.md).
`canonical_text` (built-ins, regexes only where the text contains `ffff`) rewrites the text alone.
"""
from __future__ import annotations

import ipaddress

from pyspark.sql import Column, DataFrame, functions as F

from ccselect.spark import IP, register_udfs


def _mapped_regexes() -> tuple[str, str]:
    """The text forms of an IPv4-mapped address (RFC 4291 §2.5.5.2: five zero groups, ffff, then
    the IPv4 address as a dotted quad or two hex groups), lowercase: (the prefix written out, then
    any tail, its `::` compressing zero groups of the tail; a `::` in the prefix — a + b <= 4
    zeros written around it — then a full tail). Group 1 is the tail after `ffff`."""
    z, h, q = "0{1,4}", "[0-9a-f]{1,4}", r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}"
    written = f"^(?:{z}:){{5}}ffff(:{q}|:{h}:{h}|::(?:{h})?|:{h}::)$"
    compressed = [f"{z}(?::{z}){{{a - 1}}}::(?:{z}:){{{b}}}" if a else f"::(?:{z}:){{{b}}}"
                  for a in range(5) for b in range(5 - a)]
    return written, "^(?:" + "|".join(compressed) + f")ffff(:{q}|:{h}:{h})$"


_MAPPED_WRITTEN, _MAPPED_COMPRESSED = _mapped_regexes()
_HEX_TAIL = r"^:(?:([0-9a-f]{1,4}):([0-9a-f]{1,4})|:([0-9a-f]{1,4})?|([0-9a-f]{1,4})::)$"


def _nonempty(c: Column) -> Column:
    return F.when(c != "", c)


def canonical_text(text: Column) -> Column:
    """The address text with an IPv4-mapped address written as its dotted quad (module
    docstring); any other text as it is. Regexes only where the text contains `ffff`."""
    return F.coalesce(_mapped_v4(_mapped_tail(text)), text)


def _mapped_tail(text: Column) -> Column:
    """The tail after `ffff` of an IPv4-mapped address's text; null for any other text."""
    low = F.lower(text)
    return F.when(F.instr(low, "ffff") > 0, F.coalesce(_nonempty(F.regexp_extract(low, _MAPPED_WRITTEN, 1)),
                                                       _nonempty(F.regexp_extract(low, _MAPPED_COMPRESSED, 1))))


def _mapped_v4(tail: Column) -> Column:
    """The dotted quad of an IPv4-mapped address from its tail after `ffff` (`:a.b.c.d`,
    `:HHHH:HHHH`, `::`, `::H`, `:H::`); null for a null tail."""
    def group(*idx):
        parts = [_nonempty(F.regexp_extract(tail, _HEX_TAIL, i)) for i in idx]
        return F.conv(F.coalesce(*parts, F.lit("0")), 16, 10).cast("bigint")
    g6, g7 = group(1, 4), group(2, 3)
    return (F.when(tail.rlike(r"^:[0-9.]+$"), F.substring(tail, 2, 64))
            .when(tail.isNotNull(), F.concat_ws(".", F.shiftright(g6, 8), g6 % 256, F.shiftright(g7, 8), g7 % 256)))


def with_ip(df: DataFrame, text: str | Column, out: str = "ip") -> DataFrame:
    """Add struct column `out` (family, text, packed, hex, v4_int, prefix16/24/48/64) parsed from
    `text` (module docstring); every field null for a text that is not an address."""
    register_udfs(df.sparkSession)
    return df.withColumn(out, F.call_function(IP, text if isinstance(text, Column) else F.col(text)))


def ab_bucket(packed: Column) -> Column:
    """CRC32 (zlib's) of the packed address bytes; odd = treatment."""
    return F.crc32(packed)


def canonical(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The Python mirror of `with_ip`'s address: an IPv4-mapped IPv6 address is its IPv4 address."""
    a = ipaddress.ip_address(text)
    return a.ipv4_mapped or a if a.version == 6 else a
