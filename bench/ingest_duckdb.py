"""The ingest bench's reference (issue 62): DuckDB doing ingest's work on the same files with its
own functions only — SQL expressions, macros and built-ins, no Python UDF.

The work, as jobs/ingest.py and jobs/silver.py do it:
  - every file read whole and cut into lines (1-based line numbers, a final newline is no line);
  - each line parsed against the stream's contract fields (`json_transform`), with a status and the
    first rule it breaks as its reason: bad_json, missing_key:<f>[,...], node_mismatch, bad_ip,
    unknown_cc, unknown_decision, unknown_net_type, mss_out_of_range, negative_rtt, absurd_rtt,
    out_of_range:<f>, out_of_hour, bad_time_order, then the duplicate rule (the first line by
    (file name, line) of an identity among a node-hour's accepted lines is kept);
  - bronze per stream (the raw line, its file and line, status, reason, the typed record),
    quarantine, and the per-file audit (lines read = accepted + quarantined), as Parquet;
  - silver: accepted transport records joined with the access log's per-connection label and
    totals and the QoE beacons' per-connection sums, the canonical address (an IPv4-mapped
    address is its IPv4 address), prefix16/24, prefix48/64 in Python's `ipaddress` compressed
    form, the A/B bucket (CRC32 of the packed address, as zlib.crc32), the user group by
    longest-prefix match against the reference, the derived rates; Parquet partitioned by
    (node_id, hour); and the per-(node, hour) feature statistics of silver.node_stats.

CRC32 without a crc32 function (DuckDB has none): CRC32 is affine over GF(2) in the message's
bits, so for a message of fixed length n, crc32(m) = crc32(0^n) XOR T_0[m_0] XOR ... XOR
T_{n-1}[m_{n-1}], with T_j[b] = crc32(b at position j, zeros elsewhere) XOR crc32(0^n). The
tables (4 x 256 for IPv4, 16 x 256 for IPv6) are computed here once, with zlib, and written into
the SQL as list literals; each row then takes n list lookups and n XORs, all built-ins.
`crc_tables` is checked against zlib by tests/test_ingest_duckdb.py, and bench/ingest.py compares
every silver row with Spark's.

Not done by the reference, and not in the simulated logs it is measured on (bench/ingest.py
counts them): the access log's nginx text format, a JSON line with a repeated key (DuckDB reads
the first), an integer field written as a JSON string (DuckDB casts it). Delta's transaction log
is not written: Parquet files only.
"""
from __future__ import annotations

import csv
import ipaddress
import time
import zlib
from pathlib import Path

from ccselect.contract import CCS, DECISIONS, DUPLICATE_REASON, FEATURES, FIELDS, IDENTITY, NET_TYPES, NULLABLE, RANGES
# Imported inside the functions that use them (heavy, not needed to import this module): duckdb.

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
RTT_FIELDS = ("min_rtt_us", "min_rtt_var_us", "max_rtt_var_us", "min_rto_us", "min_srtt_us", "max_srtt_us")
EXTRA_RANGES = {
    "access": {"status": (100, 599), "bytes_sent": (0, 1 << 40), "request_time_ms": (0, DAY_MS)},
    "qoe": {"play_ms": (0, DAY_MS), "rebuffer_ms": (0, DAY_MS), "rebuffer_count": (0, 1 << 20),
            "startup_ms": (0, DAY_MS)},
}


def crc_tables(n: int) -> tuple[int, list[list[int]]]:
    """(crc32 of n zero bytes, T_j[b] for j < n): crc32(m) = c0 ^ T_0[m_0] ^ ... ^ T_{n-1}[m_{n-1}]."""
    c0 = zlib.crc32(bytes(n))
    tables = []
    for j in range(n):
        row = []
        for b in range(256):
            m = bytearray(n)
            m[j] = b
            row.append(zlib.crc32(bytes(m)) ^ c0)
        tables.append(row)
    return c0, tables


def crc_sql(byte_exprs: list[str]) -> str:
    """A SQL expression: CRC32 (zlib's) of the bytes whose values (0..255 integers) are `byte_exprs`."""
    c0, tables = crc_tables(len(byte_exprs))
    expr = f"{c0}::BIGINT"
    for j, b in enumerate(byte_exprs):
        expr = f"xor({expr}, ([{','.join(map(str, tables[j]))}]::BIGINT[])[({b}) + 1])"
    return expr


def _lit(values) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _sql_type(t) -> str:
    return "BIGINT" if t is int else "VARCHAR"


def _rules(stream: str) -> list[tuple[str, str]]:
    """(condition on the record `r` and the line, reason) in jobs/parse.py's order, after the
    structural ones."""
    req = [f for f in FIELDS[stream] if f not in NULLABLE.get(stream, set())]
    rules = []
    rules.append((" OR ".join(f"r.{f} IS NULL" for f in req),
                  "'missing_key:' || concat_ws(','" + "".join(f", CASE WHEN r.{f} IS NULL THEN '{f}' END" for f in req) + ")"))
    rules.append(("r.node_id <> node", "'node_mismatch'"))
    rules.append(("NOT ip_ok(r.client_ip)", "'bad_ip'"))
    if stream == "transport":
        rules.append((f"r.cc NOT IN {_lit(CCS)}", "'unknown_cc'"))
        rules.append((f"r.decision NOT IN {_lit(DECISIONS)}", "'unknown_decision'"))
    if stream == "access":
        rules.append((f"r.net_type IS NOT NULL AND r.net_type NOT IN {_lit(NET_TYPES)}", "'unknown_net_type'"))
    ranges = dict(RANGES) if stream == "transport" else dict(EXTRA_RANGES.get(stream, {}))
    if stream == "transport":
        lo, hi = ranges.pop("mss_bytes")
        rules.append((f"r.mss_bytes NOT BETWEEN {lo} AND {hi}", "'mss_out_of_range'"))
        rules.append((" OR ".join(f"r.{f} < 0" for f in RTT_FIELDS), "'negative_rtt'"))
        rules.append((" OR ".join(f"r.{f} > {RANGES[f][1]}" for f in RTT_FIELDS), "'absurd_rtt'"))
    for f, (lo, hi) in ranges.items():
        if f in FIELDS[stream]:
            rules.append((f"r.{f} < {lo} OR r.{f} > {hi}", f"'out_of_range:{f}'"))
    if stream == "transport":
        max_conn_ms = RANGES["duration_us"][1] // 1000
        rules.append((f"r.ts_end_ms NOT BETWEEN h0 AND h0 + {HOUR_MS - 1} OR r.ts_start_ms < h0 - {max_conn_ms}",
                      "'out_of_hour'"))
        rules.append(("r.ts_end_ms < r.ts_start_ms", "'bad_time_order'"))
    else:
        rules.append((f"r.ts_ms NOT BETWEEN h0 AND h0 + {HOUR_MS - 1}", "'out_of_hour'"))
    return rules


MACROS = r"""
CREATE MACRO v4_ok(s) AS regexp_full_match(s, '((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])');
CREATE MACRO v6_hex(s) AS CASE WHEN contains(s, '.') THEN
    regexp_replace(s, '[0-9.]+$', '') || printf('%x:%x',
        TRY_CAST(split_part(regexp_extract(s, '([0-9.]+)$', 1), '.', 1) AS INT) * 256 + TRY_CAST(split_part(regexp_extract(s, '([0-9.]+)$', 1), '.', 2) AS INT),
        TRY_CAST(split_part(regexp_extract(s, '([0-9.]+)$', 1), '.', 3) AS INT) * 256 + TRY_CAST(split_part(regexp_extract(s, '([0-9.]+)$', 1), '.', 4) AS INT))
    ELSE s END;
CREATE MACRO v6_full(h) AS CASE WHEN contains(h, '::') THEN concat_ws(':',
    nullif(split_part(h, '::', 1), ''),
    nullif(rtrim(repeat('0:', 8 - CASE WHEN split_part(h, '::', 1) = '' THEN 0 ELSE len(string_split(split_part(h, '::', 1), ':')) END
                              - CASE WHEN split_part(h, '::', 2) = '' THEN 0 ELSE len(string_split(split_part(h, '::', 2), ':')) END), ':'), ''),
    nullif(split_part(h, '::', 2), '')) ELSE h END;
CREATE MACRO v6_ok(s) AS contains(s, ':') AND regexp_full_match(s, '[0-9a-fA-F:.]+')
    AND length(s) - length(replace(s, '::', '')) <= 2 AND NOT contains(s, ':::')
    AND (NOT contains(s, '.') OR v4_ok(regexp_extract(s, ':([0-9.]+)$', 1)))
    AND regexp_full_match(v6_full(v6_hex(lower(s))), '([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}')
    AND (contains(s, '::') OR NOT regexp_matches(s, '^:|:$'));
CREATE MACRO ip_ok(s) AS coalesce(v4_ok(s) OR v6_ok(s), false);
CREATE MACRO g16(groups, k) AS TRY_CAST('0x' || groups[k + 1] AS INTEGER);
CREATE MACRO hx(g) AS printf('%x', g);
"""


def address_ctes() -> str:
    """CTEs t1 .. t reading `t0` (a relation with `s`, the lowercased address text, and `client_ip`):
    `t` adds family, ip_text (the canonical text), v4_int, hi64 (an IPv6 address's top 64 bits),
    prefix16/24/48/64 and ab_bucket (CRC32 of the packed address), all SQL built-ins."""
    v4b = [f"o{i}" for i in range(1, 5)]
    v6b = [b for k in range(8) for b in (f"(g{k} >> 8)", f"(g{k} & 255)")]
    return f"""t1 AS (
  SELECT *, CASE WHEN contains(s, ':') THEN string_split(v6_full(v6_hex(s)), ':') END AS grp FROM t0
), t2 AS (
  SELECT *, CASE WHEN grp IS NOT NULL THEN g16(grp, 0) END AS g0, CASE WHEN grp IS NOT NULL THEN g16(grp, 1) END AS g1,
         CASE WHEN grp IS NOT NULL THEN g16(grp, 2) END AS g2, CASE WHEN grp IS NOT NULL THEN g16(grp, 3) END AS g3,
         CASE WHEN grp IS NOT NULL THEN g16(grp, 4) END AS g4, CASE WHEN grp IS NOT NULL THEN g16(grp, 5) END AS g5,
         CASE WHEN grp IS NOT NULL THEN g16(grp, 6) END AS g6, CASE WHEN grp IS NOT NULL THEN g16(grp, 7) END AS g7
  FROM t1
), t3 AS (
  SELECT *, CASE WHEN grp IS NULL THEN s
                 WHEN g0 = 0 AND g1 = 0 AND g2 = 0 AND g3 = 0 AND g4 = 0 AND g5 = 65535
                 THEN printf('%d.%d.%d.%d', g6 >> 8, g6 & 255, g7 >> 8, g7 & 255) END AS v4
  FROM t2
), t4 AS (
  SELECT *, CASE WHEN v4 IS NOT NULL THEN 4 ELSE 6 END AS family,
         split_part(v4, '.', 1)::INT AS o1, split_part(v4, '.', 2)::INT AS o2,
         split_part(v4, '.', 3)::INT AS o3, split_part(v4, '.', 4)::INT AS o4
  FROM t3
), t AS (
  SELECT *, CASE WHEN family = 4 THEN v4 ELSE client_ip END AS ip_text,
         CASE WHEN family = 4 THEN (o1::UBIGINT << 24) | (o2::UBIGINT << 16) | (o3::UBIGINT << 8) | o4::UBIGINT END AS v4_int,
         CASE WHEN family = 6 THEN (g0::UBIGINT << 48) | (g1::UBIGINT << 32) | (g2::UBIGINT << 16) | g3::UBIGINT END AS hi64,
         CASE WHEN family = 4 THEN o1 || '.' || o2 || '.0.0/16' END AS prefix16,
         CASE WHEN family = 4 THEN o1 || '.' || o2 || '.' || o3 || '.0/24' END AS prefix24,
         CASE WHEN family = 6 THEN CASE WHEN g2 <> 0 THEN hx(g0) || ':' || hx(g1) || ':' || hx(g2) || '::/48'
                                        WHEN g1 <> 0 THEN hx(g0) || ':' || hx(g1) || '::/48'
                                        WHEN g0 <> 0 THEN hx(g0) || '::/48' ELSE '::/48' END END AS prefix48,
         CASE WHEN family = 6 THEN CASE WHEN g3 <> 0 THEN hx(g0) || ':' || hx(g1) || ':' || hx(g2) || ':' || hx(g3) || '::/64'
                                        WHEN g2 <> 0 THEN hx(g0) || ':' || hx(g1) || ':' || hx(g2) || '::/64'
                                        WHEN g1 <> 0 THEN hx(g0) || ':' || hx(g1) || '::/64'
                                        WHEN g0 <> 0 THEN hx(g0) || '::/64' ELSE '::/64' END END AS prefix64,
         CASE WHEN family = 4 THEN {crc_sql(v4b)} ELSE {crc_sql(v6b)} END AS ab_bucket
  FROM t4
"""


def build_sql(data: str, out: str, reference_rows: list[tuple[int, int, int, str]]) -> list[str]:
    """The statements of the reference ingest of `data` (the three streams' node-hour files),
    writing under `out`; `reference_rows`: (family, prefix length, prefix as an integer of its
    top bits, ug_id) of the reference table."""
    stmts = [s for s in MACROS.split(";\n") if s.strip()]
    for stream in ("transport", "access", "qoe"):
        struct = "{" + ", ".join(f'"{k}": "{_sql_type(t)}"' for k, t in FIELDS[stream].items()) + "}"
        stmts.append(f"""CREATE TABLE lines_{stream} AS
SELECT filename AS source_file, regexp_extract(filename, '/([^/]+)/[^/]+$', 1) AS node,
       regexp_extract(filename, '([0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}})[0-9]*(\\.[0-9]+)?\\.jsonl$', 1) AS hour,
       unnest(generate_series(1, len(ls))) AS line_no, unnest(ls) AS raw
FROM (SELECT filename, string_split(CASE WHEN suffix(content, chr(10)) THEN left(content, length(content) - 1)
                                         ELSE content END, chr(10)) AS ls
      FROM read_text('{data}/{stream}/*/*.jsonl') WHERE content <> '')""")
        rules = _rules(stream)
        reason = "CASE WHEN NOT json_valid(txt) OR NOT starts_with(ltrim(txt), '{') THEN 'bad_json'\n" + "\n".join(
            f"  WHEN {c} THEN {r}" for c, r in rules) + " END"
        ident = IDENTITY[stream]
        ident_sql = ", ".join(f"r.{f}" for f in ident) if ident else "r"
        stmts.append(f"""CREATE TABLE bronze_{stream} AS
WITH p AS (
  SELECT source_file, node, hour, epoch_ms(strptime(hour, '%Y-%m-%dT%H')) AS h0, line_no, raw,
         CASE WHEN starts_with(raw, chr(65279)) THEN substr(raw, 2) ELSE raw END AS txt
  FROM lines_{stream}
), j AS (
  SELECT *, CASE WHEN json_valid(txt) THEN json_transform(txt, '{struct}') END AS r FROM p
), v AS (SELECT *, {reason} AS reason0 FROM j)
SELECT '{stream}' AS stream, node AS node_id, hour, source_file, line_no, raw,
       CASE WHEN reason0 IS NULL AND row_number() OVER (PARTITION BY node, hour, {ident_sql}, reason0 IS NULL
                 ORDER BY regexp_replace(source_file, '\\.jsonl(\\.gz)?$', ''), line_no) > 1
            THEN '{DUPLICATE_REASON.get(stream, 'duplicate')}' ELSE reason0 END AS reason,
       CASE WHEN reason IS NULL THEN 'ok' ELSE 'quarantined' END AS status,
       CASE WHEN reason IS NULL THEN r END AS record
FROM v""")
        stmts.append(f"COPY bronze_{stream} TO '{out}/bronze_{stream}' (FORMAT parquet, PARTITION_BY (node_id, hour), OVERWRITE_OR_IGNORE)")
    union = " UNION ALL ".join(f"SELECT stream, node_id, hour, source_file, line_no, raw, status, reason FROM bronze_{s}"
                               for s in ("transport", "access", "qoe"))
    stmts.append(f"CREATE TABLE quarantine AS SELECT * FROM ({union}) WHERE status = 'quarantined'")
    stmts.append(f"COPY quarantine TO '{out}/quarantine' (FORMAT parquet, PARTITION_BY (node_id, hour), OVERWRITE_OR_IGNORE)")
    stmts.append(f"""CREATE TABLE audit AS SELECT stream, node_id, hour, source_file, count(*) AS lines_read,
       count(*) FILTER (WHERE status = 'ok') AS accepted, count(*) FILTER (WHERE status = 'quarantined') AS quarantined
FROM ({union}) GROUP BY ALL""")
    stmts.append(f"COPY audit TO '{out}/audit' (FORMAT parquet, PARTITION_BY (node_id, hour), OVERWRITE_OR_IGNORE)")
    stmts.append("CREATE TABLE ref (family INT, plen INT, k UBIGINT, ug_id VARCHAR)")
    if reference_rows:
        stmts.append("INSERT INTO ref VALUES " + ", ".join(f"({f}, {p}, {k}, '{u}')" for f, p, k, u in reference_rows))
    levels = sorted({(f, p) for f, p, _, _ in reference_rows}, key=lambda x: -x[1])
    tcols = [f for f in FIELDS["transport"] if f not in ("node_id", "client_ip")]
    ug_joins = "".join(
        f"\nLEFT JOIN (SELECT k AS k{i}, any_value(ug_id) AS ug{i} FROM ref WHERE family = {f} AND plen = {p} GROUP BY k) "
        f"ON family = {f} AND k{i} = " + (f"(v4_int >> {32 - p})" if f == 4 else f"(hi64 >> {64 - p})")
        for i, (f, p) in enumerate(levels))
    ug = "coalesce(" + ", ".join(f"ug{i}" for i in range(len(levels))) + ")" if levels else "NULL::VARCHAR"
    feats = ", ".join(f"count({f}) AS {f}_n, sum(ln(1 + {f}::DOUBLE)) AS {f}_sum, sum(ln(1 + {f}::DOUBLE) ^ 2) AS {f}_sumsq"
                      for f in FEATURES)
    stmts.append(f"""CREATE TABLE silver AS
WITH t0 AS (
  SELECT node_id, hour, record.*, lower(record.client_ip) AS s FROM bronze_transport WHERE status = 'ok'
), {address_ctes()}), lab AS (
  SELECT node_id, hour, record.conn_id, count(*) AS requests, sum(record.bytes_sent) AS bytes_sent,
         sum(record.request_time_ms) AS request_time_ms,
         CASE WHEN min(record.net_type) = max(record.net_type) THEN min(record.net_type) END AS net_type
  FROM bronze_access WHERE status = 'ok' AND record.conn_id IS NOT NULL GROUP BY ALL
), qo AS (
  SELECT node_id, hour, record.conn_id, count(*) AS qoe_sessions, sum(record.play_ms) AS play_ms,
         sum(record.rebuffer_ms) AS rebuffer_ms, sum(record.rebuffer_count) AS rebuffer_count, min(record.startup_ms) AS startup_ms
  FROM bronze_qoe WHERE status = 'ok' GROUP BY ALL
)
SELECT {', '.join(tcols)}, ip_text AS client_ip, family, prefix16, prefix24, prefix48, prefix64, ab_bucket,
       ab_bucket % 2 = 1 AS ab_treatment, {ug} AS ug_id,
       list_filter([{', '.join(f"CASE WHEN {f} IS NULL THEN '{f}' END" for f in FEATURES)}], lambda x: x IS NOT NULL) AS imputed,
       lab.net_type, CASE lab.net_type WHEN 'wifi' THEN 1 WHEN '4g' THEN 0 WHEN '5g' THEN 0 END AS label,
       coalesce(lab.requests, 0) AS requests, lab.bytes_sent, lab.request_time_ms,
       coalesce(qo.qoe_sessions, 0) AS qoe_sessions, qo.play_ms, qo.rebuffer_ms, qo.rebuffer_count, qo.startup_ms,
       CASE WHEN qo.play_ms > 0 THEN qo.rebuffer_ms / qo.play_ms END AS rebuffer_rate,
       CASE WHEN duration_us > 0 THEN bytes_acked * 8e6::DOUBLE / duration_us END AS goodput_bps,
       CASE WHEN lab.request_time_ms > 0 THEN lab.bytes_sent * 8e3::DOUBLE / lab.request_time_ms END AS delivery_rate_bps,
       CASE WHEN data_segs_out > 0 THEN total_retrans / data_segs_out END AS retrans_ratio,
       max_rtt_var_us / max_srtt_us AS rtt_var_norm, node_id, hour
FROM t LEFT JOIN lab USING (node_id, hour, conn_id) LEFT JOIN qo USING (node_id, hour, conn_id){ug_joins}""")
    stmts.append(f"COPY silver TO '{out}/silver' (FORMAT parquet, PARTITION_BY (node_id, hour), OVERWRITE_OR_IGNORE)")
    stmts.append(f"CREATE TABLE node_stats AS SELECT node_id, hour, count(*) AS connections, {feats} FROM silver GROUP BY ALL")
    stmts.append(f"COPY node_stats TO '{out}/node_stats' (FORMAT parquet, PARTITION_BY (node_id, hour), OVERWRITE_OR_IGNORE)")
    return stmts


def reference_rows(path: str) -> list[tuple[int, int, int, str]]:
    """(family, prefix length, the prefix's top bits as an integer, ug_id) per row of the reference
    CSV (cidr, asn, isp, region); an IPv6 prefix longer than 64 bits is refused (the SQL keys
    IPv6 prefixes by the address's top 64 bits)."""
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            net = ipaddress.ip_network(r["cidr"].strip(), strict=False)
            width = 32 if net.version == 4 else 64
            if net.prefixlen > width:
                raise ValueError(f"{path}: {net} is longer than the reference SQL keys ({width} bits)")
            top = int(net.network_address) >> (net.max_prefixlen - net.prefixlen)
            rows.append((net.version, net.prefixlen, top, f"{r['region'].strip()}-AS{int(r['asn'])}"))
    return rows


def run(data: str, out: str, threads: int = 2) -> dict:
    """The reference ingest of `data` into Parquet under `out`: seconds, silver rows, and per stream
    lines read / accepted / quarantined."""
    import duckdb
    ref = Path(data, "reference", "ip_asn_region.csv")
    stmts = build_sql(data, out, reference_rows(str(ref)) if ref.exists() else [])
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute("SET enable_progress_bar = false")
    Path(out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for s in stmts:
        con.execute(s)
    seconds = time.perf_counter() - t0
    counts = {r[0]: {"lines_read": int(r[1]), "accepted": int(r[2]), "quarantined": int(r[3])}
              for r in con.execute("SELECT stream, sum(lines_read), sum(accepted), sum(quarantined) FROM audit GROUP BY ALL").fetchall()}
    for stream, reason, n in con.execute("SELECT stream, reason, count(*) FROM quarantine GROUP BY ALL").fetchall():
        counts.setdefault(stream, {}).setdefault("by_reason", {})[reason] = int(n)
    rows = con.execute("SELECT count(*) FROM silver").fetchone()[0]
    con.close()
    return {"seconds": round(seconds, 2), "silver_rows": int(rows), "streams": counts}
