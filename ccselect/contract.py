"""The data contract of ARCHITECTURE.md "Inputs": three newline-delimited JSON streams per edge
node and hour. Field units are named by suffix (`_us`, `_ms`, `_bytes`, `_segs`, `_bps`).

The simulator writes these, the eBPF agent writes the transport log, and ingest validates
against them; this module is the single place the names, types and allowed values live.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

STREAMS = ("transport", "access", "qoe")

#: The twelve model features of ALICCS Table 4 (Appendix B), in model order.
FEATURES = (
    "mss_bytes",
    "connection_time_us",
    "init_snd_wnd_bytes",
    "min_rtt_us",
    "max_snd_wnd_bytes",
    "min_snd_wnd_bytes",
    "min_rtt_var_us",
    "max_rtt_var_us",
    "min_rto_us",
    "min_srtt_us",
    "max_srtt_us",
    "max_cwnd_segs",
)

OUTCOMES = ("bytes_acked", "data_segs_out", "total_retrans", "max_inflight_segs", "duration_us")

CCS = ("cubic", "bbr", "reno")
DECISIONS = ("table", "fallback", "default", "ab_control", "stale")
NET_TYPES = ("wifi", "4g", "5g")

#: field -> python type, per stream. `None` allowed only where listed in NULLABLE.
TRANSPORT_FIELDS: dict[str, type] = {
    "conn_id": str,
    "node_id": str,
    "ts_start_ms": int,
    "ts_end_ms": int,
    "client_ip": str,
    "client_port": int,
    "server_port": int,
    "cc": str,
    "decision": str,
    "table_version": str,
    **{f: int for f in FEATURES},
    **{f: int for f in OUTCOMES},
}

ACCESS_FIELDS: dict[str, type] = {
    "conn_id": str,
    "node_id": str,
    "ts_ms": int,
    "client_ip": str,
    "service": str,
    "status": int,
    "bytes_sent": int,
    "request_time_ms": int,
    "net_type": str,
}

QOE_FIELDS: dict[str, type] = {
    "session_id": str,
    "conn_id": str,
    "node_id": str,
    "client_ip": str,
    "ts_ms": int,
    "play_ms": int,
    "rebuffer_ms": int,
    "rebuffer_count": int,
    "startup_ms": int,
}

FIELDS = {"transport": TRANSPORT_FIELDS, "access": ACCESS_FIELDS, "qoe": QOE_FIELDS}

#: Fields that may be null or absent: the client network type is reported by few requests.
NULLABLE = {"access": {"net_type"}, "transport": {"table_version"}, "qoe": set()}

#: Plausible physical ranges (inclusive) used by the simulator's tests and by ingest's rules.
RANGES: dict[str, tuple[int, int]] = {
    "mss_bytes": (88, 65535),
    "connection_time_us": (1, 60_000_000),
    "init_snd_wnd_bytes": (0, 1 << 30),
    "min_rtt_us": (1, 10_000_000),
    "max_snd_wnd_bytes": (0, 1 << 30),
    "min_snd_wnd_bytes": (0, 1 << 30),
    "min_rtt_var_us": (0, 10_000_000),
    "max_rtt_var_us": (0, 10_000_000),
    "min_rto_us": (1, 120_000_000),
    "min_srtt_us": (1, 10_000_000),
    "max_srtt_us": (1, 10_000_000),
    "max_cwnd_segs": (1, 1 << 20),
    "bytes_acked": (0, 1 << 40),
    "data_segs_out": (0, 1 << 32),
    "total_retrans": (0, 1 << 32),
    "max_inflight_segs": (0, 1 << 20),
    "duration_us": (0, 86_400_000_000),
    "client_port": (1, 65535),
    "server_port": (1, 65535),
}


def stream_dir(root: str, stream: str, node_id: str) -> str:
    """`<root>/<stream>/<node_id>/` holds that node's hourly files."""
    return os.path.join(root, stream, node_id)


def hour_file_name(hour_start_ms: int) -> str:
    """Hourly file name, e.g. `2026-11-01T05.jsonl` (UTC hour of the records inside)."""
    return datetime.fromtimestamp(hour_start_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H") + ".jsonl"


#: gold.predictions (written by `ccs infer`, read by `ccs export`): one row per connection of
#: silver.connections, partitioned by (node_id, hour).
#:   p_wifi        model probability of Wi-Fi (class 1); p_cell = 1 - p_wifi
#:   pred_net_type "wifi" or "cell" (argmax)
#:   cc            the CC chosen for the connection: Wi-Fi → cubic, 4G/5G → bbr when trusted,
#:                 else `default_cc` (ALICCS §4.2 fallback strategy)
#:   decision      "model" (trusted: p_wifi ≥ wifi threshold or p_cell ≥ 4G threshold) or "fallback"
#:   requests      HTTP requests on the connection (from silver; purity is weighted by it)
PREDICTION_COLS = (
    "conn_id", "client_ip", "family", "prefix16", "prefix24", "prefix48", "prefix64", "ug_id",
    "requests", "p_wifi", "p_cell", "pred_net_type", "cc", "decision", "default_cc",
    "model_name", "model_version", "node_id", "hour",
)
PREDICTION_DECISIONS = ("model", "fallback", "ood")
