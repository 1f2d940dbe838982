"""The artifact store (directory and fsspec memory:// backends) and the fleet file."""
from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.delivery.rollout import load_fleet
from ccselect.export.delivery.store import Store, StoreError


def _signed(tmp_path, version, key, epoch=0, out="out", cc="bbr"):
    now = int(time.time())
    return signing.write_table([tf.Entry("81.20.0.0/16", cc)], version, "1", now + 60, str(tmp_path / out),
                               key, created=now, extra={"coverage": 1.0}, epoch=epoch)


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
    # the version floor of a fleet file's node lives with its lake (export/edge/floor.c)
    assert fleet.rest[0].config.state_dir == os.path.join(cfg.data_root, "fleet", "edge-local-01", "state")
    bad = tmp_path / "f.yaml"
    bad.write_text("nodes:\n  - {node_id: a, canary: false, agent: {pin_dir: /sys/fs/bpf/a}}\n")
    with pytest.raises(ValueError, match="no canary"):
        load_fleet(str(bad), cfg)


def test_a_version_names_one_table_in_the_store(tmp_path):
    """A new lake numbering from 1 cannot replace the store's table 1 (what the fleet's history
    points at); the same table again publishes; the store orders tables by (epoch, version)."""
    key = signing.generate_key()
    store = Store(str(tmp_path / "store"))
    store.publish(_signed(tmp_path, 1, key).manifest)
    store.publish(str(tmp_path / "out" / "table-1.manifest.json"))   # the same table again
    new_lake = _signed(tmp_path, 1, key, epoch=1, out="new-lake", cc="cubic")
    with pytest.raises(StoreError, match=r"already holds another table 1 \(epoch 0"):
        store.publish(new_lake.manifest)
    assert store.manifest(1)["epoch"] == 0
    store.publish(_signed(tmp_path, 2, key, epoch=1, out="new-lake").manifest)
    assert store.serial(2) == (1, 2) and store.serial(1) == (0, 1) and store.serial(1) < store.serial(2)


def test_signing_bounds_and_epoch_field(tmp_path):
    """The manifest carries the epoch the agent orders by; neither it nor the version may pass
    2^53 - 1 (the agent refuses such a table: ccs.h CCS_SERIAL_MAX)."""
    key = signing.generate_key()
    m = json.loads(open(_signed(tmp_path, 3, key, epoch=2).manifest).read())
    assert (m["epoch"], m["version"]) == (2, 3)
    for version, epoch in ((2**53, 0), (1, 2**53), (2**64 - 1, 0)):
        with pytest.raises(ValueError, match="outside 0..2\\^53-1"):
            _signed(tmp_path, version, key, epoch=epoch)
    with pytest.raises(ValueError, match="shadow"):
        signing.manifest_bytes(b"", "t.bin", 1, "m", 0, 1, 0, 0, extra={"epoch": 5})


def test_opening_an_epoch_is_explicit_and_logged(cfg):
    from ccselect.export.artifact import epoch
    assert epoch.current(cfg) == 0 and epoch.history(cfg) == []
    with pytest.raises(epoch.EpochError, match="reason"):
        epoch.open_next(cfg, "  ")
    assert epoch.open_next(cfg, "new lake", now=100) == 1
    assert epoch.current(cfg) == 1
    # a keys dir behind the fleet: the operator names the fleet's epoch
    assert epoch.open_next(cfg, "new key and lake", fleet_epoch=4, now=200) == 5
    log = epoch.history(cfg)
    assert [(r["epoch"], r["from"], r["at"], r["reason"]) for r in log] == \
        [(1, 0, 100, "new lake"), (5, 4, 200, "new key and lake")], log
    with open(os.path.join(cfg.settings.export.keys_dir, epoch.STATE_NAME), "w") as f:
        f.write("{")
    with pytest.raises(epoch.EpochError, match="not an epoch file"):
        epoch.current(cfg)


def test_keys_epoch_command(cfg):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    r = CliRunner().invoke(app, ["keys", "epoch", "--new", "--config", str(cfg.path)])
    assert r.exit_code != 0 and "reason" in r.output, r.output
    r = CliRunner().invoke(app, ["keys", "epoch", "--new", "--reason", "new lake", "--config", str(cfg.path)])
    assert r.exit_code == 0, r.output + str(r.exception)
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["epoch"] == 1 and out["opened"][0]["reason"] == "new lake", out
