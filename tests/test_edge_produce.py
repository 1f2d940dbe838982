"""bench/edge_produce.c's write mode (the agent's segment write path, issue 60's edge-cost bench)
leaves each segment with the bytes it was given, under its name, and no .part behind; a file
that is not there is refused. Needs cc and librdkafka's headers (make sysdeps); skipped without."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ccs_testing import REPO

BIN = REPO / "export" / "build" / "edge-produce"


@pytest.fixture(scope="module")
def binary():
    if not shutil.which("cc") or not Path("/usr/include/librdkafka/rdkafka.h").exists():
        pytest.skip("no cc or librdkafka-dev (make sysdeps)")
    subprocess.run(["make", "-s", "-C", str(REPO), "export/build/edge-produce"], check=True, timeout=120)
    return BIN


def test_write_mode_writes_the_same_bytes_under_the_segment_names(binary, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    segs = {"2026-11-01T0000.jsonl": b'{"conn_id":"a1","node_id":"n1"}\n{"conn_id":"a2","node_id":"n1"}\n',
            "2026-11-01T0001.jsonl": b'{"conn_id":"a3","node_id":"n1"}\n' * 300 + b'not json\n'}
    rows = []
    for name, body in segs.items():
        (src / name).write_bytes(body)
        rows.append(f"n1\t{name}\t{src / name}\n")
    manifest = tmp_path / "m.tsv"
    manifest.write_text("".join(rows))
    for drain in ("0", "1"):
        out = tmp_path / f"out-{drain}"
        r = subprocess.run([str(binary), "write", str(manifest), str(out), "--drain", drain],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["records"] == 2 + 301 and got["segments"] == 2 and got["failed"] == 0
        assert sorted(p.name for p in out.iterdir()) == sorted(segs)
        for name, body in segs.items():
            assert (out / name).read_bytes() == body
    manifest.write_text(f"n1\t2026-11-01T0002.jsonl\t{src / 'missing'}\n")
    r = subprocess.run([str(binary), "write", str(manifest), str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "missing" in r.stderr
