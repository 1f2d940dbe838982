"""silver.connections transforms on tiny inline frames, compared whole."""
from __future__ import annotations

import ipaddress
import zlib

from pyspark.testing import assertDataFrameEqual

from ccselect.jobs.silver import access_labels, build_connections, derived, qoe_per_conn, read_reference, reference_frame

ACCESS = ("node_id string, hour string, conn_id string, client_ip string, client_port bigint, "
          "net_type string, bytes_sent bigint, request_time_ms bigint")


def test_access_labels_by_conn_and_by_socket(spark):
    acc = spark.createDataFrame([
        ("n", "h", "c1", "1.2.3.4", None, None, 10, 3), ("n", "h", "c1", "1.2.3.4", None, "wifi", 20, 4),
        ("n", "h", "c2", "1.2.3.5", None, "4g", 1, 0), ("n", "h", "c2", "1.2.3.5", None, "wifi", 1, 0),  # conflict
        ("n", "h", "c3", "1.2.3.6", None, None, 5, 1),
        ("n", "h", None, "2001:db8::1", 5000, "5g", 7, 2),                                             # nginx
    ], ACCESS)
    by_conn, by_socket = access_labels(acc)
    assertDataFrameEqual(by_conn, spark.createDataFrame(
        [("n", "h", "c1", 2, 30, 7, "wifi"), ("n", "h", "c2", 2, 2, 0, None), ("n", "h", "c3", 1, 5, 1, None)],
        "node_id string, hour string, conn_id string, requests bigint, bytes_sent bigint, request_time_ms bigint, "
        "net_type string"))
    assertDataFrameEqual(by_socket, spark.createDataFrame(
        [("n", "h", "2001:db8::1", 5000, 1, 7, 2, "5g")],
        "node_id string, hour string, client_ip string, client_port bigint, requests bigint, bytes_sent bigint, "
        "request_time_ms bigint, net_type string"))


def test_derived_fields_handle_zero_denominators(spark):
    df = spark.createDataFrame([(1000, 2_000_000, 10, 100, 5000, 20000, 0, 100, 900, 400),
                                (1000, 0, 0, 0, 0, 20000, None, None, 900, 0),
                                (1000, 0, 0, 0, 0, 20000, None, None, None, None)],
                               "bytes_acked bigint, duration_us bigint, total_retrans bigint, data_segs_out bigint, "
                               "max_rtt_var_us bigint, max_srtt_us bigint, rebuffer_ms bigint, play_ms bigint, "
                               "bytes_sent bigint, request_time_ms bigint")
    got = derived(df).select("goodput_bps", "delivery_rate_bps", "retrans_ratio", "rtt_var_norm", "rebuffer_rate")
    # delivery rate: 900 bytes served in 400 ms = 18,000 bit/s; none without serving time or requests
    assertDataFrameEqual(got, spark.createDataFrame(
        [(4000.0, 18000.0, 0.1, 0.25, 0.0), (None, None, None, 0.0, None), (None, None, None, 0.0, None)],
        "goodput_bps double, delivery_rate_bps double, retrans_ratio double, rtt_var_norm double, rebuffer_rate double"))


def test_build_connections_enriches_and_joins(spark, tmp_path):
    ref = tmp_path / "ip_asn_region.csv"
    ref.write_text("cidr,asn,isp,region\n10.1.0.0/16,4134,chinanet,henan\n2408:833e::/32,4837,unicom,beijing\n"
                   "10.0.0.0/8,9808,cmcc,any\n")
    reference = reference_frame(spark, read_reference(str(ref)))
    cols = ("conn_id string, node_id string, hour string, ts_start_ms bigint, ts_end_ms bigint, client_ip string, "
            "client_port bigint, server_port bigint, cc string, decision string, table_version string, "
            + ", ".join(f"{f} bigint" for f in (
                "mss_bytes", "connection_time_us", "init_snd_wnd_bytes", "min_rtt_us", "max_snd_wnd_bytes",
                "min_snd_wnd_bytes", "min_rtt_var_us", "max_rtt_var_us", "min_rto_us", "min_srtt_us",
                "max_srtt_us", "max_cwnd_segs", "bytes_acked", "data_segs_out", "total_retrans",
                "max_inflight_segs", "duration_us")))
    base = [1448, 1, 1, 1000, 1, 1, 10, 10, 1, 1000, 1000, 10, 1000, 10, 1, 5, 1_000_000]
    t = spark.createDataFrame([
        ("c1", "n", "h", 1, 2, "10.1.2.3", 40000, 443, "bbr", "ab_control", None, *base),
        ("c2", "n", "h", 1, 2, "10.200.0.1", 40001, 443, "cubic", "ab_control", "v", *base),
        ("c3", "n", "h", 1, 2, "2408:833e:d113:0:a4c:7b5f:c63c:7ab9", 5000, 443, "cubic", "table", "v", *base),
        ("c4", "n", "h", 1, 2, "192.168.0.1", 40002, 443, "cubic", "default", "v", *base),
    ], cols)
    acc = spark.createDataFrame([("n", "h", "c1", "10.1.2.3", None, "wifi", 100, 10),
                                 ("n", "h", None, "2408:833e:d113:0:a4c:7b5f:c63c:7ab9", 5000, "4g", 50, 5)], ACCESS)
    qoe = spark.createDataFrame([("n", "h", "c1", 1000, 100, 1, 300), ("n", "h", "c1", 1000, 0, 0, 200)],
                                "node_id string, hour string, conn_id string, play_ms bigint, rebuffer_ms bigint, "
                                "rebuffer_count bigint, startup_ms bigint")
    got = build_connections(t, acc, qoe, reference).select(
        "conn_id", "family", "prefix16", "prefix24", "prefix48", "prefix64", "ab_bucket", "ab_treatment", "ug_id",
        "net_type", "label", "requests", "qoe_sessions", "play_ms", "rebuffer_rate", "delivery_rate_bps", "node_id", "hour")

    def crc(ip):
        c = zlib.crc32(ipaddress.ip_address(ip).packed)
        return c, c % 2 == 1
    want = [
        ("c1", 4, "10.1.0.0/16", "10.1.2.0/24", None, None, *crc("10.1.2.3"), "henan-AS4134", "wifi", 1, 1, 2, 2000, 0.05, 80_000.0, "n", "h"),
        ("c2", 4, "10.200.0.0/16", "10.200.0.0/24", None, None, *crc("10.200.0.1"), "any-AS9808", None, None, 0, 0, None, None, None, "n", "h"),
        ("c3", 6, None, None, "2408:833e:d113::/48", "2408:833e:d113::/64",
         *crc("2408:833e:d113:0:a4c:7b5f:c63c:7ab9"), "beijing-AS4837", "4g", 0, 1, 0, None, None, 80_000.0, "n", "h"),
        ("c4", 4, "192.168.0.0/16", "192.168.0.0/24", None, None, *crc("192.168.0.1"), None, None, None, 0, 0, None, None, None, "n", "h"),
    ]
    assertDataFrameEqual(got, spark.createDataFrame(want, got.schema))
