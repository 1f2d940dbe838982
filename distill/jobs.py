"""`ccs distill`, `ccs diagnose` and `ccs handshake` as jobs: read (lake, registry) at the edges, the pure work in
distill/tree.py and distill/diagnose.py, write (MLflow, gold.diagnostics, the report) at the end."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from ccselect import delta_io, files
from ccselect.config import Config
from ccselect.lake import DIAGNOSTICS, table_path
from ccselect.contract import HANDSHAKE_FEATURES
from ccselect.hours import Window
from ccselect.settings import HandshakeSettings
from ccselect.distill import diagnose as dg, handshake, registry, report
from ccselect.distill.store import experiment_id, tracking
from ccselect.distill.data import load_window
from ccselect.distill.handshake import HandshakeRows
from ccselect.distill.tree import distill, rules_text
from ccselect.models.crossnode import split_nodes
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, torch.


def dnn_probabilities(model, z: np.ndarray, batch: int = 65536) -> np.ndarray:
    """The champion's [N, 2] class probabilities (Y_0 = 4G/5G, Y_1 = Wi-Fi, §3.2) on standardized rows."""
    import torch
    model.eval()
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(z), batch):
            out.append(model(torch.as_tensor(z[i:i + batch], dtype=torch.float32, device=device)).cpu().numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, 2))


def run_distill(spark, cfg: Config, window: Window, params=None) -> dict:
    """Distill `models:/<name>@champion` over the window into a tree; log and register it."""

    params = params or cfg.settings.distill
    champion = registry.load_champion(cfg)
    rows = load_window(spark, cfg, window, champion.stats, champion.node_std)
    if len(rows) == 0:
        raise ValueError(f"no labelled rows in window {window.name}")
    probs = dnn_probabilities(champion.model, rows.z)
    result = distill(rows.raw, probs, rows.label, rows.prefix16, params)
    logged = registry.log_tree(cfg, result, params, champion, rows.window, rows.raw[:100])
    failing = result.search.steps[-1].failing_subsets
    return {"window": rows.window, "dnn": f"{champion.name} v{champion.version}",
            "tree": f"{logged['name']} v{logged['version']}", "run_id": logged["run_id"],
            **result.metrics, "failing_subsets": failing,
            "search": [(s.depth, round(s.fidelity, 4), len(s.failing_subsets)) for s in result.search.steps]}


DIAGNOSTICS_SCHEMA = ("run string, created_at string, window string, dnn_name string, dnn_version string, "
                      "tree_version string, subset_kind string, subset string, rows bigint, accuracy double, "
                      "tree_accuracy double, fidelity double, feature string, rank int, mean_abs_shap double, "
                      "share double, global_share double, lift double, over_relied boolean")


def run_diagnose(spark, cfg: Config, window: Window | None = None, prefix: str | None = None,
                 node_id: str | None = None, worst: int | None = None, params=None, log_mlflow: bool = True) -> dict:
    """SHAP diagnostics of the champion's distilled tree over a window (default: the tree's):
    report under <data_root>/reports/diagnose/<run>/, rows in gold.diagnostics, MLflow artifacts."""

    params = params or cfg.settings.diagnose
    champion = registry.load_champion(cfg)
    tv = registry.load_tree_for(cfg, champion.version)
    window = window or Window.hours(*tv.window.split(".."))
    rows = load_window(spark, cfg, window, champion.stats, champion.node_std)
    dnn = dnn_probabilities(champion.model, rows.z)
    tree_probs = tv.tree.predict(rows.raw)
    by16 = dg.per_prefix16(rows.prefix16, rows.label, dnn, tree_probs)

    # Global attribution on a seeded sample; every subset's rows in full (they are what we study).
    g_idx = dg.sample(len(rows), params.max_rows, params.seed)
    g_values, expected = dg.shap_values(tv.tree, rows.raw[g_idx])
    g_wifi = g_values[:, :, dg.WIFI]
    g_mean_abs, g_share = dg.shares(g_wifi)
    subsets = dg.select_subsets(rows.prefix16, rows.client_ip, rows.node, by16, params, prefix, node_id, worst)

    now = datetime.now(timezone.utc)
    run = now.strftime("%Y%m%dT%H%M%SZ")
    # the report goes under <data_root>/reports/diagnose/<run>/: written there on a local data root,
    # written to a scratch folder and uploaded to the object store under an s3a:// one
    dest = files.join(cfg.data_root, "reports", "diagnose", run)
    out_dir = tempfile.mkdtemp(prefix=f"ccs-diagnose-{run}-") if files.is_remote(dest) else dest
    os.makedirs(out_dir, exist_ok=True)
    images = {"global": os.path.basename(report.global_summary_png(os.path.join(out_dir, "global_summary.png"),
                                                                   g_wifi, rows.raw[g_idx])),
              "tree": os.path.basename(report.tree_png(os.path.join(out_dir, "tree_top.png"), tv.tree))}
    label, probs_ok = rows.label, np.argmax(dnn, 1)
    found = []
    for i, s in enumerate(subsets):
        if not s.mask.any():
            continue
        vals, _ = dg.shap_values(tv.tree, rows.raw[s.mask])
        prof = dg.profile(vals[:, :, dg.WIFI], g_share, params)
        t_ok = np.argmax(tree_probs[s.mask], 1)
        found.append({"kind": s.kind, "key": s.key, "rows": int(s.mask.sum()),
                      "accuracy": float((probs_ok[s.mask] == label[s.mask]).mean()),
                      "tree_accuracy": float((t_ok == label[s.mask]).mean()),
                      "fidelity": float((t_ok == probs_ok[s.mask]).mean()),
                      "top": dg.top_features(prof, params.top_features), "over_relied": dg.over_relied(prof),
                      "profile": prof})
        images[s.key] = os.path.basename(report.subset_bars_png(
            os.path.join(out_dir, f"subset_{i:02d}.png"), prof, f"{s.kind} {s.key}"))
    global_prof = dg.profile(g_wifi, g_share, params)
    meta = {"run": run, "window": rows.window, "dnn": f"{champion.name} v{champion.version}",
            "tree": f"{tv.name} v{tv.version}", "rows": len(rows),
            "accuracy": round(float((probs_ok == label).mean()), 4),
            "tree_accuracy": round(float((np.argmax(tree_probs, 1) == label).mean()), 4),
            "expected_p_wifi": round(float(expected[dg.WIFI]), 4)}
    html_path = report.write_html(out_dir, meta, by16, found, rules_text(tv.tree, max_depth=6), images)

    frame = _diagnostics_frame(run, now, rows.window, champion, tv, meta, global_prof, found)
    frame.to_csv(os.path.join(out_dir, "diagnostics.csv"), index=False)
    _write_diagnostics(spark, cfg, frame, run)
    mlflow_run = _log_mlflow(cfg, out_dir, meta, params, found) if log_mlflow else None
    if out_dir != dest:
        files.upload_dir(cfg, out_dir, dest)
        shutil.rmtree(out_dir, ignore_errors=True)
        html_path = files.join(dest, os.path.basename(html_path))
    return {"run": run, "report": html_path, "mlflow_run_id": mlflow_run, **{k: v for k, v in meta.items() if k != "run"},
            "subsets": [{k: v for k, v in s.items() if k != "profile"} for s in found],
            "global_top": dg.top_features(global_prof, params.top_features)}


def _diagnostics_frame(run, now, window, champion, tv, meta, global_prof, found) -> pd.DataFrame:
    parts = []
    subsets = [{"kind": "global", "key": "all", "rows": meta["rows"], "accuracy": meta["accuracy"],
                "tree_accuracy": meta["tree_accuracy"], "fidelity": float("nan"), "profile": global_prof}, *found]
    for s in subsets:
        p = s["profile"]
        parts.append(pd.DataFrame({
            "run": run, "created_at": now.isoformat(), "window": window, "dnn_name": champion.name,
            "dnn_version": str(champion.version), "tree_version": tv.version, "subset_kind": s["kind"],
            "subset": s["key"], "rows": int(s["rows"]), "accuracy": float(s["accuracy"]),
            "tree_accuracy": float(s["tree_accuracy"]), "fidelity": float(s["fidelity"]),
            "feature": p["feature"], "rank": p["rank"].astype("int32"), "mean_abs_shap": p["mean_abs_shap"],
            "share": p["share"], "global_share": p["global_share"], "lift": p["lift"],
            "over_relied": p["over_relied"].astype(bool)}))
    return pd.concat(parts, ignore_index=True)


def _write_diagnostics(spark, cfg: Config, frame: pd.DataFrame, run: str) -> None:
    """gold.diagnostics, one row per run × subset × feature, keyed (replaced) by run."""
    df = spark.createDataFrame(frame.replace({np.nan: None}), DIAGNOSTICS_SCHEMA)
    delta_io.replace_partitions(df, table_path(cfg, DIAGNOSTICS), {(run,)}, ("run",))


def _log_mlflow(cfg: Config, out_dir: str, meta: dict, params, found: list[dict]) -> str:
    import mlflow

    tracking(cfg)
    with mlflow.start_run(experiment_id=experiment_id(cfg, "ccs-diagnose"),
                          run_name=f"diagnose {meta['window']}") as run:
        mlflow.log_params({**params.to_dict(), **{k: meta[k] for k in ("window", "dnn", "tree")}})
        mlflow.log_metrics({"rows": meta["rows"], "accuracy": meta["accuracy"], "tree_accuracy": meta["tree_accuracy"],
                            "subsets": len(found)})
        mlflow.set_tags({"report_run": meta["run"],
                         "over_relied": "; ".join(f"{s['key']}: {','.join(s['over_relied'])}" for s in found)})
        mlflow.log_artifacts(out_dir, "report")
        return run.info.run_id


def handshake_report(rows: HandshakeRows, settings: HandshakeSettings, share: float, seed: int) -> dict:
    """ALICCS §5.1 for the handshake tree: fitted on the training nodes, accuracy on each held-out
    node (mean, worst); the same for every feature subset (which features carry the signal)."""
    train_nodes, test_nodes = split_nodes(rows.node, share, seed)
    tr, te = rows.where(np.isin(rows.node, train_nodes)), rows.where(np.isin(rows.node, test_nodes))
    out = {"train_nodes": list(train_nodes), "test_nodes": list(test_nodes), "n_train": len(tr), "n_test": len(te),
           "subsets": {}}
    for sub in handshake.subsets(list(HANDSHAKE_FEATURES)):
        cols = [HANDSHAKE_FEATURES.index(f) for f in sub]
        clf, tree = handshake.fit(tr.x[:, cols], tr.y, settings, sub)
        pred = clf.predict(te.x[:, cols]).astype(np.int64)     # = the integer tree's leaf (module docstring)
        per_node = {str(n): float(np.mean(pred[te.node == n] == te.y[te.node == n])) for n in test_nodes}
        out["subsets"][",".join(sub)] = {
            "accuracy": float(np.mean(pred == te.y)) if len(te) else math.nan,
            "node_mean": float(np.mean(list(per_node.values()))) if per_node else math.nan,
            "node_worst": float(min(per_node.values())) if per_node else math.nan,
            "cell_recall": float(np.mean(pred[te.y == 0] == 0)) if (te.y == 0).any() else math.nan,
            "wifi_recall": float(np.mean(pred[te.y == 1] == 1)) if (te.y == 1).any() else math.nan,
            "leaves": int(sum(1 for f in tree.feature if f == handshake.LEAF)), "depth": tree.depth()}
    return out


def run_handshake(spark, cfg: Config, window: Window, promote: bool = True, features=None) -> dict:
    """`ccs handshake`: the report on held-out nodes (distill/handshake.py), then the deployed tree
    fitted on every labelled node of the window over `features` (default handshake.features),
    registered as `<name>-handshake`; alias champion when `promote` and it beats always answering
    the majority type on the held-out nodes."""
    hs = cfg.settings.handshake
    if features:
        hs = replace(hs, features=tuple(features))
    ev = cfg.settings.model.evaluate
    rows = handshake.window_rows(spark, cfg, window)
    if len(rows) == 0 or len(set(rows.y.tolist())) < 2:
        raise ValueError(f"no labelled connections of both types in {window.name}")
    rep = handshake_report(rows, hs, ev.share, ev.seed)
    te = rows.where(np.isin(rows.node, rep["test_nodes"]))
    rep["majority_accuracy"] = float(max(te.y.mean(), 1 - te.y.mean())) if len(te) else math.nan
    full = rep["subsets"][",".join(f for f in HANDSHAKE_FEATURES if f in hs.features)]
    useful = bool(full["accuracy"] > rep["majority_accuracy"])
    cols = [HANDSHAKE_FEATURES.index(f) for f in hs.features]
    clf, tree = handshake.fit(rows.x[:, cols], rows.y, hs, hs.features)
    reg = handshake.log_handshake(cfg, hs, clf, tree, rep, full, window.name, promote and useful)
    return {"window": window.name, "rows": len(rows), "features": list(hs.features), "nodes": len(tree),
            "depth": tree.depth(), "heldout": full, "majority_accuracy": rep["majority_accuracy"],
            "beats_majority": useful, "subsets": rep["subsets"], "registered": reg}
