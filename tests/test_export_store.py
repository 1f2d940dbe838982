"""The artifact store (directory and fsspec memory:// backends) and the fleet file."""
from __future__ import annotations

import time
import uuid

import pytest

from export.artifact import signing, table_format as tf
from export.delivery.rollout import load_fleet
from export.delivery.store import Store, StoreError


def _signed(tmp_path, version, key):
    now = int(time.time())
    return signing.write_table([tf.Entry("81.20.0.0/16", "bbr")], version, "1", now + 60, str(tmp_path / "out"),
                               key, created=now, extra={"coverage": 1.0})


@pytest.mark.parametrize("backend", ["dir", "memory"])
def test_publish_fetch_current_previous(tmp_path, backend):
    url = str(tmp_path / "store") if backend == "dir" else f"memory://ccs-{uuid.uuid4().hex}"
    key = signing.generate_key()
    signing.save_keypair(key, str(tmp_path / "k.pem"), str(tmp_path / "p.pem"))
    store = Store(url)
    assert store.current() is None and store.previous() is None
    with pytest.raises(StoreError, match="not in the store"):
        store.set_current(1)
    for v in (1, 2):
        assert store.publish(_signed(tmp_path, v, key).manifest) == v
        store.set_current(v)
    assert store.current() == 2 and store.previous() == 1 and store.state()["history"] == [1, 2]
    m = store.fetch(2, str(tmp_path / "node"))
    man, table = signing.read_manifest(m, signing.load_public_key(str(tmp_path / "p.pem")))
    assert man["version"] == 2 and table.entries[0].cc == "bbr"
    assert store.manifest(1)["version"] == 1
    with pytest.raises(StoreError, match="not in the store"):
        store.fetch(9, str(tmp_path / "node"))


def test_fleet_file(tmp_path, cfg):
    from ccs_testing import REPO
    fleet = load_fleet(str(REPO / "infra" / "fleet.yaml"), cfg, public_key="/k/pub.pem")
    assert [(n.node_id, n.canary) for n in fleet.nodes] == [("edge-local-canary", True), ("edge-local-01", False)]
    assert fleet.canaries[0].config.public_key == "/k/pub.pem" and fleet.rest[0].config.cgroup.endswith("ccs-edge-local-01")
    assert fleet.rest[0].table_dir.startswith(cfg.data_root)
    bad = tmp_path / "f.yaml"
    bad.write_text("nodes:\n  - {node_id: a, canary: false, agent: {pin_dir: /sys/fs/bpf/a}}\n")
    with pytest.raises(ValueError, match="no canary"):
        load_fleet(str(bad), cfg)
