"""Property-based: corrupted lines never crash parsing, every bad line is quarantined with a
machine-readable reason, good lines pass, and the per-file audit balances."""
from __future__ import annotations

import json
import re
from datetime import datetime

from hypothesis import HealthCheck, given, settings, strategies as st
from pyspark.sql import functions as F

from ccselect.jobs.ingest import to_audit, to_bronze
from tests.test_ingest_parse import H0, HOUR, lines_df, transport

REASON = re.compile(r"^(bad_json|bad_nginx_line|node_mismatch|bad_ip|unknown_cc|unknown_decision|mss_out_of_range|"
                    r"negative_rtt|absurd_rtt|out_of_hour|bad_time_order|duplicate_conn_id|"
                    r"(missing_key|wrong_type|out_of_range):[a-z_]+)$")


def corruptions(i: int):
    good = transport(conn_id=f"g{i}")
    text = json.dumps(good)
    return st.one_of(
        st.integers(1, len(text) - 1).map(lambda n: ("bad", text[:n])),                          # truncated JSON
        st.binary(min_size=1, max_size=40).map(lambda b: ("bad", b.decode("latin-1").replace("\n", " "))),
        st.sampled_from(["min_rtt_us", "mss_bytes", "client_ip", "cc", "ts_end_ms"]).flatmap(    # wrong types
            lambda f: st.sampled_from(["x", 1.5, [1], {"a": 1}, True]).map(
                lambda v: ("bad", json.dumps({**good, f: v})))),
        st.sampled_from(["bytes_acked", "min_rtt_us", "duration_us"]).flatmap(                    # huge numbers
            lambda f: st.sampled_from([2 ** 63, 10 ** 30, 1e300, -(2 ** 63) - 1]).map(
                lambda v: ("bad", json.dumps({**good, f: v})))),
        st.sampled_from(["1.2.3", "256.0.0.1", "::1::", "abc", "1.2.3.4/24", ""]).map(            # bad IPs
            lambda ip: ("bad", json.dumps({**good, "client_ip": ip}))),
        st.sampled_from([-1, 3_600_000, 10 ** 9]).map(                                            # out of hour
            lambda d: ("bad", json.dumps({**good, "ts_start_ms": H0 + d, "ts_end_ms": H0 + d}))),
        st.just(("good", text)),
    )


@st.composite
def files(draw):
    n = draw(st.integers(1, 8))
    return [draw(corruptions(i)) for i in range(n)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=files())
def test_corrupted_lines_are_quarantined_and_audit_balances(spark, lines):
    df = lines_df(spark, "transport", [raw for _, raw in lines])
    bronze = to_bronze(df, "transport", datetime(2026, 11, 1)).cache()
    rows = {r["line_no"]: (r["status"], r["reason"]) for r in bronze.collect()}
    assert sorted(rows) == list(range(1, len(lines) + 1))
    for i, (kind, raw) in enumerate(lines, start=1):
        status, reason = rows[i]
        if kind == "bad":
            assert status == "quarantined" and reason and REASON.match(reason), (raw, status, reason)
        else:
            assert (status, reason) == ("ok", None), (raw, reason)
    files_df = spark.createDataFrame([("transport", "n1", HOUR, f"/x/transport/n1/{HOUR}.jsonl")],
                                     "stream string, node_id string, hour string, source_file string")
    a = to_audit(bronze, files_df, datetime(2026, 11, 1)).collect()[0]
    assert a["lines_read"] == len(lines) == a["accepted"] + a["quarantined"]
    assert sum(a["quarantined_by_reason"].values()) == a["quarantined"]
    bronze.unpersist()
