"""ALICCS §5.3's randomized control test (evaluation/abtest.py): the rates, the per-address delta-method
interval, and gold.ab_test written per window."""
from __future__ import annotations

import math

import numpy as np
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.evaluation import abtest
from ccselect.evaluation.abtest import ArmMoments, compare
from ccselect.hours import Window

SILVER = ("conn_id string, client_ip string, ab_treatment boolean, decision string, cc string, ug_id string, "
          "net_type string, play_ms long, rebuffer_ms long, total_retrans long, data_segs_out long, "
          "node_id string, hour string")
POINT_COLS = ("segment_kind", "segment", "metric", "n_control", "n_treatment", "clusters_control",
              "clusters_treatment", "control", "treatment", "rel_change")
REGIONS = np.array(["henan", "guangdong", "qinghai", "beijing"])


# ---- a synthetic fleet with per-address correlation and a known effect ---------------------------

def fleet(seed: int, n_ips: int, rebuffer_x: float = 1.0, retrans_x: float = 1.0,
          henan_retrans_x: float | None = None) -> tuple[dict[str, np.ndarray], dict[tuple[str, str], float]]:
    """Connections of `n_ips` client addresses, half of them (by address) treated. An address has
    a path quality shared by all its connections (geometric count, mean ~2.9) — the correlation the
    interval must respect — and a region and access type; each connection has its own play time
    (30% none), stall noise (Gamma(0.5, 2), mean 1) and segment count. Treatment multiplies the
    expected stall rate by `rebuffer_x` and the loss by `retrans_x` (`henan_retrans_x` in henan).
    Returns the columns and the true relative change per (metric, region or "all"), from the
    potential outcomes of every connection."""
    rng = np.random.default_rng(seed)
    treat_ip = rng.random(n_ips) < 0.5
    quality = rng.lognormal(0.0, 0.6, n_ips)
    region_ip = REGIONS[rng.integers(0, len(REGIONS), n_ips)]
    cell_ip = rng.random(n_ips) < 0.4
    ip = np.repeat(np.arange(n_ips), rng.geometric(0.35, n_ips))
    n, treat, region = len(ip), treat_ip[ip], region_ip[ip]
    play = np.where(rng.random(n) < 0.7, np.round(rng.lognormal(np.log(60_000), 0.8, n)), 0)
    stall = 0.02 * quality[ip] * np.where(cell_ip[ip], 1.5, 1.0)
    rebuffer = np.round(play * stall * np.where(treat, rebuffer_x, 1.0) * rng.gamma(0.5, 2.0, n))
    segs = np.ceil(rng.lognormal(np.log(300), 1.0, n))
    loss = np.minimum(0.02 * quality[ip] ** 1.2, 0.5)
    ret_x = np.where(region == "henan", henan_retrans_x or retrans_x, retrans_x)
    retrans = rng.poisson(segs * loss * np.where(treat, ret_x, 1.0))
    # the cell/wifi label reaches the lake for ~8% of connections (client-reported)
    labelled = rng.random(n) < 0.08
    net_type = np.where(labelled, np.where(cell_ip[ip], np.where(rng.random(n) < 0.5, "4g", "5g"), "wifi"), None)
    cols = {"ip": ip, "ab_treatment": treat, "decision": np.where(treat, "table", "ab_control"), "cc": np.where(treat, "bbr", "cubic"),
            "ug_id": np.char.add(region.astype(str), "-AS4134"), "net_type": net_type, "play_ms": play.astype(np.int64),
            "rebuffer_ms": rebuffer.astype(np.int64), "total_retrans": retrans.astype(np.int64),
            "data_segs_out": (segs + retrans).astype(np.int64), "node_id": np.full(n, "n1"),
            "hour": np.where(np.arange(n) % 2 == 0, "2026-11-01T00", "2026-11-01T01")}
    truth = {}
    for seg in ("all", *REGIONS):
        s = np.ones(n, bool) if seg == "all" else region == seg
        # rebuffer: E[rebuffer | play] = play · stall · multiplier for every connection
        truth[("rebuffer_rate", seg)] = rebuffer_x - 1
        lt = loss[s] * ret_x[s]
        truth[("retrans_rate", seg)] = (np.sum(segs[s] * lt) / np.sum(segs[s] * (1 + lt))) / \
                                       (np.sum(segs[s] * loss[s]) / np.sum(segs[s] * (1 + loss[s]))) - 1
    return cols, truth


def frame(spark, cols: dict[str, np.ndarray]):
    """The fleet as silver.connections rows (address i → 10.x.y.z)."""
    import pandas as pd
    ip = cols["ip"]
    pdf = pd.DataFrame({k: v for k, v in cols.items() if k != "ip"}).astype({"net_type": object})
    pdf.insert(0, "client_ip", [f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}" for i in ip])
    pdf.insert(0, "conn_id", [f"c{i}" for i in range(len(ip))])
    return spark.createDataFrame(pdf, SILVER)


def numpy_moments(cols: dict[str, np.ndarray], metric: str, treated: bool, clustered: bool = True,
                  select: np.ndarray | None = None) -> ArmMoments:
    """The same cluster-sum moments `arm_moments` computes, in numpy (clusters: addresses, or
    every connection its own cluster when not `clustered`)."""
    y_col, x_col = abtest.METRICS[metric]
    y, x = cols[y_col].astype(float), cols[x_col].astype(float)
    sel = (x > 0) & (cols["ab_treatment"] == treated) & (True if select is None else select)
    key = cols["ip"] if clustered else np.arange(len(x))
    ys, xs = np.bincount(key[sel], y[sel]), np.bincount(key[sel], x[sel])
    used = np.bincount(key[sel]) > 0
    return ArmMoments.of_clusters(ys[used], xs[used], int(sel.sum()))


# ---- the estimator ------------------------------------------------------------------------------

def test_compare_by_hand():
    # control clusters (y, x): (1, 10), (3, 10) → R = 0.2, residuals −1, +1 → Var = 2 / (2·1·10²) = 0.01
    # treatment: (1, 10), (2, 10), (3, 10), (2, 10) → R = 0.2, residuals −1, 0, 1, 0 → Var = 2 / (4·3·10²)
    c = ArmMoments.of_clusters([1, 3], [10, 10])
    t = ArmMoments.of_clusters([1, 2, 3, 2], [10, 10, 10, 10])
    assert c.ratio == pytest.approx(0.2) and c.ratio_var() == pytest.approx(0.01), "control ratio and variance"
    assert t.ratio_var() == pytest.approx(2 / 1200), "treatment variance"
    r = compare(c, t, 0.95, min_clusters=2)
    se = math.sqrt(0.01 / 0.04 + (2 / 1200) / 0.04)
    assert r.rel_change == pytest.approx(0.0) and r.p_value == pytest.approx(1.0), "equal rates: no change"
    assert (r.ci_lo, r.ci_hi) == pytest.approx((math.exp(-1.959964 * se) - 1, math.exp(1.959964 * se) - 1), rel=1e-6)
    assert r.significant is False
    few = compare(c, t, 0.95, min_clusters=3)
    assert (few.rel_change, few.ci_lo, few.p_value) == (0.0, None, None), "below min_clusters: rates, no interval"
    zero = compare(ArmMoments.of_clusters([0, 0], [10, 10]), t, 0.95, 2)
    assert (zero.control, zero.rel_change, zero.ci_lo) == (0.0, None, None), "a zero control rate has no relative change"


def test_false_positive_rate_near_nominal_and_clustering_matters():
    """300 no-effect fleets in numpy through the same `compare`: the per-address interval rejects
    about 5% of them; treating connections as independent (ignoring the shared path of one address)
    rejects far more for the retransmission rate, whose loss is a property of the address."""
    reps, rejected, naive = 300, {m: 0 for m in abtest.METRICS}, {m: 0 for m in abtest.METRICS}
    for s in range(reps):
        cols, _ = fleet(1000 + s, 3000)
        for m in abtest.METRICS:
            rejected[m] += bool(compare(numpy_moments(cols, m, False), numpy_moments(cols, m, True)).significant)
            naive[m] += bool(compare(numpy_moments(cols, m, False, clustered=False),
                                     numpy_moments(cols, m, True, clustered=False)).significant)
    for m in abtest.METRICS:
        assert 0.02 <= rejected[m] / reps <= 0.09, f"{m}: clustered false-positive rate {rejected[m] / reps}"
    assert naive["retrans_rate"] / reps > 0.12, f"naive retrans false-positive rate {naive['retrans_rate'] / reps}"


# ---- the Spark transforms -----------------------------------------------------------------------

def test_point_estimates_by_hand(spark):
    rows = [
        # conn, ip, treated, decision, cc, ug_id, net_type, play, rebuffer, retrans, segs_out
        ("a", "1.1.1.1", False, "ab_control", "cubic", "henan-AS4134", "wifi", 1000, 100, 5, 100),
        ("b", "1.1.1.1", False, "ab_control", "cubic", "henan-AS4134", None, 3000, 100, 15, 100),
        ("c", "1.1.1.2", False, "ab_control", "cubic", None, "4g", 0, 0, 10, 200),        # no playback; no region
        ("d", "2.2.2.1", True, "table", "bbr", "henan-AS4134", "5g", 2000, 20, 2, 100),
        ("e", "2.2.2.2", True, "default", "cubic", "qinghai-AS9808", "WIFI", 2000, 180, 0, 0),  # nothing sent
        ("f", "3.3.3.3", None, "table", "bbr", "henan-AS4134", "wifi", 5000, 5000, 50, 50),   # no arm: left out
        ("g", "2.2.2.3", True, "table", "bbr", "qinghai-AS9808", None, None, None, 1, 50),    # no QoE beacon
    ]
    df = spark.createDataFrame([(*r, "n1", "2026-11-01T00") for r in rows], SILVER)
    got = abtest.analyse(df, 0.95, min_clusters=2).select(*POINT_COLS)
    expected = spark.createDataFrame([
        # kind, segment, metric, n_c, n_t, ip_c, ip_t, control, treatment, rel
        ("all", "all", "rebuffer_rate", 2, 2, 1, 2, 200 / 4000, 200 / 4000, 0.0),
        ("all", "all", "retrans_rate", 3, 2, 2, 2, 30 / 400, 3 / 150, (3 / 150) / (30 / 400) - 1),
        ("net_type", "cell", "rebuffer_rate", 0, 1, 0, 1, None, 20 / 2000, None),
        ("net_type", "cell", "retrans_rate", 1, 1, 1, 1, 10 / 200, 2 / 100, (2 / 100) / (10 / 200) - 1),
        ("net_type", "wifi", "rebuffer_rate", 1, 1, 1, 1, 100 / 1000, 180 / 2000, (180 / 2000) / (100 / 1000) - 1),
        ("net_type", "wifi", "retrans_rate", 1, 0, 1, 0, 5 / 100, None, None),
        ("region", "henan", "rebuffer_rate", 2, 1, 1, 1, 200 / 4000, 20 / 2000, (20 / 2000) / (200 / 4000) - 1),
        ("region", "henan", "retrans_rate", 2, 1, 1, 1, 20 / 200, 2 / 100, (2 / 100) / (20 / 200) - 1),
        ("region", "qinghai", "rebuffer_rate", 0, 1, 0, 1, None, 180 / 2000, None),
        ("region", "qinghai", "retrans_rate", 0, 1, 0, 1, None, 1 / 50, None),
    ], got.schema)
    assertDataFrameEqual(got, expected, rtol=1e-12)
    # the moments behind them: exact sums over per-address sums (1.1.1.1 holds a and b)
    m = abtest.arm_moments(abtest.metric_rows(df)).where("segment_kind = 'all' AND metric = 'rebuffer_rate'")
    assertDataFrameEqual(m.select("arm", "conns", "clusters", *[F.col(c).cast("double") for c in ("sy", "sx", "syy", "sxx", "sxy")]),
                         spark.createDataFrame([("control", 2, 1, 200.0, 4000.0, 200.0 ** 2, 4000.0 ** 2, 200.0 * 4000),
                                                ("treatment", 2, 2, 200.0, 4000.0, 20.0 ** 2 + 180 ** 2, 2 * 2000.0 ** 2,
                                                 2000.0 * 20 + 2000 * 180)],
                                               "arm string, conns long, clusters long, sy double, sx double, syy double, sxx double, sxy double"))


@pytest.fixture(scope="module")
def planted(spark):
    """24,000 addresses (~69k connections): treatment rebuffer ×0.90, retrans ×0.60 (×0.40 in henan)."""
    cols, truth = fleet(7, 24_000, rebuffer_x=0.90, retrans_x=0.60, henan_retrans_x=0.40)
    res = abtest.analyse(frame(spark, cols), 0.95, 30)
    return cols, truth, {(r["segment_kind"], r["segment"], r["metric"]): r.asDict() for r in res.collect()}


def test_planted_effect_recovered(planted):
    cols, truth, res = planted
    for metric in abtest.METRICS:
        r = res[("all", "all", metric)]
        assert r["ci_lo"] <= truth[(metric, "all")] <= r["ci_hi"], f"{metric}: truth {truth[(metric, 'all')]} outside {r}"
        assert r["ci_hi"] < 0 and r["significant"] and r["p_value"] < 0.05, f"{metric}: the effect is not detected: {r}"
    # per region (Fig. 14 right): every region's retransmission interval covers its own truth, and
    # henan's stronger effect is told apart from the others'
    for region in REGIONS:
        r = res[("region", region, "retrans_rate")]
        assert r["ci_lo"] <= truth[("retrans_rate", region)] <= r["ci_hi"], f"{region}: {truth[('retrans_rate', region)]} vs {r}"
    others = max(res[("region", g, "retrans_rate")]["ci_hi"] for g in REGIONS if g != "henan")
    assert res[("region", "henan", "retrans_rate")]["ci_hi"] < others - 0.1


def test_segments_match_numpy(planted):
    """Every row's counts and rates equal the same sums done in numpy; the network-type rows count
    only the client-labelled connections (4g and 5g together as cell)."""
    cols, _, res = planted
    region = np.char.partition(cols["ug_id"].astype(str), "-AS")[:, 0]
    net = np.array([{"wifi": "wifi", "4g": "cell", "5g": "cell"}.get(v) for v in cols["net_type"]], dtype=object)
    segs = {("all", "all"): None, **{("region", g): region == g for g in REGIONS},
            **{("net_type", t): net == t for t in ("wifi", "cell")}}
    assert {k[:2] for k in res} == set(segs), "one row per segment and metric, no other"
    for (kind, seg), sel in segs.items():
        for metric in abtest.METRICS:
            c, t = (numpy_moments(cols, metric, arm, select=sel) for arm in (False, True))
            want = compare(c, t, 0.95, 30)
            got = res[(kind, seg, metric)]
            assert (got["n_control"], got["n_treatment"], got["clusters_control"], got["clusters_treatment"]) == \
                (c.conns, t.conns, c.clusters, t.clusters), f"{kind}/{seg}/{metric} counts"
            for k in ("control", "treatment", "rel_change", "ci_lo", "ci_hi", "p_value"):
                assert got[k] == pytest.approx(getattr(want, k), rel=1e-9), f"{kind}/{seg}/{metric} {k}"
    labelled = sum(res[("net_type", t, "retrans_rate")]["n_control"] + res[("net_type", t, "retrans_rate")]["n_treatment"]
                   for t in ("wifi", "cell"))
    assert 0.06 < labelled / len(cols["ip"]) < 0.10, "only the client-labelled connections have a network type"


def test_no_effect_zero_inside(spark):
    cols, truth = fleet(8, 12_000)
    res = {(r["segment_kind"], r["segment"], r["metric"]): r for r in abtest.analyse(frame(spark, cols)).collect()}
    for metric in abtest.METRICS:
        r = res[("all", "all", metric)]
        assert truth[(metric, "all")] == pytest.approx(0.0)
        assert r["ci_lo"] < 0 < r["ci_hi"] and not r["significant"], f"{metric}: {r}"


# ---- the job: gold.ab_test per window -----------------------------------------------------------

def test_run_writes_window_and_rerun_replaces(spark, cfg):
    from ccselect.lake import table_path
    cols, _ = fleet(9, 3_000, rebuffer_x=0.9, retrans_x=0.6)
    frame(spark, cols).write.format("delta").partitionBy("node_id", "hour").save(table_path(cfg, "silver.connections"))
    first = abtest.run(spark, cfg, Window.hours("2026-11-01T01"))
    table = lambda: spark.read.format("delta").load(table_path(cfg, "gold.ab_test"))  # noqa: E731
    before = table().collect()
    again = abtest.run(spark, cfg, Window.hours("2026-11-01T01"))
    assert first["rows"] == again["rows"] == len(before) == len(first["results"]), "rows written are the rows read back"
    assertDataFrameEqual(table(), before)  # a re-run replaces its window: same rows, no duplicates
    assert {r["window"] for r in before} == {"2026-11-01T01..2026-11-01T01"}
    assert first["assignment"]["control_logged_ab_control"] == 1.0 and first["assignment"]["treatment_logged_ab_control"] == 0.0
    # the window reads only its own hours (the fleet's connections alternate between 00 and 01)
    n = {r["metric"]: r["n_control"] + r["n_treatment"] for r in first["results"] if r["segment_kind"] == "all"}
    in_hour = cols["hour"] == "2026-11-01T01"
    assert n == {"rebuffer_rate": int((in_hour & (cols["play_ms"] > 0)).sum()),
                 "retrans_rate": int((in_hour & (cols["data_segs_out"] > 0)).sum())}
