"""`ccs infer`'s driver-side engine (issue 31): silver.connections → gold.predictions without
Spark, over Arrow straight from the Delta files, in the job's own process.

Why: the Spark job (models/infer.py) cannot pass about 120 k rows/s on 2 cores. Its scan of silver
into a `noop` sink alone runs at about 860 k rows/s and the Python worker's Arrow round trip at
about 280 k, while the model itself scores about 9 M rows/s. Twelve numeric Parquet columns decode
at tens of millions of values a second per core, so this engine skips the executors:

- **Read.** The table's Delta log (delta-rs, `deltalake`) names the live data files of the window's
  (node_id, hour) partitions. Each file is read with pyarrow in batches of `infer.batch_rows`:
  only the pass-through columns and the twelve Table 4 features.
- **Score.** The same functions as the Spark job's Arrow UDF (models/infer_core.py), so the
  probabilities and decisions are the same: `standardize`, `probabilities` (the network, the
  champion's temperature and its out-of-domain guard) and ALICCS §4.2's rule (`decide_arrays`,
  the NumPy twin of `models.infer.decide`). This module reads and writes the files around them.
- **Write.** One Parquet file per input file, under the same partition directory. Then one Delta
  commit (delta-rs) that adds the new files and removes every live file of the replaced
  partitions. A re-run replaces exactly the same keys. A process killed before the commit leaves
  the table as it was: its files are not in the log.
- **Parallelism.** A thread per core over the files. pyarrow, NumPy's large-array loops and torch
  release the GIL; torch runs one intra-op thread per file meanwhile.

When it cannot run, it raises `Unsupported` and `models.infer.run` (which calls this engine; this
module does not import it) falls back to the Spark job, saying
why in its result: a lake on object storage (this engine reads local paths), a table whose
protocol needs reader features (deletion vectors, column mapping), or a partition value that is
not a plain path segment. The Spark job also stays the path that scales past one machine
(README, "Scaling out").
"""
from __future__ import annotations

import copy
import json
import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from ccselect.contract import FEATURES, PREDICTION_COLS
# the Delta log reading that jobs/autoplex_arrow.py shares (Unsupported: callers catch it from here)
from ccselect.delta_arrow import Unsupported, actions as _actions, check_protocol as _check_protocol, live_files
from ccselect.delta_arrow import local_path as _local
from ccselect.hours import Window
from ccselect.settings import InferSettings
from ccselect.features import node_stats
from ccselect.models import infer_core
# the rule's functions under the names the tests compare with the Spark job's `decide`
from ccselect.models.infer_core import decide_arrays  # noqa: F401
# Imported inside the functions that use them (heavy, not needed to import this module): deltalake, torch.

PARTITION_COLS = ("node_id", "hour")
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")
#: the Delta (Spark) types of gold.predictions' data columns, as the Spark job writes them
_TYPES = {"family": "int32", "requests": "int64", "p_wifi": "float64", "p_cell": "float64"}
#: string columns that repeat (addresses, prefixes, groups, labels, constants): read from silver and
#: written as Arrow dictionaries, so neither side materializes or re-hashes the strings
#: (dictionary-encoded in the Parquet file, plain strings to every reader: no Arrow schema is stored)
_DICTIONARY = [c for c in PREDICTION_COLS
               if c not in ("conn_id", "family", "requests", "p_wifi", "p_cell", *PARTITION_COLS)]


# ---- the decision's inputs, on record batches -------------------------------------------------

def thin_rows(rb, p: InferSettings) -> np.ndarray:
    """`models.infer.decide`'s minimum-evidence rule on a record batch: a known value below its
    minimum (`infer_core.evidence_minima`); a null is not judged."""
    thin = np.zeros(rb.num_rows, bool)
    names = rb.schema.names
    for c, lo in infer_core.evidence_minima(p).items():
        if c in names:
            thin |= _np_bool(pc.fill_null(pc.less(rb.column(c), lo), False))
    return thin


def over_imputed(rb, p: InferSettings) -> np.ndarray:
    """`models.infer.decide`'s imputation rule on a record batch: more than `ood_max_imputed`
    features in `imputed` (out of domain)."""
    if "imputed" not in rb.schema.names or p.ood_max_imputed < 0:
        return np.zeros(rb.num_rows, bool)
    n = pc.fill_null(pc.list_value_length(rb.column("imputed")), 0)
    return _np_bool(pc.greater(n, int(p.ood_max_imputed)))


def _np_bool(a) -> np.ndarray:
    return a.to_numpy(zero_copy_only=False).astype(bool)


# ---- the lake ------------------------------------------------------------------------------------

_STATISTICS = list(_TYPES)
#: gold.predictions' data columns as the Spark job writes them (its Delta schema)
_SCHEMA = pa.schema([pa.field(c, getattr(pa, _TYPES.get(c, "string"))()) for c in PREDICTION_COLS
                     if c not in PARTITION_COLS])
#: the same columns as this engine hands them to the Parquet writer
_FILE_SCHEMA = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in _DICTIONARY else f
                          for f in _SCHEMA])


def _ensure_table(path: str):
    """gold.predictions as a DeltaTable, created empty (partitioned by node_id, hour, the schema
    the Spark job writes) when missing; a table with another schema is refused."""
    from deltalake import DeltaTable
    schema = pa.schema(list(_SCHEMA) + [pa.field(c, pa.string()) for c in PARTITION_COLS])
    if not DeltaTable.is_deltatable(path):
        return DeltaTable.create(path, schema, mode="ignore", partition_by=list(PARTITION_COLS))
    dt = DeltaTable(path)
    _check_protocol(dt)
    have = [(f.name) for f in pa.schema(dt.schema())]
    if have != list(PREDICTION_COLS) or list(dt.metadata().partition_columns) != list(PARTITION_COLS):
        raise Unsupported(f"{path} has columns {have} partitioned by {dt.metadata().partition_columns}, "
                          f"not gold.predictions' {list(PREDICTION_COLS)} by {list(PARTITION_COLS)}")
    return dt


# ---- scoring one file ----------------------------------------------------------------------------

@contextmanager
def _torch_threads(n: int):
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Scorer:
    def __init__(self, champion, p: InferSettings, precision: str):
        import torch
        self.p, self.precision = p, precision
        model = champion.model.eval()
        # Module.to casts in place: the champion's own model stays fp32
        self.model = copy.deepcopy(model).to(torch.bfloat16) if precision == "bf16" else model
        self.mean, self.std = infer_core.fleet_scaling(champion.stats)
        self.temperature = infer_core.temperature(champion, p)
        self.guard = infer_core.guard(champion, p)
        self.stats = champion.stats
        #: (node, hour) → NodeScaling for a per-node standardized champion (`run` sets it), else None
        self.node_table = None
        self.labels = {"pred_net_type": list(infer_core.NET_TYPES), "decision": list(infer_core.DECISIONS),
                       "cc": list(infer_core.cc_labels(p))}
        self.constants = {"default_cc": p.default_cc, "model_name": champion.name,
                          "model_version": str(champion.version)}
        self.passthrough = [c for c in infer_core.PASS_THROUGH if c not in PARTITION_COLS]

    def batch(self, rb, key: tuple[str, str] | None = None):
        """One Arrow record batch of silver (of partition `key`, (node, hour)) → the batch of
        gold.predictions' data columns, and its decision and CC codes."""
        cols = [rb.column(f).to_numpy(zero_copy_only=False) for f in FEATURES]
        if self.node_table is not None:   # the same function as the Spark job's per-node path
            z = node_stats.standardize(cols, self.node_table[key], self.stats)
        else:
            z = infer_core.standardize(cols, self.mean, self.std)
        p_wifi, ood = infer_core.probabilities(self.model, z, self.precision, self.temperature, self.guard,
                                               self.p.ood_quantile)
        d = infer_core.decide_arrays(p_wifi, ood | over_imputed(rb, self.p), self.p, thin_rows(rb, self.p))
        n = len(p_wifi)
        cols = {c: rb.column(c) for c in self.passthrough}
        cols["p_wifi"], cols["p_cell"] = pa.array(p_wifi, pa.float64()), pa.array(d["p_cell"], pa.float64())
        for c, labels in self.labels.items():
            cols[c] = pa.DictionaryArray.from_arrays(pa.array(d[c].astype(np.int32)), pa.array(labels, pa.string()))
        zeros = np.zeros(n, dtype=np.int32)
        for c, v in self.constants.items():
            cols[c] = pa.DictionaryArray.from_arrays(pa.array(zeros), pa.array([v], pa.string()))
        arrays = [cols[f.name] if cols[f.name].type == f.type else cols[f.name].cast(f.type) for f in _FILE_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=_FILE_SCHEMA), d

    def file(self, src: str, node: str, hour: str, table: str) -> dict[str, Any]:
        """Score one silver file into a new Parquet file of gold.predictions' partition (node,
        hour); returns its add action's fields and its decision counts."""
        rel = f"node_id={node}/hour={hour}/part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        dst = os.path.join(table, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        counts = np.zeros((4, 3), dtype=np.int64)  # decision code × cc code
        rows = 0
        reader = pq.ParquetFile(src, read_dictionary=[c for c in self.passthrough if c in _DICTIONARY])
        names = reader.schema_arrow.names
        columns = self.passthrough + list(FEATURES) + [c for c in (*infer_core.EVIDENCE_COLS, "imputed") if c in names]
        # dictionaries for the repeating columns only: trying one on the unique conn_id and the
        # probabilities costs time and saves nothing. Min/max statistics for the numeric columns
        # only: the strings' cost 40% of the write (measured, 212 → 125 ns a row) and no reader of
        # gold.predictions filters on them (it is read by partition)
        with pq.ParquetWriter(dst, _FILE_SCHEMA, compression="snappy", use_dictionary=_DICTIONARY,
                              write_statistics=_STATISTICS, store_schema=False) as w:
            for rb in reader.iter_batches(batch_size=int(self.p.batch_rows), columns=columns, use_threads=False):
                out, d = self.batch(rb, (node, hour))
                w.write_batch(out)
                counts += np.bincount(d["decision"] * 3 + d["cc"], minlength=12).reshape(4, 3)
                rows += out.num_rows
        st = os.stat(dst)
        return {"path": rel, "size": st.st_size, "node_id": node, "hour": hour, "rows": rows,
                "mtime_ms": int(st.st_mtime * 1000), "counts": counts}


# ---- the job -------------------------------------------------------------------------------------

def run(silver: str, predictions: str, window: Window, champion, p: InferSettings, precision: str,
        workers: int | None = None, node_scaling=None) -> dict[str, Any]:
    """Score silver's hours of the window into gold.predictions, replacing exactly the (node_id, hour)
    partitions that have silver rows, in one Delta commit. Raises Unsupported when it cannot.
    `node_scaling(keys)`: the (node, hour) → NodeScaling table of a per-node standardized
    champion (`models.infer.node_scaling`), returned as `node_table`."""
    from deltalake import CommitProperties
    from deltalake.transaction import AddAction, RemoveAction

    silver, predictions = _local(silver), _local(predictions)
    t0 = time.perf_counter()
    files = [f for f in live_files(silver, window) if f[3] != 0]
    for _, node, hour, _ in files:
        if not (_SEGMENT.match(node) and _SEGMENT.match(hour)):
            raise Unsupported(f"partition value {node!r}/{hour!r} is not a plain path segment")
    if not files:
        return {"rows": 0, "partitions": 0}
    dt = _ensure_table(predictions)
    scorer = _Scorer(champion, p, precision)
    if infer_core.per_node(champion):
        if node_scaling is None:
            raise ValueError(f"{champion.name} v{champion.version} is per-node standardized: give node_scaling")
        scorer.node_table = node_scaling({(node, hour) for _, node, hour, _ in files})
    workers = max(1, workers or os.cpu_count() or 1)
    # one thread per file, and one BLAS / OpenMP thread inside it: idle BLAS threads spin and took
    # half the CPU (measured: 3.3 s → 1.8 s for 3 M rows on 2 cores)
    with threadpool_limits(1), _torch_threads(1), ThreadPoolExecutor(workers) as pool:
        written = list(pool.map(lambda f: scorer.file(f[0], f[1], f[2], predictions), files))
    written = [w for w in written if w["rows"]]
    keys = {(w["node_id"], w["hour"]) for w in written}
    adds = [AddAction(w["path"], w["size"], {"node_id": w["node_id"], "hour": w["hour"]}, w["mtime_ms"], True,
                      json.dumps({"numRecords": w["rows"]})) for w in written]
    dt.update_incremental()
    now = int(time.time() * 1000)
    removes = [RemoveAction(rel, True, now, size, {"node_id": node, "hour": hour})
               for rel, size, _, node, hour in _actions(dt) if (node, hour) in keys]
    dt.create_write_transaction(adds + removes, mode="append", schema=dt.schema(), partition_by=list(PARTITION_COLS),
                                commit_properties=CommitProperties(custom_metadata={
                                    "ccs.job": "ccs infer", "ccs.engine": "arrow",
                                    "ccs.rows": str(sum(w["rows"] for w in written)),
                                    "ccs.model": f"{champion.name}/{champion.version}"}))
    seconds = time.perf_counter() - t0
    counts = sum(w["counts"] for w in written)
    decisions = {}
    for di, dname in enumerate(scorer.labels["decision"]):
        for ci, cname in enumerate(scorer.labels["cc"]):
            if counts[di, ci]:
                key = f"{dname}/{cname}"
                decisions[key] = decisions.get(key, 0) + int(counts[di, ci])
    rows = int(counts.sum())
    return {"rows": rows, "partitions": len(keys), "files": len(written), "removed_files": len(removes),
            "seconds": round(seconds, 3), "workers": workers, "decisions_written": dict(sorted(decisions.items())),
            "node_table": scorer.node_table}


def window_decisions(path: str, window: Window) -> dict[str, int]:
    """Rows per "decision/cc" of gold.predictions' hours of the window (what the Spark job reports)."""
    counts: dict[str, int] = {}
    for f, _, _, _ in live_files(path, window):
        t = pq.read_table(f, columns=["decision", "cc"]).cast(pa.schema([("decision", pa.string()), ("cc", pa.string())]))
        for row in t.group_by(["decision", "cc"]).aggregate([([], "count_all")]).to_pylist():
            key = f"{row['decision']}/{row['cc']}"
            counts[key] = counts.get(key, 0) + row["count_all"]
    return dict(sorted(counts.items()))
