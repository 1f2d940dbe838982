"""Finding and reading the node-hour files of the data contract (extract side of ingest).

Layout: `DIR/<stream>/<node_id>/<YYYY-MM-DDTHH>.jsonl`. Folders starting with `_` (the
simulator's `_truth/`) and anything not matching that layout are never read.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pyspark.sql import functions as F

from ccselect.contract import STREAMS
from ccselect.hours import hour_start_ms

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOUR = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2})\.jsonl$")


@dataclass(frozen=True, order=True)
class SourceFile:
    stream: str
    node_id: str
    hour: str          # "2026-11-01T05", the UTC hour every record must fall in
    path: str

    @property
    def hour_start_ms(self) -> int:
        return hour_start_ms(self.hour)


def discover(input_dir: str, hours: tuple[str, str] | None = None,
             streams: tuple[str, ...] = STREAMS) -> list[SourceFile]:
    """Every node-hour file under `input_dir`, sorted, optionally limited to an hour range."""
    found: list[SourceFile] = []
    for stream in streams:
        sdir = os.path.join(input_dir, stream)
        if not os.path.isdir(sdir):
            continue
        for node in sorted(os.listdir(sdir)):
            ndir = os.path.join(sdir, node)
            if node.startswith("_") or not _NODE.match(node) or not os.path.isdir(ndir):
                continue
            for name in sorted(os.listdir(ndir)):
                m = _HOUR.match(name)
                if not m:
                    continue
                hour = m.group(1)
                if hours and not (hours[0] <= hour <= hours[1]):
                    continue
                found.append(SourceFile(stream, node, hour, os.path.abspath(os.path.join(ndir, name))))
    return sorted(found)


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
    body = F.regexp_replace(F.col("value"), r"\n\z", "")
    lines = F.when(F.col("value") == "", F.array().cast("array<string>")).otherwise(F.split(body, "\n", -1))
    return (text.join(F.broadcast(meta), "uri")
            .select("stream", "node_id", "hour", "hour_start_ms", "source_file",
                    F.posexplode(lines).alias("pos", "raw"))
            .select("stream", "node_id", "hour", "hour_start_ms", "source_file",
                    (F.col("pos") + 1).alias("line_no"), "raw"))
