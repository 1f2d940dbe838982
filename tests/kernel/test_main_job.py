"""The main job end to end into the kernel: simulated fleet → lakehouse → ccs_train → ccs_hourly
(ingest, infer, export, signed table, rollout to a canary and one more node, each an agent on its
own cgroup) → real connections from simulated client addresses of both families get the table's
CC from the sock_ops program on both nodes, and the agents' counters say so.

The run itself is the `main_job` fixture of tests/conftest.py (`app.run.main`, as `make run`)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


def test_main_job_loads_the_table_into_the_kernel_and_connections_get_its_cc(edge_binary, main_job):
    from ccselect.flows.pipeline import fleet_and_store_for
    from ccselect.export.edge.agent import DEFAULT_BINARY
    cfg, res, _ = main_job
    assert edge_binary == DEFAULT_BINARY
    assert res["ok"], res["summary"]
    assert res["hourly"][0]["tasks"]["rollout"].endswith("success"), res["hourly"]
    probed = res["probe"]
    assert probed and probed["addresses"] >= 2, res["summary"]
    fleet, store = fleet_and_store_for(cfg)
    assert store.current() == probed["version"] == 1
    assert sorted(probed["nodes"]) == sorted(n.node_id for n in fleet.nodes)
    for nid, r in probed["nodes"].items():
        assert r["connections"] == probed["addresses"] and r["as_table"] == r["connections"], (nid, r)
        c = r["counters"]
        hits = sum(v for k, v in c.items() if k.startswith("hit_"))
        assert hits >= r["connections"] and c.get("setsockopt_err", 0) == 0, (nid, c)
    assert "kernel counters" in res["summary"] and "got the table's CC" in res["summary"]


def test_probe_addresses_cover_both_families_and_follow_longest_prefix(main_job):
    import json

    from ccselect.export.artifact import signing, table_format as tf
    from ccselect.export.delivery.publish import key_paths
    from ccselect.export.edge.probe import probe_addresses
    cfg, res, _ = main_job
    from ccselect.flows.pipeline import fleet_and_store_for
    _, store = fleet_and_store_for(cfg)
    if store.current() is None:
        pytest.skip("no table was published")
    man = store.fetch(store.current(), str(cfg.data_root) + "/probe-check")
    _, table = signing.read_manifest(man, signing.load_public_key(key_paths(cfg)[1]))
    picks = probe_addresses(table, per_cc=2)
    assert {4, 6} <= {6 if ":" in ip else 4 for ip, _, _ in picks}, json.dumps(picks)
    for ip, prefix, cc in picks:
        e = tf.lookup(table, ip)
        assert str(e.prefix) == prefix and e.cc == cc and not e.low_confidence
