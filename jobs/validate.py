"""`ccs validate`: check edge logs against the data contract without writing the lake.

The same extract and parse as ingest (`jobs.sources.discover_all` + `read_lines`, `jobs.parse.parse`),
then counts instead of Delta writes: per stream and per file, lines read / accepted / quarantined
and counts by reason; a few example lines per reason (`file:line` and the raw text, truncated);
the files under the input folder that ingest would not read; and suspicious units, which the
per-line rules cannot see because each line on its own is plausible:

- `rtt_in_ms` (transport, per file with at least `MIN_LINES` accepted lines): the median
  `min_rtt_us` AND the median `min_srtt_us` are both below `RTT_MS_MEDIAN_US` (50 µs). A CDN
  client is at least a metro hop away (the fleet's last-mile RTTs are milliseconds: 1,000 µs and
  up); a 50 µs median means most of a node's clients sit on its own rack, which a real edge does
  not see, while a log that writes milliseconds in `_us` fields puts the typical 5–50 ms paths
  exactly there. Requiring the smoothed RTT to agree keeps one mis-scaled field (min_rtt alone)
  from raising it; that would be a different bug, and the detail shows the medians.
  A fixed median misses long paths (issue 57: real intercontinental medians written in ms are
  173–280), so two consistency rules raise it too, whatever the path's length: the handshake's
  RTT sample `connection_time_us` is itself an RTT, at least the smoothed minimum, and on every
  simulated file within 7% of it (medians of the ratio 1.01–1.07): a median ratio of at least
  `RTT_RATIO_MS` (100) says the RTT fields are a thousand times too small beside it; and Linux's
  RTO never goes below 200 ms (`TCP_RTO_MIN`; the simulated files' median `min_rto_us` are
  225,294 µs and up), so a median `min_rto_us` below `RTO_MS_MEDIAN_US` (20,000: a tenth of the
  floor, room for a lowered `rto_min`) with a median `min_srtt_us` below 1,000 is an RTO and
  RTT written in milliseconds.
- `timestamps_in_seconds` / `timestamps_in_us` (every stream, per file): most of the file's
  `out_of_hour` lines have a timestamp that lies in the file's hour once multiplied (or divided)
  by 1,000: the writer used seconds (microseconds) in an `_ms` field.
- `mss_constant` (transport, per file with at least `MIN_LINES` accepted lines): every accepted
  line has the same MSS and that value is odd or not one of the usual link MSS values
  (`COMMON_MSS`: 1460/1448 Ethernet with or without timestamps, PPPoE, IPv6, tunnels, jumbo,
  536). Real clients mix MTUs and options; one odd constant is a field written from a
  configuration value or a clamp, not the negotiated `mss_cache`.

A problem is any quarantined line, any file not read, any suspicious unit, and a transport log
without `reference/ip_asn_region.csv` beside it (ingest then leaves every connection's `ug_id`
null: no user groups, no AutoPlex caps; ingest's result says so too); `ccs validate` exits 1
when there is one. The summary also names the setting that would accept what was refused
(`hints`): transport lines quarantined only for missing imputable features are accepted by
`ingest.missing_features: impute`; lines quarantined only for missing model features that
`ingest.imputable_features` does not name would be accepted with them added there (the hint
says how many such rows `infer.ood_max_imputed` would still send to the default CC).
"""
from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession, Window, functions as F

from ccselect import hours
from ccselect.contract import FEATURES, STREAMS
from ccselect.settings import InferSettings, IngestSettings
from ccselect.jobs.parse import BOM, HOUR_MS, imputable, parse
from ccselect.jobs.sources import MISSING_REFERENCE_EFFECT, SourceFile, discover_all, missing_reference, read_lines

#: Example lines kept per (stream, reason), and how much of each raw line is shown.
EXAMPLES = 3
RAW_CHARS = 160
#: A per-file unit check needs at least this many accepted lines.
MIN_LINES = 10
RTT_MS_MEDIAN_US = 50
RTT_RATIO_MS = 100
RTO_MS_MEDIAN_US = 20_000
COMMON_MSS = frozenset({536, 1220, 1240, 1260, 1280, 1300, 1320, 1340, 1360, 1380, 1400, 1410, 1420, 1428,
                        1432, 1436, 1440, 1448, 1452, 1460, 8940, 8948, 8960, 9000, 65483})
TS_FIELDS = {"transport": "ts_end_ms", "access": "ts_ms", "qoe": "ts_ms"}


# ---- extract ------------------------------------------------------------------------------------

def list_files(input_dir: str, window: hours.Window | None = None) -> tuple[list[SourceFile], list[dict]]:
    """(files ingest reads, files it would not read: [{path, why}]) — ingest's own discover_all."""
    files, skipped = discover_all(input_dir, window)
    return files, [{"path": u.path, "why": u.why} for u in skipped]


# ---- transforms ---------------------------------------------------------------------------------

def file_counts(parsed: DataFrame) -> DataFrame:
    """Per (source_file, status, reason): lines."""
    return parsed.groupBy("node_id", "hour", "source_file", "status", "reason").count()


def examples(parsed: DataFrame, k: int = EXAMPLES, chars: int = RAW_CHARS) -> DataFrame:
    """The first `k` quarantined lines of each reason (by file, line)."""
    w = Window.partitionBy("reason").orderBy("source_file", "line_no")
    return (parsed.filter(F.col("status") == "quarantined")
            .withColumn("_n", F.row_number().over(w)).filter(F.col("_n") <= k)
            .select("reason", "source_file", "line_no", F.substring("raw", 1, chars).alias("raw"),
                    (F.length("raw") > chars).alias("truncated")))


def transport_units(parsed: DataFrame) -> DataFrame:
    """Per transport file, over accepted lines: n, medians of the RTT-like fields, MSS spread."""
    r = F.col("record")
    return (parsed.filter(F.col("status") == "ok").groupBy("source_file").agg(
        F.count(F.lit(1)).alias("n"),
        F.percentile_approx(r["min_rtt_us"], 0.5).alias("median_min_rtt_us"),
        F.percentile_approx(r["min_srtt_us"], 0.5).alias("median_min_srtt_us"),
        F.percentile_approx(r["max_srtt_us"], 0.5).alias("median_max_srtt_us"),
        F.percentile_approx(r["min_rto_us"], 0.5).alias("median_min_rto_us"),
        F.percentile_approx(r["connection_time_us"] / F.greatest(r["min_srtt_us"], F.lit(1)), 0.5)
        .alias("median_handshake_ratio"),
        F.min(r["mss_bytes"]).alias("mss_min"), F.max(r["mss_bytes"]).alias("mss_max")))


def timestamp_units(parsed: DataFrame, stream: str) -> DataFrame:
    """Per file, over `out_of_hour` JSON lines: how many timestamps fall in the file's hour when
    read as seconds (×1000) or as microseconds (÷1000)."""
    ts = F.get_json_object("raw", f"$.{TS_FIELDS[stream]}").cast("bigint")
    lo, hi = F.col("hour_start_ms"), F.col("hour_start_ms") + HOUR_MS - 1
    return (parsed.filter(F.col("reason") == "out_of_hour").groupBy("source_file").agg(
        F.count(F.lit(1)).alias("out_of_hour"),
        F.sum(F.when((ts * 1000).between(lo, hi), 1).otherwise(0)).alias("as_seconds"),
        F.sum(F.when(F.floor(ts / 1000).between(lo, hi), 1).otherwise(0)).alias("as_us")))


def suspicious_transport(row: dict) -> list[dict]:
    """The unit rules of the module docstring for one row of `transport_units`."""
    out = []
    if row["n"] < MIN_LINES:
        return out
    rtt, srtt, rto = row["median_min_rtt_us"], row["median_min_srtt_us"], row["median_min_rto_us"]
    ratio = row.get("median_handshake_ratio")
    why = []
    if rtt is not None and srtt is not None and rtt < RTT_MS_MEDIAN_US and srtt < RTT_MS_MEDIAN_US:
        why.append(f"below {RTT_MS_MEDIAN_US} µs")
    if ratio is not None and ratio >= RTT_RATIO_MS:
        why.append(f"the handshake's RTT (connection_time_us) is {ratio:.0f}× min_srtt_us")
    if rto is not None and srtt is not None and rto < RTO_MS_MEDIAN_US and srtt < 1000:
        why.append(f"min_rto_us below {RTO_MS_MEDIAN_US} µs, under Linux's 200 ms RTO floor")
    if why:
        out.append({"check": "rtt_in_ms", "file": row["source_file"],
                    "detail": f"median min_rtt_us {rtt}, min_srtt_us {srtt}, max_srtt_us "
                              f"{row['median_max_srtt_us']}, min_rto_us {rto} over "
                              f"{row['n']} lines: {'; '.join(why)}: milliseconds written as µs?"})
    mss = row["mss_min"]
    if mss is not None and mss == row["mss_max"] and (mss % 2 or mss not in COMMON_MSS):
        out.append({"check": "mss_constant", "file": row["source_file"],
                    "detail": f"all {row['n']} lines have mss_bytes {mss}, not a usual link MSS: "
                              "a configured or clamped value instead of the socket's mss_cache?"})
    return out


def suspicious_timestamps(row: dict, stream: str) -> list[dict]:
    n = row["out_of_hour"]
    for key, check in (("as_seconds", "timestamps_in_seconds"), ("as_us", "timestamps_in_us")):
        if n and row[key] * 2 > n:
            unit = "seconds" if key == "as_seconds" else "microseconds"
            return [{"check": check, "file": row["source_file"],
                     "detail": f"{row[key]} of {n} out_of_hour lines fall in the file's hour when "
                               f"{TS_FIELDS[stream]} is read as {unit}"}]
    return []


# ---- the job ------------------------------------------------------------------------------------

def notices(parsed: DataFrame, stream: str, impute: tuple[str, ...]) -> list[dict]:
    """What ingest accepts but a person should know, per file: lines that begin with a UTF-8 byte
    order mark (stripped before parsing), and accepted records with imputed (missing) features."""
    missing = F.size(F.filter(F.array(*[F.when(F.col("record")[f].isNull(), F.lit(f)) for f in impute]),
                              lambda x: x.isNotNull())) > 0 if impute else F.lit(False)
    rows = (parsed.groupBy("source_file")
            .agg(F.sum(F.col("raw").startswith(BOM).cast("int")).alias("bom"),
                 F.sum(((F.col("status") == "ok") & missing).cast("int")).alias("imputed"))
            .where((F.col("bom") > 0) | (F.col("imputed") > 0)).orderBy("source_file").collect())
    out = []
    for r in rows:
        if r["bom"]:
            out.append({"stream": stream, "file": r["source_file"], "check": "utf8_bom",
                        "detail": f"{r['bom']} line(s) begin with a UTF-8 byte order mark (ignored)"})
        if r["imputed"]:
            out.append({"stream": stream, "file": r["source_file"], "check": "imputed_features",
                        "detail": f"{r['imputed']} accepted record(s) miss features (ingest.missing_features: impute)"})
    return out


def run(spark: SparkSession, input_dir: str, window: hours.Window | None = None,
        k: int = EXAMPLES, missing_features: str = "quarantine",
        imputable_features: tuple[str, ...] | None = None) -> dict:
    """Validate every file ingest would read under `input_dir` with ingest's rules
    (`missing_features`, `imputable_features`: the ingest section's settings, None for its default);
    returns the report (a dict: `streams`, `files`, `examples`, `unknown_files`, `suspicious`,
    `notices`, `missing_reference`, `hints`, `problems`). Writes nothing."""
    if imputable_features is None:
        imputable_features = IngestSettings().imputable_features
    files, unknown = list_files(input_dir, window)
    report: dict = {"input": os.path.abspath(input_dir), "hours": [window.lo, window.hi] if window else None,
                    "streams": {}, "files": [], "examples": {}, "unknown_files": unknown, "suspicious": [],
                    "notices": [], "missing_features": missing_features,
                    "imputable_features": list(imputable_features)}
    for stream in STREAMS:
        sfiles = [f for f in files if f.stream == stream]
        if not sfiles:
            continue
        impute = imputable(missing_features, stream, tuple(imputable_features))
        parsed = parse(read_lines(spark, sfiles), stream, impute).select(
            "node_id", "hour", "hour_start_ms", "source_file", "line_no", "raw", "status", "reason",
            "record").persist()
        try:
            report["files"].extend(_per_file(stream, sfiles, file_counts(parsed).collect()))
            report["notices"].extend(notices(parsed, stream, impute))
            report["examples"][stream] = {}
            for r in examples(parsed, k).orderBy("reason", "source_file", "line_no").collect():
                report["examples"][stream].setdefault(r["reason"], []).append(
                    {"where": f"{r['source_file']}:{r['line_no']}", "raw": r["raw"] + ("…" if r["truncated"] else "")})
            if stream == "transport":
                for r in transport_units(parsed).orderBy("source_file").collect():
                    report["suspicious"].extend({"stream": stream, **s} for s in suspicious_transport(r.asDict()))
            for r in timestamp_units(parsed, stream).orderBy("source_file").collect():
                report["suspicious"].extend({"stream": stream, **s} for s in suspicious_timestamps(r.asDict(), stream))
        finally:
            parsed.unpersist()
        mine = [f for f in report["files"] if f["stream"] == stream]
        by_reason: dict[str, int] = {}
        for f in mine:
            for reason, n in f["by_reason"].items():
                by_reason[reason] = by_reason.get(reason, 0) + n
        report["streams"][stream] = {
            "files": len(mine), **{key: sum(f[key] for f in mine) for key in ("lines_read", "accepted", "quarantined")},
            "by_reason": dict(sorted(by_reason.items()))}
    # (an object store's reference is not looked up here: validate runs without the configuration)
    report["missing_reference"] = None if "://" in input_dir else missing_reference(input_dir, files)
    report["hints"] = hints(report)
    report["problems"] = problems(report)
    return report


def hints(report: dict) -> list[str]:
    """Which setting would accept what was refused: transport lines quarantined only for missing
    model features (`missing_key:` listing features alone). Those missing only features that
    `ingest.imputable_features` names are accepted by `missing_features: impute`; the others only
    with their features added to `imputable_features` (and `impute`), and a row with more than
    `infer.ood_max_imputed` imputed features is then scored `ood` (the default CC)."""
    policy = report.get("missing_features", "quarantine")
    allowed = set(report.get("imputable_features", IngestSettings().imputable_features))
    by_reason = report["streams"].get("transport", {}).get("by_reason", {})
    features_only = {tuple(reason.removeprefix("missing_key:").split(",")): n for reason, n in by_reason.items()
                     if reason.startswith("missing_key:")
                     and set(reason.removeprefix("missing_key:").split(",")) <= set(FEATURES)}
    out = []
    n = sum(c for names, c in features_only.items() if set(names) <= allowed)
    if n and policy == "quarantine":
        out.append(f"transport: ingest.missing_features: impute would accept the {n} line(s) quarantined only "
                   f"for missing imputable features ({', '.join(sorted(allowed))}; silver lists them in "
                   "`imputed`; training leaves them out)")
    others = {names: c for names, c in features_only.items() if not set(names) <= allowed}
    if others:
        # (under quarantine a reason names every missing feature, under impute only the others)
        extra = sorted({f for names in others for f in names} - allowed, key=FEATURES.index)
        total = sum(others.values())
        cap = InferSettings().ood_max_imputed
        ood = sum(c for names, c in others.items() if cap >= 0 and len(names) > cap)
        out.append(f"transport: ingest.imputable_features with {', '.join(extra)} added (and "
                   f"ingest.missing_features: impute) would accept the {total} line(s) quarantined only for "
                   f"missing model features; at least {ood} of them would miss more than infer.ood_max_imputed "
                   f"({cap}) features and be scored ood (the default CC)")
    return out


def _per_file(stream: str, sfiles: list[SourceFile], rows) -> list[dict]:
    out = {f.path: {"stream": stream, "node_id": f.node_id, "hour": f.hour, "file": f.path, "lines_read": 0,
                    "accepted": 0, "quarantined": 0, "by_reason": {}} for f in sfiles}
    for r in rows:
        e = out[r["source_file"]]
        e["lines_read"] += r["count"]
        if r["status"] == "ok":
            e["accepted"] += r["count"]
        else:
            e["quarantined"] += r["count"]
            e["by_reason"][r["reason"]] = e["by_reason"].get(r["reason"], 0) + r["count"]
    for e in out.values():
        e["by_reason"] = dict(sorted(e["by_reason"].items()))
    return [out[p] for p in sorted(out)]


def problems(report: dict) -> list[str]:
    """One line per problem: quarantined lines per stream and reason, files not read, suspicious units."""
    out = [] if report["files"] else [f"no log files under {report['input']}"]
    out += [f"{stream}: {n} line(s) quarantined as {reason}"
           for stream, s in report["streams"].items() for reason, n in s["by_reason"].items()]
    out += [f"file not read: {u['path']} ({u['why']})" for u in report["unknown_files"]]
    out += [f"{s['stream']}: {s['check']} in {s['file']}: {s['detail']}" for s in report["suspicious"]]
    if report.get("missing_reference"):
        out.append(f"missing {report['missing_reference']}: {MISSING_REFERENCE_EFFECT}")
    return out
