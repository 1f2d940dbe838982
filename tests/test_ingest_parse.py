"""Per-transform tests of parsing and validation on tiny inline frames, compared whole."""
from __future__ import annotations

import ipaddress
import json
import zlib

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES, OUTCOMES
from ccselect.ipaddr import ab_bucket, with_ip
from ccselect.jobs.parse import parse

HOUR = "2026-11-01T00"
H0 = 1793491200000  # 2026-11-01T00:00Z in ms


def transport(**over) -> dict:
    rec = {"conn_id": "c1", "node_id": "n1", "ts_start_ms": H0 + 1000, "ts_end_ms": H0 + 2000,
           "client_ip": "10.1.2.3", "client_port": 40000, "server_port": 443, "cc": "bbr",
           "decision": "ab_control", "table_version": "v1",
           **{f: 1000 for f in FEATURES}, **{f: 10 for f in OUTCOMES}}
    rec["mss_bytes"] = 1448
    rec.update(over)
    return {k: v for k, v in rec.items() if v is not _DROP}


_DROP = object()


def lines_df(spark, stream, raws, node="n1"):
    rows = [(stream, node, HOUR, H0, f"/x/{stream}/{node}/{HOUR}.jsonl", i + 1, r) for i, r in enumerate(raws)]
    return spark.createDataFrame(rows, "stream string, node_id string, hour string, hour_start_ms bigint, "
                                       "source_file string, line_no bigint, raw string")


def reasons(spark, stream, raws):
    out = parse(lines_df(spark, stream, raws), stream).select("line_no", "status", "reason")
    return out


def expect(spark, pairs):
    return spark.createDataFrame([(i + 1, "ok" if r is None else "quarantined", r) for i, r in enumerate(pairs)],
                                 "line_no bigint, status string, reason string")


def test_transport_rules_one_reason_each(spark):
    cases = [
        (json.dumps(transport()), None),
        ('{"conn_id": "c2", "node_id": ', "bad_json"),
        ("\x00\xff\xfe garbage", "bad_json"),
        ("", "bad_json"),
        ("[1, 2, 3]", "bad_json"),
        (json.dumps(transport(conn_id="c3", min_rtt_us=_DROP)), "missing_key:min_rtt_us"),
        (json.dumps(transport(conn_id="c4", cc=None)), "missing_key:cc"),
        (json.dumps(transport(conn_id="c5", mss_bytes="1448")), "wrong_type:mss_bytes"),
        (json.dumps(transport(conn_id="c6", bytes_acked=1e30)), "wrong_type:bytes_acked"),
        (json.dumps(transport(conn_id="c7", bytes_acked=10 ** 25)), "wrong_type:bytes_acked"),
        (json.dumps(transport(conn_id=7)), "wrong_type:conn_id"),
        (json.dumps(transport(conn_id="c8", node_id="n2")), "node_mismatch"),
        (json.dumps(transport(conn_id="c9", client_ip="300.1.2.3")), "bad_ip"),
        (json.dumps(transport(conn_id="c10", client_ip="2001:db8::1::2")), "bad_ip"),
        (json.dumps(transport(conn_id="c11", cc="vegas")), "unknown_cc"),
        (json.dumps(transport(conn_id="c12", decision="maybe")), "unknown_decision"),
        (json.dumps(transport(conn_id="c13", mss_bytes=87)), "mss_out_of_range"),
        (json.dumps(transport(conn_id="c14", mss_bytes=65536)), "mss_out_of_range"),
        (json.dumps(transport(conn_id="c15", min_srtt_us=-5)), "negative_rtt"),
        (json.dumps(transport(conn_id="c16", max_srtt_us=10_000_001)), "absurd_rtt"),
        (json.dumps(transport(conn_id="c17", min_rtt_us=0)), "out_of_range:min_rtt_us"),
        (json.dumps(transport(conn_id="c18", client_port=0)), "out_of_range:client_port"),
        (json.dumps(transport(conn_id="c19", ts_end_ms=H0 + 3_600_000)), "out_of_hour"),
        (json.dumps(transport(conn_id="c20", ts_start_ms=H0 - 86_400_001)), "out_of_hour"),
        (json.dumps(transport(conn_id="c21", ts_start_ms=H0 + 5000)), "bad_time_order"),
        (json.dumps(transport()), "duplicate_conn_id"),
        (json.dumps(transport(conn_id="c22", client_ip="2408:833e::1", mss_bytes=88, table_version=None)), None),
        (json.dumps(transport(conn_id="c23", mss_bytes=65535, extra_field="ignored")), None),
    ]
    got = reasons(spark, "transport", [c[0] for c in cases])
    assertDataFrameEqual(got, expect(spark, [c[1] for c in cases]))


def access(**over) -> str:
    rec = {"conn_id": "c1", "node_id": "n1", "ts_ms": H0 + 10, "client_ip": "10.1.2.3", "service": "video",
           "status": 200, "bytes_sent": 1000, "request_time_ms": 30, "net_type": "wifi"}
    rec.update(over)
    return json.dumps({k: v for k, v in rec.items() if v is not _DROP})


NGINX = "1793491200.123 n1 10.1.2.3 40000 200 5120 0.031 video 4g 28000 1500 10 65483"


def test_access_rules_and_nginx_format(spark):
    cases = [
        (access(), None),
        (access(net_type=None), None),
        (access(net_type=_DROP, ts_ms=H0 + 11), None),
        (access(conn_id="c1", ts_ms=H0 + 12), None),  # several requests per connection are normal
        (access(), "duplicate_request"),  # the same request again (contract.IDENTITY: the whole record)
        (access(net_type="satellite"), "unknown_net_type"),
        (access(status=99), "out_of_range:status"),
        (access(ts_ms=H0 + 3_600_000), "out_of_hour"),
        (access(conn_id=_DROP), "missing_key:conn_id"),
        (NGINX, None),
        (NGINX.replace(" 4g ", " - ").replace("28000 1500 10 65483", "- - - -"), None),
        ("1793491200.123 n1 10.1.2.3 40000 200", "bad_nginx_line"),
        ("1793491200.123 n1 10.1.2.3 40000 2x0 5120 0.031 video 4g 28000 1500 10 65483", "bad_nginx_line"),
        ("1793491200.123 n1 10.1.2.999 40000 200 5120 0.031 video 4g 28000 1500 10 65483", "bad_ip"),
        ("1793487600.000 n1 10.1.2.3 40000 200 5120 0.031 video 4g 28000 1500 10 65483", "out_of_hour"),
    ]
    assertDataFrameEqual(reasons(spark, "access", [c[0] for c in cases]), expect(spark, [c[1] for c in cases]))


def test_nginx_record_fields(spark):
    got = parse(lines_df(spark, "access", [NGINX]), "access").select("record.*").drop("node_id")
    want = spark.createDataFrame(
        [(None, H0 + 123, "10.1.2.3", "video", 200, 5120, 31, "4g", 40000, 28000, 1500, 10, 65483, "nginx")],
        "conn_id string, ts_ms bigint, client_ip string, service string, status bigint, bytes_sent bigint, "
        "request_time_ms bigint, net_type string, client_port bigint, tcpinfo_rtt_us bigint, "
        "tcpinfo_rttvar_us bigint, tcpinfo_snd_cwnd_segs bigint, tcpinfo_rcv_space_bytes bigint, log_format string")
    assertDataFrameEqual(got, want)


def test_qoe_rules(spark):
    def q(**over):
        rec = {"session_id": "s1", "conn_id": "c1", "node_id": "n1", "client_ip": "::ffff:10.1.2.3",
               "ts_ms": H0 + 5, "play_ms": 1000, "rebuffer_ms": 0, "rebuffer_count": 0, "startup_ms": 200}
        rec.update(over)
        return json.dumps(rec)
    cases = [(q(), None), (q(), "duplicate_session_id"), (q(session_id="s2", rebuffer_ms=-1), "out_of_range:rebuffer_ms"),
             (q(session_id="s3", play_ms=True), "wrong_type:play_ms"), (q(session_id="s4", client_ip="fe80::1%eth0"), "bad_ip")]
    assertDataFrameEqual(reasons(spark, "qoe", [c[0] for c in cases]), expect(spark, [c[1] for c in cases]))


@pytest.mark.parametrize("stream,impute", [("transport", ()), ("transport", FEATURES), ("access", ()), ("qoe", ())])
def test_parse_compiles_to_whole_stage_code(spark, stream, impute):
    """Each stream's parse compiles as Spark generates it: with `spark.sql.codegen.fallback` off, a
    generated method past the JVM's 64 KB fails the query instead of quietly running the stage on
    the interpreted path (what happened once the transport parse's stages fused; jobs/parse.py
    `_with_variant`)."""
    from ccselect.spark import conf_set
    raws = {"transport": [json.dumps(transport()), "{not json"],
            "access": ['{"conn_id": "c1"}', "1793491200.005 n1 10.1.2.3 40000 200 1000 0.010 video wifi - - - -"],
            "qoe": ['{"session_id": "s1"}', "[]"]}[stream]
    with conf_set(spark, {"spark.sql.codegen.fallback": "false"}):
        parse(lines_df(spark, stream, raws), stream, impute).write.format("noop").mode("overwrite").save()


IPS = ["0.0.0.0", "10.1.2.3", "255.255.255.255", "122.192.66.212", "::", "::1", "2408:833e:d113:0:a4c:7b5f:c63c:7ab9",
       "2400:d45d:32b0:ca::", "2001:DB8:0:0:1::1", "::ffff:10.1.2.3", "2408:0:0:5::", "fe80::", "::1.2.3.4",
       "1:2:3:4:5:6:1.2.3.4", "0000:0000:0000:0000:0000:ffff:0a01:0203"]
BAD = ["", "1.2.3", "01.2.3.4", "1.2.3.256", "1.2.3.4.5", "2001:db8::1::2", "12345::", "2001:db8:::1",
       "1:2:3:4:5:6:7:8:9", ":1:2:3:4:5:6:7", "g::1", "fe80::1%eth0", "1.2.3.4 ", None, ":1.2.3.4",
       "1:2:3:4:5:6:7:1.2.3.4", "::ffff:01.2.3.4", "1::1.2.3", ":1::"]


def py_ip(text):
    a = ipaddress.ip_address(text)
    if a.version == 6 and a.ipv4_mapped:       # ::ffff:a.b.c.d is a.b.c.d (ccselect/ipaddr.py)
        a = a.ipv4_mapped
    packed = a.packed
    if a.version == 4:
        p16, p24 = (str(ipaddress.ip_network(f"{a}/{n}", strict=False)) for n in (16, 24))
        return (4, packed.hex(), p16, p24, None, None, zlib.crc32(packed))
    p48, p64 = (str(ipaddress.ip_network(f"{a}/{n}", strict=False)) for n in (48, 64))
    return (6, packed.hex(), None, None, p48, p64, zlib.crc32(packed))


def test_ip_parsing_and_ab_bucket_match_python(spark):
    df = spark.createDataFrame([(i, t) for i, t in enumerate(IPS + BAD)], "i int, t string")
    got = with_ip(df, "t").select("i", "ip.family", "ip.hex", "ip.prefix16", "ip.prefix24", "ip.prefix48",
                                  "ip.prefix64", ab_bucket(F.col("ip.packed")).alias("crc"))
    want = [(i, *py_ip(t)) for i, t in enumerate(IPS)] + [(len(IPS) + i, *([None] * 7)) for i in range(len(BAD))]
    assertDataFrameEqual(got, spark.createDataFrame(
        want, "i int, family int, hex string, prefix16 string, prefix24 string, prefix48 string, prefix64 string, crc bigint"))


def _ip_texts():
    """Address texts in the forms clients and loggers write: IPv4, IPv6 compressed or exploded, in
    either case, with an IPv4 tail, with runs of zero groups; and the same texts damaged."""
    from hypothesis import strategies as st

    def v6_text(groups, form):
        a = ipaddress.IPv6Address(sum(g << (16 * (7 - i)) for i, g in enumerate(groups)))
        if form == "exploded":
            return a.exploded
        if form == "upper":
            return a.compressed.upper()
        if form == "v4tail":
            return ":".join(a.exploded.split(":")[:6]) + ":" + str(ipaddress.IPv4Address(int(a) & 0xFFFFFFFF))
        return a.compressed
    group = st.one_of(st.just(0), st.integers(0, 0xFFFF))
    v4 = st.integers(0, 2 ** 32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
    v6 = st.builds(v6_text, st.lists(group, min_size=8, max_size=8),
                   st.sampled_from(["compressed", "exploded", "upper", "v4tail"]))
    good = st.one_of(v4, v6)
    damage = st.sampled_from([":", "::", ".", "0", "f", "g", " ", "1.2.3.4", ":::"])
    bad = st.builds(lambda t, i, d, cut: (t[:i] + d + t[i + cut:]), good, st.integers(0, 40), damage, st.integers(0, 2))
    return st.one_of(good, bad)


def _py_ip_or_none(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return (None,) * 7
    return py_ip(text)


def test_ip_parsing_matches_python_on_generated_texts(spark):
    """Property: for any text, with_ip accepts exactly what Python's ipaddress accepts and gives
    the same bytes, prefixes and CRC32 (50 texts per example, one Spark query each)."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(_ip_texts(), min_size=50, max_size=50))
    def check(texts):
        df = spark.createDataFrame(list(enumerate(texts)), "i int, t string")
        got = with_ip(df, "t").select("i", "ip.family", "ip.hex", "ip.prefix16", "ip.prefix24", "ip.prefix48",
                                      "ip.prefix64", ab_bucket(F.col("ip.packed")).alias("crc"))
        want = [(i, *_py_ip_or_none(t)) for i, t in enumerate(texts)]
        assertDataFrameEqual(got, spark.createDataFrame(
            want, "i int, family int, hex string, prefix16 string, prefix24 string, prefix48 string, "
                  "prefix64 string, crc bigint"))
    check()


def test_bad_ip_rule_agrees_with_with_ip(spark):
    """Property: parse's address rule (`ccs_is_ip`) accepts exactly the texts `with_ip` (`ccs_ip`)
    gives a family, on the fixed cases and generated texts."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from ccselect.jobs.parse import _has_ip

    def compare(texts):
        df = spark.createDataFrame(list(enumerate(texts)), "i int, t string")
        got = _has_ip(df, F.col("t")).select("i", F.col("_has_ip").alias("ok"))
        want = with_ip(df, "t").select("i", F.col("ip.family").isNotNull().alias("ok"))
        assertDataFrameEqual(got, want)

    compare(IPS + BAD + [None, "", "::", "1::", "::1", "1:2:3:4:5:6:7::", "1:2:3:4:5:6:7::8", "::ffff:1.2.3.4",
                         "::FFFF:102:304", "0:0:0:0:0:ffff::", "fe80::1%eth0", "1.2.3.4 ", "01.2.3.4"])

    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(_ip_texts(), min_size=50, max_size=50))
    def check(texts):
        compare(texts)
    check()
