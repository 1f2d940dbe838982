"""Guard rails before a table is published (issue 7): each refusal says why, in plain words.

- the model behind the decisions passed its validation gate (models.registry.gate_passed);
- the table would not flip more than `export.guards.max_flip_share` of the traffic against the
  live table (request-weighted over the client addresses of the predictions it was built from;
  an address gets the entry's CC where the edge enforces it, else its default CC);
- coverage (manifest) at least `export.guards.min_coverage`;
- no entry overlaps reserved or bogon address space (RFC 6890 special-purpose registries, plus
  IPv6 outside 2000::/3);
- size (issue 58): entries, flow-tree nodes and encoded bytes within `export.guards`' caps (a tree
  that reaches `max_tree_nodes` ran into its generator's limit); entries and bytes at most
  `max_growth` × the live table's once it has `growth_floor_entries`. The anchor is a public 2025
  outage in which a generated edge file doubled in size, passed every format check and took a
  proxy fleet down;
- hysteresis (issue 58): the table may not send more than `max_revert_share` of the traffic back
  to the CC the table before the live one gave it, undoing the live table's change — that is how
  good and bad versions alternate. A table held back this way waits: the next export, built from
  newer predictions, is judged again. An operator who means to go back uses `ccs rollback`.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from pyspark.sql import functions as F

from ccselect.config import Config
from ccselect.export.artifact import table_format as tf
from ccselect.export.tables import aggregate as agg
from ccselect.models import registry

#: IPv4 special-purpose and bogon ranges (RFC 6890, RFC 5737, RFC 6598, multicast, class E).
BOGONS_V4 = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4"))
#: IPv6: everything outside global unicast 2000::/3, and the special ranges inside it.
BOGONS_V6 = tuple(ipaddress.ip_network(n) for n in (
    "::/3", "4000::/2", "8000::/1",  # = not 2000::/3 (covers ::, ::1, v4-mapped, fc00::/7, fe80::/10, ff00::/8)
    "2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20"))


class GuardRefused(RuntimeError):
    """Publishing refused; `reasons` lists every failed guard."""

    def __init__(self, reasons: list[str]):
        super().__init__("refused to publish: " + "; ".join(reasons))
        self.reasons = reasons


@dataclass
class GuardReport:
    checks: dict = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, value=None) -> None:
        self.checks[name] = {"ok": bool(ok), "detail": detail, "value": value}
        if not ok:
            self.refusals.append(f"{name}: {detail}")

    @property
    def ok(self) -> bool:
        return not self.refusals

    def raise_if_refused(self) -> None:
        if self.refusals:
            raise GuardRefused(self.refusals)


def bogon_overlaps(entries) -> list[tuple[str, str]]:
    """(entry prefix, bogon range) for every entry overlapping reserved/bogon space."""
    out = []
    for e in entries:
        for b in (BOGONS_V4 if e.family == 4 else BOGONS_V6):
            if e.prefix.overlaps(b):
                out.append((str(e.prefix), str(b)))
                break
    return out


def check_gate(report: GuardReport, cfg: Config, model_versions: list[str]) -> None:
    """Every registered model version the decisions came from passed its gate."""
    if not cfg.settings.export.guards.require_gate:
        report.add("gate", True, "gate check switched off (export.guards.require_gate)")
        return
    if not model_versions:
        report.add("gate", False, "the table's decisions name no model version")
        return
    failed = [v for v in model_versions if not registry.gate_passed(cfg, str(v))]
    report.add("gate", not failed,
               f"model version(s) {failed} did not pass the validation gate" if failed
               else f"model version(s) {model_versions} passed the gate", model_versions)


def check_coverage(report: GuardReport, cfg: Config, coverage: float) -> None:
    floor = cfg.settings.export.guards.min_coverage
    report.add("coverage", coverage >= floor,
               f"coverage {coverage:.1%} is below the floor {floor:.1%} (export.guards.min_coverage)"
               if coverage < floor else f"coverage {coverage:.1%} ≥ {floor:.1%}", coverage)


def check_bogons(report: GuardReport, entries) -> None:
    bad = bogon_overlaps(entries)
    report.add("bogons", not bad,
               f"{len(bad)} entries overlap reserved/bogon ranges, e.g. "
               + ", ".join(f"{p} ∩ {b}" for p, b in bad[:5]) if bad else "no reserved/bogon prefixes",
               len(bad))


def _effective(p: str):
    return F.when(F.col(f"{p}_effective"), F.col(f"{p}_cc")).otherwise(F.col("default_cc"))


def change_shares(preds, new_entries, live_entries, previous_entries=None) -> tuple[float, float]:
    """(flip, revert), request-weighted over the predictions' client addresses (Spark;
    longest-prefix match as the kernel does; an address gets the entry's CC where the edge enforces
    it, else its default CC): `flip` the share whose CC differs between the live table and the new
    one; `revert` the share whose CC the live table changed from the previous table's and the new
    one changes back (0 without a previous table). One pass for both."""
    aw = agg.address_weights(agg.address_decisions(preds))
    aw = agg.lpm(agg.lpm(aw, list(new_entries), "new"), list(live_entries), "live")
    if previous_entries is not None:
        aw = agg.lpm(aw, list(previous_entries), "prev")
        back = (~_effective("live").eqNullSafe(_effective("prev"))) & _effective("new").eqNullSafe(_effective("prev"))
    else:
        back = F.lit(False)
    s = aw.agg(F.sum("w_all").alias("w"),
               F.sum(F.when(~_effective("new").eqNullSafe(_effective("live")), F.col("w_all")).otherwise(0)).alias("flip"),
               F.sum(F.when(back, F.col("w_all")).otherwise(0)).alias("back")).first()
    if not s["w"]:
        return 0.0, 0.0
    return int(s["flip"] or 0) / int(s["w"]), int(s["back"] or 0) / int(s["w"])


def flip_share(preds, new_entries, live_entries) -> float:
    """Request-weighted share of the predictions' client addresses whose effective CC differs
    between the live table and the new one (`change_shares`)."""
    return change_shares(preds, new_entries, live_entries)[0]


def check_flips(report: GuardReport, cfg: Config, preds, new_entries, live: tf.Table | None,
                previous: tf.Table | None = None) -> None:
    """The flip cap against the live table, and the hysteresis against the table before it."""
    g = cfg.settings.export.guards
    cap = g.max_flip_share
    if live is None:
        report.add("flips", True, "no live table: nothing to flip against", None)
        return
    share, back = change_shares(preds, new_entries, live.entries, previous.entries if previous is not None else None)
    report.add("flips", share <= cap,
               f"the table would flip {share:.1%} of traffic against live version {live.version}, more "
               f"than {cap:.1%} (export.guards.max_flip_share)" if share > cap
               else f"flips {share:.1%} of traffic against live version {live.version} (≤ {cap:.1%})", share)
    if previous is None:
        report.add("hysteresis", True, "no table before the live one: nothing to alternate with", None)
        return
    report.add("hysteresis", back <= g.max_revert_share,
               f"held back: the table would send {back:.1%} of traffic back to the CC of version {previous.version}, "
               f"undoing live version {live.version}'s change (more than {g.max_revert_share:.1%}, "
               f"export.guards.max_revert_share); a table alternating with its predecessor waits for the next "
               f"export, and `ccs rollback` is the operator's way back" if back > g.max_revert_share
               else f"sends {back:.1%} of traffic back to version {previous.version}'s CC "
                    f"(≤ {g.max_revert_share:.1%})", back)


def check_size(report: GuardReport, cfg: Config, table: tf.Table, live: tf.Table | None = None) -> None:
    """Entries, tree nodes and encoded bytes within the caps; and against the live table's."""
    g = cfg.settings.export.guards
    size = len(tf.encode(table))
    nodes = len(table.tree.nodes) if table.tree is not None else 0
    n = len(table.entries)
    over = []
    if n > g.max_entries:
        over.append(f"{n:,} entries, over the cap of {g.max_entries:,} (export.guards.max_entries)")
    if nodes >= g.max_tree_nodes:
        over.append(f"a flow tree of {nodes} nodes reached the cap of {g.max_tree_nodes} "
                    "(export.guards.max_tree_nodes): its generator ran into its limit")
    if size > g.max_artifact_bytes:
        over.append(f"{size:,} bytes, over the cap of {g.max_artifact_bytes:,} (export.guards.max_artifact_bytes)")
    report.add("size", not over, "; ".join(over) if over else
               f"{n:,} entries, {nodes} tree nodes, {size:,} bytes (within the caps)", {"entries": n, "tree_nodes": nodes,
                                                                                     "bytes": size})
    if live is None:
        report.add("growth", True, "no live table to grow from", None)
        return
    n_live, size_live = len(live.entries), len(tf.encode(live))
    if n_live < g.growth_floor_entries:
        report.add("growth", True, f"the live table has {n_live} entries, under export.guards.growth_floor_entries "
                                   f"({g.growth_floor_entries}): growth not judged", None)
        return
    grew = max(n / n_live, size / size_live)
    report.add("growth", grew <= g.max_growth,
               f"the table is {n / n_live:.2f}× the live version {live.version}'s entries ({n:,} against {n_live:,}) and "
               f"{size / size_live:.2f}× its bytes, over export.guards.max_growth ({g.max_growth}×)" if grew > g.max_growth
               else f"{grew:.2f}× the live version {live.version} (≤ {g.max_growth}×)", grew)


def run_all(cfg: Config, manifest: dict, entries, preds=None, live: tf.Table | None = None,
            table: tf.Table | None = None, previous: tf.Table | None = None) -> GuardReport:
    """All guards on an exported table (its manifest and entries, and the decoded `table` for the
    size caps); `preds` are the predictions it was built from (needed for the flip check when there
    is a live table); `previous` is the table made current before the live one (the hysteresis)."""
    report = GuardReport()
    check_gate(report, cfg, list(manifest.get("model_versions") or
                                 ([manifest["model_version"]] if manifest.get("model_version") else [])))
    check_coverage(report, cfg, float(manifest.get("coverage", 0.0)))
    check_bogons(report, entries)
    if table is not None:
        check_size(report, cfg, table, live)
    if live is not None and preds is None:
        report.add("flips", False, "a live table exists but no predictions were given to compare")
    else:
        check_flips(report, cfg, preds, entries, live, previous)
    return report
