"""The job: `run` emulates a window's hours under the policies and writes gold.emulation and
gold.emulation_cells."""
from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession, functions as F

from ccselect.config import Config
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import hour_shift
from ccselect.lake import EMULATION, EMULATION_CELLS, table_path, write_window
from ccselect.settings import EmulateSettings
from ccselect.distill.handshake import load_handshake
from ccselect.evaluation.emulate.estimate import estimates, extract, sessions
from ccselect.evaluation.emulate.policies import Emulation, POLICIES, REGISTRY, split_lag
from ccselect.evaluation.emulate.report import (
    cubic_truth_by_node, cubic_truth_qoe, per_cell, per_window, read_truth, score, summarize, tail_contrasts,
    truth_cells, truth_check, with_truth)

# ---- load and the job ---------------------------------------------------------------------------

def lag_curve(summary: dict[str, Any], lags: tuple[int, ...], p: EmulateSettings) -> dict[str, Any]:
    """Per lag L of the curve: `aliccs_stream@L`'s and `true_table_stream@L`'s estimated QoE and
    rebuffer tail, and with the truth their share of the true type's truth gain and the rebuffer
    tail in truth (the truth cells' percentiles) — how fast the table's worth decays with its age
    (ALICCS §3.3, Observation IV)."""
    points = []
    for lag in lags:
        row: dict[str, Any] = {"lag_minutes": lag}
        for base in ("aliccs_stream", "true_table_stream"):
            d = summary.get(f"{base}@{lag}")
            if not d:
                continue
            t = d.get("truth") or {}
            row[base] = {"qoe": d.get("qoe"), "rebuffer_pct": d.get("rebuffer_pct"),
                         "share_of_true_type_gain": t.get("share_of_true_type_gain"),
                         "exp_rebuffer_pct": t.get("exp_rebuffer_pct")}
        points.append(row)
    return {"trigger_minutes": p.stream_trigger_minutes, "window_minutes": p.stream_window_minutes,
            "operating_delay_minutes": p.stream_delay_minutes, "points": points}


def run(spark: SparkSession, cfg: Config, window: hours.Window, policies: tuple[str, ...] | None = None,
        truth_dir: str | None = None, params: EmulateSettings | None = None,
        stream_lags: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Emulate the window's hours: gold.emulation and gold.emulation_cells for the range (replaced on a
    re-run), and the summary. `stream_lags` (minutes): the streaming table's lag curve — adds
    `aliccs_stream@L` (and, with the truth, `true_table_stream@L`) for each L, and the summary's
    `lag_curve`."""
    p = params or cfg.settings.emulate
    if not policies:     # by default every policy this lake can run: the flow ones need `ccs handshake`
        has_tree = load_handshake(cfg) is not None
        policies = tuple(x.name for x in REGISTRY.values() if (not x.truth or truth_dir) and (not x.flow_mode or has_tree))
    policies = tuple(policies)
    lags = tuple(stream_lags or ())
    for lag in lags:
        policies += tuple(x for x in (f"aliccs_stream@{lag}", f"true_table_stream@{lag}" if truth_dir else None)
                          if x and x not in policies)
    lag_of = {x: split_lag(x, p) for x in policies}
    unknown = {x for x, (base, _) in lag_of.items() if base not in REGISTRY}
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; known: {', '.join(POLICIES)}")
    needs = [x for x in policies if REGISTRY[lag_of[x][0]].truth]
    if needs and not truth_dir:
        raise ValueError(f"policies {', '.join(needs)} need --truth (the simulator's output folder)")
    # two policies and the truth check join it: read the parquet once
    truth = read_truth(spark, truth_dir).persist() if truth_dir else None
    # the sessions feed five aggregations of the estimator and the baselines' training: read once
    s = sessions(extract(spark, cfg, window, p), p).persist()
    est_all = estimates(s).persist()
    em = Emulation(spark, cfg, window, p, lag_of, s, est_all, truth)
    try:
        n = em.in_range()
        if n == 0:
            return {"range": window.name, "sessions": 0, "policies": {}}
        est = em.est
        choices: dict[str, DataFrame] = {}
        for name in policies:
            choices[name], reported = REGISTRY[lag_of[name][0]].decide(em, name)
            if reported is not None:
                em.info[name] = reported
        return _score_and_summarize(spark, cfg, window, p, em, choices, n, policies, lags)
    finally:
        em.close()
        est_all.unpersist()
        s.unpersist()
        if truth is not None:
            truth.unpersist()


def _score_and_summarize(spark: SparkSession, cfg: Config, window: hours.Window, p: EmulateSettings, em: Emulation,
                         choices: dict[str, DataFrame], n: int, policies: tuple[str, ...],
                         lags: tuple[int, ...]) -> dict[str, Any]:
    """Score every policy's choices, write gold.emulation and gold.emulation_cells for the range,
    and the summary: per policy, the tail contrasts, the truth check (with the truth), the lag curve."""
    est, truth = em.est, em.truth
    scored = score(est, choices, p).persist()
    rng = window.name
    n_w = write_window(spark, cfg, per_window(scored), EMULATION, rng)
    n_c = write_window(spark, cfg, per_cell(scored), EMULATION_CELLS, rng)
    path_w, path_c = table_path(cfg, EMULATION), table_path(cfg, EMULATION_CELLS)
    windows = spark.read.format("delta").load(path_w).where(F.col("window") == rng)
    cells = spark.read.format("delta").load(path_c).where(F.col("window") == rng)
    cols = ["policy", "node_id", "window_ms", "prefix", "net_type", "sessions", "rebuffer_rate"]
    # the tails against ALICCS's hourly table and against each policy registered as a reference
    flow_refs = [x for x in policies if x in REGISTRY and REGISTRY[x].tail_reference]
    est_cells = cells.where(F.col("sessions") >= p.min_cell_sessions).select(*cols).toPandas()
    contrasts = {"estimated": tail_contrasts(est_cells, p),
                 **{f"estimated, {r}": tail_contrasts(est_cells, p, reference=r) for r in flow_refs}}
    checked = None
    if truth is not None:
        # one join with the truth, one aggregation into cells: the check and the contrasts read both
        truthful = with_truth(scored, truth).persist()
        t_cells = truth_cells(truthful, p).persist()
        checked = truth_check(truthful, t_cells, p, base=cubic_truth_qoe(est, truth, p),
                              base_by_node=cubic_truth_by_node(est, truth, p))
        truth_pd = t_cells.select(*cols).toPandas()
        contrasts["truth"] = tail_contrasts(truth_pd, p)
        contrasts.update({f"truth, {r}": tail_contrasts(truth_pd, p, reference=r) for r in flow_refs})
        t_cells.unpersist()
        truthful.unpersist()
    summary = summarize(windows, cells, p, checked)
    scored.unpersist()
    est.unpersist()
    out = {"range": rng, "sessions": n, "train_hours": f"{hour_shift(window.lo, -p.train_hours)}..{hour_shift(window.lo, -1)}",
           "window_minutes": p.window_minutes, "alpha": p.alpha, "rows": {EMULATION: n_w, EMULATION_CELLS: n_c},
           "policies": summary, "tail_contrasts": contrasts, "baselines": em.info}
    if lags:
        out["lag_curve"] = lag_curve(summary, lags, p)
    return out
