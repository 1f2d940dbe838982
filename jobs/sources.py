"""Finding and reading the node-hour files of the data contract (extract side of ingest).

Layout: `DIR/<stream>/<node_id>/<YYYY-MM-DDTHH>.jsonl`, or `.jsonl.gz` (gzip, as log rotation
leaves it; Spark's text source decompresses it by its name), or the agent's rotated segments
`<YYYY-MM-DDTHHMM>[.<seq>].jsonl` (issue 26, `ccselect.contract.FILE_NAME`): a node-hour's segments
are read together as that hour. Folders starting with `_` (the simulator's `_truth/`) are never
read, nor are hidden files (`.<name>.part`: a segment being written); everything else that does
not match the layout is reported by `discover_all` with the reason it is not read — and so is a
node-hour that has both an hourly file and segments, or a file both as `.jsonl` and `.jsonl.gz`
(neither is read: which one holds the records is not ours to guess).

DIR is a local folder or, on a cluster, an object store prefix (`s3a://bucket/raw`): there the
folders are what the keys imply, all found by one listing of the prefix (boto3 with the
configuration's `object_store`, as ccselect/files.py: a request per 1,000 keys, where Hadoop's
FileSystem through py4j would cost a JVM round trip per file, and a Spark session). The
credentials are the ones Spark's S3A finds: the SDKs' standard chain.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from pyspark.sql import functions as F

from ccselect import files as storage
from ccselect.config import Config
from ccselect.contract import FILE_NAME, STREAMS
from ccselect.hours import Window, hour_start_ms
from ccselect.spark import SPLIT_LINES, register_udfs

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: Top-level entries of an input folder that are expected and not logs (the IP→ASN/region
#: reference silver reads, the simulator's manifest).
EXPECTED_TOP = ("reference", "manifest.json")
#: The reference the enrich step reads (jobs/silver.py: client address → ug_id), under the input folder.
REFERENCE = ("reference", "ip_asn_region.csv")
#: What a missing reference costs, as ingest's and validate's reports say it.
MISSING_REFERENCE_EFFECT = ("every connection's ug_id is null (no user groups, no AutoPlex caps): "
                            "put the IP→ASN/region table (cidr,asn,isp,region) there")


def reference_path(input_dir: str) -> str:
    return storage.join(input_dir, *REFERENCE)


def missing_reference(input_dir: str, files: list[SourceFile], cfg: Config | None = None) -> str | None:
    """The reference file's path when transport logs are among `files` and it is not under
    `input_dir` (an object store's is looked up with `cfg`, unchecked without it), else None."""
    if not any(f.stream == "transport" for f in files):
        return None
    path = reference_path(input_dir)
    if storage.is_remote(input_dir):
        return None if cfg is None or storage.exists(cfg, path) else path
    return None if os.path.exists(path) else os.path.abspath(path)


@dataclass(frozen=True, order=True)
class SourceFile:
    stream: str
    node_id: str
    hour: str          # "2026-11-01T05", the UTC hour every record must fall in
    path: str

    @property
    def hour_start_ms(self) -> int:
        return hour_start_ms(self.hour)


@dataclass(frozen=True)
class Skipped:
    path: str
    why: str


class _Folders:
    """A local folder tree, read as it is walked."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    isdir = staticmethod(os.path.isdir)
    listdir = staticmethod(os.listdir)
    join = staticmethod(os.path.join)


class _Prefix:
    """The folders the keys under an object store prefix imply (an empty folder has no key, and
    so is not there), from one listing."""

    def __init__(self, root: str, cfg: Config | None):
        if cfg is None:
            raise ValueError(f"listing {root} needs the configuration (its object_store)")
        self.root = root.rstrip("/")
        u = urlparse(self.root)
        self.dirs: dict[str, set[str]] = {}
        base = u.path.strip("/")
        prefix = base + "/" if base else ""          # s3a://bucket itself: every key
        pages = storage.s3_client(cfg).get_paginator("list_objects_v2").paginate(Bucket=u.netloc, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                parts = obj["Key"][len(prefix):].split("/")
                parent = self.root
                for i, name in enumerate(parts):
                    if not name:       # a folder marker ("a/b/") or an empty path segment
                        break
                    self.dirs.setdefault(parent, set()).add(name)
                    parent = self.join(parent, name)
                    if i < len(parts) - 1:
                        self.dirs.setdefault(parent, set())

    def isdir(self, path: str) -> bool:
        return path in self.dirs

    def listdir(self, path: str) -> list[str]:
        return list(self.dirs[path])

    @staticmethod
    def join(*parts: str) -> str:
        return "/".join(parts)


def discover_all(input_dir: str, window: Window | None = None,
                 streams: tuple[str, ...] = STREAMS, cfg: Config | None = None
                 ) -> tuple[list[SourceFile], list[Skipped]]:
    """(every node-hour file under `input_dir`, sorted, optionally limited to an hour range;
    every other entry of the folder with why it is not read). Files outside `window` (its hours) are neither:
    they are left out on purpose. An object store prefix (s3a://) is listed with `cfg`'s
    `object_store`."""
    found: list[SourceFile] = []
    skipped: list[Skipped] = []
    fs = _Prefix(input_dir, cfg) if storage.is_remote(input_dir) else _Folders(input_dir)
    root = fs.root
    if not fs.isdir(root):
        return [], [Skipped(root, "not a folder")]
    for top in sorted(fs.listdir(root)):
        if top.startswith("_") or top in EXPECTED_TOP or top in streams:
            continue
        if top in STREAMS:
            continue          # a stream not asked for
        skipped.append(Skipped(fs.join(root, top), f"not a stream folder ({', '.join(STREAMS)})"))
    for stream in streams:
        sdir = fs.join(root, stream)
        if not fs.isdir(sdir):
            continue
        for node in sorted(fs.listdir(sdir)):
            ndir = fs.join(sdir, node)
            if node.startswith("_"):
                continue
            if not fs.isdir(ndir):
                skipped.append(Skipped(ndir, "not in a <stream>/<node_id>/ folder"))
                continue
            if not _NODE.match(node):
                skipped.append(Skipped(ndir, "node folder name not accepted"))
                continue
            by_hour: dict[str, dict[str, list[str]]] = {}   # hour → file name without .gz → paths
            for name in sorted(fs.listdir(ndir)):
                path = fs.join(ndir, name)
                m = FILE_NAME.match(name)
                if name.startswith("."):
                    if name.endswith(".part"):
                        continue      # a segment the agent is still writing: it appears when renamed
                    skipped.append(Skipped(path, "hidden file"))
                elif fs.isdir(path):
                    skipped.append(Skipped(path, "not in a <stream>/<node_id>/ folder"))
                elif not m:
                    skipped.append(Skipped(path, "file name is not <YYYY-MM-DDTHH>.jsonl, a segment "
                                                 "<YYYY-MM-DDTHHMM>[.<seq>].jsonl, or either .gz"))
                elif window is None or window.lo <= m.group(1) <= window.hi:
                    base = name[:-3] if name.endswith(".gz") else name
                    by_hour.setdefault(m.group(1), {}).setdefault(base, []).append(path)
            for hour, names in sorted(by_hour.items()):
                hourly = f"{hour}.jsonl"
                if hourly in names and len(names) > 1:
                    skipped.extend(Skipped(p, f"the node-hour {hour} has both an hourly file and segments")
                                   for ps in names.values() for p in ps)
                    continue
                for base, paths in sorted(names.items()):
                    if len(paths) > 1:
                        skipped.extend(Skipped(p, f"{base} is there as {os.path.basename(q)} too")
                                       for p in paths for q in paths if q != p)
                    else:
                        found.append(SourceFile(stream, node, hour, paths[0]))
    return sorted(found), skipped


def classify(path: str, streams: tuple[str, ...] = STREAMS) -> SourceFile | Skipped:
    """One file by its path alone, as `discover_all` judges it inside its folder: the stream's
    file source (flows/stream.py) sees files one at a time."""
    ndir, name = os.path.split(path if storage.is_remote(path) else os.path.abspath(path))
    sdir, node = os.path.split(ndir)
    stream = os.path.basename(sdir)
    m = FILE_NAME.match(name)
    if stream not in streams:
        return Skipped(path, f"not in a stream folder ({', '.join(streams)})")
    if not _NODE.match(node):
        return Skipped(path, "node folder name not accepted")
    if not m:
        return Skipped(path, "file name is not <YYYY-MM-DDTHH>.jsonl, a segment <YYYY-MM-DDTHHMM>[.<seq>].jsonl, or either .gz")
    return SourceFile(stream, node, m.group(1), path)


def discover(input_dir: str, window: Window | None = None,
             streams: tuple[str, ...] = STREAMS, cfg: Config | None = None) -> list[SourceFile]:
    """Every node-hour file under `input_dir`, sorted, optionally limited to an hour range."""
    return discover_all(input_dir, window, streams, cfg)[0]


def read_lines(spark, files: list[SourceFile]):
    """One row per line: stream, node_id, hour, hour_start_ms, source_file, line_no (1-based), raw.

    Files are read whole (`wholetext`) so that line numbers are exact; a final newline does not
    make an extra empty line, and an empty file has no lines.
    """

    if not files:
        raise ValueError("no files to read")
    meta = spark.createDataFrame(
        [(f.path, f.stream, f.node_id, f.hour, f.hour_start_ms, f.path) for f in files],
        "uri string, stream string, node_id string, hour string, hour_start_ms bigint, source_file string")
    text = (spark.read.text([f.path for f in files], wholetext=True)
            .select(F.regexp_replace("_metadata.file_path", "^file:(//)?", "").alias("uri"), "value"))
    return explode_lines(text.join(F.broadcast(meta), "uri"))


def explode_lines(files):
    """Whole files (a row per file: its text as `value`, and stream, node_id, hour, hour_start_ms,
    source_file) → one row per line with its 1-based line_no (a bigint, as the Kafka source's
    offset: jobs.ingest.LINE_TYPES). Batch ingest (`read_lines`) and the
    stream (flows/stream.py) both cut lines here, with `ccs_split_lines` (jvm/src/ccselect/udf/
    SplitLines.java: the file's bytes cut at each newline, without decoding the text into a Java
    string; jobs/README.md gives the measurement)."""
    register_udfs(files.sparkSession)
    lines = F.call_function(SPLIT_LINES, F.col("value").cast("binary"))
    return (files.select("stream", "node_id", "hour", "hour_start_ms", "source_file",
                         F.posexplode(lines).alias("pos", "raw"))
            .select("stream", "node_id", "hour", "hour_start_ms", "source_file",
                    (F.col("pos") + 1).cast("bigint").alias("line_no"), F.col("raw").cast("string").alias("raw")))
