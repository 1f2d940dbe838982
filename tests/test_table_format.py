"""The Python side of the table format (export/artifact/table_format.py, export/artifact/signing.py), no root needed."""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from ccselect.export.artifact import signing, table_format as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _entries():
    return [
        tf.Entry("10.0.0.0/8", "cubic", purity_permille=800, requests=1200),
        tf.Entry("10.1.0.0/16", "bbr", pacing_rate_bps=50_000_000, cwnd_clamp_segs=64),
        tf.Entry("10.1.2.0/24", "keep"),
        tf.Entry("192.0.2.7/32", "reno", low_confidence=True, purity_permille=510),
        tf.Entry("2001:db8::/32", "bbr", requests=7),
        tf.Entry("2001:db8:1:2::/64", "cubic"),
        tf.Entry("::/0", "reno"),
    ]


def test_encode_decode_roundtrip():
    t = tf.Table(42, 1_700_000_000, 1_700_086_400, tuple(_entries()))
    blob = tf.encode(t)
    assert len(blob) == tf.HEADER_SIZE + 7 * tf.ENTRY_SIZE, "size = header + entries"
    assert blob[:4] == b"CCS1", "magic bytes"
    back = tf.decode(blob)
    assert (back.version, back.created_unix, back.expires_unix) == (42, 1_700_000_000, 1_700_086_400), \
        "header fields round-trip"
    assert (back.n_v4, back.n_v6) == (4, 3), "counts per family"
    assert sorted(back.entries, key=str) == sorted(t.entries, key=str), "entries round-trip"
    assert [e.family for e in back.entries] == [4, 4, 4, 4, 6, 6, 6], "IPv4 entries first"


def test_content_sha256_ignores_only_the_clock():
    """Two exports of the same decisions at different times share the content digest (the cluster
    test compares tables across runs with it); any other byte changes it."""
    a = tf.encode(tf.Table(42, 1_700_000_000, 1_700_086_400, tuple(_entries())))
    b = tf.encode(tf.Table(42, 1_800_000_000, 1_800_003_600, tuple(_entries())))
    assert hashlib.sha256(a).hexdigest() != hashlib.sha256(b).hexdigest()
    assert tf.content_sha256(a) == tf.content_sha256(b)
    assert tf.content_sha256(a) != tf.content_sha256(tf.encode(tf.Table(43, 1_700_000_000, 1_700_086_400,
                                                                        tuple(_entries()))))
    flipped = bytearray(a)
    flipped[-1] ^= 1
    assert tf.content_sha256(bytes(flipped)) != tf.content_sha256(a)
    with pytest.raises(tf.TableFormatError):
        tf.content_sha256(a[:10])


def test_entry_layout_bytes():
    blob = tf.encode_entry(tf.Entry("10.1.0.0/16", "bbr", purity_permille=900, requests=5,
                                    pacing_rate_bps=1 << 40, cwnd_clamp_segs=64,
                                    low_confidence=True))
    assert blob[0:4] == bytes([4, 16, 2, tf.FLAG_LOW_CONF]), "family, prefix_len, cc, flags"
    assert blob[4:6] == (900).to_bytes(2, "little"), "purity little-endian"
    assert blob[8:12] == (5).to_bytes(4, "little"), "requests"
    assert blob[12:16] == (64).to_bytes(4, "little"), "cwnd clamp"
    assert blob[16:32] == bytes([10, 1, 0, 0]) + bytes(12), "v4 address in the first 4 bytes"
    assert blob[32:40] == (1 << 40).to_bytes(8, "little"), "pacing rate"


@pytest.mark.parametrize("bad,msg", [
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:-1], "size"),
    (lambda b: b[:tf.HEADER_SIZE + 2] + bytes([9]) + b[tf.HEADER_SIZE + 3:], "cc id"),
    (lambda b: b[:tf.HEADER_SIZE] + bytes([6]) + b[tf.HEADER_SIZE + 1:], "family"),
    (lambda b: b[:tf.HEADER_SIZE + 1] + bytes([33]) + b[tf.HEADER_SIZE + 2:], "entry 0"),
])
def test_decode_rejects_malformed(bad, msg):
    blob = tf.encode(tf.Table(1, 0, 10, tuple(_entries())))
    with pytest.raises(tf.TableFormatError, match=msg):
        tf.decode(bad(blob))


def test_entry_validation():
    with pytest.raises(ValueError):
        tf.Entry("10.0.0.1/8", "cubic")  # host bits set
    with pytest.raises(tf.TableFormatError, match="unknown cc"):
        tf.Entry("10.0.0.0/8", "vegas")
    with pytest.raises(tf.TableFormatError, match="purity"):
        tf.Entry("10.0.0.0/8", "bbr", purity_permille=1001)
    with pytest.raises(tf.TableFormatError, match="duplicate"):
        tf.encode(tf.Table(1, 0, 1, (tf.Entry("10.0.0.0/8", "bbr"), tf.Entry("10.0.0.0/8", "reno"))))


def test_lookup_longest_prefix_and_mapped():
    t = tf.Table(1, 0, 1, tuple(_entries()))
    assert tf.lookup(t, "10.1.2.3").cc == "keep", "/24 beats /16 and /8"
    assert tf.lookup(t, "10.1.9.9").cc == "bbr", "/16 beats /8"
    assert tf.lookup(t, "10.200.0.1").cc == "cubic", "/8"
    assert tf.lookup(t, "::ffff:10.1.9.9").cc == "bbr", "v4-mapped v6 matches the v4 entry"
    assert tf.lookup(t, "172.16.0.1") is None, "v4 miss (::/0 is v6 only)"
    assert tf.lookup(t, "2001:db8:1:2::5").cc == "cubic", "/64 beats /32"
    assert tf.lookup(t, "2a00::1").cc == "reno", "::/0 default route"


def test_address_space_rule_v4_mapped():
    """One rule for both families: an IPv6 entry inside ::ffff:0:0/96 is refused (by Entry, so by
    encode/decode and write_table); one covering it applies to IPv6 clients only."""
    for bad in ("::ffff:0:0/96", "::ffff:10.0.0.0/104", "::ffff:192.0.2.7/128"):
        with pytest.raises(tf.TableFormatError, match="inside ::ffff:0:0/96"):
            tf.Entry(bad, "bbr")
    # a hand-made binary with such an entry: decode refuses it, naming the entry
    blob = bytearray(tf.encode(tf.Table(1, 0, 10, (tf.Entry("2001:db8::/104", "bbr"),))))
    blob[tf.HEADER_SIZE + 16:tf.HEADER_SIZE + 32] = ipaddress.IPv6Address("::ffff:10.0.0.0").packed
    with pytest.raises(tf.TableFormatError, match="entry 0: .*inside ::ffff:0:0/96"):
        tf.decode(bytes(blob))
    with pytest.raises(tf.TableFormatError, match="inside"):  # prefixes given as text, as the export does
        signing.write_table([tf.Entry("10.0.0.0/8", "bbr"), tf.Entry("::ffff:10.0.0.0/104", "bbr")],
                            1, "m", 10, "/nonexistent", signing.generate_key(), created=1)
    covering = tf.Table(1, 0, 1, (tf.Entry("::/0", "reno"), tf.Entry("::/8", "cubic"),
                                  tf.Entry("10.0.0.0/8", "bbr")))
    assert tf.lookup(covering, "10.1.2.3").cc == "bbr", "v4 client: its v4 entry"
    assert tf.lookup(covering, "172.16.0.1") is None, "v4 client, no v4 entry: miss, not ::/0"
    assert tf.lookup(covering, "::ffff:172.16.0.1") is None, "v4-mapped client: miss, not ::/8"
    assert tf.lookup(covering, "::1").cc == "cubic", "v6 client: ::/8"
    assert tf.lookup(covering, "2001:db8::1").cc == "reno", "v6 client: ::/0"


def test_ab_bucket_is_zlib_crc32_parity():
    assert tf.ab_address_bytes("192.0.2.1") == bytes([192, 0, 2, 1]), "v4: 4 network-order bytes"
    assert tf.ab_address_bytes("::ffff:192.0.2.1") == bytes([192, 0, 2, 1]), "mapped: as v4"
    assert len(tf.ab_address_bytes("2001:db8::1")) == 16, "v6: 16 bytes"
    for ip in ("192.0.2.1", "198.51.100.77", "2001:db8::1", "2001:db8:ffff::42"):
        crc = zlib.crc32(ipaddress.ip_address(ip).packed)
        assert tf.ab_bucket_odd(ip) == bool(crc & 1), f"{ip}: odd CRC32 -> treatment"
    odd = sum(tf.ab_bucket_odd(f"10.0.{i // 256}.{i % 256}") for i in range(4096))
    assert 1800 < odd < 2300, f"roughly half the addresses are treatment: {odd}/4096"


def test_write_table_and_verify(tmp_path):
    key = signing.generate_key()
    now = int(time.time())
    paths = signing.write_table(_entries(), 7, "model-abc", now + 3600, str(tmp_path), key,
                                created=now)
    man = json.loads(open(paths.manifest).read())
    assert man["version"] == 7 and man["model_version"] == "model-abc", "manifest identity"
    assert man["entries"] == {"v4": 4, "v6": 3}, "manifest counts"
    assert man["sha256"] == hashlib.sha256(open(paths.table, "rb").read()).hexdigest(), "sha256"
    assert man["table"] == os.path.basename(paths.table), "table named relative to the manifest"
    assert len(open(paths.signature, "rb").read()) == 64, "detached raw Ed25519 signature"
    m2, table = signing.read_manifest(paths.manifest, key.public_key())
    assert m2 == man and table.version == 7, "verified read returns manifest and table"

    with pytest.raises(signing.SignatureError, match="signature"):
        signing.read_manifest(paths.manifest, signing.generate_key().public_key())
    blob = bytearray(open(paths.table, "rb").read())
    blob[70] ^= 1
    open(paths.table, "wb").write(bytes(blob))
    with pytest.raises(signing.SignatureError, match="sha256"):
        signing.read_manifest(paths.manifest, key.public_key())


def test_keypair_files_roundtrip(tmp_path):
    key = signing.generate_key()
    signing.save_keypair(key, str(tmp_path / "k.pem"), str(tmp_path / "k.pub.pem"))
    assert os.stat(tmp_path / "k.pem").st_mode & 0o077 == 0, "private key not group/world readable"
    priv = signing.load_private_key(str(tmp_path / "k.pem"))
    pub = signing.load_public_key(str(tmp_path / "k.pub.pem"))
    signing.verify(b"abc", signing.sign(b"abc", priv), pub)
    with pytest.raises(signing.SignatureError):
        signing.verify(b"abd", signing.sign(b"abc", priv), pub)


def test_write_table_rejects_expiry_before_creation(tmp_path):
    with pytest.raises(tf.TableFormatError, match="expires"):
        signing.write_table(_entries(), 1, "m", 100, str(tmp_path), signing.generate_key(),
                            created=200)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32),
                          st.sampled_from(sorted(tf.CC_IDS)), st.integers(0, 1000),
                          st.integers(0, 2**64 - 1)), max_size=20))
def test_roundtrip_property(rows):
    entries = {}
    for addr, plen, cc, purity, pacing in rows:
        net = ipaddress.ip_network((addr, plen), strict=False)
        entries[net] = tf.Entry(net, cc, purity_permille=purity, pacing_rate_bps=pacing)
    t = tf.Table(3, 1, 2, tuple(entries.values()))
    back = tf.decode(tf.encode(t))
    assert set(back.entries) == set(t.entries), "property: decode(encode(t)) == t"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_header_layout_matches_python(tmp_path):
    fields = [("ccs_table_header", f, off) for f, off in tf.HEADER_FIELDS] + \
             [("ccs_table_entry", f, off) for f, off in tf.ENTRY_FIELDS] + \
             [("ccs_tree_node", f, off) for f, off in tf.NODE_FIELDS]
    src = ['#include <stdio.h>', '#include <stddef.h>', '#include "ccs_table.h"', 'int main(void){',
           'printf("%zu %zu %zu\\n", sizeof(struct ccs_table_header), sizeof(struct ccs_table_entry), '
           'sizeof(struct ccs_tree_node));',
           'printf("%u %u\\n", CCS_TABLE_MAGIC, CCS_TABLE_FORMAT);',
           'printf("%d %d %d %d %d\\n", CCS_CC_KEEP, CCS_CC_CUBIC, CCS_CC_BBR, CCS_CC_RENO, CCS_ENTRY_LOW_CONF);',
           'printf("%d %d %d %d %d %d %d\\n", CCS_FEAT_MSS, CCS_FEAT_INIT_SND_WND, CCS_FEAT_CONN_TIME, '
           'CCS_FEAT__MAX, CCS_TREE_LEAF, CCS_TREE_MAX_DEPTH, CCS_TREE_MAX_NODES);']
    src += [f'printf("%zu\\n", offsetof(struct {s}, {f}));' for s, f, _ in fields]
    src += ["return 0;}"]
    (tmp_path / "t.c").write_text("\n".join(src))
    r = subprocess.run(["cc", "-I", os.path.join(REPO, "export", "edge"), "-o",
                        str(tmp_path / "t"), str(tmp_path / "t.c")], capture_output=True, text=True)
    assert r.returncode == 0, f"compile: {r.stderr}"
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True).stdout.split("\n")
    assert out[0] == f"{tf.HEADER_SIZE} {tf.ENTRY_SIZE} {tf.NODE_SIZE}", f"sizeof: {out[0]}"
    assert out[1] == f"{tf.MAGIC} {tf.FORMAT}", f"magic/format: {out[1]}"
    assert out[2] == " ".join(str(tf.CC_IDS[c]) for c in ("keep", "cubic", "bbr", "reno")) + \
        f" {tf.FLAG_LOW_CONF}", f"cc ids / flags: {out[2]}"
    want = [tf.TREE_FEATURES.index(f) for f in ("mss_bytes", "init_snd_wnd_bytes", "connection_time_us")]
    assert out[3] == " ".join(map(str, want + [len(tf.TREE_FEATURES), tf.TREE_LEAF, tf.TREE_MAX_DEPTH,
                                              tf.TREE_MAX_NODES])), f"feature ids / tree bounds: {out[3]}"
    for (s, f, off), line in zip(fields, out[4:]):
        assert int(line) == off, f"offsetof({s}, {f}) = {line}, Python says {off}"
