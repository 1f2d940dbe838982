"""`ccs export`: per-connection CC decisions (gold.predictions) → a purity-aggregated prefix table.

ALICCS §3.3 and Algorithm 1 (Appendix F), generalized to a ladder of prefix lengths per family
(`export.ladder`, IPv4 /16 → /24 → /32, IPv6 /32 → /48 → /64 → /128): the decisions are grouped
at the ladder's first level; a prefix whose purity passes its threshold becomes one entry; the
addresses of every other prefix go down to the next level (Algorithm 1 steps 2-3, "D_expand"),
and at the last level every prefix becomes an entry. Thresholds are per level and per request
volume: busy prefixes need more purity (Appendix D), `export.purity` as [min_requests, purity]
tiers.

Purity is request-weighted here (the paper counts addresses): purity = weight of the majority CC /
weight of the prefix, where a connection weighs its request count (a connection with none weighs
1, so that every decision counts). Ties go to the CC whose name sorts last, in both versions below.
Only decisions with `decision == "model"` make entries, but every decision the model declined
(fallback, out-of-domain `ood` from models/ood.py, ...) counts against a prefix's purity as one
pseudo-CC, `DECLINED` (issue 57: an entry covers every address under it, so a /16 made from 49
model rows overrode the guard on 96 OOD rows of the same address). A prefix whose majority is
DECLINED and passes is no entry and ends its addresses' descent: they get the edge's default CC,
which is what the guard chose for them. No explicit default-CC entry: the default is the node's
(`default_cc` may differ per node), and an absent entry is that default wherever the table is
loaded. `export.declined_rule` says how DECLINED weighs: `purity` as above (it dilutes a model
CC's purity in every prefix); `plurality`, it competes only as the plurality: a prefix where
DECLINED is the heaviest is judged as under `purity`, any other prefix's purity, weight and
requests (the threshold's tier) are over its model decisions alone, as before issue 57. A prefix passes only with `export.min_support` [connections, distinct clients] under it
(all decisions counted); at the last level a prefix below its support is no entry either. The
manifest gives each declined kind's request-weighted share (`fallback_share`, `ood_share`).

Three implementations of the same aggregation:
- `reference_aggregate(rows, settings)`: plain Python over (ip, cc, requests) rows; the property
  tests and hand-made Algorithm 1 examples run against it, and both others are checked against it.
- `spark_aggregate(address_decisions(preds), settings)`: the export job. Spark sums the
  predictions per address and CC (`address_decisions`: 5 M decisions, 180 k rows in
  bench/export), the rows come to the driver as Arrow (`collect_decisions`), and the ladder runs
  there, vectorized with Arrow and numpy (`arrow_ladder`); `table_metrics` reads the same rows.
  Every entry reaches the driver anyway, and a table has at most one entry per address.
- `ladder_entries(model_weights(address_decisions(preds, by), by), settings, by)`: the ladder as
  DataFrame ops, one table per value of the `by` columns in one pass (evaluation/emulate.py).
Entries of one table never overlap: an entry's descendants are only considered when it failed,
so every address resolves by longest-prefix match to exactly the entry at its first passing level.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Window, functions as F

from ccselect import delta_io
from ccselect.config import Config
from ccselect import hours      # hours.Window: a time range (pyspark's Window is the window function's)
from ccselect.hours import hour_of_ms
from ccselect.ipaddr import canonical, with_ip
from ccselect.lake import AUTOPLEX_PARAMS, CC_TABLES, CONNECTIONS, PREDICTIONS, table_path
from ccselect.settings import BITS, FAMILIES, PrefixLadder
from ccselect.distill.handshake import load_handshake
from ccselect.export.artifact import signing, table_format as tf
from ccselect.export.artifact import epoch as deploy_epoch   # the signer's deployment epoch (issue 56)
from ccselect.export.tables.flow import table_tree

# Algorithm 1's ladder and purity tiers (`export.ladder`, `export.purity`): ccselect.settings.PrefixLadder,
# of which `cfg.settings.export` is one.


# ---- the entries ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Aggregated:
    """One table entry as the aggregation found it."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    cc: str
    weight: int          # request weight under the prefix (purity denominator)
    top_weight: int      # weight of `cc`
    requests: int        # requests under the prefix
    passed: bool         # purity passed its threshold (False only at the ladder's last level)
    pacing_rate_bps: int = 0
    cwnd_clamp_segs: int = 0

    @property
    def family(self) -> int:
        return self.network.version

    @property
    def purity(self) -> float:
        return self.top_weight / self.weight

    def entry(self) -> tf.Entry:
        return tf.Entry(self.network, self.cc,
                        purity_permille=(self.top_weight * 1000) // self.weight,
                        requests=min(self.requests, tf.U32_MAX),
                        pacing_rate_bps=self.pacing_rate_bps, cwnd_clamp_segs=self.cwnd_clamp_segs)


def key_network(family: int, level: int, key_hex: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A prefix from the first level/4 hex digits of its address."""
    bits = BITS[family]
    addr = int(key_hex, 16) << (bits - level) if level else 0
    cls = ipaddress.IPv4Network if family == 4 else ipaddress.IPv6Network
    return cls((addr, level))


def _hex(ip: str) -> tuple[int, str]:
    a = canonical(ip)            # ::ffff:a.b.c.d is a.b.c.d, as with_ip reads it
    return a.version, a.packed.hex()


def weight(requests) -> int:
    return max(int(requests or 0), 1)


# the pseudo-CC of every decision the model declined: sorts after every CC name, so that a tie
# with a model CC goes to the default (max((w, cc)) here, max(struct(w, cc)) in Spark)
DECLINED = "~declined"


def _row(r) -> tuple[str, str, int]:
    """(ip, cc, requests) of a reference row, (ip, cc, requests) or (ip, cc, requests, decision):
    a decision other than "model" is DECLINED."""
    ip, cc, req = r[0], r[1], r[2]
    return ip, (cc if len(r) < 4 or r[3] == "model" else DECLINED), req


def reference_aggregate(rows: Iterable[tuple], settings: PrefixLadder) -> list[Aggregated]:
    """Algorithm 1 over one row per connection, (client_ip, cc, requests) of a model decision or
    (client_ip, cc, requests, decision), in plain Python."""
    per_ip: dict[tuple[int, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for r in rows:
        ip, cc, req = _row(r)
        acc = per_ip[_hex(ip)][cc]
        acc[0] += weight(req)
        acc[1] += max(int(req or 0), 0)
        acc[2] += 1
    out: list[Aggregated] = []
    for fam, levels in settings.ladder.items():
        todo = {h: ccs for (f, h), ccs in per_ip.items() if f == fam}   # D, then D_expand
        for level in levels:
            groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
            clients: dict[str, int] = defaultdict(int)
            for h, ccs in todo.items():
                g = groups[h[:level // 4]]
                clients[h[:level // 4]] += 1
                for cc, (w, r, n) in ccs.items():
                    g[cc][0] += w
                    g[cc][1] += r
                    g[cc][2] += n
            failed = set()
            min_conns, min_clients = settings.support(fam, level)
            for key, ccs in groups.items():                  # AGGREGATE_AT_PREFIX_LEN
                total = sum(w for w, _, _ in ccs.values())
                reqs = sum(r for _, r, _ in ccs.values())
                conns = sum(n for _, _, n in ccs.values())
                top_w, cc = max((w, c) for c, (w, _, _) in ccs.items())
                if settings.declined_rule == "plurality" and cc != DECLINED:   # the model's decisions alone
                    total = sum(w for c, (w, _, _) in ccs.items() if c != DECLINED)
                    reqs = sum(r for c, (_, r, _) in ccs.items() if c != DECLINED)
                supported = conns >= min_conns and clients[key] >= min_clients
                passed = supported and top_w / total >= settings.threshold(fam, level, reqs)
                if (passed or (supported and settings.is_last(fam, level))) and cc != DECLINED:
                    out.append(Aggregated(key_network(fam, level, key), cc, total, top_w, reqs, passed))
                elif not passed:
                    failed.add(key)
            todo = {h: ccs for h, ccs in todo.items() if h[:level // 4] in failed}
    return sorted(out, key=lambda a: (a.family, int(a.network.network_address), a.network.prefixlen))


# ---- Spark ---------------------------------------------------------------------------------
def _threshold_col(settings: PrefixLadder, family: int, level: int, requests):
    tiers = settings.purity[family].get(level, ((0, 0.0),))
    expr = F.lit(tiers[0][1])
    for lo, p in tiers[1:]:
        expr = F.when(requests >= F.lit(lo), F.lit(p)).otherwise(expr)
    return expr


def _weight_cols():
    """(w, r, n) of a decision: its request weight (at least 1), its requests (at least 0), and
    1 (it is one connection)."""
    req = F.coalesce(F.col("requests").cast("long"), F.lit(0))
    return F.greatest(req, F.lit(1)).alias("w"), F.greatest(req, F.lit(0)).alias("r"), F.lit(1).cast("long").alias("n")


def _by_family(values: dict[int, object], default):
    """A column that is `values[f]` on rows of family `f` (column `fam`), else `default`."""
    e = None
    for f, v in values.items():
        e = F.when(F.col("fam") == f, v) if e is None else e.when(F.col("fam") == f, v)
    return e.otherwise(default)


def _root_col(settings: PrefixLadder):
    """The address's prefix at its family's first ladder level (hex digits): the root of the
    ladder tree it belongs to. Every prefix Algorithm 1 looks at for the address, and every
    shorter ladder prefix of those, lies under it."""
    return _by_family({f: F.substring("hex", 1, lv[0] // 4) for f, lv in settings.ladder.items()}, F.lit(""))


def _by_root(df, settings: PrefixLadder, by: tuple[str, ...]):
    """`df` (fam, hex, ...) with its `root` column, shuffled once so that each (by, family, root)
    — one ladder tree — is in one partition. Every later grouping and join of `ladder_entries` is
    keyed by (by, fam, root, ...), which that partitioning satisfies (a hash partitioning on a
    subset of the keys is clustered enough)."""
    return df.withColumn("root", _root_col(settings)).repartition(*by, "fam", "root")


def address_decisions(preds, by: tuple[str, ...] = ()):
    """gold.predictions summed per (family, address hex, cc, decision, default CC) — and per the
    `by` columns, one table's decisions per value of them (see `ladder_entries`): weight `w`,
    requests `r` and connections `n`. The one pass over the predictions that the aggregation and its metrics share
    (`collect_decisions`).

    Summed per address text before the text is parsed: an address repeats over connections and
    hours (5 M decisions, 164 k addresses in bench/export), and parsing it once per decision (then
    ccselect.ipaddr's regexes and IPv6 expansion, now `ccs_ip`) was most of the job's time. Only
    sums here: a max over a string column (the default CC) made Spark sort the predictions
    (SortAggregate, about 3× the CPU of the hash aggregation in bench/export's event log), so the
    default CC is a key instead."""
    w, r, n = _weight_cols()
    keys = (*by, "cc", "decision", "default_cc")
    sums = (F.sum("w").alias("w"), F.sum("r").alias("r"), F.sum("n").alias("n"))
    per_text = preds.select("client_ip", *keys, w, r, n).groupBy("client_ip", *keys).agg(*sums)
    d = with_ip(per_text, "client_ip")
    d = (d.select(F.col("ip.family").alias("fam"), F.col("ip.hex").alias("hex"), *keys, "w", "r", "n")
         .where(F.col("fam").isNotNull()))
    return d.groupBy("fam", "hex", *keys).agg(*sums)


def _ladder_cc(decision):
    return F.when(decision == "model", F.col("cc")).otherwise(F.lit(DECLINED))


def model_weights(decisions, by: tuple[str, ...] = ()):
    """The decisions as the ladder weighs them (*by, fam, hex, cc, w, r, n) from
    `address_decisions`: a model decision's CC, every other decision as DECLINED; an (address, cc)
    may repeat (one row per decision kind and default CC): the aggregation sums them per prefix
    anyway, so no shuffle here."""
    return decisions.select(*by, "fam", "hex", _ladder_cc(F.col("decision")).alias("cc"), "w", "r", "n")


def spark_aggregate(decisions, settings: PrefixLadder) -> list[Aggregated]:
    """Algorithm 1 over gold.predictions as `address_decisions(preds)` (a DataFrame, or the
    Arrow table `collect_decisions` made of it); returns the entries."""
    return arrow_ladder(collect_decisions(decisions), settings)


def ladder_entries(weights, settings: PrefixLadder, by: tuple[str, ...] = ()):
    """The table entries of Algorithm 1 (Appendix F) from `model_weights`' rows (weights summed
    per prefix and CC, DECLINED counted as `export.declined_rule` says and never an entry,
    `export.min_support` required), as a DataFrame (fam, level, key, weight, requests, top_weight, cc,
    passed); `key` is the prefix's first level/4 hex digits.

    One pass instead of one round per level: every prefix of every ladder level gets its purity
    (AGGREGATE_AT_PREFIX_LEN over all addresses under it). A prefix of level L is an entry when it
    passes (or L is the last level) and none of its shorter ladder prefixes passed. That is
    Algorithm 1's D_expand recursion (steps 2-3): the addresses under a prefix reach level L
    exactly when all its shorter prefixes failed, and then all of them reach it, so the prefix's
    purity is the same either way. Deciding on the prefixes alone (an anti-join with the passed
    ones) keeps the job to one pass over the addresses.

    `by`: extra key columns of `weights` (say, the hour of the decisions): one independent table
    per value of them, all in the same pass (evaluation/emulate.py builds every hour's table at once).

    Every grouping and join below is keyed by the ladder tree (`root`, the prefix at the family's
    first level) as well: the weights are shuffled by it once here (`_by_root`)."""
    by = tuple(by)
    fam, level = F.col("fam"), F.col("level")
    weights = _by_root(weights, settings, by)
    tree = (*by, "fam", "root")
    ladder = _by_family({f: F.array(*[F.lit(x) for x in lv]) for f, lv in settings.ladder.items()},
                       F.array().cast("array<int>"))
    lad = (weights.withColumn("level", F.explode(ladder))
           .withColumn("key", F.expr("substring(hex, 1, level div 4)")))
    thr = None
    for f, levels in settings.ladder.items():
        for lv in levels:
            cond = (fam == f) & (level == lv)
            t = _threshold_col(settings, f, lv, F.col("requests"))
            thr = F.when(cond, t) if thr is None else thr.when(cond, t)
    last = _by_family({f: F.lit(lv[-1]) for f, lv in settings.ladder.items()}, F.lit(-1))
    sup_c = sup_k = None
    for f, levels in settings.ladder.items():
        for lv in levels:
            cond = (fam == f) & (level == lv)
            c, k = settings.support(f, lv)
            sup_c = F.when(cond, F.lit(c)) if sup_c is None else sup_c.when(cond, F.lit(c))
            sup_k = F.when(cond, F.lit(k)) if sup_k is None else sup_k.when(cond, F.lit(k))
    clients = lad.groupBy(*tree, "level", "key").agg(F.countDistinct("hex").alias("_clients"))
    model = F.col("cc") != F.lit(DECLINED)

    def _denominator(all_col: str, model_col: str):
        """A prefix's purity denominator (and its requests, for the threshold's tier): every
        decision under `purity`; under `plurality` the model's decisions alone unless DECLINED is
        on top."""
        if settings.declined_rule == "plurality":
            return F.when(F.col("top.cc") == F.lit(DECLINED), F.col(all_col)).otherwise(F.col(model_col))
        return F.col(all_col)
    stats = (lad.groupBy(*tree, "level", "key", "cc").agg(F.sum("w").alias("w"), F.sum("r").alias("r"),
                                                         F.sum("n").alias("n"))
             .groupBy(*tree, "level", "key").agg(F.sum("w").alias("_w_all"), F.sum("r").alias("_r_all"),
                                                F.sum(F.when(model, F.col("w")).otherwise(0)).alias("_w_model"),
                                                F.sum(F.when(model, F.col("r")).otherwise(0)).alias("_r_model"),
                                                F.sum("n").alias("_conns"), F.max(F.struct("w", "cc")).alias("top"))
             .join(clients, [*tree, "level", "key"])
             .select(*tree, "level", "key", _denominator("_w_all", "_w_model").alias("weight"),
                     _denominator("_r_all", "_r_model").alias("requests"), F.col("top.w").alias("top_weight"),
                     F.col("top.cc").alias("cc"),
                     ((F.col("_conns") >= sup_c) & (F.col("_clients") >= sup_k)).alias("_supported"))
             .withColumn("passed", F.col("_supported") & ((F.col("top_weight") / F.col("weight")) >= thr))
             .withColumn("_last", level == last))
    # the shorter ladder prefixes of each prefix (none at a family's first level)
    shorter = None
    for f, levels in settings.ladder.items():
        for i, lv in enumerate(levels[1:], start=1):
            arr = F.array(*[F.struct(F.lit(a).alias("_alevel"), F.substring("key", 1, a // 4).alias("_akey"))
                            for a in levels[:i]])
            cond = (fam == f) & (level == lv)
            shorter = F.when(cond, arr) if shorter is None else shorter.when(cond, arr)
    candidates = stats.where((F.col("passed") | (F.col("_last") & F.col("_supported")))
                             & (F.col("cc") != F.lit(DECLINED)))
    if shorter is None:                       # every ladder has a single level
        return candidates.drop("_last", "_supported", "root")
    passed_above = stats.where(F.col("passed") & ~F.col("_last")).select(
        *tree, F.col("level").alias("_alevel"), F.col("key").alias("_akey"))
    covered = (candidates.select(*tree, "level", "key", F.explode(shorter).alias("_a"))
               .select(*tree, "level", "key", "_a._alevel", "_a._akey")
               .join(passed_above, [*tree, "_alevel", "_akey"], "left_semi")
               .select(*tree, "level", "key"))
    return candidates.join(covered, [*tree, "level", "key"], "left_anti").drop("_last", "_supported", "root")


# ---- Algorithm 1 in the driver, over the decisions summed per address ---------------------
def collect_decisions(decisions) -> pa.Table:
    """`address_decisions(preds)` in the driver: an Arrow table (fam, hex, cc, decision, w, r, n), one
    Spark job. Through Arrow, not Row objects (bench/export, 98 k entries: collect() and Row access
    2.5 s; columns from Arrow ~0.3 s). An Arrow table comes back as it is."""
    if isinstance(decisions, pa.Table):
        return decisions
    return decisions.select("fam", "hex", "cc", "decision", "w", "r", "n").toArrow()


def _np(col) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False) if isinstance(col, pa.Array) else col.to_numpy()


def _encode(strings) -> tuple[np.ndarray, pa.Array]:
    """Group ids of `strings` (Arrow) and the distinct values, id-ordered."""
    enc = pc.dictionary_encode(strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings)
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary


def _sums(group: np.ndarray, n: int, values: np.ndarray) -> np.ndarray:
    """Per-group sums, exact in int64 (bincount sums in float64)."""
    out = np.zeros(n, np.int64)
    np.add.at(out, group, values)
    return out


def _majority(group: np.ndarray, n: int, cc: np.ndarray, n_cc: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(CC index, its weight) of the heaviest CC per group, `cc` indexing the CC names in sorted
    order: ties go to the name sorting last, as max((w, cc)) in the reference and max(struct(w,
    cc)) in Spark."""
    by_cc = _sums(group * n_cc + cc, n * n_cc, w).reshape(n, n_cc)
    top = n_cc - 1 - np.argmax(by_cc[:, ::-1], axis=1)
    return top, by_cc[np.arange(n), top]


def _thresholds(settings: PrefixLadder, family: int, level: int, requests: np.ndarray) -> np.ndarray:
    """`settings.threshold` per prefix."""
    tiers = settings.purity[family].get(level, ((0, 0.0),))
    need = np.full(len(requests), tiers[0][1])
    for lo, p in tiers[1:]:
        need = np.where(requests >= lo, p, need)
    return need


def arrow_ladder(decisions: pa.Table, settings: PrefixLadder) -> list[Aggregated]:
    """Algorithm 1 over `collect_decisions`' rows, level by level as `reference_aggregate` runs it,
    each level one vectorized grouping of the addresses still in play by their prefix. Every
    decision counts, a declined one as DECLINED (never an entry; under `export.declined_rule`
    plurality, out of the denominator of a prefix whose heaviest CC is a model one)."""
    is_model = pc.fill_null(pc.equal(decisions["decision"], "model"), False)
    named = pc.if_else(is_model, decisions["cc"], pa.scalar(DECLINED, pa.string()))
    ccs = sorted(pc.unique(named).to_pylist())
    cc = _np(pc.index_in(named, value_set=pa.array(ccs, pa.string())))
    declined = ccs.index(DECLINED) if DECLINED in ccs else -1
    fam, w, r, nc = _np(decisions["fam"]), _np(decisions["w"]), _np(decisions["r"]), _np(decisions["n"])
    out: list[Aggregated] = []
    for f, levels in settings.ladder.items():
        rows = np.flatnonzero(fam == f)
        hexes = decisions["hex"].take(rows).combine_chunks()
        addr, _ = _encode(hexes)                           # distinct clients: one id per address
        todo = np.arange(len(rows))                        # D, then D_expand
        for level in levels:
            if not len(todo):
                break
            group, keys = _encode(pc.utf8_slice_codeunits(hexes.take(todo), 0, level // 4))
            n = len(keys)
            weight, requests = _sums(group, n, w[rows[todo]]), _sums(group, n, r[rows[todo]])
            conns = _sums(group, n, nc[rows[todo]])
            pairs = np.unique(group * (int(addr.max()) + 1) + addr[todo])
            clients = np.bincount(pairs // (int(addr.max()) + 1), minlength=n)
            min_conns, min_clients = settings.support(f, level)
            supported = (conns >= min_conns) & (clients >= min_clients)
            top, top_w = _majority(group, n, cc[rows[todo]], len(ccs), w[rows[todo]])
            if settings.declined_rule == "plurality":      # a model CC on top: the model's decisions alone
                model = cc[rows[todo]] != declined
                by_model = top != declined
                weight = np.where(by_model, _sums(group[model], n, w[rows[todo]][model]), weight)
                requests = np.where(by_model, _sums(group[model], n, r[rows[todo]][model]), requests)
            passed = supported & (top_w / weight >= _thresholds(settings, f, level, requests))
            entry = np.flatnonzero((passed | (supported & settings.is_last(f, level))) & (top != declined))
            out += [Aggregated(key_network(f, level, k), ccs[t], wt, tw, rq, ps) for k, t, wt, tw, rq, ps in zip(
                keys.take(entry).to_pylist(), top[entry].tolist(), weight[entry].tolist(), top_w[entry].tolist(),
                requests[entry].tolist(), passed[entry].tolist())]
            todo = todo[~passed[group]]
    return sorted(out, key=lambda a: (a.family, int(a.network.network_address), a.network.prefixlen))


# ---- longest-prefix match of addresses against a table, in Spark -------------------------
def _bits(hex_col):
    return F.concat_ws("", F.transform(F.split(hex_col, ""), lambda c: F.lpad(F.conv(c, 16, 2), 4, "0")))


def entries_frame(spark, entries: Iterable[tf.Entry], hex_keys: bool = False):
    """(fam, plen, key, cc, effective) of table entries: `key` is the prefix's first plen bits
    (with `hex_keys`, its first plen/4 hex digits: every plen a multiple of 4); `effective` is
    False for entries the edge does not enforce (cc "keep" or low confidence → the default CC);
    `idx`: the entry's position in `entries`."""
    entries = list(entries)
    plen = [e.prefix.prefixlen for e in entries]
    # an Arrow table, not Python rows: createDataFrame checks every row against the schema
    # (bench/export, 98 k entries: 2.3 s of the driver's time; 0.2 s from Arrow)
    table = pa.table({
        "fam": pa.array([e.family for e in entries], pa.int32()),
        "plen": pa.array(plen, pa.int32()),
        "key": pa.array([format(int(e.prefix.network_address), f"0{BITS[e.family] // 4}x")[:n // 4] if hex_keys
                         else format(int(e.prefix.network_address), f"0{BITS[e.family]}b")[:n]
                         for e, n in zip(entries, plen)], pa.string()),
        "cc": pa.array([e.cc for e in entries], pa.string()),
        "effective": pa.array([e.cc != "keep" and not e.low_confidence for e in entries], pa.bool_()),
        "idx": pa.array(range(len(entries)), pa.int32()),
    })
    return spark.createDataFrame(table)


def lpm(ips, entries: list[tf.Entry], prefix: str, entry_index: bool = False):
    """Add `<prefix>_cc` (the matched entry's CC or null) and `<prefix>_effective` to `ips`
    (columns fam, hex; one row per address): longest-prefix match, as the kernel's trie does.
    With `entry_index`, also `<prefix>_entry`: the matched entry's position in `entries`.

    One pass over the addresses: each address is paired with its own prefix at every entry length
    of its family and left-joined to the (broadcast) entries. A union of one join per length (seven
    on the default ladder) took 4× the time of computing `ips` once in bench/export at 5 M rows:
    Spark recomputed `ips` from the predictions in the branches. When every entry's length is a
    multiple of 4 (the ladder's are), the prefixes are compared as hex digits of `hex`, without
    spelling the address out in bits (bench/export: 0.7 s of the metrics' 4 s)."""
    spark = ips.sparkSession
    lengths: dict[int, list[int]] = defaultdict(list)
    for fam, plen in sorted({(e.family, e.prefix.prefixlen) for e in entries}):
        lengths[fam].append(plen)
    extra = [f"{prefix}_entry"] if entry_index else []
    if not lengths:
        out = (ips.withColumn(f"{prefix}_cc", F.lit(None).cast("string"))
               .withColumn(f"{prefix}_effective", F.lit(False)))
        return out.withColumn(extra[0], F.lit(None).cast("int")) if extra else out
    hex_keys = all(n % 4 == 0 for plens in lengths.values() for n in plens)
    digits = F.col("hex") if hex_keys else F.col("_bits")
    own = None                      # null for a family without entries: explode_outer keeps it
    for fam, plens in lengths.items():
        arr = F.array(*[F.struct(F.lit(n).alias("_plen"), F.substring(digits, 1, n // 4 if hex_keys else n).alias("_key"))
                        for n in plens])
        own = F.when(F.col("fam") == fam, arr) if own is None else own.when(F.col("fam") == fam, arr)
    ef = F.broadcast(entries_frame(spark, entries, hex_keys).select(
        "fam", F.col("plen").alias("_plen"), F.col("key").alias("_key"), F.col("cc").alias("_ecc"),
        F.col("effective").alias("_eeff"), F.col("idx").alias("_eidx")))
    cols = ips.columns
    m = (ips if hex_keys else ips.withColumn("_bits", _bits(F.col("hex"))))
    m = (m.withColumn("_own", F.explode_outer(own))
         .select(*cols, "_own._plen", "_own._key")
         .join(ef, ["fam", "_plen", "_key"], "left")
         .groupBy(*cols).agg(F.max(F.when(F.col("_ecc").isNotNull(), F.struct("_plen", "_ecc", "_eeff", "_eidx")))
                             .alias("_m")))
    return m.select(*cols, F.col("_m._ecc").alias(f"{prefix}_cc"),
                    F.coalesce(F.col("_m._eeff"), F.lit(False)).alias(f"{prefix}_effective"),
                    *([F.col("_m._eidx").alias(extra[0])] if extra else []))


def address_weights(decisions):
    """All decisions per (family, address hex) from `address_decisions`: total weight, model
    weight, the majority model CC (ties: the CC name sorting last, as in the aggregation), and
    the default CC."""
    is_model = F.col("decision") == "model"
    per_cc = decisions.groupBy("fam", "hex", "cc", "decision").agg(
        F.sum("w").alias("w"), F.max("default_cc").alias("default_cc"))
    return per_cc.groupBy("fam", "hex").agg(
        F.sum("w").alias("w_all"),
        F.sum(F.when(is_model, F.col("w")).otherwise(0)).alias("w_model"),
        F.max(F.when(is_model, F.struct("w", "cc"))).alias("_top"),
        F.max("default_cc").alias("default_cc"),
    ).select("fam", "hex", "w_all", "w_model", F.col("_top.cc").alias("major_cc"),
             F.col("_top.w").alias("major_w"), "default_cc")


def lpm_index(hexes, families: np.ndarray, entries: list[tf.Entry]) -> np.ndarray:
    """Longest-prefix match in the driver: per address (`hexes`, Arrow strings as `with_ip`
    spells them, and their `families`), the position in `entries` of the entry it resolves to,
    -1 for none. One lookup of the addresses' own prefixes per entry length, the longer lengths
    last so that their matches win (the kernel's trie)."""
    match = np.full(len(hexes), -1, np.int64)
    keyed: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for i, e in enumerate(entries):
        n = e.prefix.prefixlen
        digits = format(int(e.prefix.network_address), f"0{BITS[e.family] // 4}x")[:-(-n // 4)]
        keyed[(e.family, n)][digits] = i
    for (fam, n), found in sorted(keyed.items(), key=lambda kv: kv[0][1]):
        rows = np.flatnonzero(families == fam)
        own = pc.utf8_slice_codeunits(hexes.take(rows), 0, -(-n // 4))
        if n % 4:           # a length inside a hex digit: the digit's low bits cleared
            keep = (0xF << (4 - n % 4)) & 0xF
            own = pa.array([h[:-1] + format(int(h[-1], 16) & keep, "x") for h in own.to_pylist()], pa.string())
        pos = pc.index_in(own, value_set=pa.array(list(found), pa.string()))
        hit = _np(pc.is_valid(pos))
        match[rows[hit]] = np.array(list(found.values()), np.int64)[_np(pos.filter(hit))]
    return match


def table_metrics(decisions, entries: list[tf.Entry], n_aggregated: list[Aggregated]) -> dict:
    """Coverage, agreement and memory saving of a table over the predictions it was built from
    (as `address_decisions(preds)`, a DataFrame, or the Arrow table `collect_decisions` made of it).

    coverage: request-weighted share of all decisions (model, fallback, ood) whose address has an
      entry. agreement: request-weighted share of model decisions whose CC equals the table's
      (per connection). agreement_ip_majority: request-weighted share of model-decided addresses
      whose majority CC equals the table's. memory_saving: model-decided client addresses per entry.
    weight_<decision> and <decision>_share (fallback, ood): request weight of the decisions of
      that kind and its share of all.
    """
    d = collect_decisions(decisions)
    # an address's hex has its family's length (8 or 32 digits), so the hex alone keys it
    addr, hexes = _encode(d["hex"])
    n = len(hexes)
    fam = np.zeros(n, np.int64)
    fam[addr] = _np(d["fam"])
    w = _np(d["w"])
    decision = d["decision"]
    is_model = _np(pc.fill_null(pc.equal(decision, "model"), False))
    w_addr = _sums(addr, n, w)
    w_addr_model = _sums(addr[is_model], n, w[is_model])
    ccs = sorted(pc.unique(d["cc"].filter(is_model)).to_pylist())
    matched = lpm_index(hexes, fam, entries)
    covered = matched >= 0
    agree = np.zeros(n, bool)
    if ccs:
        cc = _np(pc.index_in(d["cc"].filter(is_model), value_set=pa.array(ccs, pa.string())))
        major, _ = _majority(addr[is_model], n, cc, len(ccs), w[is_model])
        entry_cc = np.array([ccs.index(e.cc) if e.cc in ccs else -1 for e in entries] + [-2], np.int64)
        agree = entry_cc[matched] == major                 # matched -1: the sentinel -2, never a CC
    by_decision = {}
    for name in pc.unique(decision).to_pylist():
        by_decision[name] = int(w[_np(pc.fill_null(pc.equal(decision, name), False))].sum())
    w_all, w_model = int(w_addr.sum()), int(w_addr_model.sum())
    n_ips_model = int((w_addr_model > 0).sum())
    top = sum(a.top_weight for a in n_aggregated)
    return {
        "coverage": (int(w_addr[covered].sum()) / w_all) if w_all else 0.0,
        "agreement": (top / w_model) if w_model else 0.0,
        "agreement_ip_majority": (int(w_addr_model[agree].sum()) / w_model) if w_model else 0.0,
        "client_ips": n,
        "client_ips_model": n_ips_model,
        "memory_saving": n_ips_model / max(len(entries), 1),
        "weight_model": w_model,
        "weight_all": w_all,
        **{f"weight_{d}": by_decision.get(d, 0) for d in ("fallback", "ood")},
        **{f"{d}_share": (by_decision.get(d, 0) / w_all) if w_all else 0.0 for d in ("fallback", "ood")},
    }


def per_level_counts(aggs: list[Aggregated], settings: PrefixLadder) -> dict:
    out = {}
    for name, fam in FAMILIES.items():
        out[name] = {f"/{lvl}": sum(1 for a in aggs if a.family == fam and a.network.prefixlen == lvl)
                     for lvl in settings.ladder[fam]}
    return out


# ---- AutoPlex caps -------------------------------------------------------------------------
def with_caps(spark, cfg: Config, preds, aggs: list[Aggregated]) -> tuple[list[Aggregated], dict]:
    """Attach AutoPlex caps (jobs.autoplex.prefix_caps' rule: pacing = pacing_rate_last, cwnd clamp
    = max_cwnd_last of the latest period) of each entry's main user group (by weight), when a
    service has caps switched on in `autoplex.caps_services` and gold.autoplex_params exists."""


    services = [k for k, v in cfg.settings.autoplex.caps_services.items() if v]
    path = table_path(cfg, AUTOPLEX_PARAMS)
    if not services:
        return aggs, {"caps": "off (no service in autoplex.caps_services)"}
    if not delta_io.is_delta(spark, path):
        return aggs, {"caps": "off (no gold.autoplex_params)"}
    policy = cfg.settings.export.caps_policy
    params = spark.read.format("delta").load(path).where(F.col("policy") == policy)
    newest = Window.partitionBy("ug_id").orderBy(F.col("period_start_ms").desc())
    latest = (params.withColumn("_r", F.row_number().over(newest)).where("_r = 1")
              .select("ug_id", F.col("pacing_rate_last_bps").cast("long").alias("pacing"),
                      F.ceil("max_cwnd_last_segs").cast("long").alias("clamp")))
    # each model-decided address's weight per user group, matched to its entry by lpm: one pass,
    # not one join per prefix length
    by = ("ug_id",)
    d = (model_weights(address_decisions(preds, by), by)
         .where(F.col("ug_id").isNotNull() & (F.col("cc") != F.lit(DECLINED))))
    matched = lpm(d, [a.entry() for a in aggs], "t", entry_index=True).where(F.col("t_entry").isNotNull())
    main = (matched.groupBy("t_entry", "ug_id").agg(F.sum("w").alias("w"))
            .groupBy("t_entry").agg(F.max(F.struct("w", "ug_id")).alias("_m"))
            .select("t_entry", F.col("_m.ug_id").alias("ug_id"))
            .join(latest, "ug_id"))
    caps = {int(r["t_entry"]): (max(int(r["pacing"] or 0), 0), max(int(r["clamp"] or 0), 0))
            for r in main.collect()}
    out = [dataclasses.replace(a, pacing_rate_bps=min(caps[i][0], tf.U64_MAX),
                               cwnd_clamp_segs=min(caps[i][1], tf.U32_MAX)) if i in caps else a
           for i, a in enumerate(aggs)]
    return out, {"caps": "on", "policy": policy, "services": services, "entries_with_caps": len(caps)}


# ---- the job: extract → aggregate → sign → record -----------------------------------------
CC_TABLES_COLS = ("version", "created", "expires", "hours", "model_name", "model_version",
                  "entries_v4", "entries_v6", "coverage", "agreement", "memory_saving", "sha256",
                  "manifest_path")


def extract(spark, cfg: Config, window: hours.Window):
    """gold.predictions of the window's hours."""

    return (spark.read.format("delta").load(table_path(cfg, PREDICTIONS))
            .where(F.col("hour").between(window.lo, window.hi)))


def window_predictions(spark, cfg: Config, from_ms: int, to_ms: int, decay_half_life_min: float | None = None):
    """gold.predictions of the connections that closed in (from_ms, to_ms] — the stream's sliding
    window (flows/stream.py). Predictions carry no time: silver.connections' ts_end_ms, joined on
    the connection's key inside the hours the window touches. With `decay_half_life_min`, a
    prediction's requests (its weight in Algorithm 1) are scaled by 2^(−age/half-life), age from
    its close to `to_ms`, rounded up: an old request still counts, at least once."""
    lo, hi = hour_of_ms(from_ms + 1), hour_of_ms(to_ms)
    ts = (spark.read.format("delta").load(table_path(cfg, CONNECTIONS))
          .where(F.col("hour").between(lo, hi) & (F.col("ts_end_ms") > from_ms) & (F.col("ts_end_ms") <= to_ms))
          .select("node_id", "hour", "conn_id", "ts_end_ms"))
    preds = extract(spark, cfg, hours.Window.hours(lo, hi))
    if not decay_half_life_min:
        return preds.join(ts.drop("ts_end_ms"), ["node_id", "hour", "conn_id"], "left_semi")
    factor = F.pow(F.lit(2.0), -(F.lit(to_ms) - F.col("ts_end_ms")) / F.lit(decay_half_life_min * 60_000.0))
    return (preds.join(ts, ["node_id", "hour", "conn_id"])
            .withColumn("requests", F.ceil(F.col("requests") * factor).cast(preds.schema["requests"].dataType))
            .select(*preds.columns))


def model_versions(preds) -> tuple[str, str, list[str]]:
    """(model name, main model version by weight, all versions) of the model decisions."""
    rows = (preds.where(F.col("decision") == "model").groupBy("model_name", "model_version")
            .agg(F.sum(F.greatest(F.coalesce(F.col("requests").cast("long"), F.lit(0)), F.lit(1))).alias("w"))
            .orderBy(F.col("w").desc()).collect())
    if not rows:
        return "", "", []
    return str(rows[0]["model_name"]), str(rows[0]["model_version"]), sorted({str(r["model_version"]) for r in rows})


def next_version(spark, cfg: Config) -> int:
    path = table_path(cfg, CC_TABLES)
    if not delta_io.is_delta(spark, path):
        return 1
    v = spark.read.format("delta").load(path).agg({"version": "max"}).first()[0]
    return int(v or 0) + 1


def record(spark, cfg: Config, manifest: dict, manifest_path: str) -> None:
    """One row per exported version in gold.cc_tables (keyed by version: a re-run replaces it)."""

    row = {"version": int(manifest["version"]), "created": int(manifest["created"]),
           "expires": int(manifest["expires"]), "hours": json.dumps(manifest["source_hours"]),
           "model_name": manifest.get("model_name", ""), "model_version": manifest["model_version"],
           "entries_v4": int(manifest["entries"]["v4"]), "entries_v6": int(manifest["entries"]["v6"]),
           "coverage": float(manifest["coverage"]), "agreement": float(manifest["agreement"]),
           "memory_saving": float(manifest["memory_saving"]), "sha256": manifest["sha256"],
           "manifest_path": manifest_path}
    schema = ("version long, created long, expires long, hours string, model_name string, "
              "model_version string, entries_v4 long, entries_v6 long, coverage double, agreement double, "
              "memory_saving double, sha256 string, manifest_path string")
    df = spark.createDataFrame([tuple(row[c] for c in CC_TABLES_COLS)], schema)
    delta_io.replace_partitions(df, table_path(cfg, CC_TABLES), {(str(row["version"]),)}, ("version",))


def history(spark, cfg: Config) -> list[dict]:
    path = table_path(cfg, CC_TABLES)
    if not delta_io.is_delta(spark, path):
        return []
    return [r.asDict() for r in spark.read.format("delta").load(path).orderBy("version").collect()]


def run_export(spark, cfg: Config, window: hours.Window, private_key, now: int | None = None,
               out_dir: str | None = None, preds=None, window_ms: tuple[int, int] | None = None,
               unless=None) -> dict | None:
    """Aggregate the decisions of the window's hours into a signed table; record it in gold.cc_tables.
    Returns the manifest (as written) plus `manifest_path`.

    The stream (flows/stream.py) comes through here too, with no second export path: `preds` its
    sliding window's predictions (of connections closed in `window_ms`, recorded under the
    manifest's `source_hours` as `from_ms`/`to_ms`), and `unless(entries)` true when the table is
    too like the live one to be worth a version: then nothing is written and None returned."""

    settings = cfg.settings.export
    preds = extract(spark, cfg, window) if preds is None else preds
    decisions = collect_decisions(address_decisions(preds))   # read by the aggregation and the metrics
    aggs = spark_aggregate(decisions, settings)
    aggs, caps = with_caps(spark, cfg, preds, aggs)
    entries = [a.entry() for a in aggs]
    if unless is not None and unless(entries):
        return None
    metrics = table_metrics(decisions, entries, aggs)
    name, version_main, versions = model_versions(preds)
    now = int(time.time()) if now is None else int(now)
    expires = now + int(settings.expiry_hours * 3600)
    version = next_version(spark, cfg)
    extra = {
        "model_name": name, "model_versions": versions, "source_hours": {"from": window.lo, "to": window.hi, **({"from_ms": int(window_ms[0]), "to_ms": int(window_ms[1]), "kind": "stream"}
                                                    if window_ms else {})},
        "entries_per_level": per_level_counts(aggs, settings),
        "coverage": round(metrics["coverage"], 6), "agreement": round(metrics["agreement"], 6),
        "agreement_ip_majority": round(metrics["agreement_ip_majority"], 6),
        "memory_saving": round(metrics["memory_saving"], 3),
        "fallback_share": round(metrics["fallback_share"], 6), "ood_share": round(metrics["ood_share"], 6),
        "client_ips": metrics["client_ips_model"], "entries_total": len(entries),
        "low_purity_last_level": sum(1 for a in aggs if not a.passed), "autoplex": caps,
    }
    tree, tree_model = None, ""
    if settings.flow_tree:
        loaded = load_handshake(cfg)
        if loaded is not None:
            tree = table_tree(loaded[0], cfg.settings.infer, settings.flow_min_purity_permille,
                              settings.flow_min_leaf_permille)
            tree_model = loaded[1]
    extra["flow_tree"] = {"model": tree_model, "features": list(loaded[0].features), "nodes": len(tree.nodes),
                          "depth": tree.depth(), "min_purity_permille": tree.min_purity_permille,
                          "min_leaf_permille": tree.min_leaf_permille} if tree else None
    out_dir = out_dir or settings.out
    paths = signing.write_table(entries, version, version_main, expires, out_dir, private_key,
                                created=now, extra=extra, tree=tree, tree_model=tree_model,
                                epoch=deploy_epoch.current(cfg))
    with open(paths.manifest) as f:
        manifest = json.load(f)
    record(spark, cfg, manifest, os.path.abspath(paths.manifest))
    return {**manifest, "manifest_path": os.path.abspath(paths.manifest)}
