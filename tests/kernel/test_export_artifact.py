"""The export's artifact (manifest with the export's extra fields) against the real agent: it loads
when signed and intact, and is refused when tampered with, unsigned, or signed by another key."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from _edge_helpers import connect_accept, in_cgroup, listener, other_ccs, sock_cc, sysctl_cc

from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.edge.agent import EdgeAgentError, Service

pytestmark = pytest.mark.kernel

EXTRA = {"model_name": "ccs-nettype", "model_versions": ["3"],
         "source_hours": {"from": "2026-11-01T00", "to": "2026-11-01T05"},
         "entries_per_level": {"v4": {"/16": 1, "/24": 1, "/32": 0}, "v6": {"/32": 0, "/48": 1}},
         "coverage": 0.93, "agreement": 0.97, "memory_saving": 123.4, "client_ips": 370}


def _export_like(edge, entries, version, key=None):
    import time
    now = int(time.time())
    return signing.write_table(entries, version, "3", now + 3600, edge.tables, key or edge.keys["private"],
                               created=now, extra=EXTRA)


def _copy(paths, dest):
    os.makedirs(dest, exist_ok=True)
    for p in (paths.table, paths.manifest, paths.signature):
        shutil.copy(p, dest)
    return os.path.join(dest, os.path.basename(paths.manifest))


def test_export_manifest_loads_and_tampering_is_refused(edge, tmp_path):
    default = sysctl_cc()
    a, b = other_ccs(default)
    with in_cgroup(edge.cgroup):
        ls = edge.track(listener())
    edge.configure([Service(ls.getsockname()[1], "video")])
    entries = [tf.Entry("127.60.0.0/16", a), tf.Entry("127.61.7.0/24", b), tf.Entry("2408:8300:1::/48", a)]
    good = _export_like(edge, entries, 21)
    man = json.load(open(good.manifest))
    assert man["coverage"] == 0.93 and man["entries"] == {"v4": 2, "v6": 1}

    # tampered table bytes: the sha256 no longer matches the signed manifest
    m = _copy(good, tmp_path / "bin")
    tab = os.path.join(tmp_path / "bin", os.path.basename(good.table))
    blob = bytearray(open(tab, "rb").read())
    blob[tf.HEADER_SIZE + 2] = tf.CC_IDS[b]          # first entry's CC changed
    open(tab, "wb").write(bytes(blob))
    with pytest.raises(EdgeAgentError, match="sha256"):
        edge.agent.load(m)
    # tampered manifest (an extra field edited): the signature no longer verifies
    m = _copy(good, tmp_path / "man")
    open(m, "w").write(open(good.manifest).read().replace('"coverage": 0.93', '"coverage": 0.99'))
    with pytest.raises(EdgeAgentError, match="bad signature"):
        edge.agent.load(m)
    # unsigned: no .sig next to the manifest
    m = _copy(good, tmp_path / "unsigned")
    os.unlink(m + signing.SIG_SUFFIX)
    with pytest.raises(EdgeAgentError, match="no signature"):
        edge.agent.load(m)
    # signed by a key the agent does not trust
    other = _export_like(edge, entries, 22, key=edge.keys["other"])
    with pytest.raises(EdgeAgentError, match="bad signature"):
        edge.agent.load(other.manifest)
    st = edge.agent.status()
    assert st["table"] is None, f"nothing refused may go live, status table {st['table']}"

    # the intact artifact loads and is enforced
    edge.agent.load(good.manifest)
    st = edge.agent.status()
    assert st["table"]["version"] == 21 and st["table"]["enforced"], st["table"]
    assert st["table"]["entries"] == {"v4": 2, "v6": 1}, st["table"]
    c, acc, _ = connect_accept(ls, "127.61.7.9")
    assert sock_cc(acc) == b, "the /24 entry's CC"
    c.close(), acc.close()
    c, acc, _ = connect_accept(ls, "127.60.1.1")
    assert sock_cc(acc) == a, "the /16 entry's CC"
    c.close(), acc.close()
