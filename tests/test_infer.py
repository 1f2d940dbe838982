"""`ccs infer`: the ALICCS §4.2 decision on hand-made boundary rows (whole frames), and the job
end to end on a copy of the small lake with a real registered champion: gold.predictions has
exactly PREDICTION_COLS, one row per silver connection, probabilities equal to a direct torch
computation calibrated with the champion's temperature, the out-of-domain guard and the fallback
rule applied, and a re-run replaces rather than appends."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccs_testing import copy_lake
from ccselect.hours import Window

pytestmark = pytest.mark.filterwarnings("ignore")


def test_decide_at_the_thresholds(spark):
    from ccselect.settings import InferSettings
    from ccselect.models.infer import decide
    p = InferSettings(wifi_threshold=0.8, cell_threshold=0.6, default_cc="reno", wifi_cc="cubic", cell_cc="bbr")
    probs = [None, 0.0, 0.39, 0.4, 0.41, 0.4999, 0.5, 0.79, 0.8, 0.81, 1.0]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(probs)], "id int, p_wifi double")
    expected = spark.createDataFrame([
        (0, None, None, None, "fallback", "reno", "reno"),
        (1, 0.0, 1.0, "cell", "model", "bbr", "reno"),
        (2, 0.39, 0.61, "cell", "model", "bbr", "reno"),
        (3, 0.4, 0.6, "cell", "model", "bbr", "reno"),          # P(4G) = 0.6: trusted (≥)
        (4, 0.41, 0.59, "cell", "fallback", "reno", "reno"),    # P(4G) < 0.6: default CC
        (5, 0.4999, 0.5001, "cell", "fallback", "reno", "reno"),
        (6, 0.5, 0.5, "wifi", "fallback", "reno", "reno"),      # argmax tie → Wi-Fi, not trusted
        (7, 0.79, 0.21, "wifi", "fallback", "reno", "reno"),
        (8, 0.8, 0.2, "wifi", "model", "cubic", "reno"),        # P(Wi-Fi) = 0.8: trusted (≥)
        (9, 0.81, 0.19, "wifi", "model", "cubic", "reno"),
        (10, 1.0, 0.0, "wifi", "model", "cubic", "reno"),
    ], "id int, p_wifi double, p_cell double, pred_net_type string, decision string, cc string, default_cc string")
    got = decide(df, p).select(*expected.columns)
    assertDataFrameEqual(got, expected, rtol=1e-12, atol=1e-12)


def test_standardize_matches_spark_scaling(spark):
    """The Arrow side's standardization equals features.scaling.transform (log1p, z-score,
    std 0 → 1, negatives clipped at 0)."""
    from ccselect.features.scaling import FeatureStats, transform
    from ccselect.models.infer import standardize
    feats = ("a", "b", "c")
    stats = FeatureStats(feats, (1.0, 2.0, 0.5), (0.5, 0.0, 2.0), 3, "w")
    rows = [(0, 10, -3), (1460, 0, 7), (3, 2**40, 0)]
    df = spark.createDataFrame(rows, "a long, b long, c long")
    want = np.array(transform(df, stats).select("features").toPandas()["features"].tolist(), dtype=np.float32)
    cols = [np.array([r[j] for r in rows], dtype=np.int64) for j in range(3)]
    np.testing.assert_allclose(standardize(cols, stats.mean, stats.std), want, rtol=1e-6)


def _predictions(spark, cfg):
    from ccselect.lake import table_path
    return spark.read.format("delta").load(table_path(cfg, "gold.predictions"))


def test_ccs_infer_writes_predictions(spark, lake_with_champion):
    import torch
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    from ccselect.contract import PREDICTION_COLS
    from ccselect.lake import connections_in
    from ccselect.features.scaling import transform
    from ccselect.models import registry
    from ccselect.models.ood import calibrate
    lake, cfg, version = lake_with_champion
    runner = CliRunner()
    args = ["infer", "--hours", f"{lake.lo}..{lake.hi}", "--json", "--config", str(lake.cfg_path)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output + repr(res.exception)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    silver = connections_in(spark, cfg, Window.hours(lake.lo, lake.hi))
    pred = _predictions(spark, cfg)
    assert tuple(pred.columns) == PREDICTION_COLS
    n_silver = silver.count()
    assert out["rows"] == n_silver == pred.count()
    # one row per silver connection, same keys and pass-through columns
    keys = ["conn_id", "client_ip", "family", "prefix16", "prefix24", "prefix48", "prefix64", "ug_id",
            "requests", "node_id", "hour"]
    assertDataFrameEqual(pred.select(*keys), silver.select(*keys))
    assert pred.select("conn_id", "node_id", "hour").distinct().count() == n_silver

    # probabilities equal a direct torch computation over Spark-standardized features, calibrated
    champ = registry.load_champion(cfg)
    assert champ.version == version == out["model_version"]
    assert champ.guard is not None and champ.temperature == out["temperature"]
    sample = transform(silver.orderBy("conn_id").limit(200), champ.stats).select("conn_id", "features").toPandas()
    with torch.no_grad():
        direct = champ.model(torch.as_tensor(np.stack(sample["features"]).astype(np.float32)))[:, 1].double().numpy()
    got = pred.where(F.col("conn_id").isin(sample["conn_id"].tolist())).select("conn_id", "p_wifi").toPandas()
    got = got.set_index("conn_id").loc[sample["conn_id"], "p_wifi"].to_numpy()
    np.testing.assert_allclose(got, calibrate(direct, champ.temperature), rtol=1e-5, atol=1e-6)

    # the guard and the fallback rule over every row, and the constants
    p = cfg.settings.infer
    z = transform(silver, champ.stats).select("conn_id", "node_id", "features").toPandas()
    flags = dict(zip(zip(z["conn_id"], z["node_id"]),
                     champ.guard.flags(np.stack(z["features"]).astype(np.float32), p.ood_quantile)))
    pdf = pred.select("conn_id", "node_id", "p_wifi", "p_cell", "pred_net_type", "decision", "cc", "default_cc", "model_name",
                      "model_version").toPandas()
    ood = np.array([flags[k] for k in zip(pdf["conn_id"], pdf["node_id"])], dtype=bool)
    wifi = pdf["p_wifi"] >= 0.5
    # the minimum-evidence rule (issue 57) before the guard
    from ccselect.models.infer import EVIDENCE_COLS
    ev = silver.select("conn_id", "node_id", *EVIDENCE_COLS).toPandas()
    ev = pdf[["conn_id", "node_id"]].merge(ev, on=["conn_id", "node_id"], how="left")
    thin = ((ev["data_segs_out"] < p.min_data_segs) | (ev["bytes_acked"] < p.min_bytes_acked)
            | (ev["duration_us"] < p.min_duration_us)).to_numpy()
    assert 0 < thin.sum() < 0.05 * len(thin), thin.sum()
    trusted = np.where(wifi, pdf["p_wifi"] >= p.wifi_threshold, pdf["p_cell"] >= p.cell_threshold) & ~ood & ~thin
    expect = pd.DataFrame({
        "p_cell": 1.0 - pdf["p_wifi"], "pred_net_type": np.where(wifi, "wifi", "cell"),
        "decision": np.where(thin, "evidence", np.where(ood, "ood", np.where(trusted, "model", "fallback"))),
        "cc": np.where(trusted, np.where(wifi, p.wifi_cc, p.cell_cc), p.default_cc),
        "default_cc": p.default_cc, "model_name": champ.name, "model_version": version})
    pd.testing.assert_frame_equal(pdf[expect.columns], expect, check_dtype=False)
    assert {"model", "fallback"} <= set(pdf["decision"]), "the quick model should leave some rows untrusted"
    assert out["ood_share"] == pytest.approx(ood.mean()) and ood.mean() <= 0.05
    assert out["decisions"] == {f"{d}/{c}": int(n) for (d, c), n in pdf.groupby(["decision", "cc"]).size().items()}

    # idempotent: a second run replaces the same partitions (same rows, no duplicates)
    before = pred.toPandas().sort_values("conn_id").reset_index(drop=True)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    after = _predictions(spark, cfg).toPandas().sort_values("conn_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(after, before)


def test_ccs_infer_without_champion_fails(tmp_path, small_lake):
    from typer.testing import CliRunner

    from ccselect.app.cli import app
    lake = copy_lake(small_lake, tmp_path / "lake")
    res = CliRunner().invoke(app, ["infer", "--hours", f"{lake.lo}..{lake.hi}", "--config", str(lake.cfg_path)])
    assert res.exit_code == 1 and "champion" in res.output


def _sorted(df):
    return df.toPandas().sort_values(["node_id", "hour", "conn_id"]).reset_index(drop=True)


def test_arrow_engine_matches_the_spark_job(spark, lake_with_champion, monkeypatch):
    """The driver-side engine (models/infer_arrow.py) and the Spark job on the same silver, with
    the same champion, write the same gold.predictions: every column but the probabilities
    bit-identical, the probabilities within 1e-5. Each replaces the other's files (one row per
    connection after either), Spark reads the table the engine committed (also from a delta-rs
    checkpoint), and a run that fails before its commit leaves the table as it was."""
    from deltalake import DeltaTable

    from ccselect.contract import PREDICTION_COLS
    from ccselect.lake import table_path
    from ccselect.models import infer, infer_arrow, registry
    lake, cfg, version = lake_with_champion
    champ = registry.load_champion(cfg)
    path = table_path(cfg, "gold.predictions")
    by_spark = infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=champ, engine="spark")
    spark_rows = _sorted(_predictions(spark, cfg))
    by_arrow = infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=champ, engine="arrow")
    arrow_rows = _sorted(_predictions(spark, cfg))
    assert (by_spark["engine"], by_arrow["engine"]) == ("spark", "arrow")
    assert by_arrow["rows"] == by_spark["rows"] == len(arrow_rows) == len(spark_rows) > 0
    assert by_arrow["partitions"] == by_spark["partitions"]
    exact = [c for c in PREDICTION_COLS if c not in ("p_wifi", "p_cell")]
    pd.testing.assert_frame_equal(arrow_rows[exact], spark_rows[exact])
    np.testing.assert_allclose(arrow_rows["p_wifi"], spark_rows["p_wifi"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(arrow_rows["p_cell"], spark_rows["p_cell"], rtol=0, atol=1e-5)
    assert by_arrow["decisions"] == by_spark["decisions"] and len(by_arrow["decisions"]) >= 2
    # the minimum-evidence rule (issue 57) in both: its own decision, counted alike
    assert any(k.startswith("evidence/") for k in by_arrow["decisions"]), by_arrow["decisions"]
    assert by_arrow["evidence_share"] == by_spark["evidence_share"] > 0
    assert _predictions(spark, cfg).schema == spark.read.format("delta").load(path).schema

    # a delta-rs checkpoint is read by Spark
    DeltaTable(path).create_checkpoint()
    assert _predictions(spark, cfg).count() == len(arrow_rows)

    # a failure before the commit: the new files are written, the table is not changed
    version_before = DeltaTable(path).version()

    def fail(*a, **k):
        raise OSError("killed before the commit")
    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)
    with pytest.raises(OSError):
        infer_arrow.run(table_path(cfg, "silver.connections"), path, Window.hours(lake.lo, lake.hi), champ, cfg.settings.infer, "fp32")
    monkeypatch.undo()
    assert DeltaTable(path).version() == version_before
    pd.testing.assert_frame_equal(_sorted(_predictions(spark, cfg)), arrow_rows)

    # and back: the Spark job replaces the engine's files
    infer.run(spark, cfg, Window.hours(lake.lo, lake.hi), champion=champ, engine="spark")
    pd.testing.assert_frame_equal(_sorted(_predictions(spark, cfg))[exact], spark_rows[exact])


def test_arrow_engine_refuses_what_it_cannot_read():
    from ccselect.settings import InferSettings
    from ccselect.models import infer_arrow
    assert infer_arrow._local("/data/lake/silver/connections") == "/data/lake/silver/connections"
    with pytest.raises(infer_arrow.Unsupported, match="local filesystem"):
        infer_arrow._local("s3a://bucket/lake/silver/connections")
    with pytest.raises(infer_arrow.Unsupported):
        infer_arrow.run("s3a://bucket/silver", "s3a://bucket/predictions", Window.hours("2026-11-01T00"), None, InferSettings(), "fp32")
    with pytest.raises(ValueError, match="engine"):
        InferSettings(engine="gpu")
