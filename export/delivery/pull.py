"""What an edge host runs to take a signed table from the store: download one version's three files
(the .bin, its signature, the manifest last) into the host's table directory and print the local
manifest's path.

    python -m ccselect.export.delivery.pull --store s3://ccselect-artifacts/cc-tables \
        --endpoint http://10.231.1.1:19000 --version 42 --dest /var/lib/ccs/tables

`--endpoint` is the store's address as this host sees it (on a one-machine fleet, the host side of
the node's veth); credentials come from the environment or the SDK's standard chain. Nothing is
checked here: `ccs-edge load` verifies the signature, the manifest's fields and the .bin's sha256
before anything reaches the kernel (export/edge/README.md, "The table"), so a table altered in the
store or on the way is refused there, where the key is.
"""
from __future__ import annotations

import argparse
import sys

from ccselect.export.delivery.store import Store, StoreError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ccselect.export.delivery.pull", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="the store's URL (s3://bucket/prefix or a directory)")
    ap.add_argument("--endpoint", default=None, help="the S3 server as this host reaches it (http://host:port)")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--virtual-host", action="store_true", help="bucket in the host name, not in the path")
    ap.add_argument("--version", required=True, type=int)
    ap.add_argument("--dest", required=True, help="the host's table directory")
    a = ap.parse_args(argv)
    try:
        store = Store(a.store, endpoint=a.endpoint, region=a.region, path_style=not a.virtual_host)
        print(store.fetch(a.version, a.dest))
    except StoreError as exc:
        print(f"pull: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 — the store unreachable, refused credentials...: say which
        print(f"pull: {a.store} at {a.endpoint or 'the default endpoint'}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
