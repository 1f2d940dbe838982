"""`ccs fleet status` (app/commands/fleet.py, issue 59): one row per node of a fleet file from each
node's own agent, exit 3 when any node needs attention, `--json` for scripts.

An unreachable node (its agent binary missing) needs no root. The kernel test has two nodes on
throwaway cgroups and pin dirs: one with a table and traffic (a hit, a miss), one attached without
a table; the second needs attention until it gets one."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from typer.testing import CliRunner

from ccselect.app.cli import app
from kernel._edge_helpers import cc_of, edge_binary


def _fleet(tmp_path, nodes: list[dict]) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    return str(path)


def _status(cfg, fleet: str, *extra: str):
    r = CliRunner().invoke(app, ["fleet", "status", "--fleet", fleet, "--config", str(cfg.path), *extra])
    return r.exit_code, r.output


def test_an_unreachable_node_needs_attention(cfg, tmp_path):
    fleet = _fleet(tmp_path, [{"node_id": "edge-gone", "canary": True, "binary": str(tmp_path / "no-such-agent"),
                               "agent": {"pin_dir": str(tmp_path / "pins")}}])
    code, out = _status(cfg, fleet, "--json")
    assert code == 3, out
    rows = json.loads(out)
    assert [(r["node"], r["reachable"]) for r in rows] == [("edge-gone", False)]
    assert rows[0]["attention"][0].startswith("agent unreachable: "), rows
    code, text = _status(cfg, fleet)
    assert code == 3 and "edge-gone" in text and "agent unreachable" in text, text


@pytest.mark.kernel
def test_two_local_nodes(cfg, tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root under CI", pytrace=False)
        pytest.skip("needs root (BPF, cgroups)")
    from ccselect.export.artifact import signing, table_format as tf
    from ccselect.export.edge.probe import CGROUP_ROOT, in_cgroup, kernel_ready, listener, system_cc
    if why := kernel_ready():
        pytest.skip(why)
    binary = edge_binary()
    key = signing.generate_key()
    signing.save_keypair(key, str(tmp_path / "priv.pem"), str(tmp_path / "pub.pem"))
    tag = f"ccs-fleetst-{os.getpid()}"
    ls = None
    nodes = []
    for i, name in enumerate(("edge-a", "edge-b")):
        cg = os.path.join(CGROUP_ROOT, f"{tag}-{i}")
        os.makedirs(cg)
        nodes.append({"node_id": name, "canary": i == 0, "binary": binary,
                      "agent": {"cgroup": cg, "pin_dir": f"/sys/fs/bpf/{tag}-{i}", "state_dir": str(tmp_path / f"state-{i}"),
                                "public_key": str(tmp_path / "pub.pem"), "sample_rate": 0.0,
                                "services": [{"port": 0, "name": "video"}]}})
    from ccselect.export.delivery.rollout import load_fleet
    try:
        with in_cgroup(nodes[0]["agent"]["cgroup"]):
            ls = listener()
        nodes[0]["agent"]["services"][0]["port"] = ls.getsockname()[1]
        nodes[1]["agent"]["services"][0]["port"] = ls.getsockname()[1]
        fleet = _fleet(tmp_path, nodes)
        loaded = load_fleet(fleet, cfg).nodes
        for n in loaded:
            a = n.agent()
            try:
                a.attach(n.config.cgroup)
            finally:
                a.close()
        default = system_cc()
        other = next(c for c in ("cubic", "reno", "bbr") if c != default)
        now = int(time.time())
        m = signing.write_table([tf.Entry("127.70.0.0/16", other)], 21, "m-21", now + 3600,
                                str(tmp_path / "t"), key, created=now, epoch=5)
        a = loaded[0].agent()
        try:
            a.load(m.manifest)
        finally:
            a.close()
        for src, want in (("127.70.0.5", other), ("127.71.0.5", default)):
            assert cc_of(ls, src) == want, f"setup: {src} gets {want}"

        code, out = _status(cfg, fleet, "--json")
        rows = {r["node"]: r for r in json.loads(out)}
        assert code == 3, out
        a_row, b_row = rows["edge-a"], rows["edge-b"]
        assert (a_row["version"], a_row["epoch"], a_row["enforced"], a_row["attached"], a_row["attention"]) == \
            (21, 5, True, True, [])
        assert a_row["lookups"] == 2 and a_row["mix"][f"hit_{other}"] == 0.5 and a_row["mix"]["miss"] == 0.5
        assert 3500 < a_row["expires_in_s"] <= 3600 and a_row["errors"] == {}
        assert b_row["version"] is None and b_row["attention"] == ["no live table"], b_row
        code, text = _status(cfg, fleet)
        assert code == 3 and "no live table" in text and text.splitlines()[1].split()[:2] == ["edge-a", "21"], text

        # edge-b gets the table: nothing needs attention; with a margin above its expiry, it does
        a = loaded[1].agent()
        try:
            a.load(m.manifest)
        finally:
            a.close()
        code, out = _status(cfg, fleet, "--json")
        assert code == 0 and all(r["attention"] == [] for r in json.loads(out)), out
        code, out = _status(cfg, fleet, "--json", "--expiry-margin", "7200")
        assert code == 3 and all(r["attention"][0].startswith("live table expires in") for r in json.loads(out)), out
    finally:
        if ls is not None:
            ls.close()
        for n in nodes:
            subprocess.run([binary, "--pin-dir", n["agent"]["pin_dir"], "detach", "--purge"], capture_output=True)
            subprocess.run(["rm", "-rf", n["agent"]["pin_dir"]])
            for _ in range(50):
                try:
                    os.rmdir(n["agent"]["cgroup"])
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
