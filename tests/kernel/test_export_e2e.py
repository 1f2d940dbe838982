"""End to end: simulator → ingest (the `small_lake` fixture) → train + gate + promote → `ccs infer`
→ `ccs keys init` / `ccs export` → `ccs rollout` to a two-node fleet (canary + one) → connections
from simulated client addresses (IPv4 and IPv6, on lo of a network namespace) get the table's CC
in the kernel, on both nodes."""
from __future__ import annotations

import json
import socket

import pytest
import yaml

from _edge_helpers import client, sock_cc
from ccs_testing import copy_lake
from export import signing
from export import table_format as tf

pytestmark = pytest.mark.kernel


def test_simulated_fleet_to_kernel(spark, small_lake, edge_binary, netns, tmp_path):
    from typer.testing import CliRunner

    from ccselect.cli import app
    from export.cli import key_paths
    from jobs import infer
    from models import registry, train_job
    from test_rollout import LocalFleet

    lake = copy_lake(small_lake, tmp_path / "lake")
    raw = yaml.safe_load(lake.cfg_path.read_text())
    # a 2-epoch model on 8 simulated nodes: the gate and coverage floor are set for this tiny run
    # (the guards themselves are tested in tests/test_export_job.py)
    raw["model"]["gate"] = {"min_mean_accuracy": 0.0, "min_worst_accuracy": 0.0, "max_drop_vs_champion": 1.0}
    raw["export"]["guards"]["min_coverage"] = 0.05
    raw["export"]["rollout"]["health_wait_s"] = 0.3
    lake.cfg_path.write_text(yaml.safe_dump(raw))
    cfg = lake.cfg()
    hours = f"{lake.lo}..{lake.hi}"

    trained = train_job.run(spark, cfg, lake.lo, lake.hi, variant="mlp", epochs=2, k=2, seed=3)
    assert registry.gate_passed(cfg, trained["version"]), trained.get("gate")
    registry.promote(cfg, trained["version"])
    inf = infer.run(spark, cfg, lake.lo, lake.hi)
    assert inf["rows"] > 0, inf

    runner = CliRunner()
    r = runner.invoke(app, ["keys", "init", "--config", str(lake.cfg_path)])
    assert r.exit_code == 0, r.output + str(r.exception)
    r = runner.invoke(app, ["export", "--hours", hours, "--config", str(lake.cfg_path)])
    assert r.exit_code == 0, r.output + str(r.exception)
    man = json.loads(r.stdout[r.stdout.index("{"):])
    assert man["model_version"] == str(trained["version"]) and man["entries_total"] > 0, man
    _, table = signing.read_manifest(man["manifest_path"], signing.load_public_key(key_paths(cfg)[1]))

    name, ns = netns
    lf = LocalFleet(edge_binary, key_paths(cfg)[1], tmp_path, netns_runner=ns, bind=("::", socket.AF_INET6))
    try:
        lf.attach_all(cfg)
        r = runner.invoke(app, ["rollout", "--fleet", lf.path, "--config", str(lake.cfg_path)])
        assert r.exit_code == 0, r.output + str(r.exception)
        res = json.loads(r.stdout[r.stdout.index("{\n"):])
        assert res["ok"] and list(res["nodes"]) == [n["node_id"] for n in lf.nodes], res
        for i in range(2):
            st = lf.status(cfg, i)
            assert st["table"]["version"] == man["version"] and st["table"]["enforced"], st["table"]

        # simulated client addresses the model decided for, a few per entry, both families
        preds = (spark.read.format("delta").load(cfg.get("lake.root") + "/gold/predictions")
                 .where("decision = 'model'").select("client_ip").distinct().toPandas()["client_ip"])
        by_entry = {}
        for ip in preds:
            e = tf.lookup(table, ip)
            assert e is not None, f"model-decided {ip} has no entry"
            by_entry.setdefault(e.prefix, []).append(ip)
        picks = []
        for fam in (4, 6):
            for cc in ("bbr", "cubic"):
                ents = [e for e in table.entries if e.family == fam and e.cc == cc and e.prefix in by_entry]
                for e in ents[:3]:
                    picks.append((by_entry[e.prefix][0], e))
        assert {e.family for _, e in picks} == {4, 6}, "test setup: sources of both families"
        import subprocess
        for ip, _ in picks:
            plen = 128 if ":" in ip else 32
            subprocess.run(["ip", "-n", name, "addr", "add", f"{ip}/{plen}", "dev", "lo"]
                           + (["nodad"] if plen == 128 else []), check=True)
        counts = {0: {}, 1: {}}
        for k, (ip, e) in enumerate(picks):
            i = k % 2
            ls = lf.nodes[i]["listener"]
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            dst = "::1" if fam == socket.AF_INET6 else "127.0.0.1"
            c = ns.call(client, ip, fam)
            ns.call(c.connect, (dst, ls.getsockname()[1]))
            acc, peer = ls.accept()
            got = sock_cc(acc)
            acc.close()
            c.close()
            assert got == e.cc, f"node {i}: {ip} in {e.prefix} got {got}, table says {e.cc}"
            counts[i][e.cc] = counts[i].get(e.cc, 0) + 1
        for i in range(2):
            cnt = lf.status(cfg, i)["counters"]
            for cc, n in counts[i].items():
                assert cnt[f"hit_{cc}"] == n, f"node {i}: hit_{cc} {cnt[f'hit_{cc}']} vs {n}"
            assert cnt["setsockopt_err"] == 0 and cnt["miss"] == 0, cnt
        rec = spark.read.format("delta").load(cfg.get("lake.root") + "/gold/cc_tables").collect()
        assert [row["version"] for row in rec] == [man["version"]]
    finally:
        lf.cleanup(cfg)
