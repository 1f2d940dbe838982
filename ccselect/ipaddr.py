"""Client-address parsing with Spark built-ins only (it runs on every connection, so no UDF).

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

One address form from ingest to the kernel: an IPv4-mapped address (`::ffff:0:0/96`) *is* its
IPv4 address — family 4, four packed bytes (so the A/B bucket is the CRC32 the kernel takes over
4 bytes), IPv4 prefixes, and the dotted quad as `text` (so joins by address meet the access log's
plain form). The table's address-space rule says the same (export/edge/README.md).
"""
from __future__ import annotations

import ipaddress

from pyspark.sql import Column, DataFrame, functions as F

_OCTET = r"(0|[1-9][0-9]{0,2})"
_V4 = rf"^{_OCTET}(\.{_OCTET}){{3}}$"
_HEXGROUP = r"^[0-9a-f]{1,4}$"

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


def _empty() -> Column:
    return F.array().cast("array<string>")


def _octets(text: Column) -> Column:
    """The four octets of a dotted quad as bigints, null unless it is one (each <= 255)."""
    o = F.when(text.rlike(_V4), F.split(text, r"\.").cast("array<bigint>"))
    return F.when(F.array_max(o) <= 255, o)


def _v6_prefix(hex32: Column, groups: int) -> Column:
    """`g1:g2:...::/<16*groups>` in compressed form: the trailing zero run is always the longest
    (at least 8-groups zeros follow), so compressing means dropping trailing zero groups."""
    parts = [F.lower(F.conv(F.substring(hex32, 1 + 4 * i, 4), 16, 16)) for i in range(groups)]
    stripped = F.regexp_replace(F.concat_ws(":", *parts), r"(^|:)0(:0)*$", "")
    return F.concat(stripped, F.lit(f"::/{16 * groups}"))


def with_ip(df: DataFrame, text: str | Column, out: str = "ip") -> DataFrame:
    """Add struct column `out` (family, packed, hex, v4_int, prefix16/24/48/64) parsed from `text`.

    Built step by step in columns so that Spark does not inline the IPv6 expansion many times.
    """
    c = F.col
    t = text if isinstance(text, Column) else c(text)
    # ::ffff:a.b.c.d is the IPv4 address a.b.c.d (module docstring): the text is rewritten before
    # it is parsed (a second pass over the expanded IPv6 form doubled the generated code of every
    # job that parses addresses, past the JVM's 64 KB a method in ingest's parse)
    df = (df.withColumn("_ip_t", t)
          .withColumn("_ip_w", _mapped_tail(c("_ip_t")))
          .withColumn("_ip_t", F.coalesce(_mapped_v4(c("_ip_w")), c("_ip_t")))
          .withColumn("_ip_o", _octets(c("_ip_t")))
          .withColumn("_ip_v4", c("_ip_o")[0] * 16777216 + c("_ip_o")[1] * 65536 + c("_ip_o")[2] * 256 + c("_ip_o")[3])
          # IPv6 only when there is a colon; an IPv4 tail (`::ffff:1.2.3.4`) becomes two hex groups.
          .withColumn("_ip_s", F.when(F.instr(c("_ip_t"), ":") > 0, F.lower(c("_ip_t"))))
          .withColumn("_ip_to", F.when(F.instr(c("_ip_s"), ".") > 0,
                                       _octets(F.regexp_extract(c("_ip_s"), r":([0-9.]+)$", 1))))
          .withColumn("_ip_s", F.when(F.instr(c("_ip_s"), ".") == 0, c("_ip_s"))
                      .when(c("_ip_to").isNotNull(), F.concat(
                          F.regexp_replace(c("_ip_s"), r"[0-9.]+$", ""),
                          F.lower(F.hex(c("_ip_to")[0] * 256 + c("_ip_to")[1])), F.lit(":"),
                          F.lower(F.hex(c("_ip_to")[2] * 256 + c("_ip_to")[3])))))
          .withColumn("_ip_h", F.split(c("_ip_s"), "::", -1))
          .withColumn("_ip_l", F.when(c("_ip_h")[0] == "", _empty()).otherwise(F.split(c("_ip_h")[0], ":", -1)))
          .withColumn("_ip_r", F.when((F.size("_ip_h") < 2) | (c("_ip_h")[1] == ""), _empty())
                      .otherwise(F.split(c("_ip_h")[1], ":", -1)))
          .withColumn("_ip_n", F.size("_ip_l") + F.size("_ip_r"))
          .withColumn("_ip_g", F.when((F.size("_ip_h") == 1) & (c("_ip_n") == 8), c("_ip_l"))
                      .when((F.size("_ip_h") == 2) & (c("_ip_n") <= 7),
                            F.concat(c("_ip_l"), F.array_repeat(F.lit("0"), 8 - c("_ip_n")), c("_ip_r"))))
          .withColumn("_ip_6", F.when(F.forall(c("_ip_g"), lambda g: g.rlike(_HEXGROUP)),
                                      F.concat_ws("", F.transform(c("_ip_g"), lambda g: F.lpad(g, 4, "0")))))
          .withColumn("_ip_6", F.when(c("_ip_v4").isNull(), c("_ip_6")))
          .withColumn("_ip_hex", F.coalesce(F.lpad(F.lower(F.hex(c("_ip_v4"))), 8, "0"), c("_ip_6"))))
    o = c("_ip_o")
    is_v4, is_v6 = c("_ip_v4").isNotNull(), c("_ip_6").isNotNull()
    ip = F.struct(
        F.when(is_v4, F.lit(4)).when(is_v6, F.lit(6)).alias("family"),
        F.when(is_v4 | is_v6, c("_ip_t")).alias("text"),
        F.unhex(c("_ip_hex")).alias("packed"),
        c("_ip_hex").alias("hex"),
        c("_ip_v4").alias("v4_int"),
        F.when(is_v4, F.concat_ws(".", o[0], o[1], F.lit("0.0/16"))).alias("prefix16"),
        F.when(is_v4, F.concat_ws(".", o[0], o[1], o[2], F.lit("0/24"))).alias("prefix24"),
        F.when(is_v6, _v6_prefix(c("_ip_6"), 3)).alias("prefix48"),
        F.when(is_v6, _v6_prefix(c("_ip_6"), 4)).alias("prefix64"),
    )
    return df.withColumn(out, ip).drop(*[n for n in df.columns if n.startswith("_ip_")])


def ab_bucket(packed: Column) -> Column:
    """CRC32 (zlib's) of the packed address bytes; odd = treatment."""
    return F.crc32(packed)


def canonical(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The Python mirror of `with_ip`'s address: an IPv4-mapped IPv6 address is its IPv4 address."""
    a = ipaddress.ip_address(text)
    return a.ipv4_mapped or a if a.version == 6 else a
