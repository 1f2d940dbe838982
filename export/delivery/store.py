"""The artifact store the edge fleet pulls signed tables from.

`export.rollout.store` is a directory (the default) or an fsspec URL (s3://, gs://, memory://...;
the backend's own package, e.g. s3fs, must be installed for anything but local and memory).
Layout under the store root:
  tables/table-V.bin, tables/table-V.manifest.json, tables/table-V.manifest.json.sig
  state.json   {"current": V or null, "history": [V1, V2, ...]}  (versions in publication order)
The store only holds signed files; agents verify them (signature, sha256) before loading.
"""
from __future__ import annotations

import json
import os
import posixpath

from export.artifact.signing import SIG_SUFFIX
# Imported inside the functions that use them (heavy, not needed to import this module): fsspec.


class StoreError(RuntimeError):
    pass


class Store:
    def __init__(self, url: str):
        import fsspec
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self._p("tables"), exist_ok=True)

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # -- state -----------------------------------------------------------------------------------
    def state(self) -> dict:
        p = self._p("state.json")
        if not self.fs.exists(p):
            return {"current": None, "history": []}
        with self.fs.open(p, "r") as f:
            return json.load(f)

    def _write_state(self, st: dict) -> None:
        tmp = self._p("state.json.tmp")
        with self.fs.open(tmp, "w") as f:
            json.dump(st, f, indent=1)
        self.fs.mv(tmp, self._p("state.json"))

    def current(self) -> int | None:
        return self.state()["current"]

    def set_current(self, version: int) -> None:
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
        return all(self.fs.exists(self._p("tables", n)) for n in self.names(version))

    def publish(self, manifest_path: str) -> int:
        """Upload a signed table (its manifest, signature and .bin) under tables/; → version."""
        with open(manifest_path) as f:
            man = json.load(f)
        version = int(man["version"])
        src = os.path.dirname(os.path.abspath(manifest_path))
        for n in self.names(version):
            local = os.path.join(src, n)
            if not os.path.exists(local):
                raise StoreError(f"cannot publish version {version}: {local} is missing")
        # the .bin and signature first, the manifest last: a reader never sees a manifest
        # without its table
        b, m, s = self.names(version)
        for n in (b, s, m):
            self.fs.put_file(os.path.join(src, n), self._p("tables", n))
        return version

    def fetch(self, version: int, dest_dir: str) -> str:
        """Download version's files into dest_dir; → local manifest path."""
        if not self.has(version):
            raise StoreError(f"version {version} is not in the store {self.url}")
        os.makedirs(dest_dir, exist_ok=True)
        for n in self.names(version):
            self.fs.get_file(self._p("tables", n), os.path.join(dest_dir, n))
        return os.path.join(dest_dir, self.names(version)[1])

    def manifest(self, version: int) -> dict:
        with self.fs.open(self._p("tables", self.names(version)[1]), "r") as f:
            return json.load(f)
