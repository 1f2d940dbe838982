"""The data path's metrics (issue 59): `ccs stream --metrics-file FILE` keeps FILE, in Prometheus's
text format, for node_exporter's textfile collector on the host the stream runs on (the same
pattern as the edge agent's, export/edge/metrics.c; docs/operations-metrics.md).

`StreamMetrics` stands between the stream and its log: every micro-batch's summary line
(`stream: {...}`, flows/stream.py) passes through unchanged and updates the counters; a thread
rewrites the file every `every_s` seconds, with a heartbeat (a killed stream's file stops moving:
CcsStreamDown) and the newest segment waiting in the input folder (the lag behind it:
CcsStreamLag). The file is written whole or not at all (a temporary file beside it, then rename).

Series (ccs_stream_ prefix, counters _total, seconds):
  heartbeat_timestamp_seconds, started_timestamp_seconds, batches_total, segments_total, lines_read_total,
  rows_accepted_total, rows_quarantined_total,
  rows_quarantined_by_reason_total{stream,reason} (reason: the code of jobs/README.md's quarantine
  reasons, the part before any `:<field>`, so the label takes the contract's codes only; they sum
  to rows_quarantined_total), batch_duration_seconds (last batch),
  batch_stage_duration_seconds{stage} (last batch), last_batch_timestamp_seconds,
  processed_segment_timestamp_seconds (mtime of the newest segment a batch took in),
  newest_segment_timestamp_seconds (mtime of the newest segment in the input folder),
  tables_emitted_total, table_rollouts_total{outcome}, table_version, table_ood_share,
  table_fallback_share, table_coverage (the newest table the stream emitted, from its manifest).
The quarantine share and the input rate are rates of the counters (the rules compute them).
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable

from ccselect.contract import STREAMS

PREFIX = "stream: "


def reason_code(reason: str) -> str:
    """A quarantine reason's code, a bounded label value: `missing_key:a,b` → `missing_key`,
    `out_of_range:status` → `out_of_range` (the fields stay in bronze.quarantine)."""
    return reason.split(":", 1)[0]


def add_by_reason(into: dict, by_stream: dict) -> None:
    """Adds {stream: {reason: n}} (an ingest's summary) to `into`, {(stream, code): n}."""
    for stream, reasons in (by_stream or {}).items():
        for reason, n in reasons.items():
            key = (stream, reason_code(reason))
            into[key] = into.get(key, 0) + int(n)


def by_reason_samples(counts: dict) -> list[tuple[str, int]]:
    """(labels, value) of {(stream, code): n}, in a stable order."""
    return [(f'{{stream="{st}",reason="{code}"}}', n) for (st, code), n in sorted(counts.items())]



def write_textfile(path: str, text: str) -> str:
    """`text` to `path` whole or not at all, as node_exporter's textfile collector must see it:
    written to a hidden temporary file of the same folder (not `*.prom`, so never collected
    half-written), then renamed over `path`."""
    d, name = os.path.split(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


class StreamMetrics:
    """A `log` for flows/stream.run that also keeps the metrics file (see the module's docstring)."""

    def __init__(self, path: str, input_dir: str, export_dir: str, log: Callable[[str], None],
                 every_s: float = 5.0):
        self.path, self.input_dir, self.export_dir, self.log = path, input_dir, export_dir, log
        self.every_s = every_s
        self.lock = threading.Lock()
        self.counters = {"batches": 0, "segments": 0, "lines_read": 0, "rows_accepted": 0,
                         "rows_quarantined": 0, "tables_emitted": 0}
        self.rollouts: dict[str, int] = {"ok": 0, "refused": 0, "failed": 0}
        self.by_reason: dict[tuple[str, str], int] = {}
        self.last: dict = {}
        self.table: dict = {}
        self.processed_ts: float | None = None
        # before its first batch a stream has processed nothing: the lag counts from its start
        self.started_ts = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the log ------------------------------------------------------------------------------

    def __call__(self, msg: str) -> None:
        self.log(msg)
        if not msg.startswith(PREFIX):
            return
        try:
            info = json.loads(msg[len(PREFIX):])
        except ValueError:
            return          # the stream's other lines ("stream: batch 3: not read: ...")
        if isinstance(info, dict) and "batch" in info:
            self.batch(info)

    def batch(self, info: dict) -> None:
        """One micro-batch's summary, as flows/stream.py logs it."""
        with self.lock:
            c = self.counters
            c["batches"] += 1
            c["segments"] += int(info.get("files") or 0)
            for k, name in (("lines_read", "lines_read"), ("accepted", "rows_accepted"),
                            ("quarantined", "rows_quarantined")):
                c[name] += int(info.get(k) or 0)
            add_by_reason(self.by_reason, info.get("quarantined_by_reason"))
            self.last = {"seconds": info.get("seconds"), "ended_unix": info.get("ended_unix"),
                         "stages_s": dict(info.get("stages_s") or {})}
            lag = info.get("lag_s") or {}
            if lag.get("newest") is not None and info.get("ended_unix") is not None:
                self.processed_ts = float(info["ended_unix"]) - float(lag["newest"])
            t = info.get("table") or {}
            if t.get("built"):
                c["tables_emitted"] += 1
                r = t.get("rollout")
                outcome = ("refused" if isinstance(r, dict) and "refused" in r else
                           "failed" if isinstance(r, dict) and "failed" in r else "ok")
                self.rollouts[outcome] += 1
                self.table = self._manifest(int(t["version"]))
        self.write()

    def _manifest(self, version: int) -> dict:
        path = os.path.join(self.export_dir, f"table-{version}.manifest.json")
        try:
            with open(path) as f:
                m = json.load(f)
        except (OSError, ValueError) as exc:
            self.log(f"stream metrics: manifest of table {version}: {exc}")
            return {"version": version}
        return {k: m.get(k) for k in ("version", "ood_share", "fallback_share", "coverage")}

    # ---- the file -----------------------------------------------------------------------------

    def newest_segment(self) -> float | None:
        """The mtime of the newest closed segment under the input folder (hidden .part files are
        not closed yet)."""
        newest = None
        for stream in STREAMS:
            top = os.path.join(self.input_dir, stream)
            try:
                nodes = os.listdir(top)
            except OSError:
                continue
            for node in nodes:
                try:
                    with os.scandir(os.path.join(top, node)) as it:
                        for e in it:
                            if not e.name.startswith(".") and e.name.endswith(".jsonl"):
                                m = e.stat().st_mtime
                                newest = m if newest is None or m > newest else newest
                except OSError:
                    continue
        return newest

    def exposition(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        newest = self.newest_segment()
        out = []

        def metric(name, kind, help_, samples):
            out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {value!r}" if isinstance(value, float) else f"{name}{labels} {value}"
                       for labels, value in samples)

        with self.lock:
            c, last, table = dict(self.counters), dict(self.last), dict(self.table)
            rollouts, processed, by_reason = dict(self.rollouts), self.processed_ts, dict(self.by_reason)
        metric("ccs_stream_heartbeat_timestamp_seconds", "gauge",
               "When the stream's metrics were last written (Unix time).", [("", round(now, 3))])
        metric("ccs_stream_started_timestamp_seconds", "gauge",
               "When this stream process started (Unix time).", [("", round(self.started_ts, 3))])
        for name, help_ in (("batches", "Micro-batches processed."),
                            ("segments", "Log segments taken in by micro-batches."),
                            ("lines_read", "Lines read from new segments."),
                            ("rows_accepted", "Lines accepted into bronze."),
                            ("rows_quarantined", "Lines quarantined (bronze.quarantine names each reason)."),
                            ("tables_emitted", "Signed tables the stream emitted.")):
            metric(f"ccs_stream_{name}_total", "counter", help_, [("", c[name])])
        if by_reason:
            metric("ccs_stream_rows_quarantined_by_reason_total", "counter",
                   "Lines quarantined, by stream and reason code (jobs/README.md); they sum to rows_quarantined_total.",
                   by_reason_samples(by_reason))
        metric("ccs_stream_table_rollouts_total", "counter",
               "Rollouts of the stream's tables, by outcome (ok, refused by a guard, failed and rolled back).",
               [(f'{{outcome="{k}"}}', v) for k, v in rollouts.items()])
        if last.get("seconds") is not None:
            metric("ccs_stream_batch_duration_seconds", "gauge", "The last micro-batch's duration.",
                   [("", float(last["seconds"]))])
            metric("ccs_stream_batch_stage_duration_seconds", "gauge",
                   "The last micro-batch's stages (bronze, silver, predictions, table).",
                   [(f'{{stage="{k}"}}', float(v)) for k, v in sorted(last["stages_s"].items())])
        if last.get("ended_unix") is not None:
            metric("ccs_stream_last_batch_timestamp_seconds", "gauge", "When the last micro-batch ended.",
                   [("", float(last["ended_unix"]))])
        if processed is not None:
            metric("ccs_stream_processed_segment_timestamp_seconds", "gauge",
                   "Modification time of the newest segment a micro-batch took in.", [("", round(processed, 3))])
        if newest is not None:
            metric("ccs_stream_newest_segment_timestamp_seconds", "gauge",
                   "Modification time of the newest closed segment in the input folder.", [("", round(newest, 3))])
        if table:
            metric("ccs_stream_table_version", "gauge", "The newest table the stream emitted.",
                   [("", int(table["version"]))])
            for k, help_ in (("ood_share", "Its request-weighted share of out-of-domain decisions (manifest ood_share)."),
                             ("fallback_share", "Its request-weighted share of low-confidence fallbacks (manifest fallback_share)."),
                             ("coverage", "Its coverage (manifest coverage).")):
                if table.get(k) is not None:
                    metric(f"ccs_stream_table_{k}", "gauge", help_, [("", float(table[k]))])
        return "\n".join(out) + "\n"

    def write(self) -> None:
        write_textfile(self.path, self.exposition())

    # ---- the heartbeat ------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.write()
            except OSError as exc:     # a full or missing folder: said, and tried again
                self.log(f"stream metrics: {self.path}: {exc}")

    def __enter__(self) -> "StreamMetrics":
        self.write()
        self._thread = threading.Thread(target=self._beat, name="ccs-stream-metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
