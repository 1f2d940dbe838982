"""The skeptic's baselines of the emulation (evaluation/emulate.py, issue 55) on hand-made inputs:
Disco's tree trained on the network-type label (`disco_type`), and the hourly table with
gradient-boosted trees in the champion's place (`gbdt`), whose declined predictions stay declined
and count against purity as the export counts them."""
from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F

from ccselect.contract import FEATURES
from ccselect.lake import table_path
from ccselect.settings import EmulateSettings
from ccselect.evaluation import emulate

H0, H1 = "2026-11-01T00", "2026-11-01T01"
P = EmulateSettings(window_minutes=60, train_hours=1, tree_min_leaf=5, tree_depth=4)


def _features(wifi: bool, i: int) -> list[int]:
    """Wi-Fi: MSS 1460, a window of 65,535; cellular: MSS 1400, 65,536 (a bit apart, as
    sim/stacks.py's rules put them); the other features alike, with a little spread."""
    f = {name: 1000 + (i % 7) for name in FEATURES}
    f["mss_bytes"], f["init_snd_wnd_bytes"] = (1460, 65535) if wifi else (1400, 65536)
    return [f[name] for name in FEATURES]


def _sessions(spark, rows):
    """`emulate.sessions`-shaped rows: (conn_id, hour, in_range, ip, type_label)."""
    out = [(cid, "n1", hour, in_range, ip, "1.1.1.0/24" if ip.startswith("1.") else "2.2.2.0/24", lab,
            *_features(lab == 1 if lab is not None else True, k))
           for k, (cid, hour, in_range, ip, lab) in enumerate(rows)]
    schema = ("conn_id string, node_id string, hour string, in_range boolean, client_ip string, prefix string, "
              "type_label int, " + ", ".join(f"{c} long" for c in FEATURES))
    return spark.createDataFrame(out, schema)


def _train_rows(n=40):
    """Labelled training sessions of hour H0: half Wi-Fi in 1.1.1.0/24, half 4G in 2.2.2.0/24."""
    return [(f"t{i}", H0, False, f"1.1.1.{i % 200 + 1}" if i % 2 else f"2.2.2.{i % 200 + 1}", i % 2) for i in range(n)]


def test_disco_type_learns_the_type_from_the_handshake_and_maps_it_as_aliccs(spark):
    train = _sessions(spark, _train_rows())
    est = _sessions(spark, [("w", H1, True, "1.1.1.9", 1), ("c", H1, True, "2.2.2.9", 0)])
    choice, info = emulate.disco_type_policy(train, est, P)
    got = {r["conn_id"]: r["choice"] for r in choice.collect()}
    assert got == {"w": "cubic", "c": "bbr"}, got
    assert info == {"train_rows": 40, "share_wifi_labels": 0.5}
    # one type only among the labels: nothing to learn, the default CC
    only_wifi = _sessions(spark, [r for r in _train_rows() if r[4] == 1])
    choice, info = emulate.disco_type_policy(only_wifi, est, P)
    assert {r["choice"] for r in choice.collect()} == {P.default_cc} and info == {"train_rows": 20}


def _write(spark, cfg, name, rows, schema):
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(table_path(cfg, name))


def test_gbdt_table_swaps_the_classifier_and_keeps_the_declines(spark, cfg):
    """The table of hour H0 for the sessions of H1: 1.1.1.0/24's connections are Wi-Fi by their
    features, so GBDT sends the prefix to CUBIC though the champion's predictions said BBR; in
    2.2.2.0/24 most source predictions were declined (`ood`): they count against the prefix's
    purity, so it gets no entry and keeps the default CC, as the export would ship it."""
    silver = [(f"s{i}", "n1", H0, *_features(i < 12, i)) for i in range(24)]
    _write(spark, cfg, "silver.connections", silver,
           "conn_id string, node_id string, hour string, " + ", ".join(f"{c} long" for c in FEATURES))
    preds = ([(f"s{i}", "n1", H0, f"1.1.1.{i + 1}", 5, "bbr", "model", "cubic") for i in range(12)]
             + [(f"s{i}", "n1", H0, f"2.2.2.{i + 1}", 5, "bbr", "model" if i < 18 else "ood", "cubic")
                for i in range(12, 24)])
    _write(spark, cfg, "gold.predictions", preds,
           "conn_id string, node_id string, hour string, client_ip string, requests long, cc string, "
           "decision string, default_cc string")
    train = _sessions(spark, _train_rows())
    est = _sessions(spark, [("w", H1, True, "1.1.1.99", 1), ("c", H1, True, "2.2.2.99", 0)])
    p = replace(P, table_lag_hours=1)
    choice, info = emulate.gbdt_table_policy(spark, cfg, train, est, p)
    got = {r["conn_id"]: r["choice"] for r in choice.collect()}
    assert got == {"w": "cubic", "c": p.default_cc}, got
    assert info["train_rows"] == 40
    # the champion's own table from the same predictions: 1.1.1.0/24 → BBR (its decisions), and
    # 2.2.2.0/24 the same as GBDT's: declined
    looked = emulate.table_lookup(spark, cfg, est, p)
    champion = {r["conn_id"]: r["_ecc"] for r in looked.collect()}
    assert champion == {"w": "bbr", "c": None}, champion
    assert est.where(F.col("in_range")).count() == 2
