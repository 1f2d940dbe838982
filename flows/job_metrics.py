"""Each batch job's rows and duration (issue 59), as the stream keeps its own (flows/stream_metrics.py):
a file in Prometheus's text format for node_exporter's textfile collector, here one per job,
`<pipeline.metrics_dir>/ccs-job-<job>.prom`, rewritten whole (a temporary file, then rename) when
a step of flows/pipeline.py ends. docs/operations-metrics.md lists the series.

Why a textfile and not the Pushgateway: the stream already writes one for the same node_exporter
(job ccs-platform in the topology), so the data path has one way in, with no second server to run
and no push that fails when it is down; and a job's last values are what the Pushgateway would
keep too (the pattern's point: a job that has ended still shows its last run). The values are of
the job's last run, so they are gauges: its rows by kind, its duration, its outcome, when it ended
and when it last succeeded (kept from the file before when a run fails or is skipped).

Labels take bounded values: the job (the steps below), the row kind (fixed per job), and for
ingest the stream and the quarantine reason's code (flows.stream_metrics.reason_code). No hour, node
or window is a label: those are unbounded over time; the step's result (its log line) names them.

The rollout's freeze (export/delivery/freeze.py) is state of the artifact store, not a value of a
job's run, so it has a file of its own beside the jobs', `ccs-rollout-freeze.prom`, written by one
function (`write_freeze`) from the store's record: by the `rollout` step after every run (the
hourly DAG's and the stream's: an automatic rollback's freeze shows at the latest with the next
run), and at once by `ccs freeze`, `ccs unfreeze` and a `ccs rollout` whose gate froze the fleet.
A file of its own, and not lines of `ccs-job-rollout.prom`, so those commands need not write back
a run they did not make.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import time
from typing import Callable

from ccselect.flows.stream_metrics import add_by_reason, by_reason_samples, write_textfile
from ccselect.config import Config, load_config
from ccselect.export.delivery import freeze, inflight
from ccselect.export.delivery.store import Store, store_for

OUTCOMES = ("ok", "failed", "skipped")


def _streams_sum(res: dict, key: str) -> int:
    return sum(int(s.get(key) or 0) for s in (res.get("streams") or {}).values())


#: job → its rows by kind, from the step's result (flows/pipeline.py says what each returns)
ROWS: dict[str, Callable[[dict], dict[str, int]]] = {
    "ingest": lambda r: {"files": int(r.get("files") or 0), "lines_read": _streams_sum(r, "lines_read"),
                         "accepted": _streams_sum(r, "accepted"), "quarantined": _streams_sum(r, "quarantined"),
                         "silver": int(r.get("silver_rows") or 0)},
    "infer": lambda r: {"predictions": int(r.get("rows") or 0), "partitions": int(r.get("partitions") or 0)},
    "export": lambda r: {f"entries_{fam}": int(n) for fam, n in (r.get("entries") or {}).items()},
    "rollout": lambda r: {"nodes": len(r.get("nodes") or ())},
    "training_set": lambda r: {"training": int(r.get("training_rows") or 0), "stats": int(r.get("stats_rows") or 0)},
    "prefix_groups": lambda r: {"prefixes": int(r.get("rows") or 0)},
    "autoplex": lambda r: {"params": sum(int(n) for n in (r.get("rows_per_policy") or {}).values())},
}


def job_file(metrics_dir: str, job: str) -> str:
    return os.path.join(metrics_dir, f"ccs-job-{job}.prom")


def _last_success(path: str) -> float | None:
    """The last success the job's file before this run recorded (None: none, or no file)."""
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"ccs_job_last_success_timestamp_seconds\{[^}]*\} (\S+)$", line.strip())
                if m:
                    return float(m.group(1))
    except OSError:
        pass
    return None


def exposition(job: str, outcome: str, ended: float, seconds: float, rows: dict[str, int],
               quarantined: dict[tuple[str, str], int], last_success: float | None) -> str:
    out: list[str] = []
    lab = f'job="{job}"'

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, object]]) -> None:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {kind}")
        out.extend(f"{name}{{{lab}{',' + extra if extra else ''}}} {value!r}" for extra, value in samples)

    metric("ccs_job_last_run_timestamp_seconds", "gauge", "When the job's last run ended (Unix time).",
           [("", round(ended, 3))])
    metric("ccs_job_last_run_outcome", "gauge", "The last run's outcome (one series per outcome, 1 for it).",
           [(f'outcome="{o}"', int(o == outcome)) for o in OUTCOMES])
    metric("ccs_job_duration_seconds", "gauge", "How long the job's last run took.", [("", round(seconds, 3))])
    if last_success is not None:
        metric("ccs_job_last_success_timestamp_seconds", "gauge", "When a run of the job last succeeded (Unix time).",
               [("", round(last_success, 3))])
    if rows:
        metric("ccs_job_rows", "gauge", "Rows of the job's last successful run, by kind.",
               [(f'kind="{k}"', int(v)) for k, v in sorted(rows.items())])
    if quarantined:
        metric("ccs_job_rows_quarantined", "gauge",
               "Lines the last run quarantined, by stream and reason code (jobs/README.md).",
               [(labels.strip("{}"), n) for labels, n in by_reason_samples(quarantined)])
    return "\n".join(out) + "\n"


def write(metrics_dir: str, job: str, outcome: str, ended: float, seconds: float, result: dict | None) -> str:
    """The job's file for a run that ended with `outcome` (its rows from `result` when ok)."""
    path = job_file(metrics_dir, job)
    last = ended if outcome == "ok" else _last_success(path)
    rows, quarantined = {}, {}
    if outcome == "ok" and isinstance(result, dict):
        rows = ROWS[job](result) if job in ROWS else {}
        if job == "ingest":
            add_by_reason(quarantined, {st: s.get("by_reason") or {} for st, s in (result.get("streams") or {}).items()})
    return write_textfile(path, exposition(job, outcome, ended, seconds, rows, quarantined, last))


FREEZE_FILE = "ccs-rollout-freeze.prom"
#: who froze, as the label `by`: the gate's automatic rollback (who: "rollout") or anyone else
FROZEN_BY = ("operator", "rollout")


def freeze_exposition(rec: dict | None, flight: dict | None = None) -> str:
    """The freeze gauges of the store's record (None or an unfreeze record: not frozen), and the
    rollout in flight's (export/delivery/inflight.py; None: none in flight)."""
    frozen = bool(rec and rec.get("frozen"))
    by = ("rollout" if rec.get("who") == "rollout" else "operator") if frozen else None
    out = ["# HELP ccs_rollout_frozen Whether the artifact store is frozen (1 on the series of who froze it): "
           "no table is published or rolled out but the pinned one.",
           "# TYPE ccs_rollout_frozen gauge"]
    out += [f'ccs_rollout_frozen{{by="{b}"}} {int(b == by)}' for b in FROZEN_BY]
    if frozen:
        out += ["# HELP ccs_rollout_frozen_since_timestamp_seconds When the freeze holding now began (Unix time).",
                "# TYPE ccs_rollout_frozen_since_timestamp_seconds gauge",
                f"ccs_rollout_frozen_since_timestamp_seconds {round(int(rec['at_ms']) / 1000, 3)!r}"]
    out += ["# HELP ccs_rollout_inflight Whether a rollout is in flight (export.rollout.gate canary): a cohort "
            "loaded and waiting for the canary's A/B on its outcomes.",
            "# TYPE ccs_rollout_inflight gauge", f"ccs_rollout_inflight {int(flight is not None)}"]
    if flight is not None:
        out += ["# HELP ccs_rollout_inflight_cohort_loaded_timestamp_seconds When the cohort in flight loaded the "
                "table (Unix time, wall clock).",
                "# TYPE ccs_rollout_inflight_cohort_loaded_timestamp_seconds gauge",
                "ccs_rollout_inflight_cohort_loaded_timestamp_seconds "
                f"{round(int(flight.get('loaded_wall_ms') or flight['loaded_ms']) / 1000, 3)!r}",
                "# HELP ccs_rollout_inflight_cohort_index The cohort in flight's place in the fleet's order (0: canary).",
                "# TYPE ccs_rollout_inflight_cohort_index gauge",
                f"ccs_rollout_inflight_cohort_index {int(flight['index'])}"]
    return "\n".join(out) + "\n"


def write_freeze(cfg: Config, store: Store | None = None) -> str | None:
    """`<pipeline.metrics_dir>/ccs-rollout-freeze.prom` from the freeze record and the rollout in
    flight of `store` (default: the configuration's, `export.rollout.store`), whole or not at all; → its path, None when
    `pipeline.metrics_dir` is not set."""
    metrics_dir = cfg.settings.pipeline.metrics_dir
    if not metrics_dir:
        return None
    store = store or store_for(cfg)
    text = freeze_exposition(freeze.current(store), inflight.current(store))
    return write_textfile(os.path.join(metrics_dir, FREEZE_FILE), text)


def measured(job: str, skip_on: tuple[type[BaseException], ...] = (),
             also: Callable[[Config], object] | None = None):
    """A pipeline step whose runs write the job's file when `pipeline.metrics_dir` is set: its
    duration and outcome always (an exception in `skip_on` is a skip, as the DAG takes it), its
    rows when it succeeds; then `also(cfg)` (the rollout's freeze file), whatever the outcome. The
    step's result and exceptions pass through unchanged."""
    def wrap(step):
        sig = inspect.signature(step)

        @functools.wraps(step)
        def run(*args, **kwargs):
            cfg: Config = sig.bind(*args, **kwargs).arguments.get("cfg") or load_config()
            metrics_dir = cfg.settings.pipeline.metrics_dir
            t0 = time.monotonic()
            outcome, result = "failed", None
            try:
                result = step(*args, **kwargs)
                outcome = "ok"
                return result
            except skip_on:
                outcome = "skipped"
                raise
            finally:
                if metrics_dir:
                    try:
                        write(metrics_dir, job, outcome, time.time(), time.monotonic() - t0, result)
                    except Exception as exc:   # the metrics never fail the job (said in its log)
                        print(f"ccs job metrics: {job_file(metrics_dir, job)}: {exc}", flush=True)
                    if also is not None:
                        try:
                            also(cfg)
                        except Exception as exc:
                            print(f"ccs job metrics: {job}: {exc}", flush=True)
        return run
    return wrap
