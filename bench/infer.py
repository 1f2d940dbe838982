"""bench/infer: network-type inference speed (issues 4 and 31).

(a) Model only: the NetTypeModel (G + C) in torch on CPU, no grad, large batches, in fp32 and in
    bf16 (weights and activations cast; the CPU's AVX-512 bf16 paths), rows/s, with the 2 cores
    used two ways (`intra`: torch's intra-op pool; `split`: a Python thread per core, one intra-op
    thread each, as the Arrow engine runs it); bf16's accuracy change against fp32 on the
    labelled rows (goal ≤ 0.1 point) and how many CC decisions change: a check of the cast on
    this bench's own quick model and its training rows, not of accuracy; bf16 is judged on the
    champion over held-out nodes by bench/champion_bf16.py. Goal ≥ 10 M rows/s. Also
    the same network compiled by torch.compile (`compiled_fp32`).
(b) End to end, Delta to Delta: `ccs infer` over a silver.connections of `--rows` rows (the
    simulated fleet's silver replicated with fresh connection ids) into gold.predictions, with a
    champion carrying an out-of-domain guard and a temperature, side by side:
    - `spark`: the Spark job (models/infer.py, local[2], the model in an Arrow UDF), with two floors
      that show what limits it: the same scan and UDF into Spark's `noop` sink (no Delta write),
      and the scan alone;
    - `arrow`: the driver-side engine (models/infer_arrow.py: Delta files → pyarrow → torch →
      Parquet → one delta-rs commit), in bf16 and fp32, and whether its fp32 output has the same
      decision, CC and predicted-type columns as the Spark job's (probabilities: largest
      difference).
    Goal ≥ 3 M rows/s. Peak memory of each: the driver's Python process and its JVM (with the
    Spark job's Python workers).

The model is trained here for a few epochs on a small simulated fleet (the architecture, not its
accuracy, sets the speed; the bf16 check uses its labelled rows). Writes bench/results/infer.json
and prints it.

    .venv/bin/python bench/infer.py [--rows 3000000] [--model-rows 4000000] [--workdir /tmp/ccs-bench-infer]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bench.ingest import PeakRss, bench_config  # noqa: E402
from ccselect.contract import FEATURES
from ccselect.hours import Window
from ccselect.lake import CONNECTIONS, PREDICTIONS, TRAINING_SET
from ccselect.settings import InferSettings
from ccselect.spark import get_spark
from ccselect.sim.params import SimParams
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark, torch, and our modules that load them.


def _split_predict(model, x, prec: str, chunk: int, pool, workers: int) -> None:
    """predict_wifi over x cut into `workers` contiguous parts, one Python thread each (torch
    releases the GIL in its operators), each with one intra-op thread: how `ccs infer`'s Arrow
    engine runs the model (one file per thread)."""
    from ccselect.models.infer import predict_wifi
    bounds = np.linspace(0, len(x), workers + 1).astype(int)
    list(pool.map(lambda i: predict_wifi(model, x[bounds[i]:bounds[i + 1]], prec, chunk=chunk), range(workers)))


def model_only(model, x_all, x_lab, y_lab, infer_params, rows: int, batches, threads: int = 2,
               compiled_batches=(8192, 16384, 32768)) -> dict:
    """Rows/s of the model alone, per precision and batch size, two ways of using the cores:
    `intra` (one call, torch's intra-op pool of `threads`) and `split` (`threads` Python threads
    over parts of the rows, one intra-op thread each)."""
    import torch

    from ccselect.models.infer import predict_wifi
    reps = int(np.ceil(rows / len(x_all)))
    x = np.ascontiguousarray(np.tile(x_all, (reps, 1))[:rows])
    out: dict = {"rows": rows, "threads": threads, "precisions": {}}
    models = {"fp32": model.float().eval(), "bf16": __import__("copy").deepcopy(model).to(torch.bfloat16).eval()}
    probs = {}
    with ThreadPoolExecutor(threads) as pool:
        for prec, m in models.items():
            res: dict = {"intra": {}, "split": {}}
            for mode in ("intra", "split"):
                torch.set_num_threads(threads if mode == "intra" else 1)
                for b in batches:
                    def once(n=len(x)):
                        if mode == "intra":
                            predict_wifi(m, x[:n], prec, chunk=b)
                        else:
                            _split_predict(m, x[:n], prec, b, pool, threads)
                    once(b * 2 * threads)  # warm-up (oneDNN primitives per shape)
                    best = float("inf")
                    for _ in range(3):
                        t0 = time.perf_counter()
                        once()
                        best = min(best, time.perf_counter() - t0)
                    res[mode][str(b)] = round(rows / best)
            torch.set_num_threads(threads)
            probs[prec] = predict_wifi(m, x_lab, prec)
            probs[prec + "_all"] = predict_wifi(m, x_all, prec)
            out["precisions"][prec] = {"rows_per_s_by_batch": res,
                                       "best_rows_per_s": max(v for r in res.values() for v in r.values())}
    out["compiled_fp32"] = compiled_fp32(model, x, compiled_batches) if compiled_batches else {"skipped": True}
    acc = {p: float(((probs[p] >= 0.5) == y_lab.astype(bool)).mean()) for p in models}

    def cc(p):
        wifi = p >= 0.5
        trusted = np.where(wifi, p >= infer_params.wifi_threshold, 1 - p >= infer_params.cell_threshold)
        return np.where(trusted, np.where(wifi, infer_params.wifi_cc, infer_params.cell_cc), infer_params.default_cc)
    out["accuracy"] = {
        "labelled_rows": int(len(y_lab)), "fp32": round(acc["fp32"], 6), "bf16": round(acc["bf16"], 6),
        "change_points": round(100 * (acc["bf16"] - acc["fp32"]), 4),
        "prediction_agreement": float(((probs["fp32"] >= 0.5) == (probs["bf16"] >= 0.5)).mean()),
        "max_abs_p_diff": float(np.abs(probs["fp32"] - probs["bf16"]).max()),
        "cc_changed_share_all_rows": float((cc(probs["fp32_all"]) != cc(probs["bf16_all"])).mean()),
        "goal_points": 0.1}
    return out


def compiled_fp32(model, x, batches) -> dict:
    """What the same network reaches when compiled: torch.compile (inductor, max-autotune: its
    C++ GEMM templates fuse bias, LayerNorm and ReLU into fewer passes; freezing: the weights as
    constants, prepacked) of G + C with P(Wi-Fi)
    as sigmoid(l_wifi − l_4g), which equals softmax(·)[1]. Not what `ccs infer` runs (each Spark
    Python worker would compile for seconds); it shows how much of the model-only time is the
    eager operators' memory passes. Rows/s per batch, the compile time, and the largest
    difference from the eager fp32 model; or the error when the machine cannot compile."""
    import torch
    import torch.nn.functional as F

    from ccselect.models.infer import predict_wifi
    gen, w = model.generator.net, model.classifier.net
    lin = [m for m in gen if isinstance(m, torch.nn.Linear)]
    norms = [m for m in gen if isinstance(m, torch.nn.LayerNorm)]
    if len(lin) != 3 or len(norms) != 2:
        return {"error": "not the default G architecture (3 linear layers, 2 LayerNorms)"}
    wd = (w.weight[1] - w.weight[0]).detach().unsqueeze(1).contiguous()
    bd = (w.bias[1] - w.bias[0]).detach()

    def forward(xb):
        h = xb
        for li, ln in zip(lin[:2], norms):
            h = F.layer_norm(F.linear(h, li.weight, li.bias), ln.normalized_shape, ln.weight, ln.bias, ln.eps).relu()
        h = F.linear(h, lin[2].weight, lin[2].bias).relu()
        return torch.sigmoid((h @ wd).squeeze(1) + bd)

    res: dict = {"rows_per_s_by_batch": {}, "compile_seconds": {}}
    try:
        for b in batches:
            torch._dynamo.reset()
            fn = torch.compile(forward, mode="max-autotune", dynamic=False)
            n = (len(x) // b) * b
            xs = torch.from_numpy(x[:n])
            out = np.empty(n, dtype=np.float32)
            t0 = time.perf_counter()
            # freezing: the weights become constants, which inductor folds and prepacks for
            # oneDNN (2026-11-24, batch 16384: 9.5-9.9 M rows/s with it, 8.7 M without)
            with torch.inference_mode(), torch._inductor.config.patch(freezing=True):
                fn(xs[:b])
            res["compile_seconds"][str(b)] = round(time.perf_counter() - t0, 1)
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                with torch.inference_mode():
                    for i in range(0, n, b):
                        out[i:i + b] = fn(xs[i:i + b]).numpy()
                best = min(best, time.perf_counter() - t0)
            res["rows_per_s_by_batch"][str(b)] = round(n / best)
        res["max_abs_p_diff_vs_eager"] = float(np.abs(out - predict_wifi(model, x[:n], "fp32")).max())
        res["best_rows_per_s"] = max(res["rows_per_s_by_batch"].values())
    except Exception as e:  # no C++ compiler, an inductor failure: report it, the eager figures stand
        res["error"] = f"{type(e).__name__}: {e}"[:500]
    return res


def replicate_silver(spark, src_cfg, dst_cfg, lo, hi, rows: int) -> int:
    """dst's silver.connections = src's window replicated to ≥ `rows` rows (new conn_ids)."""
    from pyspark.sql import functions as F

    from ccselect.lake import connections_in, table_path
    src = connections_in(spark, src_cfg, Window.hours(lo, hi))
    n = src.count()
    k = max(1, -(-rows // n))
    rep = spark.range(k).withColumnRenamed("id", "_copy")
    df = (src.crossJoin(rep).withColumn("conn_id", F.concat_ws("-", "conn_id", F.col("_copy").cast("string")))
          .drop("_copy").repartition("node_id", "hour"))
    df.write.format("delta").mode("overwrite").partitionBy("node_id", "hour").save(table_path(dst_cfg, CONNECTIONS))
    return n * k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3_000_000, help="silver rows for the end-to-end runs (Delta to Delta)")
    ap.add_argument("--model-rows", type=int, default=4_000_000, help="rows per model-only timing")
    ap.add_argument("--batches", default="16384,65536,262144", help="model-only batch sizes")
    ap.add_argument("--compiled-batches", default="8192,16384,32768",
                    help="batch sizes for torch.compile's figure ('' skips it: compiling takes minutes)")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=int, default=3)
    ap.add_argument("--conns-per-node-hour", type=int, default=1500)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/ccs-bench-infer")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "infer.json"))
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)

    from ccselect.lake import connections_in, table_path, write_window
    from ccselect.features import labels, scaling
    from ccselect.jobs import ingest
    from ccselect.models import infer
    from ccselect.models.dataset import load_labelled, to_train_data
    from ccselect.models.registry import Champion
    from ccselect.models.train import TrainParams, fit
    from ccselect.sim.fleet import simulate

    def say(m):
        print(m, file=sys.stderr, flush=True)

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    t_all = time.perf_counter()
    simulate(SimParams(nodes=args.nodes, hours=args.hours, conns_per_node_hour=args.conns_per_node_hour,
                       seed=23), str(work / "logs"), workers=2, progress=False)
    cfg = bench_config(work / "fleet")
    bench_cfg = bench_config(work / "bench")
    spark = get_spark(cfg, "ccs-bench-infer")
    ing = ingest.run(spark, cfg, str(work / "logs"))
    silver = spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
    hours = sorted(r["hour"] for r in silver.select("hour").distinct().collect())
    lo, hi = hours[0], hours[-1]
    window = f"{lo}..{hi}"
    conns = connections_in(spark, cfg, Window.hours(lo, hi))
    stats = scaling.fit(conns, window)
    write_window(spark, cfg, labels.training_set(conns, 0.5), TRAINING_SET, window)
    lab = load_labelled(spark, cfg, Window.hours(lo, hi), stats)
    data, _ = to_train_data(lab, pd.DataFrame(columns=["label", "prefix24", "group", "k"]))
    say(f"fleet: {ing.get('silver_rows')} silver rows, {len(lab)} labelled; training {args.epochs} epochs ...")
    trainer = fit(TrainParams(variant="mlp", epochs=args.epochs, seed=0, device="cpu"), data)
    model = trainer.model.cpu().eval()
    x_all = np.array(scaling.transform(conns, stats).select("features").toArrow().column(0).to_pylist(),
                     dtype=np.float32)
    p = InferSettings()

    say("model only ...")
    with PeakRss() as mem_model:
        mo = model_only(model, x_all, lab.x, lab.y, p, args.model_rows, [int(b) for b in args.batches.split(",")],
                        compiled_batches=tuple(int(b) for b in args.compiled_batches.split(",") if b))
    mo["peak_rss_mb"] = round(mem_model.peak / 2 ** 20)

    say(f"replicating silver to {args.rows:,} rows ...")
    n_rows = replicate_silver(spark, cfg, bench_cfg, lo, hi, args.rows)
    # the champion as `ccs train` registers it: with its out-of-domain guard and a temperature
    from ccselect.models.infer import predict_wifi
    from ccselect.models.ood import fit_calibration, fit_guard
    guard = fit_guard(lab.x, stats.features, p.ood_quantile, p.ood_method, p.ood_margin)
    calibration = fit_calibration(predict_wifi(model, lab.x), lab.y, rows="bench: all labelled rows")
    champion = Champion(model=model, stats=stats, name="bench", version="0", run_id="", guard=guard,
                        calibration=calibration)
    pred_path = table_path(bench_cfg, PREDICTIONS)
    spark_res: dict = {"silver_rows": n_rows, "partitions": len(hours) * args.nodes, "master": "local[2]"}
    arrow_res: dict = {"silver_rows": n_rows, "workers": os.cpu_count()}
    load_avg = {"start": round(os.getloadavg()[0], 2)}

    def engine_runs(engine: str, prec: str, res: dict) -> None:
        runs = []
        for i in range(2):  # the first Spark run starts the Python workers (each imports torch)
            r = infer.run(spark, bench_cfg, Window.hours(lo, hi), champion=champion, precision=prec, decisions=False, engine=engine)
            assert r["engine"] == engine, r
            runs.append({"seconds": r["seconds"], "rows": r["rows"], "rows_per_s": r["rows_per_s"]})
            say(f"ccs infer --engine {engine} {prec} run {i + 1}: {r['rows']:,} rows in {r['seconds']:.1f} s")
        res[f"infer_{prec}"] = {"cold": runs[0], "warm": runs[1]}

    def table_now():
        from deltalake import DeltaTable
        t = pq.ParquetDataset(DeltaTable(pred_path).file_uris(), partitioning=None).read(
            columns=["conn_id", "p_wifi", "decision", "cc", "pred_net_type"])
        return t.sort_by("conn_id")

    with PeakRss() as mem:
        engine_runs("spark", "fp32", spark_res)
        spark_table = table_now()
        src = infer.extract(spark, bench_cfg, Window.hours(lo, hi))
        for name, df in (("score_noop_sink_fp32", infer.transform(src, champion, p)),
                         ("scan_noop_sink", src)):
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(p.batch_rows))
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            s = time.perf_counter() - t0
            spark_res[name] = {"seconds": round(s, 2), "rows_per_s": round(n_rows / s)}
            say(f"{name}: {s:.1f} s")
    spark_res["peak_rss_mb"] = {"total": round(mem.peak / 2 ** 20), "python_driver": round(mem.peak_python / 2 ** 20),
                                "jvm_and_workers": round(mem.peak_jvm / 2 ** 20)}
    load_avg["arrow_start"] = round(os.getloadavg()[0], 2)
    with PeakRss() as mem:
        engine_runs("arrow", "bf16", arrow_res)
        bf16_table = table_now()
        engine_runs("arrow", "fp32", arrow_res)
    # the driver's JVM idles meanwhile; the engine's own memory is the Python process's
    arrow_res["peak_rss_mb"] = {"python_driver": round(mem.peak_python / 2 ** 20),
                                "idle_jvm": round(mem.peak_jvm / 2 ** 20)}
    load_avg["end"] = round(os.getloadavg()[0], 2)
    arrow_table = table_now()
    same = {c: arrow_table.column(c).equals(spark_table.column(c)) for c in ("conn_id", "decision", "cc", "pred_net_type")}
    pw_a, pw_s = (t.column("p_wifi").to_numpy() for t in (arrow_table, spark_table))
    arrow_res["vs_spark_fp32"] = {"rows": arrow_table.num_rows, "identical_columns": same,
                                  "decisions_identical": all(same.values()),
                                  "max_abs_p_wifi_diff": float(np.abs(pw_a - pw_s).max()) if len(pw_a) else 0.0}
    arrow_res["bf16_vs_fp32"] = {
        "cc_changed_rows": int(np.sum(np.asarray(bf16_table.column("cc")) != np.asarray(arrow_table.column("cc")))),
        "max_abs_p_wifi_diff": float(np.abs(bf16_table.column("p_wifi").to_numpy() - pw_a).max()) if len(pw_a) else 0.0}
    written = spark.read.format("delta").load(pred_path)
    arrow_res["written_rows"] = written.count()
    arrow_res["decisions"] = {f"{r['decision']}/{r['cc']}": r["count"] for r in
                              written.groupBy("decision", "cc").count().orderBy("decision", "cc").collect()}
    spark.stop()

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    best_model = max(v["best_rows_per_s"] for v in mo["precisions"].values())
    best_compiled = mo["compiled_fp32"].get("best_rows_per_s", 0)
    spark_job = spark_res["infer_fp32"]["warm"]["rows_per_s"] or 0
    arrow_fp32 = arrow_res["infer_fp32"]["warm"]["rows_per_s"] or 0
    out = {"bench": "infer", "cpu": cpu, "cores": os.cpu_count(), "features": len(FEATURES),
           "load_average": load_avg, "model_only": mo, "spark": spark_res, "arrow": arrow_res,
           "goals": {"model_rows_per_s": 10_000_000, "model_met": best_model >= 10_000_000,
                     "model_best_rows_per_s": best_model,
                     "model_compiled_met": best_compiled >= 10_000_000,
                     "infer_rows_per_s": 3_000_000, "infer_engine": "arrow", "infer_fp32_rows_per_s": arrow_fp32,
                     "infer_met": arrow_fp32 >= 3_000_000 and arrow_res["vs_spark_fp32"]["decisions_identical"],
                     "spark_job_rows_per_s": spark_job,
                     "arrow_over_spark_job": round(arrow_fp32 / spark_job, 1) if spark_job else None,
                     "bf16_accuracy_points": 0.1,
                     "bf16_met": abs(mo["accuracy"]["change_points"]) <= 0.1},
           "seconds": round(time.perf_counter() - t_all, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True))
    print(json.dumps(out, indent=2, sort_keys=True))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
