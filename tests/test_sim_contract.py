"""The simulator's files follow the data contract: every field, type, unit range; one file per
node and hour with every timestamp inside it; the ground truth kept apart; deterministic."""
from __future__ import annotations

import glob
import hashlib
import ipaddress
import json
import os
from datetime import datetime, timezone

import pytest

from ccselect import contract
from ccselect.sim.fleet import simulate
from ccselect.sim.params import SimParams


def _records(out: str, stream: str):
    for path in sorted(glob.glob(os.path.join(out, stream, "*", "*.jsonl"))):
        hour = datetime.strptime(os.path.basename(path), "%Y-%m-%dT%H.jsonl").replace(tzinfo=timezone.utc)
        lo = int(hour.timestamp() * 1000)
        with open(path) as fh:
            for line in fh:
                yield path, lo, json.loads(line)


@pytest.mark.parametrize("stream", contract.STREAMS)
def test_every_record_matches_the_contract(small_fleet, stream):
    out, _ = small_fleet
    fields = contract.FIELDS[stream]
    nullable = contract.NULLABLE[stream]
    n = 0
    for path, lo, rec in _records(out, stream):
        n += 1
        assert set(rec) == set(fields), f"{path}: fields {sorted(set(rec) ^ set(fields))} differ from the contract"
        for name, typ in fields.items():
            v = rec[name]
            if v is None:
                assert name in nullable, f"{path}: {name} is null but not nullable"
                continue
            assert isinstance(v, typ) and not isinstance(v, bool), f"{path}: {name}={v!r} is not {typ.__name__}"
            if name in contract.RANGES:
                a, b = contract.RANGES[name]
                assert a <= v <= b, f"{path}: {name}={v} outside [{a}, {b}]"
        ipaddress.ip_address(rec["client_ip"])
        ts = rec["ts_end_ms"] if stream == "transport" else rec["ts_ms"]
        assert lo <= ts < lo + 3_600_000, f"{path}: timestamp {ts} outside the file's hour"
        if stream == "transport":
            assert lo <= rec["ts_start_ms"] <= rec["ts_end_ms"], f"{path}: start after end"
            assert rec["cc"] in contract.CCS and rec["decision"] in contract.DECISIONS
            assert rec["min_srtt_us"] <= rec["max_srtt_us"], "min srtt above max srtt"
            assert rec["min_rtt_var_us"] <= rec["max_rtt_var_us"], "min rttvar above max"
            assert rec["min_snd_wnd_bytes"] <= rec["max_snd_wnd_bytes"] or rec["min_snd_wnd_bytes"] == 0
            assert rec["min_rto_us"] >= 200_000, "Linux never sets an RTO below rto_min (200 ms)"
            assert rec["total_retrans"] <= rec["data_segs_out"]
            assert rec["max_inflight_segs"] <= rec["max_cwnd_segs"]
            assert 1280 <= rec["mss_bytes"] <= 1460, "MSS outside what real paths announce"
        if stream == "access" and rec["net_type"] is not None:
            assert rec["net_type"] in contract.NET_TYPES
        if stream == "qoe":
            assert 0 <= rec["rebuffer_ms"] <= rec["play_ms"], "rebuffered longer than played"
            assert (rec["rebuffer_count"] > 0) == (rec["rebuffer_ms"] > 0)
    assert n > 1000, f"too few {stream} records to check ({n})"


def test_one_file_per_node_and_hour_and_unique_ids(small_fleet):
    out, manifest = small_fleet
    for stream in contract.STREAMS:
        files = glob.glob(os.path.join(out, stream, "*", "*.jsonl"))
        assert len(files) == len(manifest["nodes"]) * manifest["params"]["hours"], stream
    ids = [r["conn_id"] for _, _, r in _records(out, "transport")]
    assert len(ids) == len(set(ids)) == manifest["counts"]["transport"], "conn_id must be unique fleet-wide"
    conns = set(ids)
    assert all(r["conn_id"] in conns for _, _, r in _records(out, "access")), "request of an unknown connection"
    assert all(r["conn_id"] in conns for _, _, r in _records(out, "qoe")), "beacon of an unknown connection"


def test_ab_mode_follows_crc32_parity(small_fleet):
    import zlib
    out, _ = small_fleet
    for _, _, r in _records(out, "transport"):
        odd = zlib.crc32(ipaddress.ip_address(r["client_ip"]).packed) & 1
        assert r["cc"] == ("bbr" if odd else "cubic"), f"{r['client_ip']}: A/B arm does not follow CRC32 parity"
        assert r["decision"] == ("table" if odd else "ab_control")


def test_reference_table_covers_every_client(small_fleet):
    import csv
    out, _ = small_fleet
    with open(os.path.join(out, "reference", "ip_asn_region.csv")) as fh:
        nets = [ipaddress.ip_network(r["cidr"]) for r in csv.DictReader(fh)]
    by_family = {4: {n for n in nets if n.version == 4}, 6: {n for n in nets if n.version == 6}}
    for _, _, r in _records(out, "transport"):
        ip = ipaddress.ip_address(r["client_ip"])
        plen = 16 if ip.version == 4 else 32
        assert ipaddress.ip_network(f"{ip}/{plen}", strict=False) in by_family[ip.version], f"{ip} has no ASN/region"
        assert ip.is_global, f"{ip} is not a public address"


def test_ground_truth_is_kept_apart(small_fleet):
    out, _ = small_fleet
    truth = os.path.join(out, "_truth")
    assert os.path.isdir(os.path.join(truth, "connections")) and os.path.exists(os.path.join(truth, "prefixes.parquet"))
    for stream in contract.STREAMS:
        for path in glob.glob(os.path.join(out, stream, "*", "*.jsonl"))[:3]:
            text = open(path).read()
            assert "share_cell" not in text and "policed" not in text, "truth leaked into the logs"


def _digest(out: str) -> str:
    h = hashlib.sha256()
    for stream in contract.STREAMS:
        for path in sorted(glob.glob(os.path.join(out, stream, "*", "*.jsonl"))):
            h.update(os.path.relpath(path, out).encode())
            h.update(open(path, "rb").read())
    return h.hexdigest()


def test_same_seed_same_files_whatever_the_workers(tmp_path):
    p = SimParams(nodes=3, hours=2, conns_per_node_hour=200, seed=5)
    simulate(p, str(tmp_path / "a"), workers=1, progress=False)
    simulate(p, str(tmp_path / "b"), workers=2, progress=False)
    simulate(SimParams(nodes=3, hours=2, conns_per_node_hour=200, seed=6), str(tmp_path / "c"), workers=1, progress=False)
    assert _digest(str(tmp_path / "a")) == _digest(str(tmp_path / "b")), "output depends on the worker count"
    assert _digest(str(tmp_path / "a")) != _digest(str(tmp_path / "c")), "the seed changes nothing"


def test_table_mode_serves_the_tables_cc(tmp_path):
    """cc_mode=table closes the loop: a prefix→CC table decides, misses stay on the default."""
    table = tmp_path / "table.csv"
    p = SimParams(nodes=2, hours=1, conns_per_node_hour=300, seed=3)
    simulate(p, str(tmp_path / "ab"), workers=1, progress=False)
    ips = [r["client_ip"] for _, _, r in _records(str(tmp_path / "ab"), "transport")]
    v4 = sorted({str(ipaddress.ip_network(f"{ip}/24", strict=False)) for ip in ips if ":" not in ip})
    v6 = sorted({str(ipaddress.ip_network(f"{ip}/48", strict=False)) for ip in ips if ":" in ip})
    bbr24, bbr48 = set(v4[::2]), set(v6[::2])
    table.write_text("cidr,cc\n" + "".join(f"{c},bbr\n" for c in sorted(bbr24 | bbr48)))
    from dataclasses import replace
    simulate(replace(p, cc_mode="table", table_path=str(table)), str(tmp_path / "t"), workers=1, progress=False)
    n_hit = 0
    for _, _, r in _records(str(tmp_path / "t"), "transport"):
        ip = ipaddress.ip_address(r["client_ip"])
        net = str(ipaddress.ip_network(f"{ip}/{24 if ip.version == 4 else 48}", strict=False))
        hit = net in bbr24 | bbr48
        n_hit += hit
        assert (r["cc"], r["decision"]) == (("bbr", "table") if hit else ("cubic", "default")), net
        assert r["table_version"] == "table.csv"
    assert n_hit > 0


def test_bad_parameters_are_refused(tmp_path):
    with pytest.raises(ValueError, match="table_path"):
        simulate(SimParams(nodes=1, hours=1, cc_mode="table"), str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="/16"):
        simulate(SimParams(nodes=1, hours=1, fault_mss_prefix16="10.0.0.0/8"), str(tmp_path), progress=False)


def test_resimulating_into_the_same_folder_leaves_no_stale_files(tmp_path):
    import glob
    simulate(SimParams(nodes=3, hours=2, conns_per_node_hour=100, seed=1), str(tmp_path), workers=1, progress=False)
    m = simulate(SimParams(nodes=2, hours=1, conns_per_node_hour=100, seed=1), str(tmp_path), workers=1, progress=False)
    assert len(glob.glob(str(tmp_path / "transport" / "*" / "*.jsonl"))) == 2, "files of the earlier, larger run remain"
    from ccselect.sim.fleet import code_version
    assert m["code_version"] == code_version()


def test_planted_mss_fault_changes_only_the_mss_of_its_prefix16_from_its_hour():
    """The issue-5 fault: from `fault_start_hour` on, the /16's IPv4 connections log MSS
    `fault_mss_bytes`; every other column of every stream is what the fault-free fleet writes."""
    from ccselect.sim.traffic import generate_node_hour
    from ccselect.sim.world import World
    base = SimParams(nodes=4, hours=3, conns_per_node_hour=300, seed=5)
    clean = World(base)
    faulty = World(SimParams(**{**base.to_dict(), "fault_mss_prefix16": "auto", "fault_start_hour": 1}))
    net16 = ipaddress.ip_network(f"{faulty.fault_prefix16 >> 8}.{faulty.fault_prefix16 & 255}.0.0/16")
    assert any(n.labelled for n in faulty.nodes) and clean.fault_prefix16 is None
    hit = 0
    for node in range(base.nodes):
        for hour in range(base.hours):
            a, b = generate_node_hour(clean, node, hour), generate_node_hour(faulty, node, hour)
            for stream in ("access", "qoe"):
                assert getattr(a, stream).equals(getattr(b, stream))
            assert a.transport.drop("mss_bytes").equals(b.transport.drop("mss_bytes"))
            inside = [ipaddress.ip_address(ip) in net16 if ":" not in ip else False for ip in b.transport["client_ip"]]
            want = [536 if (f and hour >= 1) else m for f, m in zip(inside, a.transport["mss_bytes"])]
            assert b.transport["mss_bytes"].to_list() == want
            truth = dict(zip(b.truth["conn_id"], b.truth["fault_mss"]))
            assert [truth[c] for c in b.transport["conn_id"]] == [f and hour >= 1 for f in inside]
            hit += sum(inside) * (hour >= 1)
    assert hit > 0


def test_busy_nodes_get_distinct_prefixes_beyond_a_regions_blocks():
    """At bench/ingest's 5 M connections (17,361 per node-hour) a node wants more /24s of a small
    ISP in its region than that ISP's one /16 there holds: the extra prefixes come from the ISP's
    blocks in other regions (this used to loop forever); every prefix stays distinct and in the
    reference table's blocks."""
    from ccselect.sim.world import World
    w = World(SimParams(nodes=12, hours=24, conns_per_node_hour=17_361, seed=17))
    blocks = {(b.family, b.net, b.region) for b in w.blocks}
    for i in range(len(w.nodes)):
        ps = w.prefixes(i)
        keys = list(zip(ps.family.tolist(), ps.net.tolist()))
        assert len(set(keys)) == len(keys), f"node {i}: a prefix drawn twice"
        for fam, net, region in zip(ps.family.tolist(), ps.net.tolist(), ps.region.tolist()):
            parent = net >> (8 if fam == 4 else 16)
            assert (fam, parent, region) in blocks, f"node {i}: prefix {net:x} not in its region's block"
