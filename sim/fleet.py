"""Run the simulator over nodes × hours and write the data contract's files.

Layout under OUT:
  transport/<node_id>/<YYYY-MM-DDTHH>.jsonl   access/...   qoe/...      (the three streams)
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

from ccselect.contract import STREAMS, hour_file_name, stream_dir
from sim.params import SimParams
from sim.tables import CcTable
from sim.traffic import generate_node_hour
from sim.world import World
# Imported inside the functions that use them (heavy, not needed to import this module): polars.

TRUTH_DIR = "_truth"

_WORLD = None
_TABLE = None


def _init_worker(params: SimParams) -> None:
    global _WORLD, _TABLE
    _WORLD = World(params)
    _TABLE = CcTable.from_csv(params.table_path) if params.cc_mode == "table" else None


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def _write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
    _atomic_write(path, write)


def _task(args: tuple[str, int, int]) -> dict[str, int]:
    out, node_idx, hour_idx = args
    assert _WORLD is not None
    nh = generate_node_hour(_WORLD, node_idx, hour_idx, _TABLE)
    node_id = _WORLD.nodes[node_idx].node_id
    fname = hour_file_name(_WORLD.hour_start_ms(hour_idx))
    for stream in STREAMS:
        df = getattr(nh, stream)
        _atomic_write(os.path.join(stream_dir(out, stream, node_id), fname), df.write_ndjson)
    _atomic_write(os.path.join(out, TRUTH_DIR, "connections", node_id, fname.replace(".jsonl", ".parquet")),
                  nh.truth.write_parquet)
    return {"transport": nh.transport.height, "access": nh.access.height, "qoe": nh.qoe.height,
            "labelled": int(nh.access["net_type"].is_not_null().sum())}


def _write_static(params: SimParams, out: str) -> dict[str, Any]:
    import polars as pl

    world = World(params)
    ref = world.reference_rows()

    def write_ref(path: str) -> None:
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(ref[0]))
            w.writeheader()
            w.writerows(ref)
    _atomic_write(os.path.join(out, "reference", "ip_asn_region.csv"), write_ref)

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
    _atomic_write(os.path.join(truth, "prefixes.parquet"), pl.DataFrame(rows).write_parquet)
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


def simulate(params: SimParams, out: str, workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Write the fleet's logs for `params` under `out`; return the manifest."""

    if params.cc_mode == "table" and not params.table_path:
        raise ValueError("cc_mode='table' needs table_path")
    params = replace(params, table_path=os.path.abspath(params.table_path) if params.table_path else None)
    if os.path.exists(os.path.join(out, "manifest.json")):  # an earlier simulation: start clean
        for d in (*STREAMS, "reference", TRUTH_DIR):
            shutil.rmtree(os.path.join(out, d), ignore_errors=True)
        os.remove(os.path.join(out, "manifest.json"))
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    static = _write_static(params, out)
    tasks = [(out, n, h) for h in range(params.hours) for n in range(params.nodes)]
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
    manifest = {"params": params.to_dict(), "code_version": code_version(), **static, "counts": totals,
                "seconds": round(time.time() - t0, 2), "layout": __doc__.split("Layout under OUT:")[1].split("\n\n")[0]}
    _write_text(os.path.join(out, "manifest.json"), json.dumps(manifest, indent=1))
    return manifest
