"""`ccs validate`: the contract check of edge logs without writing the lake. A simulated fleet has
no problem; a folder with a bad JSON line, an out-of-range MSS, a node logging RTTs in
milliseconds, a node with timestamps in seconds, a constant odd MSS and files ingest would not read
gets each of them named, with file:line examples."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ccs_testing import write_config

RTT_US = ("connection_time_us", "min_rtt_us", "min_rtt_var_us", "max_rtt_var_us", "min_rto_us",
          "min_srtt_us", "max_srtt_us")


def _lines(path: str) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def _write(path: Path, records: list, raw_extra: tuple[str, ...] = ()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(x + "\n" for x in raw_extra))


def build_bad_folder(fleet_dir: str, dest: Path) -> dict:
    """Edge logs with known faults, made from one transport and one access file of the fleet."""
    from ccselect.jobs.sources import discover
    files = discover(fleet_dir)
    tf = next(f for f in files if f.stream == "transport")
    af = next(f for f in files if f.stream == "access" and f.node_id == tf.node_id and f.hour == tf.hour)
    recs = _lines(tf.path)[:40]
    name = f"{tf.hour}.jsonl"

    def renode(r: dict, node: str) -> dict:
        return {**r, "node_id": node, "conn_id": r["conn_id"].replace(tf.node_id, node, 1) + "x"}

    # n-bad: good lines, one truncated JSON line (line 41), one MSS of 70000 (line 42)
    _write(dest / "transport" / "n-bad" / name, [renode(r, "n-bad") for r in recs]
           + [{**renode(recs[0], "n-bad"), "conn_id": "n-bad-mss", "mss_bytes": 70000}],
           raw_extra=())
    lines = (dest / "transport" / "n-bad" / name).read_text().splitlines()
    lines.insert(40, lines[0][:55])
    (dest / "transport" / "n-bad" / name).write_text("\n".join(lines) + "\n")
    # n-ms: every RTT-like field written in milliseconds
    _write(dest / "transport" / "n-ms" / name,
           [{**renode(r, "n-ms"), **{k: max(1, r[k] // 1000) for k in RTT_US}} for r in recs])
    # n-mss: every MSS the same odd value
    _write(dest / "transport" / "n-mss" / name, [{**renode(r, "n-mss"), "mss_bytes": 1337} for r in recs])
    # n-sec: access log timestamps in seconds
    acc = _lines(af.path)[:20]
    _write(dest / "access" / "n-sec" / name,
           [{**renode(r, "n-sec"), "ts_ms": r["ts_ms"] // 1000} for r in acc])
    # files ingest does not read
    (dest / "transport" / "n-bad" / "notes.txt").write_text("hello\n")
    (dest / "transprot" / "n-bad").mkdir(parents=True)
    (dest / "transprot" / "n-bad" / name).write_text("{}\n")
    return {"hour": tf.hour, "name": name}


def test_simulated_fleet_has_no_problem(spark, small_fleet):
    from ccselect.jobs import validate
    fleet_dir, manifest = small_fleet
    report = validate.run(spark, fleet_dir)
    assert report["problems"] == [], report["problems"][:10]
    assert set(report["streams"]) == {"transport", "access", "qoe"}
    for stream, s in report["streams"].items():
        assert s["lines_read"] == s["accepted"] > 0 and s["quarantined"] == 0, stream
        assert s["files"] == 8 * 6
    assert sum(f["lines_read"] for f in report["files"]) == sum(manifest["counts"][s] for s in report["streams"])


def test_bad_folder_names_each_problem(spark, small_fleet, tmp_path):
    from ccselect.jobs import validate
    bad = tmp_path / "bad"
    built = build_bad_folder(small_fleet[0], bad)
    report = validate.run(spark, str(bad))
    t = report["streams"]["transport"]
    assert t["by_reason"] == {"bad_json": 1, "mss_out_of_range": 1}
    assert t["lines_read"] == t["accepted"] + t["quarantined"] == 3 * 40 + 2
    per_file = {Path(f["file"]).parent.name + "/" + f["stream"]: f for f in report["files"]}
    assert per_file["n-bad/transport"]["by_reason"] == {"bad_json": 1, "mss_out_of_range": 1}
    assert per_file["n-sec/access"]["by_reason"] == {"out_of_hour": 20}
    ex = report["examples"]["transport"]
    bad_file = str(bad / "transport" / "n-bad" / built["name"])
    assert ex["bad_json"][0]["where"] == f"{bad_file}:41" and len(ex["bad_json"][0]["raw"]) == 55
    assert ex["mss_out_of_range"][0]["where"] == f"{bad_file}:42"
    assert '"conn_id": "n-bad-mss"' in ex["mss_out_of_range"][0]["raw"] and ex["mss_out_of_range"][0]["raw"].endswith("…")
    checks = {(Path(s["file"]).parent.name, s["check"]) for s in report["suspicious"]}
    assert checks == {("n-ms", "rtt_in_ms"), ("n-mss", "mss_constant"), ("n-sec", "timestamps_in_seconds")}
    unknown = {os.path.relpath(u["path"], bad) for u in report["unknown_files"]}
    assert unknown == {"transport/n-bad/notes.txt", "transprot"}
    text = "\n".join(report["problems"])
    for needle in ("bad_json", "mss_out_of_range", "out_of_hour", "rtt_in_ms", "mss_constant",
                   "timestamps_in_seconds", "notes.txt", "transprot"):
        assert needle in text, needle


def test_validate_command_exit_status(spark, small_fleet, tmp_path):
    """`ccs validate` through the CLI: 0 on the fleet (one hour), 1 with the report on the bad folder."""
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    cfg_path = write_config(tmp_path)
    fleet_dir = small_fleet[0]
    runner = CliRunner()
    hour = sorted(os.listdir(os.path.join(fleet_dir, "transport", sorted(os.listdir(os.path.join(fleet_dir, "transport")))[0])))[0][:13]
    res = runner.invoke(app, ["validate", fleet_dir, "--hours", hour, "--config", str(cfg_path)])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "0 problem(s)" in res.output and "transport: 8 files" in res.output
    build_bad_folder(fleet_dir, tmp_path / "bad")
    res = runner.invoke(app, ["validate", str(tmp_path / "bad"), "--json", "--config", str(cfg_path)])
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert report["streams"]["transport"]["quarantined"] == 2 and len(report["problems"]) >= 7
    assert not (tmp_path / "lake").exists(), "validate writes no lake"
