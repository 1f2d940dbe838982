"""The rotated layout of issue 26 (ccselect/contract.py ROTATE_MINUTES, FILE_NAME): which files
`jobs.sources.discover_all` reads as which node-hour, and the simulator's `rotate_minutes`, whose
segments hold the hourly files' records and ingest into the same silver.connections."""
from __future__ import annotations

import collections
import json
import os

import pytest

from ccselect import contract
from ccselect.jobs.sources import SourceFile, discover_all

HOUR4, HOUR5 = "2026-11-01T04", "2026-11-01T05"


def _touch(path: str, text: str = "") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def test_discover_reads_a_node_hours_segments_as_that_hour(tmp_path):
    n1, n2 = tmp_path / "transport" / "n1", tmp_path / "transport" / "n2"
    segs = [_touch(str(n1 / f"{HOUR4}{m}.jsonl")) for m in ("00", "01", "01.1", "59")]
    _touch(str(n1 / f".{HOUR4}02.jsonl.part"))                 # being written: not there yet
    both = [_touch(str(n1 / f"{HOUR5}.jsonl")), _touch(str(n1 / f"{HOUR5}01.jsonl"))]
    reopened = _touch(str(n2 / f"{HOUR5}07.1.jsonl"))
    bad_minute = _touch(str(n2 / f"{HOUR5}60.jsonl"))

    found, skipped = discover_all(str(tmp_path))

    assert found == sorted([SourceFile("transport", "n1", HOUR4, p) for p in segs]
                           + [SourceFile("transport", "n2", HOUR5, reopened)]), found
    why = {s.path: s.why for s in skipped}
    assert sorted(why) == sorted([*both, bad_minute]), f"reported: {why} (a .part is skipped silently)"
    for p in both:
        assert why[p] == f"the node-hour {HOUR5} has both an hourly file and segments", (p, why[p])
    assert why[bad_minute].startswith("file name is not <YYYY-MM-DDTHH>.jsonl"), why[bad_minute]


# ---- the simulator's segments ----------------------------------------------------------------------

ROTATE = 10
TIME = {"transport": "ts_end_ms", "access": "ts_ms", "qoe": "ts_ms"}


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    """The same tiny fleet (same seed) twice: hourly files, and segments every ROTATE minutes."""
    from ccselect.sim.fleet import simulate
    from ccselect.sim.params import SimParams
    params = SimParams(nodes=2, hours=1, conns_per_node_hour=150, seed=5)
    hourly, rotated = str(tmp_path_factory.mktemp("hourly")), str(tmp_path_factory.mktemp("rotated"))
    simulate(params, hourly, workers=1, progress=False)
    manifest = simulate(params, rotated, workers=1, progress=False, rotate_minutes=ROTATE)
    assert manifest["rotate_minutes"] == ROTATE
    return hourly, rotated


def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


def test_segments_hold_the_hourly_records_by_time(fleets):
    hourly, rotated = fleets
    hourly_files, _ = discover_all(hourly)
    seg_files, skipped = discover_all(rotated)
    assert skipped == [], skipped
    segs = collections.defaultdict(list)
    for f in seg_files:
        segs[(f.stream, f.node_id, f.hour)].append(f.path)
    assert sorted(segs) == sorted((f.stream, f.node_id, f.hour) for f in hourly_files), "the same node-hours"
    for f in hourly_files:
        want = _lines(f.path)
        got = []
        for path in sorted(segs[(f.stream, f.node_id, f.hour)]):
            m = contract.FILE_NAME.match(os.path.basename(path))
            assert m and m.group(1) == f.hour and int(m.group(2)) % ROTATE == 0 and m.group(3) is None, path
            lines = _lines(path)
            assert lines, f"{path}: an empty segment"
            start = f.hour_start_ms + int(m.group(2)) * 60_000
            for ln in lines:
                t = json.loads(ln)[TIME[f.stream]]
                assert start <= t < start + ROTATE * 60_000, f"{path}: {TIME[f.stream]} {t} outside the segment"
            at = [want.index(ln) for ln in lines]
            assert at == sorted(at), f"{path}: records not in the hourly file's order"
            got += lines
        assert collections.Counter(got) == collections.Counter(want), \
            f"{f.stream} {f.node_id} {f.hour}: the segments' records are not the hourly file's"


def test_segments_ingest_to_the_same_silver(fleets, spark, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from ccs_testing import write_config
    from ccselect.config import load_config
    from ccselect.lake import table_path
    from ccselect.jobs import ingest

    hourly, rotated = fleets
    lakes = {}
    for name, fleet in (("hourly", hourly), ("rotated", rotated)):
        (tmp_path / name).mkdir()
        cfg = load_config(write_config(tmp_path / name))
        res = ingest.run(spark, cfg, fleet)
        assert res["skipped"] == [], res["skipped"]
        lakes[name] = cfg

    def table(name, t):
        return spark.read.format("delta").load(table_path(lakes[name], t))

    conns = table("rotated", "silver.connections")
    assert conns.count() > 100, "a fleet big enough to compare"
    assertDataFrameEqual(conns, table("hourly", "silver.connections"))

    audit = table("rotated", "gold.ingest_audit")
    files = {f.path: f for f in discover_all(rotated)[0]}
    rows = audit.collect()
    assert sorted(r["source_file"] for r in rows) == sorted(files), "one audit row per segment file"
    for r in rows:
        f = files[r["source_file"]]
        assert (r["stream"], r["node_id"], r["hour"]) == (f.stream, f.node_id, f.hour), r
        assert r["lines_read"] == len(_lines(f.path)) == r["accepted"] + r["quarantined"], r
    keys = ["stream", "node_id", "hour"]
    sums = [F.sum(c).alias(c) for c in ("lines_read", "accepted", "quarantined")]
    assertDataFrameEqual(audit.groupBy(*keys).agg(*sums),
                         table("hourly", "gold.ingest_audit").groupBy(*keys).agg(*sums))
