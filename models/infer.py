"""`ccs infer`: batch inference of the champion network-type model over silver.connections →
gold.predictions, one row per connection, partitioned and replaced by (node_id, hour).

- The model is `models:/<name>@champion` (models.registry.load_champion), its weights broadcast
  once to the executors; the twelve Table 4 features go to Python as one Arrow struct column
  through a scalar Arrow UDF (Spark ≥ 4.1 `arrow_udf`: Arrow in, Arrow out, no pandas and never
  row at a time), where they are standardized with the champion's own statistics (log1p, then
  z-score as features/scaling.py) and scored by torch in large batches without gradients.
  P(Wi-Fi) is then calibrated with the champion's temperature (`infer.calibrate`), and the
  champion's out-of-domain guard (`infer.ood_guard`, models/ood.py) flags the rows unlike its
  training rows.
- The decision is built-in Spark: an out-of-domain row keeps the default CC with decision "ood";
  otherwise ALICCS §4.2's fallback strategy — trust a Wi-Fi prediction when P(Wi-Fi) ≥
  `infer.wifi_threshold` (0.8) and a 4G/5G one when P(4G) ≥ `infer.cell_threshold` (0.6); a
  trusted Wi-Fi gets CUBIC and a trusted 4G/5G gets BBR (§2, Table 1), anything else keeps the
  default CC ("fallback").
- A per-node standardized champion (`champion.node_std`, a `*_nodestd` variant) is scored on
  features standardized per (node, hour) over the node's own trailing traffic
  (features/node_stats.py, silver.node_stats), a node with too little traffic on the champion's
  fleet statistics; the guard reads the same z. The job's result says how many (node, hour)
  partitions had each (`node_stats`: node / fleet_fallback, and which fell back).
- Column meanings: ccselect/contract.py PREDICTION_COLS.
- The computation is models/infer_core.py's, shared with the in-process engine
  (models/infer_arrow.py): this module is the Spark adapter around it (extract, the UDF, the
  decision in columns, the Delta write) and `run`, which picks the engine.
"""
from __future__ import annotations

import io
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa  # module level: the Arrow UDF's type hints (strings here) resolve against it
from pyspark.sql import DataFrame, SparkSession, functions as F
from pyspark.sql.functions import arrow_udf
from threadpoolctl import threadpool_limits

from ccselect import delta_io
from ccselect.config import Config
from ccselect.contract import FEATURES, PREDICTION_COLS
from ccselect.delta_arrow import by_engine
from ccselect.hours import Window
from ccselect.lake import CONNECTIONS, PREDICTIONS, connections_in, table_path
from ccselect.settings import InferSettings
from ccselect.spark import conf_set, get_spark
from ccselect.features import node_stats
from ccselect.models import infer_arrow, infer_core
# the computation both engines share, under the names this job's callers use
from ccselect.models.infer_core import EVIDENCE_COLS, PASS_THROUGH, evidence_minima, predict_wifi, standardize  # noqa: F401
from ccselect.models.registry import load_champion
# Imported inside the functions that use them (heavy, not needed to import this module): delta, torch.

log = logging.getLogger(__name__)


# ---- extract ------------------------------------------------------------------------------------

def inputs(conns: DataFrame) -> DataFrame:
    """What scoring reads of silver.connections: the rows' keys, the features, the evidence the
    minimum-evidence rule counts and, where silver has it, `imputed`. `ccs infer` and the stream
    (flows/stream.py) both select through here, so both decide with the same rules."""
    return conns.select(*PASS_THROUGH, *FEATURES, *EVIDENCE_COLS, *(["imputed"] if "imputed" in conns.columns else []))


def extract(spark: SparkSession, cfg: Config, window: Window) -> DataFrame:
    return inputs(connections_in(spark, cfg, window))


# ---- the model in an Arrow UDF -------------------------------------------------------------------

def model_bytes(model) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


_MODELS: dict[Any, Any] = {}  # per Python worker: (broadcast token, precision) → ready model


def _worker_model(bc, precision: str, threads: int):
    """The broadcast model, unpickled once per (reused) Python worker, not once per batch."""
    import torch
    token, blob = bc.value
    key = (token, precision)
    if key not in _MODELS:
        torch.set_num_threads(max(1, threads))
        # Spark runs a Python worker per core: BLAS threads of their own (the guard's product)
        # would only spin against the other workers
        threadpool_limits(max(1, threads), user_api="blas")
        model = torch.load(io.BytesIO(blob), weights_only=False).eval()
        _MODELS.clear()
        _MODELS[key] = model.to(torch.bfloat16) if precision == "bf16" else model
    return _MODELS[key]


def score(df: DataFrame, model, stats, precision: str = "fp32", temperature: float = 1.0,
          guard=None, ood_quantile: float | None = None, node_table: dict | None = None) -> DataFrame:
    """Add `p_wifi` (double), calibrated with `temperature`, and `ood` (boolean, false without a
    `guard`: the rows `guard` flags at `ood_quantile`), with the model broadcast once. A missing
    feature (imputed at ingest, silver's `imputed`) is scored at the training mean (z = 0).
    With `node_table` ((node, hour) → features.node_stats.NodeScaling), each row is standardized
    with its partition's statistics instead (`node_stats.standardize_rows`)."""

    spark = df.sparkSession
    mean, std = infer_core.fleet_scaling(stats)
    bc = spark.sparkContext.broadcast((uuid.uuid4().hex, model_bytes(model)))
    threads = int(spark.conf.get("spark.task.cpus", "1") or 1)

    temperature = float(temperature)

    per_node = node_table is not None
    inputs = [*FEATURES, *(("node_id", "hour") if per_node else ())]

    @arrow_udf("struct<p_wifi: double, ood: boolean>")
    def p_wifi(x: pa.Array) -> pa.Array:
        # a null (imputed) feature comes out as NaN, which standardize sets to the training mean
        arrays = [c.to_numpy(zero_copy_only=False) for c in x.flatten()]
        if per_node:
            z = node_stats.standardize_rows(arrays[:len(FEATURES)], arrays[-2], arrays[-1], node_table, stats)
        else:
            z = standardize(arrays, mean, std)
        p, ood = infer_core.probabilities(_worker_model(bc, precision, threads), z, precision, temperature,
                                          guard, ood_quantile)
        return pa.StructArray.from_arrays([pa.array(p, type=pa.float64()), pa.array(ood, type=pa.bool_())],
                                          names=["p_wifi", "ood"])

    return (df.withColumn("_scored", p_wifi(F.struct(*[F.col(f) for f in inputs])))
            .withColumn("p_wifi", F.col("_scored.p_wifi")).withColumn("ood", F.col("_scored.ood")).drop("_scored"))


# ---- the decision (ALICCS §4.2) -----------------------------------------------------------------

def decide(df: DataFrame, p: InferSettings) -> DataFrame:
    """From `p_wifi` (and `ood`, when the frame has it): p_cell = 1 − p_wifi, pred_net_type
    (argmax; "wifi" at 0.5, null without a probability), decision "ood" where `ood` is true (the
    guard: the row is unlike the training rows), else "model" when the predicted type's
    probability reaches its threshold (≥), else "fallback", and the CC: Wi-Fi → wifi_cc, 4G/5G →
    cell_cc, ood and fallback → default_cc; a row with more than `ood_max_imputed` features in
    its `imputed` column (when the frame has one) is "ood" too. Before all of these, decision "evidence" (default_cc)
    where a column of EVIDENCE_COLS in the frame is below its minimum (`evidence_minima`)."""
    ood = F.coalesce(F.col("ood"), F.lit(False)) if "ood" in df.columns else F.lit(False)
    if "imputed" in df.columns and p.ood_max_imputed >= 0:   # mostly imputed: out of domain
        ood = ood | F.coalesce(F.size("imputed") > F.lit(int(p.ood_max_imputed)), F.lit(False))
    thin = F.lit(False)
    for c, lo in evidence_minima(p).items():
        if c in df.columns:
            thin = thin | F.coalesce(F.col(c) < F.lit(lo), F.lit(False))
    pw = F.col("p_wifi")
    pc = F.lit(1.0) - pw
    pred = F.when(pw.isNull(), F.lit(None).cast("string")).when(pw >= 0.5, "wifi").otherwise("cell")
    trusted = (((pred == "wifi") & (pw >= F.lit(float(p.wifi_threshold))))
               | ((pred == "cell") & (pc >= F.lit(float(p.cell_threshold)))))
    trusted = F.coalesce(trusted, F.lit(False)) & ~ood & ~thin
    return (df.withColumn("p_cell", pc)
            .withColumn("pred_net_type", pred)
            .withColumn("decision", F.when(thin, "evidence").when(ood, "ood").when(trusted, "model")
                        .otherwise("fallback"))
            .withColumn("cc", F.when(~trusted, p.default_cc).when(F.col("pred_net_type") == "wifi", p.wifi_cc)
                        .otherwise(p.cell_cc))
            .withColumn("default_cc", F.lit(p.default_cc)))


def transform(df: DataFrame, champion, p: InferSettings, node_table: dict | None = None) -> DataFrame:
    """Score and decide; a per-node standardized champion needs `node_table` (`node_scaling`)."""
    if infer_core.per_node(champion) and node_table is None:
        raise ValueError(f"{champion.name} v{champion.version} is per-node standardized: "
                         "score it with its node statistics (node_table)")
    scored = score(df, champion.model, champion.stats, p.precision, infer_core.temperature(champion, p),
                   infer_core.guard(champion, p), p.ood_quantile,
                   node_table if infer_core.per_node(champion) else None)
    out = (decide(scored, p)
           .withColumn("model_name", F.lit(champion.name))
           .withColumn("model_version", F.lit(str(champion.version))))
    return out.select(*PREDICTION_COLS)


# ---- load ---------------------------------------------------------------------------------------

def load(df: DataFrame, cfg: Config, keys: set[tuple[str, str]]) -> None:
    delta_io.replace_partitions(df, table_path(cfg, PREDICTIONS), keys)


def partitions(df: DataFrame) -> set[tuple[str, str]]:
    return {(r["node_id"], r["hour"]) for r in df.select("node_id", "hour").distinct().collect()}


def run(spark: SparkSession | None, cfg: Config, window: Window, champion=None,
        precision: str | None = None, decisions: bool = True, engine: str | None = None) -> dict[str, Any]:
    """Score silver.connections over the window's hours with the champion into gold.predictions, with
    `engine` (default `infer.engine`): "arrow" (models/infer_arrow.py, in this process), "spark"
    (this module's job), or "auto" (arrow where it can run, else spark; the result says why).
    `spark` may be None: a session is started only when the Spark job runs."""
    p = replace(cfg.settings.infer, **({"precision": precision} if precision else {}))
    engine = engine or p.engine
    champion = champion or load_champion(cfg)
    result = by_engine(engine, lambda: _run_arrow(cfg, window, champion, p, decisions),
                       lambda: _run_spark(spark or get_spark(cfg, "ccs-infer"), cfg, window, champion, p, decisions))
    ns = result.get("node_stats") or {}
    if ns.get("fleet_fallback"):
        log.warning("%d (node, hour) partitions scored on the fleet's statistics (fleet_fallback: fewer than "
                    "%d connections in the node's last %d hours): %s", ns["fleet_fallback"],
                    champion.node_std.min_conns, champion.node_std.hours, ", ".join(ns["fallback_partitions"][:20]))
    return result


def node_scaling(cfg: Config, champion, keys, spark: SparkSession | None = None) -> dict | None:
    """(node, hour) → NodeScaling for the partitions `keys` when the champion is per-node
    standardized (features/node_stats.py, with the champion's own window and minimum), else None."""
    ns = getattr(champion, "node_std", None)
    return None if ns is None else node_stats.lookup(cfg, keys, champion.stats, ns, spark)


def node_report(table: dict | None, champion=None) -> dict:
    """The result's `node_stats`: the champion's standardization and the partitions per source
    (none scored: no partitions)."""
    if table is None and not infer_core.per_node(champion):
        return {"standardization": "fleet"}
    return {"standardization": "node", **node_stats.summary(table or {})}


def _summary(cfg: Config, window: Window, champion, p: InferSettings) -> dict[str, Any]:
    return {**infer_core.summary(champion, p, window), "table": table_path(cfg, PREDICTIONS)}


def _run_arrow(cfg: Config, window: Window, champion, p: InferSettings, decisions: bool) -> dict[str, Any]:
    path = table_path(cfg, PREDICTIONS)
    r = infer_arrow.run(table_path(cfg, CONNECTIONS), path, window, champion, p, p.precision,
                        node_scaling=lambda keys: node_scaling(cfg, champion, keys))
    result = {**_summary(cfg, window, champion, p), "engine": "arrow", "rows": r["rows"],
              "partitions": r["partitions"], "node_stats": node_report(r.get("node_table"), champion)}
    if not r["rows"]:
        return result
    result.update({"seconds": r["seconds"], "rows_per_s": round(r["rows"] / r["seconds"]) if r["seconds"] > 0 else None,
                   "files": r["files"], "removed_files": r["removed_files"], "workers": r["workers"]})
    if decisions:
        result.update(infer_core.decision_report(infer_arrow.window_decisions(path, window)))
    return result


def _run_spark(spark: SparkSession, cfg: Config, window: Window, champion, p: InferSettings,
               decisions: bool) -> dict[str, Any]:
    src = extract(spark, cfg, window)
    keys = partitions(src)
    if not keys:
        return {**_summary(cfg, window, champion, p), "engine": "spark", "rows": 0, "partitions": 0}
    t0 = time.perf_counter()
    table = node_scaling(cfg, champion, keys, spark)
    with conf_set(spark, {"spark.sql.execution.arrow.maxRecordsPerBatch": str(int(p.batch_rows))}):
        load(transform(src, champion, p, table), cfg, keys)
    seconds = time.perf_counter() - t0
    path = table_path(cfg, PREDICTIONS)
    rows = _written_rows(spark, path)
    result = {**_summary(cfg, window, champion, p), "engine": "spark", "rows": rows, "partitions": len(keys),
              "node_stats": node_report(table, champion), "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds) if rows and seconds > 0 else None}
    if decisions:
        out = (spark.read.format("delta").load(path).where(F.col("hour").between(window.lo, window.hi))
               .groupBy("decision", "cc").count().collect())
        result.update(infer_core.decision_report(
            {f"{r['decision']}/{r['cc']}": r["count"] for r in sorted(out, key=lambda r: (r[0], r[1]))}))
    return result


def _written_rows(spark: SparkSession, path: str) -> int | None:
    """Rows of the last commit, from Delta's operation metrics (no second scan)."""
    from delta.tables import DeltaTable
    last = DeltaTable.forPath(spark, path).history(1).select("operationMetrics").collect()
    metrics = (last[0]["operationMetrics"] or {}) if last else {}
    return int(metrics["numOutputRows"]) if "numOutputRows" in metrics else None
