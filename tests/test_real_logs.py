"""Logs as real servers write them (issue 25): IPv4-mapped client addresses (a dual-stack
listener's `::ffff:a.b.c.d`) are IPv4 from ingest on; a connection belongs to the hour it closed
in; a repeated JSON key is bad_json; a byte order mark is ignored; gzipped files are read and
unknown names reported; a record missing features names every one, or is imputed and flagged.
Parse rules on inline lines, then ingest and validate over a hand-made folder with all of them."""
from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.contract import FEATURES
from ccselect.hours import hour_start_ms
from ccselect.ipaddr import ab_bucket, with_ip
from ccselect.jobs.parse import imputable, parse
from test_ingest_parse import H0, _DROP, expect, lines_df, transport

BOM = "\ufeff"
MISSING = ("init_snd_wnd_bytes", "max_snd_wnd_bytes")   # what older kernels do not report


def crc(dotted: str) -> int:
    return zlib.crc32(bytes(int(o) for o in dotted.split(".")))


# ---- addresses ----------------------------------------------------------------------------------

def test_ipv4_mapped_address_is_its_ipv4_address(spark):
    texts = ["::ffff:10.1.2.3", "::FFFF:a01:203", "0:0:0:0:0:ffff:7ac0:42d4", "::ffff:0.0.0.0",
             "::ffff:0:1.2.3.4", "64:ff9b::1.2.3.4", "10.1.2.3"]
    df = spark.createDataFrame(list(enumerate(texts)), "i int, t string")
    got = with_ip(df, "t").select("i", "ip.family", "ip.text", "ip.hex", "ip.prefix24", "ip.prefix48",
                                  ab_bucket(F.col("ip.packed")).alias("crc"))
    want = [(0, 4, "10.1.2.3", "0a010203", "10.1.2.0/24", None, crc("10.1.2.3")),
            (1, 4, "10.1.2.3", "0a010203", "10.1.2.0/24", None, crc("10.1.2.3")),
            (2, 4, "122.192.66.212", "7ac042d4", "122.192.66.0/24", None, crc("122.192.66.212")),
            (3, 4, "0.0.0.0", "00000000", "0.0.0.0/24", None, crc("0.0.0.0")),
            # not IPv4-mapped: the IPv4-translated form (RFC 2765) and NAT64 stay IPv6
            (4, 6, "::ffff:0:1.2.3.4", "0000000000000000ffff000001020304", None, "::/48",
             zlib.crc32(bytes.fromhex("0000000000000000ffff000001020304"))),
            (5, 6, "64:ff9b::1.2.3.4", "0064ff9b000000000000000001020304", None, "64:ff9b::/48",
             zlib.crc32(bytes.fromhex("0064ff9b000000000000000001020304"))),
            (6, 4, "10.1.2.3", "0a010203", "10.1.2.0/24", None, crc("10.1.2.3"))]
    assertDataFrameEqual(got, spark.createDataFrame(
        want, "i int, family int, text string, hex string, prefix24 string, prefix48 string, crc bigint"))


def test_canonical_text_rewrites_only_mapped_addresses(spark):
    """What silver writes as client_ip (and joins the nginx log by): the dotted quad of a mapped
    address, any other text as logged."""
    from ccselect.ipaddr import canonical_text
    texts = ["::ffff:10.1.2.3", "0:0:0:0:0:FFFF:a01:203", "0:0:0:0:0:ffff::", "2408:833e::1", "10.1.2.3",
             "::ffff:0:1.2.3.4", "not an address", None]
    df = spark.createDataFrame(list(enumerate(texts)), "i int, t string")
    got = [r["c"] for r in df.select("i", canonical_text(F.col("t")).alias("c")).orderBy("i").collect()]
    assert got == ["10.1.2.3", "10.1.2.3", "0.0.0.0", "2408:833e::1", "10.1.2.3", "::ffff:0:1.2.3.4",
                   "not an address", None]


# ---- the line rules -----------------------------------------------------------------------------

def _reasons(spark, stream, raws, impute=()):
    return parse(lines_df(spark, stream, raws), stream, impute).select("line_no", "status", "reason")


def test_connection_belongs_to_the_hour_it_closed_in(spark):
    cases = [
        (json.dumps(transport(conn_id="a", ts_start_ms=H0 - 600_000, ts_end_ms=H0 + 5)), None),   # began last hour
        (json.dumps(transport(conn_id="b", ts_start_ms=H0 - 86_400_000, ts_end_ms=H0)), None),    # a day long
        (json.dumps(transport(conn_id="c", ts_start_ms=H0 - 86_400_001, ts_end_ms=H0)), "out_of_hour"),
        (json.dumps(transport(conn_id="d", ts_start_ms=H0 + 5, ts_end_ms=H0 + 3_600_000)), "out_of_hour"),
        (json.dumps(transport(conn_id="e", ts_start_ms=H0 - 5, ts_end_ms=H0 - 1)), "out_of_hour"),
    ]
    assertDataFrameEqual(_reasons(spark, "transport", [c[0] for c in cases]), expect(spark, [c[1] for c in cases]))


def test_repeated_key_is_bad_json_and_bom_is_ignored(spark):
    good = json.dumps(transport())
    repeated = good[:-1] + ', "cc": "cubic"}'
    repeated_access = json.dumps({"conn_id": "c9", "node_id": "n1", "ts_ms": H0 + 10, "client_ip": "10.1.2.3",
                                  "service": "video", "status": 200, "bytes_sent": 1, "request_time_ms": 3,
                                  "net_type": "wifi"})[:-1] + ', "net_type": "4g"}'
    cases = [(BOM + good, None), (repeated.replace('"c1"', '"c2"'), "bad_json"),
             (json.dumps(transport(conn_id="c3", extra="x")), None)]
    assertDataFrameEqual(_reasons(spark, "transport", [c[0] for c in cases]), expect(spark, [c[1] for c in cases]))
    assertDataFrameEqual(_reasons(spark, "access", [repeated_access]), expect(spark, ["bad_json"]))
    first = parse(lines_df(spark, "transport", [BOM + good]), "transport").first()
    assert first["record"]["conn_id"] == "c1" and first["raw"].startswith(BOM)


def test_missing_features_named_every_one_or_imputed(spark):
    lines = [json.dumps(transport(conn_id="m1", **{f: _DROP for f in MISSING})),
             json.dumps(transport(conn_id="m2", init_snd_wnd_bytes=None, max_snd_wnd_bytes=_DROP)),
             json.dumps(transport(conn_id=_DROP, init_snd_wnd_bytes=_DROP)),
             json.dumps(transport(conn_id="m4", min_rtt_us="5"))]
    names = ",".join(MISSING)
    strict = [f"missing_key:{names}", f"missing_key:{names}", "missing_key:conn_id,init_snd_wnd_bytes",
              "wrong_type:min_rtt_us"]
    assertDataFrameEqual(_reasons(spark, "transport", lines), expect(spark, strict))
    imputing = [None, None, "missing_key:conn_id", "wrong_type:min_rtt_us"]   # (the imputable field is not at fault)
    impute = imputable("impute", "transport")
    assertDataFrameEqual(_reasons(spark, "transport", lines, impute), expect(spark, imputing))
    rec = parse(lines_df(spark, "transport", lines[:1]), "transport", impute).first()["record"]
    assert rec["init_snd_wnd_bytes"] is None and rec["max_snd_wnd_bytes"] is None and rec["min_rtt_us"] == 1000
    with pytest.raises(ValueError, match="missing_features"):
        imputable("zero", "transport")


# ---- a folder as a real fleet leaves it ---------------------------------------------------------

HOUR = "2026-11-01T01"
H1 = hour_start_ms(HOUR)


def _t(**over) -> dict:
    return transport(**{"node_id": "n1", "ts_start_ms": H1 + 100, "ts_end_ms": H1 + 2000, **over})


def write_real_folder(root: Path) -> Path:
    """n1: a BOM, a connection that began in the hour before, a dual-stack (::ffff:) client whose
    nginx line writes the plain IPv4 form, a record without the send-window features, a repeated
    key; n2: a gzipped file with a mapped client; and a file whose name ingest does not read."""
    d = root / "logs"
    (d / "transport" / "n1").mkdir(parents=True)
    (d / "access" / "n1").mkdir(parents=True)
    (d / "transport" / "n2").mkdir(parents=True)
    c1 = _t(conn_id="c1", client_ip="::ffff:10.1.2.3", client_port=40000, ts_start_ms=H1 - 600_000)
    c2 = _t(conn_id="c2", client_ip="10.1.2.4", client_port=40001, **{f: _DROP for f in MISSING})
    c3 = json.dumps(_t(conn_id="c3"))[:-1] + ', "conn_id": "c3b"}'
    (d / "transport" / "n1" / f"{HOUR}.jsonl").write_text(
        BOM + json.dumps(c1) + "\n" + json.dumps(c2) + "\n" + c3 + "\n", encoding="utf-8")
    secs = H1 // 1000
    (d / "access" / "n1" / f"{HOUR}.jsonl").write_text(
        f"{secs + 1}.500 n1 10.1.2.3 40000 200 5120 0.031 video wifi 28000 1500 10 65483\n"
        + json.dumps({"conn_id": "c2", "node_id": "n1", "ts_ms": H1 + 500, "client_ip": "::ffff:10.1.2.4",
                      "service": "video", "status": 200, "bytes_sent": 100, "request_time_ms": 5,
                      "net_type": "4g"}) + "\n")
    c4 = transport(conn_id="c4", node_id="n2", client_ip="::ffff:192.0.2.9", ts_start_ms=H1 + 10, ts_end_ms=H1 + 20)
    with gzip.open(d / "transport" / "n2" / f"{HOUR}.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(c4) + "\n")
    (d / "transport" / "n1" / "notes.txt").write_text("not a log\n")
    return d


SILVER = "conn_id string, hour string, family int, client_ip string, prefix24 string, prefix48 string, " \
         "ab_bucket bigint, label int, imputed array<string>"


@pytest.mark.parametrize("policy", ["quarantine", "impute"])
def test_ingest_real_folder(spark, tmp_path, policy):
    from ccselect.config import load_config
    from ccselect.lake import table_path
    from ccselect.features.labels import training_set
    from ccselect.jobs import ingest
    from ccs_testing import write_config

    logs = write_real_folder(tmp_path)
    (tmp_path / "lake").mkdir()
    cfg = load_config(write_config(tmp_path / "lake", ingest={"missing_features": policy}))
    result = ingest.run(spark, cfg, str(logs))
    assert result["skipped"] == [{"path": str(logs / "transport" / "n1" / "notes.txt"),
                                  "why": "file name is not <YYYY-MM-DDTHH>.jsonl, a segment "
                                         "<YYYY-MM-DDTHHMM>[.<seq>].jsonl, or either .gz"}]
    t = result["streams"]["transport"]
    quarantined = {"bad_json": 1} if policy == "impute" else {"bad_json": 1, f"missing_key:{','.join(MISSING)}": 1}
    assert t["lines_read"] == 4 and t["accepted"] == 4 - sum(quarantined.values()), t
    assert t["by_reason"] == quarantined, t
    silver = spark.read.format("delta").load(table_path(cfg, "silver.connections"))
    want = [("c1", HOUR, 4, "10.1.2.3", "10.1.2.0/24", None, crc("10.1.2.3"), 1, []),
            ("c4", HOUR, 4, "192.0.2.9", "192.0.2.0/24", None, crc("192.0.2.9"), None, [])]
    if policy == "impute":
        want.append(("c2", HOUR, 4, "10.1.2.4", "10.1.2.0/24", None, crc("10.1.2.4"), 0, list(MISSING)))
    assertDataFrameEqual(silver.select(*[c.split()[0] for c in SILVER.split(", ")]),
                         spark.createDataFrame(want, SILVER))
    # rows with imputed features are not learnt from; inference sees them at the training mean
    assert [r["conn_id"] for r in training_set(silver, None).collect()] == ["c1"]
    if policy == "impute":
        from ccselect.features import scaling
        stats = scaling.fit(silver, "w")
        z = scaling.transform(silver.where("conn_id = 'c2'"), stats).first()
        assert z["z_init_snd_wnd_bytes"] == 0.0 and z["z_max_snd_wnd_bytes"] == 0.0
        assert all(v is not None for v in z["features"])


def test_validate_names_each_defect(spark, tmp_path):
    from ccselect.jobs import validate

    logs = write_real_folder(tmp_path)
    (logs / "transport" / "n2" / f"{HOUR}.jsonl").write_text("")      # beside the .gz of the same hour
    report = validate.run(spark, str(logs))
    text = "\n".join(report["problems"])
    for needle in ("bad_json", f"missing_key:{','.join(MISSING)}", "notes.txt", "is there as"):
        assert needle in text, (needle, text)
    assert "out_of_hour" not in text, "a connection that began the hour before is this hour's"
    assert [(Path(n["file"]).parent.name, n["check"]) for n in report["notices"]] == [("n1", "utf8_bom")]
    imputing = validate.run(spark, str(logs), missing_features="impute")
    assert f"missing_key:{','.join(MISSING)}" not in "\n".join(imputing["problems"])
    assert ("n1", "imputed_features") in [(Path(n["file"]).parent.name, n["check"]) for n in imputing["notices"]]
