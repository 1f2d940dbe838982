"""AutoPlex's driver-side engine (issue 31): silver.connections → gold.autoplex_params and
gold.autoplex_similarity without Spark, over Arrow straight from the Delta files, in the job's
own process. The same computation as `jobs/autoplex.py` (Algorithm 1 lines 5-8 and §3.4 of
autoplex-nai22.txt), the same tables, partitions and results: the policies, the band rule, the
parameters' arithmetic, the periods and the summary are jobs/autoplex_core.py's, which both engines
call; this module ranks, counts and sums in NumPy.

Why: at one day of a 20-node fleet (720 k connections) the two Spark jobs take about 15 s on
2 cores against DuckDB's 2.5 s for the same statements. The profile (stop 45's note) puts most of
it in Spark's fixed costs, not in the work: a read of silver's 480 small files into the cache
(2.7-5.5 s), query planning and code generation for every new plan, a dozen small jobs per Delta
read and commit. Spark running DuckDB's own statements over the same rows takes 9x DuckDB's time.
The work itself (two sorts of 720 k rows and some sums) takes NumPy well under a second.

- **Read.** The table's Delta log (delta-rs) names the live files of the window's hours
  (`ccselect.delta_arrow.live_files`); pyarrow reads the columns the bands need, a thread per core.
- **Bands.** One stable sort per (metric, direction) by (group, period, metric with nulls last,
  conn_id), as the Spark job orders its window; position k and the group's count n of sessions
  with the metric give the band (`autoplex_core.in_band`, the same double arithmetic).
- **Means.** Sums of the band's non-null values over their count, as Spark's `avg`. NumPy adds a
  band's values pairwise where Spark adds them in sort order, so a mean may differ from the Spark
  job's in its last bits (the tests compare to 1e-12).
- **Write.** One Delta commit per table (delta-rs `write_deltalake`, overwrite with a predicate on
  the replaced partitions, as the Spark job's `replaceWhere`): a re-run replaces exactly the same
  periods or window; a process killed before the commit leaves the table as it was.

Where it cannot run it raises `Unsupported` (an object-store lake, a table that needs reader
features, a NaN metric, which Spark's ordering sorts differently) and `jobs.autoplex` runs the
Spark job, saying why in its result. The Spark job stays the path that scales past one machine.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ccselect.config import Config
from ccselect.delta_arrow import Unsupported, check_protocol, live_files, local_path
from ccselect.hours import Window
from ccselect.lake import AUTOPLEX_PARAMS, AUTOPLEX_SIMILARITY, CONNECTIONS, table_path
from ccselect.jobs import autoplex_core as core
# Imported inside the functions that use them (heavy, not needed to import this module): deltalake.

#: silver's partition columns: a group_by that names one gets it from the file's partition values
PARTITION_COLS = ("node_id", "hour")


def _param_cols() -> list[tuple[str, pa.DataType]]:
    """gold.autoplex_params' data columns after the group columns, with their Delta types, as the
    Spark job writes them (the partition column `period` last)."""
    return [("period_start_ms", pa.int64()), ("n_sessions", pa.int64()), ("n_band", pa.int64()),
            *[(f"mean_{c}", pa.float64()) for c in core.VALUES], ("mean_metric", pa.float64()),
            ("policy", pa.string()), ("metric", pa.string()), ("band_lo", pa.float64()), ("band_hi", pa.float64()),
            ("pacing_rate_last_bps", pa.float64()), ("max_cwnd_last_segs", pa.float64()),
            ("applies_from_ms", pa.int64()), ("period", pa.string())]

_SIMILARITY_COLS = [("period_start_ms", pa.int64()), ("band", pa.string()), ("value", pa.string()),
                    ("change_rate", pa.float64()), ("window", pa.string())]


# ---- read ---------------------------------------------------------------------------------------

def read_window(silver: str, window: Window, columns: list[str], workers: int | None = None) -> pa.Table:
    """`columns` of silver.connections' rows closed in the window, from the live files of the
    hours they can lie in (a partition column among `columns` comes from the file's path)."""
    silver = local_path(silver)
    files = [f for f in live_files(silver, window) if f[3] != 0]
    data_cols = [c for c in columns if c not in PARTITION_COLS]

    def one(f):
        path, node, hour, _ = f
        t = pq.read_table(path, columns=data_cols, use_threads=False)
        for c, v in (("node_id", node), ("hour", hour)):
            if c in columns:
                t = t.append_column(c, pa.array([v] * t.num_rows, pa.string()))
        return t.select(columns)
    with ThreadPoolExecutor(max(1, workers or os.cpu_count() or 1)) as pool:
        parts = list(pool.map(one, files))
    if not parts:
        return pa.table({c: pa.array([], pa.string() if c in PARTITION_COLS else pa.null()) for c in columns})
    t = pa.concat_tables(parts, promote_options="permissive")
    ts = t.column("ts_end_ms")
    return t.filter(pc.and_(pc.greater_equal(ts, window.start_ms), pc.less(ts, window.end_ms)))


# ---- the bands (Algorithm 1 lines 5-6) --------------------------------------------------------------

def _floats(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 with nulls 0, valid mask) of a table's column."""
    arr = pc.cast(col, pa.float64()).combine_chunks()
    valid = np.ones(len(arr), bool) if arr.null_count == 0 else np.asarray(arr.is_valid())
    return np.asarray(arr.fill_null(0.0)), valid


def metric_values(t: pa.Table, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of `metric` per row, the arithmetic of the Spark job's `jobs.autoplex.METRICS`."""
    if metric == "retrans_ratio":
        m, ok = _floats(t.column("retrans_ratio"))
    elif metric == "goodput_per_srtt":
        g, ok = _floats(t.column(core.GOODPUT))
        lo, hi = (pc.cast(t.column(c), pa.int64()).combine_chunks() for c in ("min_srtt_us", "max_srtt_us"))
        ok = ok & np.asarray(lo.is_valid()) & np.asarray(hi.is_valid())
        lo, hi = np.asarray(lo.fill_null(0)), np.asarray(hi.fill_null(0))
        denom = ((lo + hi) / 2) / 1e6
        # silver keeps both srtt > 0 (its CHECK constraint); a zero sum would stop the Spark job
        # (ANSI division by zero), here it is a session without the metric
        ok &= denom != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(ok, (g / 1e6) / np.where(denom != 0, denom, 1.0), 0.0)
    else:
        raise Unsupported(f"metric {metric!r} has no Arrow form")
    if np.isnan(m[ok]).any():
        raise Unsupported(f"{metric} has NaN values, which Spark orders above every number: run the Spark job")
    return m, ok


class Groups:
    """The rows' group keys (`group_cols`) as one integer code per row, and back."""

    def __init__(self, t: pa.Table, group_cols: list[str]):
        self.cols, self.dicts, code = group_cols, [], np.zeros(t.num_rows, np.int64)
        for c in group_cols:
            enc = pc.dictionary_encode(t.column(c).combine_chunks(), null_encoding="encode")
            size = max(1, len(enc.dictionary))
            code = code * size + np.asarray(enc.indices.fill_null(0)).astype(np.int64)
            self.dicts.append((enc.dictionary, size))
        self.code = code

    def columns(self, codes: np.ndarray) -> dict[str, pa.Array]:
        out, rest = {}, codes.copy()
        for c, (d, size) in reversed(list(zip(self.cols, self.dicts))):
            out[c] = d.take(pa.array(rest % size)) if len(d) else pa.nulls(len(codes), d.type)
            rest //= size
        return {c: out[c] for c in self.cols}


def band_means(t: pa.Table, groups: Groups, period: np.ndarray, conn_rank: np.ndarray,
               bands: list[tuple[str, Any]]) -> list[dict[str, np.ndarray]]:
    """`jobs.autoplex.band_means` on arrays: per band (label, policy), one dict of arrays with a row
    per (group, period) that has sessions in the band and at least the policy's min_sessions:
    `code` (Groups), `period_start_ms`, `n_sessions`, `n_band`, `mean_<value>` (NaN: no value),
    `mean_metric`. The bands of one metric and direction share one sort."""
    values = {c: _floats(t.column(src)) for c, src in core.VALUES.items()}
    out = []
    for ordering in core.orderings(bands):
        metric, ascending = ordering[0][1].metric, ordering[0][1].ascending
        m, ok = metric_values(t, metric)
        # keys last to first: group, period, metric (nulls last, either direction), conn_id
        order = np.lexsort((conn_rank, m if ascending else -m, ~ok, period, groups.code))
        code, per, ok_s = groups.code[order], period[order], ok[order]
        n_rows = len(order)
        if not n_rows:
            out += [{"label": label, "policy": p, "rows": 0} for label, p in ordering]
            continue
        new = np.ones(n_rows, bool)
        new[1:] = (code[1:] != code[:-1]) | (per[1:] != per[:-1])
        starts = np.flatnonzero(new)
        seg = np.cumsum(new) - 1
        k = np.arange(n_rows) - starts[seg]
        n_seg = np.add.reduceat(ok_s.astype(np.int64), starts)
        n = n_seg[seg]
        for label, p in ordering:
            member = ok_s & core.in_band(k, n, p)
            rows = np.flatnonzero(member)
            if not len(rows):
                out.append({"label": label, "policy": p, "rows": 0})
                continue
            bseg = seg[rows]
            bnew = np.ones(len(rows), bool)
            bnew[1:] = bseg[1:] != bseg[:-1]
            bstarts = np.flatnonzero(bnew)
            segs = bseg[bstarts]
            res = {"label": label, "policy": p, "code": code[starts[segs]], "period_start_ms": per[starts[segs]],
                   "n_sessions": n_seg[segs], "n_band": np.diff(np.append(bstarts, len(rows)))}
            src = order[rows]
            for c, (v, v_ok) in values.items():
                cnt = np.add.reduceat(v_ok[src].astype(np.int64), bstarts)
                tot = np.add.reduceat(np.where(v_ok[src], v[src], 0.0), bstarts)
                with np.errstate(divide="ignore", invalid="ignore"):
                    res[f"mean_{c}"] = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
            res["mean_metric"] = np.add.reduceat(m[src], bstarts) / res["n_band"]
            keep = res["n_sessions"] >= p.min_sessions
            res = {k2: (v2[keep] if isinstance(v2, np.ndarray) else v2) for k2, v2 in res.items()}
            res["rows"] = int(keep.sum())
            out.append(res)
    return out


def _nullable(a: np.ndarray) -> pa.Array:
    """float64 with NaN (no value) as null, as Spark's avg of no values."""
    return pa.array(a, pa.float64(), mask=np.isnan(a))


def _inputs(t: pa.Table, group_cols: list[str], period_minutes: int) -> tuple[Groups, np.ndarray, np.ndarray]:
    per_ms = period_minutes * 60_000
    ts = np.asarray(pc.cast(t.column("ts_end_ms"), pa.int64()).combine_chunks())
    period = (ts // per_ms) * per_ms          # floor(ts / T)·T; ts_end_ms is never null in silver
    rank = np.asarray(pc.rank(t.column("conn_id").combine_chunks(), sort_keys="ascending", tiebreaker="dense")).astype(np.int64)
    return Groups(t, group_cols), period, rank


def parameters(t: pa.Table, policies, group_cols: list[str], period_minutes: int) -> pa.Table:
    """gold.autoplex_params' rows (with `period`) for every policy: `jobs.autoplex.parameters_all`."""
    if not t.num_rows:
        return _typed([], t, group_cols, _param_cols())
    groups, period, rank = _inputs(t, group_cols, period_minutes)
    parts = []
    for b in band_means(t, groups, period, rank, [(str(i), p) for i, p in enumerate(policies)]):
        p, n = b["policy"], b["rows"]
        if not n:
            continue
        inflight, cwnd = b["mean_max_inflight_segs"], b["mean_max_cwnd_segs"]
        cols = {**groups.columns(b["code"]), "period_start_ms": pa.array(b["period_start_ms"], pa.int64()),
                "n_sessions": pa.array(b["n_sessions"], pa.int64()), "n_band": pa.array(b["n_band"], pa.int64()),
                **{f"mean_{c}": _nullable(b[f"mean_{c}"]) for c in core.VALUES},
                "mean_metric": _nullable(b["mean_metric"]),
                "policy": pa.array([p.name] * n, pa.string()), "metric": pa.array([p.metric] * n, pa.string()),
                "band_lo": pa.array(np.full(n, float(p.band_lo))), "band_hi": pa.array(np.full(n, float(p.band_hi))),
                "pacing_rate_last_bps": _nullable(b["mean_goodput_bps"]),
                "max_cwnd_last_segs": _nullable(core.max_cwnd_last(inflight, cwnd)),
                "applies_from_ms": pa.array(b["period_start_ms"] + period_minutes * 60_000, pa.int64()),
                "period": _labels(b["period_start_ms"])}
        parts.append(pa.table(cols))
    return _typed(parts, t, group_cols, _param_cols())


def change_rates(t: pa.Table, group_cols: list[str], better, worse, period_minutes: int) -> pa.Table:
    """`jobs.autoplex.change_rates`: per group, adjacent periods and band, |m_T − m_{T−1}| / m_{T−1}
    of each band mean; rows (group cols, period_start_ms, band, value, change_rate)."""
    if not t.num_rows:
        return _typed([], t, group_cols, _SIMILARITY_COLS[:-1])
    groups, period, rank = _inputs(t, group_cols, period_minutes)
    per_ms = period_minutes * 60_000
    parts = []
    for b in band_means(t, groups, period, rank, [("better", better), ("worse", worse)]):
        if not b["rows"]:
            continue
        code, start = b["code"], b["period_start_ms"]      # sorted by (group, period): the window's order
        has_prev = np.zeros(len(code), bool)
        has_prev[1:] = (code[1:] == code[:-1]) & (start[1:] - start[:-1] == per_ms)
        for c in core.VALUES:
            v = b[f"mean_{c}"]
            prev = np.full(len(v), np.nan)
            prev[1:] = v[:-1]
            keep = has_prev & (prev > 0) & ~np.isnan(v)       # NaN > 0 is false: no previous value
            idx = np.flatnonzero(keep)
            if not len(idx):
                continue
            parts.append(pa.table({**groups.columns(code[idx]), "period_start_ms": pa.array(start[idx], pa.int64()),
                                   "band": pa.array([b["label"]] * len(idx), pa.string()),
                                   "value": pa.array([c] * len(idx), pa.string()),
                                   "change_rate": pa.array(np.abs(v[idx] - prev[idx]) / prev[idx])}))
    return _typed(parts, t, group_cols, _SIMILARITY_COLS[:-1])


def similarity_summary(rates: pa.Table) -> list[dict[str, Any]]:
    """Mean change rate per value and band, better/worse (`autoplex_core.similarity_summary`)."""
    if not rates.num_rows:
        return []
    g = rates.group_by(["value", "band"]).aggregate([("change_rate", "mean")]).to_pylist()
    return core.similarity_summary([(r["value"], r["band"], r["change_rate_mean"]) for r in g])


def _labels(ms: np.ndarray) -> pa.Array:
    uniq, inv = np.unique(ms, return_inverse=True)
    return pa.array([core.period_label(int(u)) for u in uniq], pa.string()).take(pa.array(inv))


def _typed(parts: list[pa.Table], t: pa.Table, group_cols: list[str], cols) -> pa.Table:
    schema = pa.schema([pa.field(c, t.schema.field(c).type if t.schema.field(c).type != pa.null() else pa.string())
                        for c in group_cols] + [pa.field(c, ty) for c, ty in cols])
    if not parts:
        return schema.empty_table()
    return pa.concat_tables([p.cast(pa.schema([schema.field(c) for c in p.column_names])).select(schema.names)
                             for p in parts])


# ---- write --------------------------------------------------------------------------------------

def _quote(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def replace_partitions(path: str, data: pa.Table, column: str, values: list[str], job: str) -> None:
    """Replace the `column` partitions `values` of the Delta table at `path` with `data` (whose rows
    all lie in them) in one commit; the table is created, partitioned by `column`, when missing.
    An existing table with other columns is refused (Unsupported: the Spark job then writes it)."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    path = local_path(path)
    props = CommitProperties(custom_metadata={"ccs.job": job, "ccs.engine": "arrow", "ccs.rows": str(data.num_rows)})
    if not DeltaTable.is_deltatable(path):
        write_deltalake(path, data, partition_by=[column], mode="append", commit_properties=props)
        return
    dt = DeltaTable(path)
    check_protocol(dt)
    have = pa.schema(dt.schema())
    if have.names != data.schema.names or list(dt.metadata().partition_columns) != [column]:
        raise Unsupported(f"{path} has columns {have.names} partitioned by {dt.metadata().partition_columns}, "
                          f"not {data.schema.names} by [{column}]")
    data = data.cast(pa.schema([pa.field(f.name, have.field(f.name).type) for f in data.schema]))
    write_deltalake(dt, data, partition_by=[column], mode="overwrite",
                    predicate=f"{column} IN ({', '.join(_quote(v) for v in sorted(values))})", commit_properties=props)


# ---- the jobs -------------------------------------------------------------------------------------

def run_parameters(cfg: Config, window: Window) -> dict[str, Any]:
    """`jobs.autoplex.run_parameters` in this process (the same result dict, with `engine`)."""
    s = cfg.settings.autoplex
    policies, group_cols, period = core.load_policies(s), list(s.group_by), s.period_minutes
    labels = core.period_labels(window, period)
    t0 = time.perf_counter()
    cols = core.input_columns(group_cols, {p.metric for p in policies})
    params = parameters(read_window(table_path(cfg, CONNECTIONS), window, cols),
                        policies, group_cols, period)
    replace_partitions(table_path(cfg, AUTOPLEX_PARAMS), params, "period", labels, "ccs autoplex")
    counts = {r["policy"]: r["count"] for r in params.group_by("policy").aggregate([("policy", "count")])
              .rename_columns(["policy", "count"]).to_pylist()} if params.num_rows else {}
    return {"periods": labels, "group_by": group_cols, "rows_per_policy": counts, "engine": "arrow",
            "seconds": round(time.perf_counter() - t0, 3)}


def run_similarity(cfg: Config, window: Window, plot_dir: str | None = None) -> dict[str, Any]:
    """`jobs.autoplex.run_similarity` in this process (the same result dict, with `engine`)."""
    s = cfg.settings.autoplex
    group_cols, period = list(s.group_by), s.period_minutes
    better, worse = core.similarity_bands(s)
    key = core.similarity_window(window, period)
    t0 = time.perf_counter()
    silver = read_window(table_path(cfg, CONNECTIONS), window,
                         core.input_columns(group_cols, {better.metric}))
    rates = change_rates(silver, group_cols, better, worse, period)
    replace_partitions(table_path(cfg, AUTOPLEX_SIMILARITY),
                       rates.append_column("window", pa.array([key] * rates.num_rows, pa.string())),
                       "window", [key], "ccs autoplex-similarity")
    summary = similarity_summary(rates)
    out = {"window": key, "rows": rates.num_rows, "summary": summary, "engine": "arrow",
           "seconds": round(time.perf_counter() - t0, 3)}
    if plot_dir and summary:
        out["plot"] = core.plot_similarity(summary, os.path.join(plot_dir, "autoplex_similarity.png"))
    return out
