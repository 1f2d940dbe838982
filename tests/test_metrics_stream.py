"""The data path's metrics (flows/stream_metrics.py, issue 59): `ccs stream --metrics-file` keeps a
textfile in Prometheus's format beside the stream.

The real stream (flows/stream.run, once) over one node's first 10 minutes of segments of the small
lake, one of them with a malformed line: the counters balance (lines read = accepted +
quarantined, the malformed one among the quarantined, and the quarantined by stream and reason
code sum to them, the malformed one as transport's bad_json), the segments taken in are the folder's,
the newest one processed is the newest there (no lag); a segment arriving afterwards shows as the
lag the CcsStreamLag rule reads. `promtool check metrics` passes on the file. The table part reads
a real signed manifest's shares."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from ccselect.flows.stream_metrics import StreamMetrics
from ccs_testing import copy_lake, write_segments


def _parse(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _promtool_check(text: str, tmp_path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed under CI (make sysdeps)", pytrace=False)
        return      # the rest of the test stands without it
    p = tmp_path / "m.prom"
    p.write_text(text)
    with open(p) as f:
        r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_stream_metrics_of_a_real_stream(spark, small_lake, tmp_path):
    from ccselect.flows import stream
    lake = copy_lake(small_lake, tmp_path / "lake")
    cfg = lake.cfg()
    node = sorted(os.listdir(os.path.join(small_lake.fleet_dir, "transport")))[0]
    seg = tmp_path / "segments"
    paths = write_segments(small_lake.fleet_dir, seg, [node], [small_lake.lo], minutes=10)
    bad = next(p for p in paths if p.parts[-3] == "transport")
    t = bad.stat().st_mtime
    with open(bad, "a") as fh:
        fh.write('{"conn_id": "broken", "node_id": \n')
    os.utime(bad, (t, t))
    lines = sum(len(p.read_text().splitlines()) for p in paths)

    out = tmp_path / "textfile" / "ccs-stream.prom"
    said = []
    with StreamMetrics(str(out), str(seg), cfg.settings.export.out, said.append, every_s=0.2) as metrics:
        stream.run(spark, cfg, str(seg), once=True, log=metrics)
        time.sleep(0.5)
    assert any(m.startswith("stream: {") for m in said), "the stream's lines pass through"
    text = out.read_text()
    _promtool_check(text, tmp_path)
    m = _parse(text)
    g = lambda name: m[(name, ())]  # noqa: E731
    assert g("ccs_stream_batches_total") >= 1
    assert g("ccs_stream_segments_total") == len(paths), "every segment taken in once"
    assert g("ccs_stream_lines_read_total") == lines
    assert g("ccs_stream_rows_accepted_total") + g("ccs_stream_rows_quarantined_total") == lines
    assert g("ccs_stream_rows_quarantined_total") >= 1, "the malformed line"
    by_reason = {dict(k[1])["stream"] + "/" + dict(k[1])["reason"]: v for k, v in m.items()
                 if k[0] == "ccs_stream_rows_quarantined_by_reason_total"}
    assert sum(by_reason.values()) == g("ccs_stream_rows_quarantined_total"), by_reason
    assert by_reason.get("transport/bad_json", 0) >= 1, f"the malformed line by its reason: {by_reason}"
    assert all(":" not in k for k in by_reason), "codes only, no field lists in a label"
    newest = max(p.stat().st_mtime for p in paths)
    assert g("ccs_stream_newest_segment_timestamp_seconds") == pytest.approx(newest, abs=0.01)
    assert g("ccs_stream_processed_segment_timestamp_seconds") == pytest.approx(newest, abs=0.01), \
        "caught up: the newest segment processed is the newest there"
    assert g("ccs_stream_batch_duration_seconds") > 0
    assert {k[1][0][1] for k in m if k[0] == "ccs_stream_batch_stage_duration_seconds"} >= {"bronze", "silver"}
    assert g("ccs_stream_heartbeat_timestamp_seconds") >= g("ccs_stream_last_batch_timestamp_seconds")

    # a segment arriving after the stream stopped: the lag behind it, in the next exposition
    late = seg / "transport" / node / "2099-01-01T0000.jsonl"
    late.write_text("")
    os.utime(late, (newest + 600, newest + 600))
    m2 = _parse(metrics.exposition())
    assert m2[("ccs_stream_newest_segment_timestamp_seconds", ())] - \
        m2[("ccs_stream_processed_segment_timestamp_seconds", ())] == pytest.approx(600, abs=0.01)
    assert m2[("ccs_stream_batches_total", ())] == g("ccs_stream_batches_total"), "nothing counted twice"


def test_a_table_batch_reads_the_manifest(tmp_path):
    """A micro-batch that emitted a table: its manifest's shares (a real signed manifest), the
    rollout's outcome, the table counted once."""
    from ccselect.export.artifact import signing, table_format as tf
    key = signing.generate_key()
    now = int(time.time())
    signing.write_table([tf.Entry("10.0.0.0/16", "bbr")], 7, "3", now + 3600, str(tmp_path / "out"), key,
                        created=now, extra={"ood_share": 0.125, "fallback_share": 0.25, "coverage": 0.5})
    said = []
    metrics = StreamMetrics(str(tmp_path / "s.prom"), str(tmp_path / "in"), str(tmp_path / "out"), said.append)
    info = {"batch": 4, "files": 2, "lines_read": 10, "accepted": 9, "quarantined": 1, "seconds": 1.5,
            "ended_unix": now, "stages_s": {"bronze": 1.0}, "lag_s": {"newest": 2.0, "oldest": 3.0},
            "table": {"built": True, "version": 7, "rollout": {"refused": "coverage under the floor"}}}
    metrics("stream: " + json.dumps(info))
    metrics("stream: batch 5: not read: /x (not a segment)")
    m = _parse((tmp_path / "s.prom").read_text())
    assert m[("ccs_stream_table_version", ())] == 7
    assert (m[("ccs_stream_table_ood_share", ())], m[("ccs_stream_table_fallback_share", ())],
            m[("ccs_stream_table_coverage", ())]) == (0.125, 0.25, 0.5)
    assert m[("ccs_stream_tables_emitted_total", ())] == 1
    assert m[("ccs_stream_table_rollouts_total", (("outcome", "refused"),))] == 1
    assert m[("ccs_stream_processed_segment_timestamp_seconds", ())] == now - 2.0
    assert said[1] == "stream: batch 5: not read: /x (not a segment)" and m[("ccs_stream_batches_total", ())] == 1
    _promtool_check((tmp_path / "s.prom").read_text(), tmp_path)


def test_quarantined_rows_by_reason_code(tmp_path):
    """Batches' quarantined lines by stream and reason: a reason's fields (missing_key:a,b) are
    not part of the label, so the label takes the contract's codes only; counters add up across
    batches and sum to rows_quarantined_total."""
    metrics = StreamMetrics(str(tmp_path / "s.prom"), str(tmp_path / "in"), str(tmp_path / "out"), lambda m: None)
    metrics("stream: " + json.dumps({"batch": 1, "files": 1, "lines_read": 10, "accepted": 6, "quarantined": 4,
                                     "quarantined_by_reason": {"transport": {"bad_json": 1, "missing_key:min_rtt_us": 2},
                                                               "access": {"out_of_range:status": 1}}}))
    metrics("stream: " + json.dumps({"batch": 2, "files": 1, "lines_read": 5, "accepted": 3, "quarantined": 2,
                                     "quarantined_by_reason": {"transport": {"missing_key:mss_bytes,cc": 2}}}))
    metrics("stream: " + json.dumps({"batch": 3, "files": 1, "lines_read": 5, "accepted": 5, "quarantined": 0}))
    text = (tmp_path / "s.prom").read_text()
    m = _parse(text)
    got = {tuple(v for _, v in k[1]): n for k, n in m.items() if k[0] == "ccs_stream_rows_quarantined_by_reason_total"}
    assert got == {("bad_json", "transport"): 1, ("missing_key", "transport"): 4,
                   ("out_of_range", "access"): 1}, got
    assert sum(got.values()) == m[("ccs_stream_rows_quarantined_total", ())] == 6
    _promtool_check(text, tmp_path)
