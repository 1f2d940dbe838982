"""Reading a local Delta table's live files without Spark (delta-rs's log, pyarrow's reader): what
the driver-side engines (`models/infer_arrow.py`, `jobs/autoplex_arrow.py`) share.

They run in the job's own process, over the files the table's Delta log names, and raise
`Unsupported` where they cannot: a lake on object storage (they read local paths), or a table
whose protocol needs reader features (deletion vectors, column mapping). Their callers then run
the Spark job instead."""
from __future__ import annotations

import os
import re
from urllib.parse import unquote

import pyarrow as pa

from ccselect.hours import Window
# Imported inside the functions that use them (heavy, not needed to import this module): deltalake.


class Unsupported(RuntimeError):
    """A driver-side engine cannot run on this lake; the Spark job can."""


def by_engine(engine: str, arrow_job, spark_job) -> dict:
    """`arrow_job()` or `spark_job()` by `engine`: "arrow" (the driver-side engine, or its
    Unsupported), "spark", or "auto" (arrow where it can run, else spark, the result's
    `engine_fallback` saying why)."""
    fallback = None
    if engine in ("auto", "arrow"):
        try:
            return arrow_job()
        except Unsupported as e:
            if engine == "arrow":
                raise
            fallback = str(e)
    result = spark_job()
    if fallback:
        result["engine_fallback"] = fallback
    return result


def local_path(path: str) -> str:
    """`path` as a local filesystem path (`file:///x` and Hadoop's `file:/x` are `/x`); Unsupported
    for any other scheme."""
    if "://" in path and not path.startswith("file://"):
        raise Unsupported(f"{path} is not on the local filesystem (this engine reads local paths)")
    return re.sub(r"^file:(//)?", "", path)


def check_protocol(dt) -> None:
    """Unsupported when reading the table needs a reader feature."""
    proto = dt.protocol()
    if proto.min_reader_version > 1 or (proto.reader_features or []):
        raise Unsupported(f"{dt.table_uri} needs reader version {proto.min_reader_version} "
                          f"(features {proto.reader_features}): read it with Spark")


def actions(dt) -> list[tuple[str, int, int, str, str]]:
    """(relative path, size, rows (−1 unknown), node_id, hour) of a (node_id, hour)-partitioned
    table's live data files."""
    acts = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    return [(rel, int(acts["size_bytes"][i]), -1 if acts["num_records"][i] is None else int(acts["num_records"][i]),
             acts["partition.node_id"][i], acts["partition.hour"][i]) for i, rel in enumerate(acts["path"])]


def live_files(path: str, window: Window | None) -> list[tuple[str, str, str, int]]:
    """(absolute path, node_id, hour, rows) of the live data files of a (node_id, hour)-partitioned
    table's partitions in the window's hours (None: every hour), from its Delta log."""
    from deltalake import DeltaTable
    dt = DeltaTable(path)
    check_protocol(dt)
    return sorted(((os.path.join(path, unquote(rel)), node, hour, rows) for rel, _, rows, node, hour in actions(dt)
                   if hour is not None and (window is None or window.lo <= hour <= window.hi)), key=lambda f: (f[1], f[2], f[0]))
