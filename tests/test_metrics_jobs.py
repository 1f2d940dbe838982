"""Each batch job's rows and duration (flows/job_metrics.py, issue 59): a textfile per job under
`pipeline.metrics_dir`, written when a step of flows/pipeline.py ends. Real steps that need no Spark
here (promotion left to a human; an export without a signing key, which fails before its work);
the jobs with rows are checked against the lake the main job's DAG runs wrote (tests/test_dags.py,
`main_job`)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ccselect.flows import job_metrics, pipeline
from ccs_testing import raw_section, write_config


def parse(text: str) -> dict:
    """{(name, sorted labels without job): value} of one job's file."""
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def promtool_check(path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed under CI (make sysdeps)", pytrace=False)
        return
    with open(path) as f:
        r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_step_writes_its_outcome_duration_and_last_success(tmp_path):
    from ccselect.config import load_config
    cfg = load_config(write_config(tmp_path, pipeline={**raw_section("pipeline"), "metrics_dir": str(tmp_path / "textfile")}))
    # promotion left to a human: a run that succeeds, with no rows
    res = pipeline.promote_if_configured("1", cfg, auto=False)
    assert res["promoted"] is False
    path = tmp_path / "textfile" / "ccs-job-promote.prom"
    m = parse(path.read_text())
    assert m[("ccs_job_last_run_outcome", (("outcome", "ok"),))] == 1
    assert m[("ccs_job_last_run_outcome", (("outcome", "failed"),))] == 0
    assert m[("ccs_job_duration_seconds", ())] >= 0
    assert m[("ccs_job_last_success_timestamp_seconds", ())] == m[("ccs_job_last_run_timestamp_seconds", ())]
    assert not any(k[0] == "ccs_job_rows" for k in m), "no rows for a step that has none"
    promtool_check(path)

    # an export without a signing key fails; its file says so, with no success yet
    with pytest.raises(FileNotFoundError):
        pipeline.export_hour("2026-11-01T05", cfg)
    m = parse((tmp_path / "textfile" / "ccs-job-export.prom").read_text())
    assert m[("ccs_job_last_run_outcome", (("outcome", "failed"),))] == 1
    assert ("ccs_job_last_success_timestamp_seconds", ()) not in m and not any(k[0] == "ccs_job_rows" for k in m)

    # a later failure keeps the last success's time
    before = parse(path.read_text())[("ccs_job_last_success_timestamp_seconds", ())]
    job_metrics.write(str(tmp_path / "textfile"), "promote", "failed", before + 5, 0.1, None)
    m = parse(path.read_text())
    assert m[("ccs_job_last_success_timestamp_seconds", ())] == before
    assert m[("ccs_job_last_run_outcome", (("outcome", "failed"),))] == 1
    assert sorted(os.listdir(tmp_path / "textfile")) == ["ccs-job-export.prom", "ccs-job-promote.prom"], \
        "no temporary file left"


def test_no_metrics_dir_no_file(cfg, tmp_path):
    assert cfg.settings.pipeline.metrics_dir is None
    pipeline.promote_if_configured("1", cfg, auto=False)
    assert job_metrics.write_freeze(cfg) is None
    assert not any(p.name.endswith(".prom") for p in tmp_path.rglob("*"))


def test_ingest_rows_and_quarantine_by_reason_code(tmp_path):
    """An ingest result as jobs.ingest.summarize gives it: rows by kind, quarantined lines by
    stream and reason code (fields not in the label), summing to the quarantined rows."""
    res = {"hour": "2026-11-01T05", "files": 3, "silver_rows": 90, "streams": {
        "transport": {"lines_read": 100, "accepted": 95, "quarantined": 5,
                      "by_reason": {"bad_json": 2, "missing_key:min_rtt_us": 1, "missing_key:cc,mss_bytes": 2}},
        "access": {"lines_read": 10, "accepted": 10, "quarantined": 0}}}
    path = job_metrics.write(str(tmp_path), "ingest", "ok", 1.8e9, 12.5, res)
    m = parse(open(path).read())
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "ccs_job_rows"} == {
        "files": 3, "lines_read": 110, "accepted": 105, "quarantined": 5, "silver": 90}
    q = {tuple(v for _, v in k[1]): n for k, n in m.items() if k[0] == "ccs_job_rows_quarantined"}
    assert q == {("bad_json", "transport"): 2, ("missing_key", "transport"): 3}
    assert m[("ccs_job_duration_seconds", ())] == 12.5
    promtool_check(path)


def test_the_freeze_gauge_follows_ccs_freeze_unfreeze_and_the_rollout_step(tmp_path):
    """ccs-rollout-freeze.prom (flows/job_metrics.write_freeze) on a folder store: `ccs freeze` and
    `ccs unfreeze` rewrite it at once; a freeze made without it (a gate's rollback inside a
    rollout, who: rollout) shows after the next rollout step, here one that fails before its work
    (no fleet file)."""
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    from ccselect.config import load_config
    from ccselect.export.delivery import freeze
    from ccselect.export.delivery.store import store_for
    textfile = tmp_path / "textfile"
    path = write_config(tmp_path, pipeline={**raw_section("pipeline"), "metrics_dir": str(textfile),
                                            "fleet": str(tmp_path / "no-fleet.yaml")})
    cfg = load_config(path)
    gauge = textfile / job_metrics.FREEZE_FILE

    r = CliRunner().invoke(app, ["freeze", "--reason", "v2 doubled retransmissions on pop-7", "--who", "ana@ops",
                                 "--config", str(path)])
    assert r.exit_code == 0, r.output
    rec = freeze.current(store_for(cfg))
    m = parse(gauge.read_text())
    assert m == {("ccs_rollout_frozen", (("by", "operator"),)): 1, ("ccs_rollout_frozen", (("by", "rollout"),)): 0,
                 ("ccs_rollout_frozen_since_timestamp_seconds", ()): rec["at_ms"] / 1000, ("ccs_rollout_inflight", ()): 0}, m
    promtool_check(gauge)

    r = CliRunner().invoke(app, ["unfreeze", "--reason", "pop-7's clients fixed", "--config", str(path)])
    assert r.exit_code == 0, r.output
    m = parse(gauge.read_text())
    assert m == {("ccs_rollout_frozen", (("by", "operator"),)): 0, ("ccs_rollout_frozen", (("by", "rollout"),)): 0,
                 ("ccs_rollout_inflight", ()): 0}, m
    promtool_check(gauge)

    # the gate's own freeze, as export/delivery/rollout.deploy writes it: no file rewritten yet
    rec = freeze.freeze(store_for(cfg), "table 0:2 rolled back on cohort canary: retransmissions up", who="rollout")
    assert parse(gauge.read_text())[("ccs_rollout_frozen", (("by", "rollout"),))] == 0
    with pytest.raises(FileNotFoundError, match="no-fleet.yaml"):
        pipeline.rollout(2, cfg)
    m = parse(gauge.read_text())
    assert m == {("ccs_rollout_frozen", (("by", "operator"),)): 0, ("ccs_rollout_frozen", (("by", "rollout"),)): 1,
                 ("ccs_rollout_frozen_since_timestamp_seconds", ()): rec["at_ms"] / 1000,
                 ("ccs_rollout_inflight", ()): 0}, m
    assert parse((textfile / "ccs-job-rollout.prom").read_text())[
        ("ccs_job_last_run_outcome", (("outcome", "failed"),))] == 1
    assert sorted(os.listdir(textfile)) == ["ccs-job-rollout.prom", job_metrics.FREEZE_FILE], "no temporary file left"

    # a rollout in flight (export/delivery/inflight.py's record, the fields the gauges read) on the
    # 50% cohort: its gauges beside the freeze's; gone once it ends
    from ccselect.export.delivery import inflight
    store = store_for(cfg)
    store.write_json(inflight.KEY, {"rollout_id": "0:3@1", "version": 3, "epoch": 0, "cohort": "50%", "index": 1,
                                    "nodes": ["n2"], "loaded_ms": 1_790_000_061_500})
    job_metrics.write_freeze(cfg)
    m = parse(gauge.read_text())
    assert (m[("ccs_rollout_inflight", ())], m[("ccs_rollout_inflight_cohort_loaded_timestamp_seconds", ())],
            m[("ccs_rollout_inflight_cohort_index", ())]) == (1, 1_790_000_061.5, 1), m
    promtool_check(gauge)
    store.write_json(inflight.KEY, {"version": None, "next": None, "last": {"rollout_id": "0:3@1", "version": 3}})
    job_metrics.write_freeze(cfg)
    m = parse(gauge.read_text())
    assert m[("ccs_rollout_inflight", ())] == 0 and ("ccs_rollout_inflight_cohort_index", ()) not in m, m
