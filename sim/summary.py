"""The short summary `make run` ends with: what was simulated, its calibration figures, and
where to look next."""
from __future__ import annotations

import numpy as np

from ccselect.sim import stats


def summarize(out: str, manifest: dict) -> str:
    df = stats.load_joined(out)
    pur = stats.purity_of_busy_prefixes(df)
    reb = stats.rebuffer_by(df)
    pol = stats.policer_effect(df)
    c = manifest["counts"]
    lines = [
        "",
        "== ccselect: main job summary ==",
        f"simulated fleet : {len(manifest['nodes'])} nodes × {manifest['params']['hours']} h from "
        f"{manifest['params']['start']} (seed {manifest['params']['seed']})",
        f"written         : {c['transport']:,} connections, {c['access']:,} requests, {c['qoe']:,} playback sessions",
        f"labelled        : {c['labelled'] / max(1, c['access']):.1%} of requests carry net_type "
        f"(ALICCS: 5-10%), from {len(manifest['labelled_nodes'])} of {len(manifest['nodes'])} nodes",
        f"Wi-Fi share     : {(df['net_type'] == 'wifi').mean():.1%} of connections; "
        f"IPv6 {df['client_ip'].str.contains(':').mean():.1%}",
        f"/24 purity      : {np.mean(pur > 0.91):.1%} of busy /24-hours above 91% (ALICCS Fig. 7: ~90%)",
        f"rebuffer rate   : 4G/5G cubic {reb.get(('cell', 'cubic'), float('nan')):.4f} vs bbr "
        f"{reb.get(('cell', 'bbr'), float('nan')):.4f}; Wi-Fi cubic {reb.get(('wifi', 'cubic'), float('nan')):.4f} "
        f"vs bbr {reb.get(('wifi', 'bbr'), float('nan')):.4f}",
        f"policed 4G cubic: {pol['cubic_policed_goodput_kbps']:.0f} kbps vs {pol['cubic_free_goodput_kbps']:.0f} "
        f"unpoliced, retransmissions ×{pol['cubic_policed_retrans'] / max(pol['cubic_free_retrans'], 1e-9):.0f}",
        "",
        "where to look:",
        f"  logs (the pipeline's input) : {out}/{{transport,access,qoe}}/<node>/<hour>.jsonl",
        f"  IP→ASN/region reference     : {out}/reference/ip_asn_region.csv",
        f"  ground truth (never trained): {out}/_truth/",
        f"  manifest                    : {out}/manifest.json",
        "  what the simulator models   : docs/simulator.md",
    ]
    return "\n".join(lines)
