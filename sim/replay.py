"""The simulator's hourly logs as the edge agent's rotated segments (ccselect/contract.py
`segment_file_name`): for feeding `ccs stream` with traffic that was simulated hourly — `make
run`'s stream hour, bench/freshness.py's replay at N × real time, the stream's tests.

A record goes to the segment of its time (transport: ts_end_ms, access and QoE: ts_ms), in the
order of the hourly file; a segment is due when its last minute is over."""
from __future__ import annotations

import json
import os
import shutil
from typing import NamedTuple

from ccselect.contract import STREAMS, segment_file_name

TIME_FIELD = {"transport": "ts_end_ms", "access": "ts_ms", "qoe": "ts_ms"}


class Segment(NamedTuple):
    due_ms: int         # the end of its last minute: when the agent renames it into place
    stream: str
    node_id: str
    name: str
    lines: list[str]


def segments(src: str, hours: list[str], nodes: list[str] | None = None, minutes: int = 60,
             rotate_minutes: int = 1) -> list[Segment]:
    """The segments of `hours` (of `nodes`, default all) under the hourly folder `src`, only
    records in each hour's first `minutes`, in the order they fall due (then by name)."""
    segs: dict[tuple[str, str, str], list[str]] = {}
    due: dict[tuple[str, str, str], int] = {}
    for stream in STREAMS:
        sdir = os.path.join(src, stream)
        for node in nodes or sorted(os.listdir(sdir)):
            for hour in hours:
                path = os.path.join(sdir, node, f"{hour}.jsonl")
                if not os.path.exists(path):
                    continue
                with open(path) as fh:
                    for line in fh:
                        ts = json.loads(line)[TIME_FIELD[stream]]
                        if ts // 60_000 % 60 >= minutes:
                            continue
                        key = (stream, node, segment_file_name(ts, rotate_minutes))
                        segs.setdefault(key, []).append(line)
                        due[key] = max(due.get(key, 0), (ts // 60_000 + 1) * 60_000)
    return sorted((Segment(due[k], k[0], k[1], k[2], v) for k, v in segs.items()),
                  key=lambda s: (s.due_ms, s.name, s.stream, s.node_id))


def write(seg: Segment, dst: str, mtime: float | None = None) -> str:
    """Write one segment as the agent does: hidden while written, then renamed into place."""
    d = os.path.join(dst, seg.stream, seg.node_id)
    os.makedirs(d, exist_ok=True)
    tmp, path = os.path.join(d, f".{seg.name}.part"), os.path.join(d, seg.name)
    with open(tmp, "w") as fh:
        fh.writelines(seg.lines)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.rename(tmp, path)
    return path


def write_all(src: str, dst: str, hours: list[str], nodes: list[str] | None = None, minutes: int = 60,
              rotate_minutes: int = 1) -> list[str]:
    """Every segment at once, with modification times one second apart in due order (a file
    source takes files by modification time); the IP reference is copied along."""
    segs = segments(src, hours, nodes, minutes, rotate_minutes)
    t0 = 1_700_000_000
    paths = [write(s, dst, t0 + i) for i, s in enumerate(segs)]
    if os.path.isdir(os.path.join(src, "reference")):
        shutil.copytree(os.path.join(src, "reference"), os.path.join(dst, "reference"), dirs_exist_ok=True)
    return paths
