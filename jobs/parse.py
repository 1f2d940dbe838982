"""Parsing and validating the three streams: pure transforms from lines to typed records with a
status and, for a rejected line, one machine-readable reason (the first rule it breaks).

Input: the lines of `jobs.sources.read_lines` (stream, node_id, hour, hour_start_ms, source_file,
line_no, raw). Output adds `record` (a struct of the contract's fields, typed), `status`
(`ok` / `quarantined`) and `reason`.

Reasons, in the order they are checked:
  bad_json, bad_nginx_line                 the line is not one record (a key repeated in the
                                           object is `bad_json`: which value counts is unknowable;
                                           so is text after the object)
  missing_key:<f>[,<f>...]                 required fields absent or null, every one named
  wrong_type:<f>                           a field has the wrong JSON type (incl. non-int64 numbers)
                                           (of these two, the first field in contract order decides)
  node_mismatch                            node_id differs from the file's node folder
  bad_ip                                   client_ip is not an IPv4/IPv6 address
  unknown_cc, unknown_decision, unknown_net_type
  mss_out_of_range                         MSS outside 88..65535
  negative_rtt, absurd_rtt                 an RTT-like field below 0 or above its contract maximum
  out_of_range:<f>                         any other field outside contract.RANGES (or >= 0 rules)
  out_of_hour                              a timestamp outside the file's UTC hour; a transport
                                           record belongs to the hour it closed in (`ts_end_ms`),
                                           as the agent files it, and may have started up to
                                           a day (the contract's longest connection) before
  bad_time_order                           ts_end_ms before ts_start_ms
  duplicate_conn_id, duplicate_session_id, duplicate_request
                                           a repeat of a record's identity (contract.IDENTITY) among
                                           the node-hour's lines read together: the first line by
                                           (file name, line) is kept

A UTF-8 byte order mark at the start of a line (what some Windows tools put at the top of a file)
is not part of the record: RFC 8259 §8.1 lets a parser ignore it, and parse does; `raw` keeps it.

Missing model features: with `impute` (the fields `ingest.missing_features: impute` allows: those
`ingest.imputable_features` names, by default the send window; jobs.parse.imputable), a record
whose only missing fields are among them is accepted with those fields null — silver lists them in
`imputed`, training leaves such rows out and inference standardizes them to the training mean
(features/scaling.py). A record missing any other required field is quarantined as `missing_key:`
naming exactly the missing fields that are not imputable (issue 57: the imputable send-window
fields were listed beside `bytes_acked` as if they were at fault). By default nothing is imputable
and such a record is quarantined naming every missing field.

Hot path: `ccs_json_record_<stream>` (jvm/src/ccselect/udf/JsonRecord.java, one pass over the
line's characters) says what from_json does not: that no top-level key is repeated and each
field's value is of its JSON type (`ccs_json_plain`'s answer, JsonPlain.java); and for such a line
whose values are all simple (strings without escapes, integers, true, false, null: what the agents
write) it gives the record itself, exactly as from_json reads it. `from_json` with the typed schema
reads only the other lines: it creates a parser and a reader with its own buffer per line, about a
third of the access stream's parse-and-write time (measured on 3.08 M access lines parsed into a
`noop` sink, warm: 8.9 s with from_json for every line, 4.7 s). Only a suspicious line (not surely
plain, or a required field came back null) pays for the exact diagnosis through `try_parse_json`
and `schema_of_variant`. (The check was `json_object_keys` with a distinct count and a regex over
the string fields' names: a second parse of every line. Measured on 999k transport lines parsed
into a `noop` sink, warm: 17.0 s with them, 10.5 s with ccs_json_plain, 9.0 s with neither; the
reasons found were the same.)
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, functions as F, types as T

from ccselect.contract import CCS, DECISIONS, DUPLICATE_REASON, FIELDS, IDENTITY, NET_TYPES, NULLABLE, RANGES
from ccselect.settings import IngestSettings
from ccselect.spark import IS_IP, register_json_record, register_udfs

HOUR_MS = 3_600_000
#: `ccs_json_plain`'s answers (jvm/src/ccselect/udf/JsonPlain.java)
NOT_SURE, PLAIN, TEXT_AFTER = 0, 1, 2
#: a transport record may start this long before the hour it closed in (contract: duration_us ≤ a day)
MAX_CONN_MS = RANGES["duration_us"][1] // 1000
BOM = "\ufeff"
#: `ingest.missing_features`: whether a transport record may miss the imputable features
MISSING_POLICIES = ("quarantine", "impute")


def imputable(policy: str, stream: str, features: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The fields of `stream` that `ingest.missing_features: policy` lets a record miss: under
    `impute`, `features` (`ingest.imputable_features`; None: its default, the send window)."""
    if policy not in MISSING_POLICIES:
        raise ValueError(f"ingest.missing_features must be one of {sorted(MISSING_POLICIES)}, not {policy!r}")
    if features is None:
        features = IngestSettings().imputable_features
    else:
        IngestSettings(policy, tuple(features))          # the same checks as the configuration's
    return tuple(features) if policy == "impute" and stream == "transport" else ()


def imputable_of(ingest: IngestSettings, stream: str) -> tuple[str, ...]:
    """`imputable` for a configuration's `ingest:` section."""
    return imputable(ingest.missing_features, stream, ingest.imputable_features)
RTT_FIELDS = ("min_rtt_us", "min_rtt_var_us", "max_rtt_var_us", "min_rto_us", "min_srtt_us", "max_srtt_us")
#: Non-negative counters and durations of the access log and the QoE beacons (no upper contract
#: range: a day is the absurd bound).
DAY_MS = 86_400_000
EXTRA_RANGES = {
    "access": {"status": (100, 599), "bytes_sent": (0, 1 << 40), "request_time_ms": (0, DAY_MS)},
    "qoe": {"play_ms": (0, DAY_MS), "rebuffer_ms": (0, DAY_MS), "rebuffer_count": (0, 1 << 20),
            "startup_ms": (0, DAY_MS)},
}
#: nginx access-log tokens (see jobs/README.md for the log_format line), in order.
NGINX_TOKENS = ("msec", "node_id", "client_ip", "client_port", "status", "bytes_sent", "request_time",
                "service", "net_type", "tcpinfo_rtt_us", "tcpinfo_rttvar_us", "tcpinfo_snd_cwnd_segs",
                "tcpinfo_rcv_space_bytes")
ACCESS_EXTRA = {"client_port": int, "tcpinfo_rtt_us": int, "tcpinfo_rttvar_us": int,
                "tcpinfo_snd_cwnd_segs": int, "tcpinfo_rcv_space_bytes": int, "log_format": str}

#: Every stream has a duplicate rule (contract.IDENTITY: the fields that must be unique within a
#: node-hour, or the whole record).
DEDUPLICATED = dict(IDENTITY)

_SPARK_TYPE = {int: T.LongType(), str: T.StringType()}
_VARIANT_TYPE = {int: "BIGINT", str: "STRING"}


def schema(stream: str) -> T.StructType:
    """The typed record schema of a stream (access also carries the nginx-only fields)."""
    fields = dict(FIELDS[stream])
    if stream == "access":
        fields.update(ACCESS_EXTRA)
    return T.StructType([T.StructField(k, _SPARK_TYPE[t]) for k, t in fields.items()])


def required(stream: str) -> list[str]:
    return [k for k in FIELDS[stream] if k not in NULLABLE.get(stream, set())]


def _with_variant(df: DataFrame, raw: Column, stream: str, suspicious: Column) -> DataFrame:
    """Adds `_variant` (a suspicious line parsed by `try_parse_json`, else null) and `_vtypes` (the
    `schema_of_variant` of each contract field's value, in contract order) for `_json_diagnosis`.
    Each is a column that the diagnosis reads many times, so Spark computes it once and keeps it
    out of the expressions that read it: written inline, the parse was generated into the code 186
    times, and the transport parse's whole-stage code passed the JVM's 64 KB a method."""
    df = df.withColumn("_variant", F.when(suspicious, F.call_function("try_parse_json", raw)))
    v = F.col("_variant")
    # (a null variant, not JSON or not suspicious, needs no types: the diagnosis says bad_json first)
    return df.withColumn("_vtypes", F.when(v.isNotNull(), F.array(*[
        F.call_function("schema_of_variant", F.call_function("variant_get", v, F.lit(f"$.{name}")))
        for name in FIELDS[stream]])))


def _json_diagnosis(raw: Column, stream: str, impute: tuple[str, ...] = (), text_after: Column | None = None) -> Column:
    """Exact reason for a suspicious JSON line (null when it turns out fine), from the columns of
    `_with_variant`. `try_parse_json` refuses a repeated key (spark.sql.variant.allowDuplicateKeys
    is false), so that is bad_json; so is `text_after` an object (which it, like from_json, reads
    no further than)."""
    v = F.col("_variant")
    is_object = F.ltrim(raw).startswith("{")
    if text_after is not None:
        is_object = is_object & ~text_after
    types = {name: F.col("_vtypes")[i] for i, name in enumerate(FIELDS[stream])}
    absent = {name: t.isNull() | (t == "VOID") for name, t in types.items()}
    need = [n for n in FIELDS[stream] if n not in NULLABLE.get(stream, set())]
    # The first field (contract order) with a problem says which kind. A missing imputable field is
    # no problem on its own; a missing required one is, and then the reason names every missing
    # field that is not imputable (the imputable ones are not at fault): the chain says
    # "missing_key:" and the list is put in once, after it (each expression here appears once:
    # repeating the list in every branch made the generated code 20× larger).
    chain = F.when(v.isNull() | ~is_object, F.lit("bad_json"))
    for name, typ in FIELDS[stream].items():
        if name in need and name not in impute:
            chain = chain.when(absent[name], F.lit("missing_key:"))
        chain = chain.when(~absent[name] & (types[name] != _VARIANT_TYPE[typ]), F.lit(f"wrong_type:{name}"))
    listed = F.concat(F.lit("missing_key:"), F.concat_ws(",", *[F.when(absent[n], F.lit(n)) for n in need
                                                                if n not in impute]))
    return F.replace(chain, F.lit("missing_key:"), listed)


def _spec(sch: T.StructType) -> str:
    """`sch`'s fields as ccs_json_plain and ccs_json_record take them: "name:s,name:i,..."."""
    return ",".join(f"{f.name}:{'s' if isinstance(f.dataType, T.StringType) else 'i'}" for f in sch)


def _with_record(df: DataFrame, raw: Column, stream: str, sch: T.StructType) -> DataFrame:
    """Adds `_json` (the record from_json reads from `raw` with `sch`) and `_plain` (PLAIN when `raw`
    is certainly that record, key for key: one JSON object, no top-level key repeated, every field
    of `sch` null or of its JSON type, a string or an integer of at most 18 digits; TEXT_AFTER for a
    whole object with more text after it; else NOT_SURE), from one pass of
    `ccs_json_record_<stream>` (jvm/src/ccselect/udf/JsonRecord.java): it gives `ccs_json_plain`'s
    answer and, for a plain line whose values are all simple (strings without escapes, integers,
    true, false, null; what the agents write), the record itself; from_json reads only the other
    lines (module docstring)."""
    name = f"ccs_json_record_{stream}"
    register_json_record(df.sparkSession, name, sch.simpleString())
    df = df.withColumn("_scan", F.call_function(name, raw, F.lit(_spec(sch))))
    return (df.withColumn("_plain", F.coalesce(F.col("_scan.plain"), F.lit(NOT_SURE)))
            .withColumn("_json", F.coalesce(F.col("_scan.record"), F.from_json(raw, sch)))
            .drop("_scan"))


def _range_rules(rec: Column, stream: str) -> list[tuple[Column, str]]:
    rules: list[tuple[Column, str]] = []
    ranges = dict(RANGES) if stream == "transport" else dict(EXTRA_RANGES.get(stream, {}))
    if stream == "transport":
        lo, hi = ranges.pop("mss_bytes")
        rules.append((~rec["mss_bytes"].between(lo, hi), "mss_out_of_range"))
        rules.append((F.greatest(*[rec[f] < 0 for f in RTT_FIELDS]), "negative_rtt"))
        rules.append((F.greatest(*[rec[f] > RANGES[f][1] for f in RTT_FIELDS]), "absurd_rtt"))
    for f, (lo, hi) in ranges.items():
        if f in FIELDS[stream] or f in ACCESS_EXTRA:
            rules.append(((rec[f] < lo) | (rec[f] > hi), f"out_of_range:{f}"))
    return rules


def _first_reason(rules: list[tuple[Column, str]]) -> Column:
    chain = None
    for cond, reason in rules:
        chain = F.when(cond, F.lit(reason)) if chain is None else chain.when(cond, F.lit(reason))
    return chain


def _in_hour(ts: Column) -> Column:
    return ts.between(F.col("hour_start_ms"), F.col("hour_start_ms") + HOUR_MS - 1)


def _has_ip(df: DataFrame, text: Column) -> DataFrame:
    """Adds `_has_ip`: whether `text` is an address (`ccselect.ipaddr.with_ip`'s family is not
    null; false for null), by `ccs_is_ip` (jvm/src/ccselect/udf/IsIp.java: with_ip's parse without
    building its struct)."""
    register_udfs(df.sparkSession)
    return df.withColumn("_has_ip", F.call_function(IS_IP, text))


def _parse_nginx(raw: Column) -> tuple[Column, Column]:
    """(record, reason) of an nginx `ccs_tcpinfo` line; reason is `bad_nginx_line` or null."""
    tok = F.split(raw, " ", -1)
    t = {name: tok.getItem(i) for i, name in enumerate(NGINX_TOKENS)}
    int_re, ms_re = r"^[0-9]{1,18}$", r"^[0-9]{1,15}\.[0-9]{3}$"

    def opt_int(c: Column) -> Column:  # "-" or "" when nginx has no value
        return F.when(c.rlike(int_re), c.cast("bigint"))

    ok = (F.size(tok) == len(NGINX_TOKENS)) & t["msec"].rlike(ms_re) & t["request_time"].rlike(ms_re)
    for name in ("client_port", "status", "bytes_sent"):
        ok = ok & t[name].rlike(int_re)
    for name in NGINX_TOKENS[-4:]:
        ok = ok & (t[name].rlike(int_re) | t[name].isin("-", ""))
    net = F.when(t["net_type"] != "-", t["net_type"])
    rec = F.struct(
        F.lit(None).cast("string").alias("conn_id"),
        t["node_id"].alias("node_id"),
        F.regexp_replace(t["msec"], r"\.", "").cast("bigint").alias("ts_ms"),
        t["client_ip"].alias("client_ip"),
        t["service"].alias("service"),
        t["status"].cast("bigint").alias("status"),
        t["bytes_sent"].cast("bigint").alias("bytes_sent"),
        F.regexp_replace(t["request_time"], r"\.", "").cast("bigint").alias("request_time_ms"),
        net.alias("net_type"),
        t["client_port"].cast("bigint").alias("client_port"),
        *[opt_int(t[n]).alias(n) for n in NGINX_TOKENS[-4:]],
        F.lit("nginx").alias("log_format"),
    )
    return F.when(ok, rec), F.when(~ok, F.lit("bad_nginx_line"))


def parse(lines: DataFrame, stream: str, impute: tuple[str, ...] = ()) -> DataFrame:
    """Lines of one stream → lines with `record`, `status` and `reason` (see module docstring).
    `impute`: the fields a record may miss and still be accepted (`imputable`)."""
    register_udfs(lines.sparkSession)
    dedup = stream in DEDUPLICATED
    key = DEDUPLICATED.get(stream, ())
    if dedup:
        # The duplicate rule needs each file's lines together: shuffle once by (node, hour), before
        # anything is derived from a line, so that only the lines themselves cross the shuffle (with the
        # parsed record, the keys and the BOM-less text it was much larger; jobs/README.md), which
        # also leaves one output file per (node, hour) partition when bronze is written.
        # (Shuffling whole files before they are split into lines instead puts the split, the
        # parse and the window's sort in one generated method past the JVM's 64 KB, and Spark
        # falls back to interpreted execution; no faster when measured.)
        lines = lines.repartition("node_id", "hour")
    # the record's text: `raw` without a leading byte order mark (module docstring)
    lines = lines.withColumn("_text", F.when(F.col("raw").startswith(BOM), F.substring("raw", 2, 1 << 30))
                             .otherwise(F.col("raw")))
    raw = F.col("_text")
    sch = schema(stream)
    is_json = F.ltrim(raw).startswith("{")
    lines = _with_record(lines, raw, stream, sch)
    parsed = F.col("_json")
    if stream == "access":
        # Field by field, not `withField`: Spark inlines the one-reference `_json` column before it
        # expands withField into one from_json per field, and shares no subexpression inside a CASE
        # branch — 15 JSON parses per access line (measured on 738k lines: 23.4 s → 8.9 s)
        parsed = F.when(parsed.isNotNull(), F.struct(*[parsed[f.name].alias(f.name) if f.name != "log_format"
                                                        else F.lit("json").alias("log_format") for f in sch]))
        nginx_rec, nginx_reason = _parse_nginx(raw)
        looks_nginx = ~is_json & raw.rlike(r"^[0-9]+\.[0-9]{3} ")
        rec = F.when(looks_nginx, nginx_rec).otherwise(parsed)
    else:
        looks_nginx = F.lit(False)
        rec = parsed
    df = lines.withColumn("record", rec)
    r = F.col("record")
    json_required = [f for f in required(stream) if not (stream == "access" and f == "conn_id")]
    # a key repeated in the object (from_json keeps the last value silently), a number in a string
    # field (read as its text) or a quoted number in a bigint one (read as null): not surely plain
    suspicious = ~is_json | (F.col("_plain") != PLAIN) | F.greatest(F.lit(False), *[r[f].isNull() for f in json_required])
    text_after = F.col("_plain") == TEXT_AFTER
    if stream == "access":
        suspicious = suspicious | r["conn_id"].isNull()
    df = _with_variant(df, raw, stream, suspicious & ~looks_nginx)
    if stream == "access":
        structural = F.when(looks_nginx, nginx_reason).when(suspicious, _json_diagnosis(raw, stream, (), text_after))
    else:
        structural = F.when(suspicious, _json_diagnosis(raw, stream, impute, text_after))

    df = _has_ip(df, r["client_ip"])
    # (a JSON line with a required field null is suspicious: the diagnosis above names every
    # missing field; these rules are the net for a record built otherwise, the nginx format's)
    rules: list[tuple[Column, str]] = [(r[f].isNull(), f"missing_key:{f}") for f in json_required
                                       if f not in impute]
    if stream == "access":
        rules.append(((r["log_format"] == "json") & r["conn_id"].isNull(), "missing_key:conn_id"))
    rules.append((r["node_id"] != F.col("node_id"), "node_mismatch"))
    rules.append((~F.col("_has_ip"), "bad_ip"))
    if stream == "transport":
        rules.append((~r["cc"].isin(*CCS), "unknown_cc"))
        rules.append((~r["decision"].isin(*DECISIONS), "unknown_decision"))
    if stream == "access":
        rules.append((r["net_type"].isNotNull() & ~r["net_type"].isin(*NET_TYPES), "unknown_net_type"))
    rules.extend(_range_rules(r, stream))
    if stream == "transport":   # filed by the hour it closed in (module docstring)
        rules.append((~_in_hour(r["ts_end_ms"]) | (r["ts_start_ms"] < F.col("hour_start_ms") - MAX_CONN_MS),
                      "out_of_hour"))
    else:
        rules.append((~_in_hour(r["ts_ms"]), "out_of_hour"))
    if stream == "transport":
        rules.append((r["ts_end_ms"] < r["ts_start_ms"], "bad_time_order"))
    reason = F.coalesce(structural, _first_reason(rules))
    df = df.withColumn("reason", reason)
    if dedup:
        # Only lines that pass every other rule compete, across the node-hour's files read
        # together (its segments, a `.1` re-send); the first by (file name, line) is kept: the
        # name without `.jsonl[.gz]`, so that `T0805` comes before its re-send `T0805.1`.
        ident = [F.col("record")[f] for f in key] if key else [F.col("record")]
        order = F.regexp_replace("source_file", r"\.jsonl(\.gz)?$", "")
        w = Window.partitionBy("node_id", "hour", *ident, F.col("reason").isNull()).orderBy(order, "line_no")
        first = F.row_number().over(w) == 1
        df = df.withColumn("reason", F.when(F.col("reason").isNull() & ~first,
                                            F.lit(DUPLICATE_REASON[stream])).otherwise(F.col("reason")))
    # (the record keeps the address as logged; silver writes the canonical one, jobs/silver.py:
    # rewriting it here too tripled the generated code of this stage)
    return (df.withColumn("status", F.when(F.col("reason").isNull(), F.lit("ok")).otherwise(F.lit("quarantined")))
            .withColumn("record", F.when(F.col("reason").isNull(), F.col("record")))
            .drop("_has_ip", "_json", "_plain", "_text", "_variant", "_vtypes"))
