"""The artifact store the edge fleet pulls signed tables from.

`export.rollout.store` is a directory (the default), an `s3://bucket/prefix` URL on the
S3-compatible store of `object_store:` (boto3; the endpoint, region and addressing come from the
configuration, the credentials from the environment or the SDK's standard chain only), or another
fsspec URL (memory://...; its backend's own package must be installed).
Layout under the store root:
  tables/table-V.bin, tables/table-V.manifest.json, tables/table-V.manifest.json.sig
  state.json   {"current": V or null, "history": [V1, V2, ...]}  (versions in publication order)
  freeze.json  the operator's kill switch while it holds (export/delivery/freeze.py): who, when,
               why, the table it pins; freeze-log.json every freeze and unfreeze
The store only holds signed files; agents verify them (signature, sha256) before loading.
"""
from __future__ import annotations

import json
import os
import posixpath
from urllib.parse import urlparse

from ccselect import files
from ccselect.config import Config
from ccselect.export.artifact.signing import SIG_SUFFIX
# Imported inside the functions that use them (heavy, not needed to import this module): fsspec, botocore.


class StoreError(RuntimeError):
    pass


#: the freeze record's key in the store (export/delivery/freeze.py writes it; the store obeys it)
FREEZE_KEY = "freeze.json"


class Frozen(StoreError):
    """Refused: the fleet is frozen."""


def describe_freeze(rec: dict) -> str:
    pinned = "no table" if rec.get("pinned") is None else f"table {rec['pinned']} (epoch {rec.get('pinned_epoch', 0)})"
    return (f"the fleet is frozen since {rec['at']} by {rec['who']}: {rec['why']} — {pinned} pinned; "
            "`ccs unfreeze --reason ...` lifts it")


class _Fsspec:
    """A directory or an fsspec URL: state.json replaced by a rename of a temporary file."""

    def __init__(self, url: str):
        import fsspec
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self._p("tables"), exist_ok=True)

    def _p(self, key: str) -> str:
        return posixpath.join(self.root, key)

    def exists(self, key: str) -> bool:
        return self.fs.exists(self._p(key))

    def read(self, key: str) -> bytes | None:
        p = self._p(key)
        if not self.fs.exists(p):
            return None
        with self.fs.open(p, "rb") as f:
            return f.read()

    def replace(self, key: str, data: bytes) -> None:
        tmp = self._p(key + ".tmp")
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, self._p(key))

    def put_file(self, local: str, key: str) -> None:
        self.fs.put_file(local, self._p(key))

    def get_file(self, key: str, local: str) -> None:
        self.fs.get_file(self._p(key), local)


class _S3:
    """`s3://bucket/prefix` through boto3. A PUT replaces the whole object at once (S3 never shows a
    half-written object), so state.json is written by one PUT, without a temporary key."""

    def __init__(self, url: str, endpoint: str | None, region: str | None, path_style: bool):
        u = urlparse(url)
        if not u.netloc:
            raise StoreError(f"{url}: no bucket (s3://bucket/prefix)")
        self.bucket, self.prefix = u.netloc, u.path.strip("/")
        # credentials: the environment or the SDK's standard chain, never the configuration
        self.s3 = files.make_s3_client(endpoint, region, path_style, connect_timeout=5, read_timeout=30)

    def _k(self, key: str) -> str:
        return posixpath.join(self.prefix, key) if self.prefix else key

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._k(key))
            return True
        except ClientError as exc:
            if files.is_missing(exc):
                return False
            raise

    def read(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except ClientError as exc:
            if files.is_missing(exc):
                return None
            raise

    def replace(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)

    def put_file(self, local: str, key: str) -> None:
        with open(local, "rb") as f:
            self.s3.put_object(Bucket=self.bucket, Key=self._k(key), Body=f.read())

    def get_file(self, key: str, local: str) -> None:
        with open(local, "wb") as f:
            f.write(self.s3.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read())


class Store:
    """`endpoint`, `region`, `path_style`: the S3-compatible server of an s3:// store
    (`object_store:`; `store_for(cfg)` passes them); ignored for directories and other URLs."""

    def __init__(self, url: str, endpoint: str | None = None, region: str | None = None,
                 path_style: bool = True):
        self.url = url
        self.endpoint = endpoint
        self.region = region
        self.path_style = path_style
        self.backend = (_S3(url, endpoint, region, path_style) if url.startswith("s3://")
                        else _Fsspec(url))

    # -- state -----------------------------------------------------------------------------------
    def state(self) -> dict:
        data = self.backend.read("state.json")
        return {"current": None, "history": []} if data is None else json.loads(data)

    def _write_state(self, st: dict) -> None:
        self.backend.replace("state.json", json.dumps(st, indent=1).encode())

    def current(self) -> int | None:
        return self.state()["current"]

    def read_json(self, key: str):
        """A JSON document of the store's root (freeze.json...), None when absent."""
        data = self.backend.read(key)
        return None if data is None else json.loads(data)

    def write_json(self, key: str, doc) -> None:
        self.backend.replace(key, json.dumps(doc, indent=1).encode())

    def _refuse_if_frozen(self, what: str, version: int | None = None) -> None:
        """Raise Frozen naming the freeze (export/delivery/freeze.py), unless none holds or
        `version` is the pinned table."""
        rec = self.read_json(FREEZE_KEY)
        if not rec or not rec.get("frozen") or (version is not None and version == rec.get("pinned")):
            return
        raise Frozen(f"refused {what}: {describe_freeze(rec)}")

    def set_current(self, version: int) -> None:
        self._refuse_if_frozen(f"making table {int(version)} current", int(version))
        st = self.state()
        if not self.has(version):
            raise StoreError(f"version {version} is not in the store")
        st["current"] = int(version)
        if not st["history"] or st["history"][-1] != int(version):
            st["history"].append(int(version))
        self._write_state(st)

    def previous(self) -> int | None:
        """The version made current before the current one (for `ccs rollback`)."""
        st = self.state()
        hist = [v for v in st["history"] if v != st["current"]]
        return hist[-1] if hist else None

    # -- files -------------------------------------------------------------------------------
    @staticmethod
    def names(version: int) -> tuple[str, str, str]:
        m = f"table-{int(version)}.manifest.json"
        return f"table-{int(version)}.bin", m, m + SIG_SUFFIX

    def has(self, version: int) -> bool:
        return all(self.backend.exists(posixpath.join("tables", n)) for n in self.names(version))

    def publish(self, manifest_path: str) -> int:
        """Upload a signed table (its manifest, signature and .bin) under tables/; → version."""
        with open(manifest_path) as f:
            man = json.load(f)
        version = int(man["version"])
        self._refuse_if_frozen(f"publishing table {version}")
        src = os.path.dirname(os.path.abspath(manifest_path))
        for n in self.names(version):
            local = os.path.join(src, n)
            if not os.path.exists(local):
                raise StoreError(f"cannot publish version {version}: {local} is missing")
        # a version names one table: another table under the same number (a new lake numbering
        # from 1 into an old store) would replace what nodes and the history point at
        b, m, s = self.names(version)
        held = self.backend.read(posixpath.join("tables", m))
        if held is not None:
            with open(os.path.join(src, m), "rb") as f:
                if f.read() != held:
                    theirs = json.loads(held)
                    raise StoreError(
                        f"cannot publish version {version} (epoch {int(man.get('epoch', 0))}): the "
                        f"store already holds another table {version} (epoch "
                        f"{int(theirs.get('epoch', 0))}, sha256 {theirs.get('sha256', '?')[:12]}). "
                        "A lake whose numbering started again publishes to a new store, in a new "
                        "epoch (`ccs keys epoch --new`)")
        # the .bin and signature first, the manifest last: a reader never sees a manifest
        # without its table
        for n in (b, s, m):
            self.backend.put_file(os.path.join(src, n), posixpath.join("tables", n))
        return version

    def fetch(self, version: int, dest_dir: str) -> str:
        """Download version's files into dest_dir (each written beside, then renamed into place);
        → local manifest path."""
        if not self.has(version):
            raise StoreError(f"version {version} is not in the store {self.url}")
        os.makedirs(dest_dir, exist_ok=True)
        b, m, s = self.names(version)
        for n in (b, s, m):
            local = os.path.join(dest_dir, n)
            self.backend.get_file(posixpath.join("tables", n), local + ".part")
            os.replace(local + ".part", local)
        return os.path.join(dest_dir, m)

    def serial(self, version: int) -> tuple[int, int]:
        """(epoch, version) of a table in the store: the order the agents keep."""
        return int(self.manifest(version).get("epoch", 0)), int(version)

    def manifest(self, version: int) -> dict:
        data = self.backend.read(posixpath.join("tables", self.names(version)[1]))
        if data is None:
            raise StoreError(f"version {version} is not in the store {self.url}")
        return json.loads(data)


def store_for(cfg: Config, url: str | None = None) -> Store:
    """The store `url` names (default `export.rollout.store`), on the configuration's object store."""
    st = cfg.settings.object_store
    return Store(url or cfg.settings.export.rollout.store, endpoint=st.endpoint, region=st.region,
                 path_style=st.path_style)
