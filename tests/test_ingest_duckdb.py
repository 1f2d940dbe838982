"""The ingest bench's DuckDB reference (bench/ingest_duckdb.py) computes the address work with SQL
built-ins only: its CRC32 (lookup tables, DuckDB has no crc32) is zlib's, and its family,
canonical text, prefixes and A/B bucket are what ccselect.ipaddr's Python mirror and zlib give,
address for address. DuckDB alone, no Spark: cheap."""
from __future__ import annotations

import ipaddress
import random
import zlib

import duckdb

from bench.ingest_duckdb import MACROS, address_ctes, crc_sql, crc_tables
from ccselect.ipaddr import canonical


def test_crc_tables_give_zlib_crc32():
    rng = random.Random(3)
    for n in (4, 16):
        c0, tables = crc_tables(n)
        for _ in range(200):
            m = bytes(rng.randrange(256) for _ in range(n))
            got = c0
            for j, b in enumerate(m):
                got ^= tables[j][b]
            assert got == zlib.crc32(m)
    con = duckdb.connect()
    m = bytes(range(250, 254))
    assert con.execute(f"SELECT {crc_sql([str(b) for b in m])}").fetchone()[0] == zlib.crc32(m)


def _python(ip: str) -> tuple:
    a = canonical(ip)
    if a.version == 4:
        o = str(a).split(".")
        return (4, str(a), f"{o[0]}.{o[1]}.0.0/16", f"{o[0]}.{o[1]}.{o[2]}.0/24", None, None, zlib.crc32(a.packed))
    return (6, ip, None, None, str(ipaddress.ip_network(f"{a}/48", strict=False)),
            str(ipaddress.ip_network(f"{a}/64", strict=False)), zlib.crc32(a.packed))


def test_address_sql_matches_python_row_for_row():
    rng = random.Random(7)
    ips = ["1.2.3.4", "0.0.0.0", "255.255.255.255", "10.0.0.1", "::", "::1", "1::", "2001:db8::1",
           "2001:0:0:1::", "0:1::", "0:0:1::", "2001:db8:0:0:1::", "::ffff:1.2.3.4", "::ffff:102:304",
           "0:0:0:0:0:ffff:a0b:c0d", "64:ff9b::1.2.3.4", "::1.2.3.4", "FE80::ABCD", "2400:0DB8:00:1::7"]
    for _ in range(300):
        ips.append(str(ipaddress.IPv4Address(rng.getrandbits(32))))
        bits = rng.getrandbits(128) & ~(((1 << rng.randrange(0, 100)) - 1) << rng.randrange(0, 28))
        ips.append(str(ipaddress.IPv6Address(bits)))
    con = duckdb.connect()
    for stmt in [s for s in MACROS.split(";\n") if s.strip()]:
        con.execute(stmt)
    con.execute("CREATE TABLE x (i INT, client_ip VARCHAR)")
    con.executemany("INSERT INTO x VALUES (?, ?)", list(enumerate(ips)))
    rows = con.execute(f"""WITH t0 AS (SELECT i, client_ip, lower(client_ip) AS s FROM x), {address_ctes()})
        SELECT family, ip_text, prefix16, prefix24, prefix48, prefix64, ab_bucket, ip_ok(client_ip) FROM t ORDER BY i""").fetchall()
    for ip, row in zip(ips, rows):
        assert row[:7] == _python(ip), ip
        assert row[7], ip
    bad = ["1.2.3", "256.1.1.1", "01.2.3.4", "1:2:3:4:5:6:7", "1::2::3", ":1:2:3:4:5:6:7", "12345::", "g::1", "", "1.2.3.4 "]
    got = con.execute("SELECT ip_ok(s) FROM unnest(?) AS u(s)", [bad]).fetchall()
    for ip, (ok,) in zip(bad, got):
        try:
            ipaddress.ip_address(ip)
            valid = True
        except ValueError:
            valid = False
        assert ok == valid, ip
