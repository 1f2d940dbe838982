"""Ed25519 signing and the JSON manifest of an exported prefix table (format: ccs_table.h).

The manifest's `epoch` is the deployment epoch (issue 56, item 3): tables are ordered by
(epoch, version); a new lake, store or key whose versions start again is signed in the next epoch,
opened by an explicit, logged operator command (`ccs keys epoch --new`, export/artifact/epoch.py).
Versions and epochs are at most SERIAL_MAX (2^53 - 1, the agent's bound, ccs.h CCS_SERIAL_MAX).

Layout in `out_dir` for table version V:
  table-V.bin                   binary table (export/artifact/table_format.py)
  table-V.manifest.json         manifest: format, version, model_version, created, expires,
                                entries {v4, v6}, table (file name), sha256 (of the .bin),
                                tree {model, nodes} (format 2: the flow tree in the .bin, or
                                nodes 0 and model "" without one)
  table-V.manifest.json.sig     detached Ed25519 signature, 64 raw bytes, over the exact
                                manifest file bytes

The public key is distributed as an Ed25519 SubjectPublicKeyInfo PEM file; the edge agent
verifies the signature, then the sha256, then the header, before anything reaches the kernel.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ccselect.export.artifact import table_format as tf

SIG_SUFFIX = ".sig"
SERIAL_MAX = 2**53 - 1   # the most a version or epoch may be (export/edge/ccs.h CCS_SERIAL_MAX)


class SignatureError(ValueError):
    """A manifest whose signature or checksum does not verify."""


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def save_keypair(key: Ed25519PrivateKey, private_path: str, public_path: str) -> None:
    """PKCS#8 PEM private key (mode 0600) and SubjectPublicKeyInfo PEM public key."""
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    with open(public_path, "wb") as f:
        f.write(public_pem(key.public_key()))


def public_pem(pub: Ed25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(path: str) -> Ed25519PrivateKey:
    with open(path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: str) -> Ed25519PublicKey:
    with open(path, "rb") as f:
        key = serialization.load_pem_public_key(f.read())
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"{path}: not an Ed25519 public key")
    return key


def sign(data: bytes, key: Ed25519PrivateKey) -> bytes:
    return key.sign(data)


def verify(data: bytes, signature: bytes, pub: Ed25519PublicKey) -> None:
    try:
        pub.verify(signature, data)
    except InvalidSignature:
        raise SignatureError("bad Ed25519 signature") from None


@dataclass(frozen=True)
class TablePaths:
    table: str
    manifest: str
    signature: str


def manifest_bytes(table_bin: bytes, table_name: str, version: int, model_version: str,
                   created: int, expires: int, n_v4: int, n_v6: int,
                   extra: dict | None = None, tree_nodes: int = 0, tree_model: str = "",
                   epoch: int = 0) -> bytes:
    """The manifest JSON. `extra` (export details: source hours, coverage, agreement, ...) goes
    after the fields the agent reads; an extra key must not repeat one of them (the agent, like
    `read_manifest`, refuses a manifest with a duplicate key)."""
    m = {
        "format": tf.FORMAT,
        "epoch": int(epoch),
        "version": int(version),
        "model_version": str(model_version),
        "created": int(created),
        "expires": int(expires),
        "entries": {"v4": int(n_v4), "v6": int(n_v6)},
        "table": table_name,
        "sha256": hashlib.sha256(table_bin).hexdigest(),
        # the flow tree the .bin carries (issue 27): the signature covers its name and size here
        # and, through sha256, its nodes; the agent checks nodes against the .bin's header
        "tree": {"model": str(tree_model), "nodes": int(tree_nodes)},
    }
    for k in ("epoch", "version"):
        if not 0 <= m[k] <= SERIAL_MAX:
            raise ValueError(f"manifest {k} {m[k]} is outside 0..2^53-1 (the agent refuses it)")
    for k, v in (extra or {}).items():
        if k in m or k in ("v4", "v6"):
            raise ValueError(f"manifest extra field {k!r} would shadow a field the agent reads")
        m[k] = v
    return (json.dumps(m, indent=2, sort_keys=False) + "\n").encode()


def write_table(entries, version: int, model_version: str, expires: int, out_dir: str,
                private_key: Ed25519PrivateKey, created: int | None = None,
                extra: dict | None = None, tree: tf.Tree | None = None,
                tree_model: str = "", epoch: int = 0) -> TablePaths:
    """Encode `entries` (table_format.Entry) and the flow tree `tree` (table_format.Tree, or
    None), write the .bin, the manifest (naming the tree's model `tree_model`, and the deployment
    `epoch`) and its signature.

    `expires` and `created` are unix seconds. Returns the three paths.
    """
    if tree is None and tree_model:
        raise ValueError("tree_model names a tree, but there is none")
    if len(tree_model.encode()) >= 64:
        raise ValueError("tree_model longer than 63 bytes (the agent's bound)")
    created = int(time.time()) if created is None else int(created)
    if expires <= created:
        raise tf.TableFormatError(f"expires ({expires}) must be after created ({created})")
    table = tf.Table(int(version), created, int(expires), tuple(entries), tree)
    blob = tf.encode(table)
    os.makedirs(out_dir, exist_ok=True)
    name = f"table-{int(version)}.bin"
    paths = TablePaths(os.path.join(out_dir, name),
                       os.path.join(out_dir, f"table-{int(version)}.manifest.json"),
                       os.path.join(out_dir, f"table-{int(version)}.manifest.json" + SIG_SUFFIX))
    man = manifest_bytes(blob, name, version, model_version, created, expires,
                         table.n_v4, table.n_v6, extra,
                         tree_nodes=len(tree.nodes) if tree is not None else 0, tree_model=tree_model,
                         epoch=epoch)
    for path, data in ((paths.table, blob), (paths.manifest, man),
                       (paths.signature, sign(man, private_key))):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return paths


def read_manifest(manifest_path: str, pub: Ed25519PublicKey) -> tuple[dict, tf.Table]:
    """Verify signature and checksum the way the agent does; return (manifest, decoded table)."""
    with open(manifest_path, "rb") as f:
        man_raw = f.read()
    with open(manifest_path + SIG_SUFFIX, "rb") as f:
        sig = f.read()
    verify(man_raw, sig, pub)
    man = json.loads(man_raw)
    table_path = os.path.join(os.path.dirname(manifest_path), man["table"])
    with open(table_path, "rb") as f:
        blob = f.read()
    if hashlib.sha256(blob).hexdigest() != man["sha256"]:
        raise SignatureError("sha256 of the table does not match the manifest")
    table = tf.decode(blob)
    if man.get("format") != tf.FORMAT:
        raise SignatureError(f"unsupported format {man.get('format')} in the manifest (this reader "
                             f"takes format {tf.FORMAT})")
    n_nodes = len(table.tree.nodes) if table.tree is not None else 0
    if (table.version, table.expires_unix, table.n_v4, table.n_v6, n_nodes) != (
            man["version"], man["expires"], man["entries"]["v4"], man["entries"]["v6"],
            man["tree"]["nodes"]):
        raise SignatureError("table header disagrees with the manifest")
    return man, table
