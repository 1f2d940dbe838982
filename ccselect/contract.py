"""The data contract of docs/architecture.md, "Inputs": three newline-delimited JSON streams per edge
node and hour. Field units are named by suffix (`_us`, `_ms`, `_bytes`, `_segs`, `_bps`).

The simulator writes these, the eBPF agent writes the transport log, and ingest validates
against them; this module is the single place the names, types and allowed values live.
"""
from __future__ import annotations

import os
import re
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
#: flow and table+flow: the handshake tree decided, alone or overriding the entry (issue 27)
DECISIONS = ("table", "fallback", "default", "ab_control", "stale", "flow", "table+flow")
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

#: What names a record uniquely (issue 61): every table keeps one row per identity, whoever reads
#: the logs again (a re-sent file or `.1` segment, a stream restarted with a new checkpoint, the
#: same hour as an hourly file and as segments). A connection is (node_id, conn_id): the agent's id
#: is unique per node and boot. A playback session is (node_id, session_id). A request has no id
#: in the contract, so an access line's identity is its whole record: two requests alike in every
#: field (the same connection, millisecond, status, bytes and serving time) count once. A record
#: lies in its file's hour (the hour rule), so every copy of one lands in the same (node, hour)
#: partition, where the duplicate rule judges them (jobs/README.md, "Identity").
#: stream → the record's fields that make its identity; () for the whole record.
IDENTITY: dict[str, tuple[str, ...]] = {"transport": ("node_id", "conn_id"), "access": (),
                                        "qoe": ("node_id", "session_id")}
#: The quarantine reason of a repeat, per stream.
DUPLICATE_REASON = {"transport": "duplicate_conn_id", "access": "duplicate_request", "qoe": "duplicate_session_id"}

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


#: The rotated layout (issue 26): the agent closes its transport log every `rotate_minutes`
#: (default 1) into `<YYYY-MM-DDTHHMM>.jsonl`, the UTC minute the segment starts at; records
#: still lie in the file's hour (the hour rule is unchanged), a segment holds those filed while it
#: was open. A segment reopened after it was closed (a record that came late) gets `.<seq>`:
#: `2026-11-01T0507.1.jsonl`. While being written a segment is hidden (`.<name>.part`): readers
#: never see a half-written file, and the rename is the moment it appears. A node-hour is either
#: one hourly file or segments, never both (`jobs.sources.discover_all` reads neither then).
ROTATE_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
#: name → (hour "YYYY-MM-DDTHH", minute or None for an hourly file, sequence or None, gzip)
FILE_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2})(?:([0-5]\d)(?:\.([1-9]\d{0,5}))?)?\.jsonl(\.gz)?$")


def segment_file_name(ts_ms: int, rotate_minutes: int = 1, seq: int = 0) -> str:
    """The segment of a `rotate_minutes` rotation holding time `ts_ms`, e.g. `2026-11-01T0505.jsonl`."""
    if rotate_minutes not in ROTATE_MINUTES:
        raise ValueError(f"rotate_minutes must divide the hour: one of {ROTATE_MINUTES}")
    t = datetime.fromtimestamp(ts_ms // 1000, tz=timezone.utc)
    minute = t.minute - t.minute % rotate_minutes
    return t.strftime("%Y-%m-%dT%H") + f"{minute:02d}" + (f".{seq}" if seq else "") + ".jsonl"


#: gold.predictions (written by `ccs infer`, read by `ccs export`): one row per connection of
#: silver.connections, partitioned by (node_id, hour).
#:   p_wifi        model probability of Wi-Fi (class 1); p_cell = 1 - p_wifi
#:   pred_net_type "wifi" or "cell" (argmax)
#:   cc            the CC chosen for the connection: Wi-Fi → cubic, 4G/5G → bbr when trusted,
#:                 else `default_cc` (ALICCS §4.2 fallback strategy)
#:   decision      one of PREDICTION_DECISIONS (PREDICTION_DECISION_DOCS says when each is made)
#:   requests      HTTP requests on the connection (from silver; purity is weighted by it)
PREDICTION_COLS = (
    "conn_id", "client_ip", "family", "prefix16", "prefix24", "prefix48", "prefix64", "ug_id",
    "requests", "p_wifi", "p_cell", "pred_net_type", "cc", "decision", "default_cc",
    "model_name", "model_version", "node_id", "hour",
)
PREDICTION_DECISIONS = ("model", "fallback", "ood", "evidence")
#: decision → when inference makes it (models/infer.py, models/infer_arrow.py: `evidence` first,
#: then `ood`, then the thresholds); every decision but `model` keeps `default_cc`.
PREDICTION_DECISION_DOCS = {
    "model": "trusted: the predicted type's probability reaches its threshold (`infer.wifi_threshold`, "
             "`infer.cell_threshold`): Wi-Fi → `infer.wifi_cc`, 4G/5G → `infer.cell_cc`",
    "fallback": "the model is not confident enough either way: default_cc (ALICCS §4.2 fallback strategy)",
    "ood": "the champion's guard found the connection unlike its training data, or it has more than "
           "`infer.ood_max_imputed` imputed features: default_cc",
    "evidence": "too little data for its features to mean what they meant in training (fewer than "
                "`infer.min_data_segs` data segments, `infer.min_bytes_acked` bytes acknowledged or "
                "`infer.min_duration_us` of life): default_cc, before the guard and the thresholds",
}

#: What the edge knows of a connection when it picks its CC (sock_ops PASSIVE_ESTABLISHED, the
#: final ACK of the handshake just in): the transport fields the program fills at that moment —
#: the MSS (mss_cache), the client's window from its handshake ACK (snd_wnd) and the SYN-ACK → ACK
#: time (the first RTT sample). The handshake tree (distill/handshake.py) reads exactly these, in
#: this order (the kernel's feature ids, export/edge/ccs_table.h CCS_FEAT_*).
HANDSHAKE_FEATURES = ("mss_bytes", "init_snd_wnd_bytes", "connection_time_us")


# ---- field reference ----------------------------------------------------------------------------
#
# FIELD_DOCS[stream][field] = (unit, meaning, how to fill it). "How to fill it" names what the
# eBPF program (export/edge/ccs.bpf.c) records and when, and the equivalent in the kernel's
# `struct tcp_info` (getsockopt TCP_INFO), `ss -ti` and nginx's `$tcpinfo_*`, for a fleet that
# writes the log some other way. Callbacks of the program: PASSIVE_ESTABLISHED (the handshake's
# final ACK is in; the decision is made here), RTT (every ACK that yields an RTT sample, for
# sampled connections only), STATE → TCP_CLOSE (the record is emitted). "Over the callbacks"
# means at PASSIVE_ESTABLISHED, every RTT callback and TCP_CLOSE. `docs/contract.md` is rendered
# from this (`ccs contract --markdown`).

_OVER = "over the callbacks (PASSIVE_ESTABLISHED, every RTT callback, TCP_CLOSE)"
_SS_MS = "`ss -ti` prints it in milliseconds with 3 decimals: multiply by 1000"

FIELD_DOCS: dict[str, dict[str, tuple[str, str, str]]] = {
    "transport": {
        "conn_id": ("text", "the connection; (node_id, conn_id) is its identity: one row per pair in every table, a repeat anywhere is quarantined as a duplicate",
                    "agent: `<node_id>-<first 8 hex of /proc/sys/kernel/random/boot_id><socket cookie, 16 hex>` "
                    "(`bpf_get_socket_cookie` at PASSIVE_ESTABLISHED); any id unique per node and boot will do"),
        "node_id": ("text", "the edge node; must equal the `<node_id>` folder of the file",
                    "agent: config `node_id` (default: the hostname)"),
        "ts_start_ms": ("ms since the Unix epoch (UTC)", "when the connection was established; at most a day (the longest "
                        "duration_us) before the file's hour: a connection open across the hour boundary began earlier",
                        "agent: `bpf_ktime_get_boot_ns()` at PASSIVE_ESTABLISHED, turned into wall-clock time when "
                        "drained; elsewhere: accept() time. Not seconds (`$msec` is seconds.ms)"),
        "ts_end_ms": ("ms since the Unix epoch (UTC)", "when the connection closed; must lie in the file's hour (a "
                      "record belongs to the hour it closed in) and not before ts_start_ms",
                      "agent: boot clock at TCP_CLOSE; the agent files a record by the UTC hour of ts_end_ms"),
        "client_ip": ("IPv4 or IPv6 text", "the client address; an IPv4-mapped `::ffff:a.b.c.d` (a dual-stack listener's IPv4 "
                      "peer) is read as a.b.c.d everywhere (prefixes, A/B bucket, joins, table entries)",
                      "agent: `remote_ip4`/`remote_ip6` of the socket, `inet_ntop`; zone ids are refused"),
        "client_port": ("port", "the client's TCP port", "agent: `remote_port` of the socket"),
        "server_port": ("port", "the local (served) port", "agent: `local_port`; only ports in the config's `services` are logged"),
        "cc": ("one of " + ", ".join(CCS), "the congestion control the socket ran at close",
               "agent: `icsk_ca_ops->name` at TCP_CLOSE; tcp_info has none: `ss -ti` prints it first "
               "(`cubic`, `bbr`), `getsockopt(TCP_CONGESTION)`"),
        "decision": ("one of " + ", ".join(DECISIONS), "why the socket got its CC",
                     "agent: the program's decision at PASSIVE_ESTABLISHED: no live table → `default` (counter "
                     "`no_table`), expired → `stale`, A/B control → `ab_control`, miss → `default`, keep or "
                     "low confidence → `fallback`, hit → `table`; with the table's handshake tree and the "
                     "service's flow mode (fill, combine, flow): the tree's leaf → `flow`, a leaf more confident "
                     "than a disagreeing entry (combine) → `table+flow`; without an enforcer write `default`"),
        "table_version": ("text or null", "the live table's version at PASSIVE_ESTABLISHED",
                          "agent: `ccs_meta[live].version`; null when no table was loaded (observe-only)"),
        "mss_bytes": ("bytes", "the sender MSS the connection started with (Table 4)",
                      "agent: `mss_cache` at PASSIVE_ESTABLISHED; tcp_info `tcpi_snd_mss`; `ss -ti` `mss:`"),
        "connection_time_us": ("µs", "the handshake's RTT: SYN-ACK sent → final ACK received, the first RTT sample",
                               "agent: `srtt_us >> 3` at PASSIVE_ESTABLISHED (srtt is the first sample then); "
                               "tcp_info `tcpi_rtt` right after accept()"),
        "init_snd_wnd_bytes": ("bytes", "the client's receive window (our send window) at establishment",
                               "agent: `tcp_sock.snd_wnd` at PASSIVE_ESTABLISHED (scaled bytes); tcp_info "
                               "`tcpi_snd_wnd` (Linux ≥ 6.2) right after accept(); `ss -ti` `snd_wnd:`"),
        "min_rtt_us": ("µs", "the minimum RTT the kernel saw",
                       "agent: `rtt_min` (the kernel's windowed min RTT, `tcp_min_rtt_wlen`, 300 s by default) at "
                       "TCP_CLOSE, min_srtt_us when there was no sample; tcp_info `tcpi_min_rtt`; "
                       "`ss -ti` `minrtt:` (" + _SS_MS + ")"),
        "max_snd_wnd_bytes": ("bytes", "the largest send window", f"agent: max of `snd_wnd` {_OVER}; tcp_info "
                              "`tcpi_snd_wnd` sampled"),
        "min_snd_wnd_bytes": ("bytes", "the smallest send window",
                              f"agent: min of `snd_wnd` {_OVER} (0 if never read); tcp_info `tcpi_snd_wnd` sampled"),
        "min_rtt_var_us": ("µs", "the smallest RTT variation (mdev/4, what tcp_info calls rttvar)",
                           f"agent: min of `mdev_us >> 2` {_OVER}; tcp_info `tcpi_rttvar`; nginx `$tcpinfo_rttvar`; "
                           "`ss -ti` `rtt:<srtt>/<rttvar>` (" + _SS_MS + ")"),
        "max_rtt_var_us": ("µs", "the largest RTT variation", f"agent: max of `mdev_us >> 2` {_OVER}; as min_rtt_var_us"),
        "min_rto_us": ("µs", "the smallest retransmission timeout",
                       f"agent: min of `icsk_rto` (jiffies × 10^6 / CONFIG_HZ) {_OVER}; 0 when the agent could not "
                       "read CONFIG_HZ, which ingest quarantines (`out_of_range:min_rto_us`); tcp_info `tcpi_rto`; "
                       "`ss -ti` `rto:` (" + _SS_MS + ")"),
        "min_srtt_us": ("µs", "the smallest smoothed RTT", f"agent: min of `srtt_us >> 3` (non-zero) {_OVER}; "
                        "tcp_info `tcpi_rtt`; nginx `$tcpinfo_rtt`; `ss -ti` `rtt:` (" + _SS_MS + ")"),
        "max_srtt_us": ("µs", "the largest smoothed RTT", f"agent: max of `srtt_us >> 3` {_OVER}; as min_srtt_us"),
        "max_cwnd_segs": ("segments", "the largest congestion window",
                          f"agent: max of `snd_cwnd` {_OVER}; tcp_info `tcpi_snd_cwnd`; nginx `$tcpinfo_snd_cwnd`; "
                          "`ss -ti` `cwnd:`"),
        "bytes_acked": ("bytes", "bytes the client acknowledged over the connection's life",
                        "agent: `bytes_acked` at TCP_CLOSE; tcp_info `tcpi_bytes_acked`; `ss -ti` `bytes_acked:`"),
        "data_segs_out": ("segments", "data segments sent, retransmissions included",
                          "agent: `data_segs_out` at TCP_CLOSE; tcp_info `tcpi_data_segs_out`; `ss -ti` `data_segs_out:`"),
        "total_retrans": ("segments", "segments retransmitted over the connection's life",
                          "agent: `total_retrans` at TCP_CLOSE; tcp_info `tcpi_total_retrans`; `ss -ti` `retrans:<cur>/<total>`"),
        "max_inflight_segs": ("segments", "the most segments in flight",
                              f"agent: max of packets_out − (sacked_out + lost_out) + retrans_out {_OVER}; "
                              "tcp_info `tcpi_unacked − tcpi_sacked − tcpi_lost + tcpi_retrans`"),
        "duration_us": ("µs", "established → closed",
                        "agent: boot clock at TCP_CLOSE − at PASSIVE_ESTABLISHED; elsewhere accept() to close()"),
    },
    "access": {
        "conn_id": ("text", "the transport log's conn_id of the connection that served the request",
                    "the web server must log the agent's id (or leave it out and use the nginx format, which "
                    "silver joins by node, hour, client_ip and client_port)"),
        "node_id": ("text", "the edge node; must equal the file's node folder", "nginx `$hostname`"),
        "ts_ms": ("ms since the Unix epoch (UTC)", "when the request was logged; must lie in the file's hour",
                  "nginx `$msec` is seconds with 3 decimals: × 1000 (the nginx format is read as such)"),
        "client_ip": ("IPv4 or IPv6 text", "the client address (`::ffff:a.b.c.d` is read as a.b.c.d)", "nginx `$remote_addr`"),
        "service": ("text", "the service of the request (e.g. video, other)", "nginx: a `map $uri $ccs_service`"),
        "status": ("HTTP status 100–599", "the response status", "nginx `$status`"),
        "bytes_sent": ("bytes", "response body bytes", "nginx `$body_bytes_sent`"),
        "request_time_ms": ("ms", "time serving the request", "nginx `$request_time` (seconds.ms: × 1000)"),
        "net_type": ("one of " + ", ".join(NET_TYPES) + " or null",
                     "the access network the client reported (5–10% of requests carry it)",
                     "a request header, nginx `$http_x_net_type`; `-`/absent → null"),
    },
    "qoe": {
        "session_id": ("text", "the playback session; (node_id, session_id) is its identity, as conn_id's", "the player's beacon"),
        "conn_id": ("text", "the transport conn_id that carried the session", "the player/CDN must echo it"),
        "node_id": ("text", "the edge node; must equal the file's node folder", "the beacon collector"),
        "client_ip": ("IPv4 or IPv6 text", "the client address", "the beacon collector's peer address"),
        "ts_ms": ("ms since the Unix epoch (UTC)", "when the beacon was sent; must lie in the file's hour",
                  "the player's clock (JavaScript `Date.now()` is already ms)"),
        "play_ms": ("ms", "time spent playing", "the player"),
        "rebuffer_ms": ("ms", "time spent stalled after startup", "the player"),
        "rebuffer_count": ("count", "stalls after startup", "the player"),
        "startup_ms": ("ms", "play request → first frame", "the player"),
    },
}


def render_markdown() -> str:
    """docs/contract.md: every field of FIELDS with its type, unit, range, nullability, meaning
    and how to fill it (FIELD_DOCS), and the decisions of gold.predictions."""
    out = ["# The data contract: field reference", "",
           "Generated from `ccselect/contract.py` (`FIELDS`, `NULLABLE`, `RANGES`, `FIELD_DOCS`, "
           "`PREDICTION_DECISIONS`) by "
           "`ccs contract --markdown`; do not edit by hand. The layout, the streams and the quarantine "
           "rules: `docs/architecture.md` \"Inputs\" and `jobs/README.md`. Check logs against it with "
           "`ccs validate DIR`.", "",
           "Files: `<root>/<stream>/<node_id>/<YYYY-MM-DDTHH>.jsonl` (or `.jsonl.gz`), or the rotated "
           "layout the agent writes for the stream (`ccs stream`): segments `<YYYY-MM-DDTHHMM>.jsonl`, named by "
           "the UTC minute they start at (every `rotate_minutes`, default 1), `<YYYY-MM-DDTHHMM>.<seq>.jsonl` for a "
           "segment reopened by a late record, hidden as `.<name>.part` until complete; a node-hour is one hourly "
           "file or its segments, never both. UTF-8 (a leading "
           "byte order mark is ignored), one JSON object a line, each key once, every timestamp inside the "
           "file's UTC hour except a connection's `ts_start_ms` (it belongs to the hour it closed in). Integers are JSON integers (int64; no `1.5`, `1e3`, "
           "`\"5\"`). Units are in the suffix: `_us` microseconds, `_ms` milliseconds, `_bytes`, `_segs`, "
           "`_bps` bits per second.", "",
           "The transport log's source column names what the eBPF program (`export/edge/ccs.bpf.c`) "
           "measures and when. Its callbacks: PASSIVE_ESTABLISHED (the handshake's last ACK is in; "
           "the CC decision is made and, for a sampled connection, the record starts), RTT (every ACK "
           "that yields an RTT sample, sampled connections only) and TCP_CLOSE (last update, record "
           "emitted). The `tcp_info`, `ss -ti` and nginx `$tcpinfo_*` equivalents are for fleets that "
           "produce the log some other way.", "",
           "Identity: a connection is (`node_id`, `conn_id`), a playback session (`node_id`, `session_id`), "
           "a request its whole record (the contract gives it no id: two requests alike in every field count "
           "once). Every table keeps one row per identity, across files, segments, re-sends, stream restarts "
           "and sources; a repeat is quarantined (`duplicate_conn_id`, `duplicate_session_id`, "
           "`duplicate_request`) and which copy wins is a rule (`jobs/README.md`, \"Identity\").", ""]
    for stream, fields in FIELDS.items():
        out += [f"## {stream}", "", "| field | type | unit | range | null | meaning | how to fill it |",
                "|---|---|---|---|---|---|---|"]
        for name, typ in fields.items():
            unit, meaning, source = FIELD_DOCS[stream][name]
            rng = RANGES.get(name) if stream == "transport" else None
            rng_s = f"{rng[0]:,}–{rng[1]:,}" if rng else ""
            null = "yes" if name in NULLABLE.get(stream, set()) else ""
            cells = [f"`{name}`", typ.__name__, unit, rng_s, null, meaning, source]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    out += ["## gold.predictions: decision", "",
            "What `ccs infer` writes as a connection's `decision` (`PREDICTION_DECISIONS`); the export "
            "counts every decision but `model` as declined (against a prefix's purity).", "",
            "| decision | when |", "|---|---|"]
    out += [f"| `{d}` | {PREDICTION_DECISION_DOCS[d]} |" for d in PREDICTION_DECISIONS]
    out.append("")
    return "\n".join(out)
