"""Run the simulator over nodes × hours and write the data contract's files.

Layout under OUT:
  transport/<node_id>/<YYYY-MM-DDTHH>.jsonl   access/...   qoe/...      (the three streams;
      with rotate_minutes, the agent's segments <YYYY-MM-DDTHHMM>.jsonl instead: issue 26)
  reference/ip_asn_region.csv                                           (IP→ASN/region table)
  manifest.json                                                         (params and counts)
  _truth/                                   ground truth, kept apart: no pipeline code reads it

Each node-hour is one task with its own random stream: the output is identical for a seed
whatever the number of workers, and memory stays flat as nodes × hours grow.
"""
from __future__ import annotations

import csv
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, replace
from typing import Any, Callable

from tqdm import tqdm

from ccselect.contract import ROTATE_MINUTES, STREAMS, hour_file_name, segment_file_name, stream_dir
from ccselect.sim.params import SimParams
from ccselect.sim.tables import CcTable
from ccselect.sim.traffic import generate_node_hour
from ccselect.sim.world import World
# Imported inside the functions that use them (heavy, not needed to import this module): polars.

TRUTH_DIR = "_truth"
#: the record time a stream's file is chosen by (a connection belongs to the hour it closed in)
TIME_FIELD = {"transport": "ts_end_ms", "access": "ts_ms", "qoe": "ts_ms"}

_WORLD = None
_TABLE = None


def _init_worker(params: SimParams) -> None:
    global _WORLD, _TABLE
    _WORLD = World(params)
    _TABLE = CcTable.from_csv(params.table_path) if params.cc_mode == "table" else None


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write beside `path` hidden, as the agent does (`.<name>.part`: readers of the contract, and
    Spark's streaming file source, skip names starting with '.'), then rename it into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.part")
    write(tmp)
    os.replace(tmp, path)


def write_reference(world: World, out: str) -> None:
    """The reference CSV a fleet's logs come with (`<out>/reference/ip_asn_region.csv`: prefix,
    ASN, region), written as the agent writes a file."""
    ref = world.reference_rows()

    def write(path: str) -> None:
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(ref[0]))
            w.writeheader()
            w.writerows(ref)
    atomic_write(os.path.join(out, "reference", "ip_asn_region.csv"), write)


def _write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
    atomic_write(path, write)


def _write_segments(folder: str, df, time_field: str, hour_ms: int, rotate_minutes: int) -> None:
    """One node-hour of a stream as the agent's segments: a record goes to the segment of its
    time, rows keep their order inside a segment, no segment is empty. A time outside the hour
    (never, the contract's hour rule) stays in the hour's first or last segment, so a node-hour
    writes only its own files."""
    import polars as pl

    minute = ((pl.col(time_field) - hour_ms) // 60_000).clip(0, 59)
    parts = df.with_columns((minute // rotate_minutes * rotate_minutes).alias("_segment")) \
              .partition_by("_segment", maintain_order=True, include_key=False, as_dict=True)
    for (m,), part in parts.items():
        atomic_write(os.path.join(folder, segment_file_name(hour_ms + m * 60_000, rotate_minutes)),
                      part.write_ndjson)


def _task(args: tuple[str, int, int, int]) -> dict[str, int]:
    out, node_idx, hour_idx, rotate_minutes = args
    assert _WORLD is not None
    nh = generate_node_hour(_WORLD, node_idx, hour_idx, _TABLE)
    node_id = _WORLD.nodes[node_idx].node_id
    hour_ms = _WORLD.hour_start_ms(hour_idx)
    fname = hour_file_name(hour_ms)
    for stream in STREAMS:
        df = getattr(nh, stream)
        folder = stream_dir(out, stream, node_id)
        if rotate_minutes:
            _write_segments(folder, df, TIME_FIELD[stream], hour_ms, rotate_minutes)
        else:
            atomic_write(os.path.join(folder, fname), df.write_ndjson)
    atomic_write(os.path.join(out, TRUTH_DIR, "connections", node_id, fname.replace(".jsonl", ".parquet")),
                  nh.truth.write_parquet)
    return {"transport": nh.transport.height, "access": nh.access.height, "qoe": nh.qoe.height,
            "labelled": int(nh.access["net_type"].is_not_null().sum())}


def _write_static(params: SimParams, out: str) -> dict[str, Any]:
    import polars as pl

    world = World(params)
    write_reference(world, out)

    truth = os.path.join(out, TRUTH_DIR)
    nodes = [asdict(n) for n in world.nodes]
    _write_text(os.path.join(truth, "nodes.json"), json.dumps(nodes, indent=1))
    rows = []
    for n in world.nodes:
        ps = world.prefixes(n.idx)
        for i in range(len(ps.weight)):
            rows.append({"node_id": n.node_id, "prefix": ps.cidr(i), "family": int(ps.family[i]),
                         "weight": float(ps.weight[i]),
                         "share_cell_by_hour": ps.share_cell[i].tolist(),
                         "segment_by_hour": ps.segment[i].tolist()})
    atomic_write(os.path.join(truth, "prefixes.parquet"), pl.DataFrame(rows).write_parquet)
    fault = None
    if world.fault_prefix16 is not None:
        fault = f"{world.fault_prefix16 >> 8}.{world.fault_prefix16 & 255}.0.0/16"
    _write_text(os.path.join(truth, "faults.json"), json.dumps({"mss_prefix16": fault}))
    return {"nodes": [n.node_id for n in world.nodes],
            "labelled_nodes": [n.node_id for n in world.nodes if n.labelled],
            "fault_mss_prefix16": fault}


def code_version() -> str:
    """A digest of the simulator's own source: output from other code is never reused."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            h.update(name.encode())
            h.update(open(os.path.join(here, name), "rb").read())
    return h.hexdigest()[:16]


def simulate(params: SimParams, out: str, workers: int | None = None, progress: bool = True,
             rotate_minutes: int = 0) -> dict[str, Any]:
    """Write the fleet's logs for `params` under `out`; return the manifest. `rotate_minutes`:
    the streams as the agent's rotated segments (ccselect.contract.ROTATE_MINUTES), 0 hourly."""

    if params.cc_mode == "table" and not params.table_path:
        raise ValueError("cc_mode='table' needs table_path")
    if rotate_minutes and rotate_minutes not in ROTATE_MINUTES:
        raise ValueError(f"rotate_minutes must be 0 (hourly files) or one of {ROTATE_MINUTES}, not {rotate_minutes}")
    params = replace(params, table_path=os.path.abspath(params.table_path) if params.table_path else None)
    if os.path.exists(os.path.join(out, "manifest.json")):  # an earlier simulation: start clean
        for d in (*STREAMS, "reference", TRUTH_DIR):
            shutil.rmtree(os.path.join(out, d), ignore_errors=True)
        os.remove(os.path.join(out, "manifest.json"))
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    static = _write_static(params, out)
    tasks = [(out, n, h, rotate_minutes) for h in range(params.hours) for n in range(params.nodes)]
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    totals = {"transport": 0, "access": 0, "qoe": 0, "labelled": 0}
    bar = tqdm(total=len(tasks), unit="node-hour", desc="simulate", disable=not progress)
    if workers <= 1:
        _init_worker(params)
        results = map(_task, tasks)
        for r in results:
            for k in totals:
                totals[k] += r[k]
            bar.update()
    else:
        os.environ.setdefault("POLARS_MAX_THREADS", "1")
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(params,)) as pool:
            for r in pool.imap_unordered(_task, tasks, chunksize=2):
                for k in totals:
                    totals[k] += r[k]
                bar.update()
    bar.close()
    manifest = {"params": params.to_dict(), "rotate_minutes": rotate_minutes, "code_version": code_version(),
                **static, "counts": totals,
                "seconds": round(time.time() - t0, 2), "layout": __doc__.split("Layout under OUT:")[1].split("\n\n")[0]}
    _write_text(os.path.join(out, "manifest.json"), json.dumps(manifest, indent=1))
    return manifest
