"""The simulator's statistics against the papers' observations (CALIBRATION.md). These read
the ground truth on purpose: they check the simulator, not a model."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from ccselect.sim import physics, stats
from ccselect.sim.fleet import simulate
from ccselect.sim.params import SimParams
from ccselect.sim.world import World

PARAMS = SimParams(nodes=12, hours=12, conns_per_node_hour=900, seed=7)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("statfleet"))
    simulate(PARAMS, out, workers=2, progress=False)
    return out, stats.load_joined(out)


def test_busy_prefixes_are_pure_as_in_fig7(fleet):
    """ALICCS Fig. 7: among the busiest /24s ~90% have purity above 91%; §3.3: only 8.6% of
    /24s fall below 90%. Sampling noise of an hour's connections lowers measured purity a little."""
    _, df = fleet
    pur = stats.purity_of_busy_prefixes(df, min_conns=30)
    assert len(pur) > 200, "too few busy /24-hours to measure"
    assert 0.80 <= np.mean(pur > 0.91) <= 0.97, f"share of busy /24s above 91% purity: {np.mean(pur > 0.91):.3f}"
    assert np.mean(pur < 0.5 + 1e-9) < 0.02, "a busy /24 should rarely be a coin flip"


def test_wifi_dominates_and_ipv6_is_about_a_third(fleet):
    _, df = fleet
    wifi = (df["net_type"] == "wifi").mean()
    v6 = df["client_ip"].str.contains(":").mean()
    assert 0.55 <= wifi <= 0.85, f"Wi-Fi share {wifi:.3f}"
    assert 0.25 <= v6 <= 0.42, f"IPv6 share {v6:.3f}"


def test_bbr_wins_rebuffer_on_cellular_and_cubic_on_wifi(fleet):
    """ALICCS Observation II, Fig. 3, Table 2 (4G: CUBIC 1.13× BBR's rebuffer)."""
    _, df = fleet
    r = stats.rebuffer_by(df)
    assert r[("cell", "cubic")] > 1.05 * r[("cell", "bbr")], f"4G: cubic {r[('cell', 'cubic')]:.4f} vs bbr {r[('cell', 'bbr')]:.4f}"
    assert r[("wifi", "bbr")] > 1.05 * r[("wifi", "cubic")], f"Wi-Fi: bbr {r[('wifi', 'bbr')]:.4f} vs cubic {r[('wifi', 'cubic')]:.4f}"
    t = stats.retrans_by(df)
    assert t[("cell", "cubic")] > t[("cell", "bbr")], "4G: CUBIC retransmits more than BBR (Table 2: 1.41×)"



def test_cellular_retransmits_more_and_more_so_on_ipv6(fleet):
    """ALICCS §4.2: under today's CUBIC, cellular/Wi-Fi mean retransmission ratio is 2.1× on
    IPv4 and 2.9× on IPv6."""
    _, df = fleet
    cubic = df.filter(pl.col("cc") == "cubic").with_columns(v6=pl.col("client_ip").str.contains(":"),
                                                           cell=pl.col("net_type") != "wifi")
    g = {(v6, cell): r for v6, cell, r in cubic.group_by("v6", "cell").agg(
        pl.col("total_retrans").sum() / pl.col("data_segs_out").sum()).iter_rows()}
    v4, v6 = g[(False, True)] / g[(False, False)], g[(True, True)] / g[(True, False)]
    assert 1.6 <= v4 <= 3.2, f"IPv4 cellular/Wi-Fi retransmission ratio {v4:.2f}"
    assert v6 > v4 and v6 <= 4.5, f"IPv6 ratio {v6:.2f} should exceed IPv4's {v4:.2f}"


def test_bbr_does_not_win_everywhere(fleet):
    """Superiority varies by region and day (ALICCS Figs. 1, 2): in a real share of cellular
    prefixes CUBIC's expected rebuffer is the lower one."""
    _, df = fleet
    per = (df.filter(pl.col("net_type") != "wifi").group_by("prefix")
           .agg(c=pl.col("exp_rebuffer_cubic").mean(), b=pl.col("exp_rebuffer_bbr").mean(), n=pl.len())
           .filter(pl.col("n") >= 20))
    cubic_better = (per["c"] < per["b"]).mean()
    assert 0.03 <= cubic_better <= 0.6, f"share of cellular prefixes where CUBIC wins: {cubic_better:.3f}"


def test_rate_limiting_collapses_cubic_but_not_bbr(fleet):
    """ALICCS Observation III: under the 4G token bucket CUBIC's throughput collapses (8728 →
    1472 kbps) and its retransmissions surge (×73) while BBR copes."""
    _, df = fleet
    p = stats.policer_effect(df)
    assert p["cubic_policed_goodput_kbps"] < 0.35 * p["cubic_free_goodput_kbps"], p
    assert p["cubic_policed_retrans"] > 10 * p["cubic_free_retrans"], p
    assert p["bbr_policed_goodput_kbps"] > 1.2 * p["cubic_policed_goodput_kbps"], p
    assert p["bbr_policed_retrans"] < 0.3 * p["cubic_policed_retrans"], p


def test_labelled_share_is_5_to_10_percent_from_one_app(fleet):
    out, _ = fleet
    share = stats.labelled_share(out)
    assert 0.05 <= share <= 0.10, f"labelled share {share:.3f}"
    acc = pl.scan_ndjson(f"{out}/access/*/*.jsonl").filter(pl.col("net_type").is_not_null())
    services = acc.select(pl.col("service").unique()).collect()["service"].to_list()
    assert services == ["video"], f"labels come from one app only, got {services}"
    labelled_nodes = acc.select(pl.col("node_id").unique()).collect().height
    assert labelled_nodes < PARAMS.nodes, "labels should come from a subset of nodes"


def test_labels_agree_with_the_truth(fleet):
    out, df = fleet
    acc = (pl.scan_ndjson(f"{out}/access/*/*.jsonl").filter(pl.col("net_type").is_not_null())
           .select("conn_id", pl.col("net_type").alias("label")).collect())
    j = acc.join(df.select("conn_id", "net_type"), on="conn_id")
    assert (j["label"] == j["net_type"]).all(), "a client label disagrees with the connection's network"


def test_plain_classifier_loses_accuracy_across_nodes(fleet):
    """ALICCS §3.1, Fig. 5: trained on 30% of nodes, a plain classifier's worst held-out node
    is at least 3 points below its training accuracy."""
    out, _ = fleet
    r = stats.cross_node_accuracy(out, train_share=0.3, seed=0)
    assert r["train_accuracy"] > 0.9, r
    assert r["worst"] <= r["train_accuracy"] - 0.03, f"worst held-out {r['worst']:.3f} vs train {r['train_accuracy']:.3f}"
    assert r["mean"] > 0.75, "the features must still carry the network type"


def test_cellular_rtt_and_variation_exceed_wifi(fleet):
    """BBR-E2E §III: cellular srtt consistently above Wi-Fi, rtt_var larger."""
    _, df = fleet
    g = df.group_by(pl.col("net_type") == "wifi").agg(pl.col("min_srtt_us").median(), pl.col("max_rtt_var_us").median())
    wifi = g.filter(pl.col("net_type")).row(0, named=True)
    cell = g.filter(~pl.col("net_type")).row(0, named=True)
    assert cell["min_srtt_us"] > wifi["min_srtt_us"] and cell["max_rtt_var_us"] > wifi["max_rtt_var_us"]


def test_no_branch_has_broadband_slower_than_its_cellular():
    """BBR-E2E §III: cellular srtt consistently above Wi-Fi — in every provincial branch too. The
    branches still differ (the domain shift), but no branch's broadband median access RTT exceeds
    its 5G median, whatever the seed."""
    med = physics.ACCESS_MEDIAN_MS
    spread = []
    for seed in range(20):
        s = World(SimParams(nodes=2, seed=seed)).access_scale
        assert (med["wifi"] * s[..., 0] <= med["5g"] * s[..., 1] * (1 + 1e-9)).all(), f"seed {seed}"
        spread.append(s.max() / s.min())
    assert np.median(spread) > 4, f"branches should still differ: max/min scale {np.median(spread):.1f}"


def test_dominance_lasts_hours_and_shifts(tmp_path):
    """§3.3: a /24 stays dominated >2 h with ~87% probability, ≥15 h with ~10%."""
    w = World(SimParams(nodes=4, hours=400, conns_per_node_hour=1000, seed=3))
    lengths = []
    for n in range(4):
        seg = w.prefixes(n).segment
        for row in seg:
            _, counts = np.unique(row, return_counts=True)
            lengths.extend(counts[1:-1])  # whole segments only
    lengths = np.array(lengths)
    assert 0.80 <= np.mean(lengths > 2) <= 0.93, np.mean(lengths > 2)
    assert 0.05 <= np.mean(lengths >= 15) <= 0.16, np.mean(lengths >= 15)


def test_month_end_has_less_cellular_and_more_policing(tmp_path):
    """Fig. 9 and Observation III: 4G use falls towards month end; policing strengthens."""
    early = SimParams(nodes=4, hours=3, conns_per_node_hour=800, seed=9, start="2026-11-02T00:00:00")
    late = replace(early, start="2026-11-29T00:00:00")
    res = {}
    for name, p in (("early", early), ("late", late)):
        out = str(tmp_path / name)
        simulate(p, out, workers=2, progress=False)
        t = pl.read_parquet(f"{out}/_truth/connections/*/*.parquet")
        cell = t.filter(pl.col("net_type") != "wifi")
        res[name] = (t.height and cell.height / t.height, cell["policed"].mean())
    assert res["late"][0] < res["early"][0], res
    assert res["late"][1] > 2 * res["early"][1], res


def test_planted_mss_fault_touches_only_mss(tmp_path):
    base = SimParams(nodes=2, hours=2, conns_per_node_hour=800, seed=4)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    simulate(base, a, workers=1, progress=False)
    m = simulate(replace(base, fault_mss_prefix16="auto"), b, workers=1, progress=False)
    ja, jb = stats.load_joined(a), stats.load_joined(b)
    hit = jb.filter(pl.col("fault_mss"))
    assert hit.height > 50 and m["fault_mss_prefix16"], "the fault should touch a busy /16"
    j = ja.join(jb, on="conn_id", suffix="_f")
    changed = [c for c in ("min_rtt_us", "min_rtt_var_us", "init_snd_wnd_bytes", "bytes_acked", "cc")
               if not (j[c] == j[f"{c}_f"]).all()]
    assert changed == [], f"the fault changed {changed}"
    faulty = j.filter(pl.col("fault_mss_f"))
    assert (faulty["mss_bytes"] != faulty["mss_bytes_f"]).mean() > 0.5, "MSS should differ inside the /16"
