"""`ccs run`: the main job on the embedded default (what `make run` calls), through real Airflow:
the command and its summary. The job's flow (simulate, backfill, ccs_train and ccs_hourly through
Airflow, the kernel probe, the stream, the emulation, the audit) is flows/main_job.py.

The summary: per-node accuracy, table entries and memory saving, rollout status, kernel counters,
the emulation's QoE per policy (every policy evaluation/emulate.py declares), the stream's tables,
and where to look further.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Optional

import typer

from ccselect.app import results
from ccselect.config import Config, load_config
from ccselect.spark import get_spark
from ccselect.evaluation.emulate import POLICIES
from ccselect.flows.main_job import FleetTooShort, champion, run as run_flow
from ccselect.flows.pipeline import fleet_and_store_for
# Imported inside the functions that use them (heavy, not needed to import this module): mlflow, and our modules that load it.


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)


def run_cmd(config: Optional[str] = typer.Option(None, "--config", envvar="CCS_CONFIG"),
            hourly_hours: int = typer.Option(2, "--hourly-hours", min=1,
                                             help="hours after the training window run through ccs_hourly"),
            stream_hours: int = typer.Option(1, "--stream-hours", min=0,
                                             help="the fleet's last hours, as the agents' one-minute segments, "
                                                  "through `ccs stream` after the hourly runs"),
            fresh: bool = typer.Option(False, "--fresh", help="redo the backfill and the training even when "
                                                              "what they learnt from is unchanged"),
            probe: bool = typer.Option(True, "--probe/--no-probe",
                                       help="when root: open connections from table addresses to the fleet")) -> None:
    """Run the main job: simulate, backfill, ccs_train and ccs_hourly through Airflow, the kernel
    enforcer when root, then a summary."""
    cfg = load_config(config)
    try:
        res = main(cfg, hourly_hours=hourly_hours, fresh=fresh, probe=probe, stream_hours=stream_hours)
    except FleetTooShort as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(res["summary"])
    results.save(cfg, "main_job", res)
    if not res["ok"]:
        raise typer.Exit(1)


def main(cfg: Config, hourly_hours: int = 2, fresh: bool = False, probe: bool = True, stream_hours: int = 0) -> dict:
    """The whole main job (flows/main_job.run) and its summary; returns {"ok", "summary", "train",
    "hourly", "probe", "emulation", "reused", "stream", "audit"}."""
    res, seen = run_flow(cfg, hourly_hours=hourly_hours, fresh=fresh, probe=probe, stream_hours=stream_hours)
    summary = _summary(cfg, seen["manifest"], seen["seconds"], res["reused"], seen["no_deploy"], res["probe"],
                       res["emulation"], res["stream"])
    return {"ok": res["ok"], "summary": summary, **{k: v for k, v in res.items() if k != "ok"}}


# ---- the summary --------------------------------------------------------------------------------

def _stream_lines(res: dict | None) -> list[str]:
    if not res:
        return []
    if "error" in res:
        return [f"stream          : failed: {res['error']}"]
    lines = [f"stream          : {', '.join(res['hours'])}: {res['files']:,} segments, {res['lines_read']:,} lines in "
             f"{res['batches']} micro-batches; {len(res['tables'])} tables (gold.cc_tables, with their window)"]
    for t in res["tables"]:
        ro = t.get("rollout") or {}
        state = ("deployed to " + ", ".join(ro["nodes"])) if ro.get("deployed") else \
            ro.get("why") or ro.get("refused") or ro.get("failed") or "?"
        lines.append(f"  v{t['version']}: window to {datetime.fromtimestamp(t['boundary'] / 1000, timezone.utc):%H:%M}Z, "
                     f"{t['entries']} entries, " + ("the stream's first table" if t.get("changed") is None else
                                                    f"{t['changed']:.1%} of traffic changed CC") + f"; {state}")
        if str(t.get("version")) in (res.get("canary") or {}):
            from ccselect.export.delivery.stream_canary import summary_line
            lines.append(summary_line(res["canary"][str(t["version"])]))
    if res.get("canary_error"):
        lines.append(f"  canary verdicts failed: {res['canary_error']}")
    return lines


def _emulation_lines(res: dict | None) -> list[str]:
    if not res:
        return []
    if "error" in res:
        return [f"emulation       : failed: {res['error']}"]
    pol = res["policies"]
    lines = [f"emulation       : hour {res['range'][:13]}, {res['sessions']:,} playback sessions "
             f"(QoE = 1 − {res['alpha']}·rebuffer − {1 - res['alpha']:.1f}·retransmission; gold.emulation)",
             f"  {'policy':16s}{'QoE':>9s}{'rebuffer':>10s}{'retrans':>9s}{'reb p85':>9s}{'gap closed':>12s}"
             f"{'truth gain':>12s}"]
    for name in POLICIES:      # the emulation's own list: a policy added there is shown here
        d = pol.get(name)
        if not d or "qoe" not in d:
            continue
        gap = d.get("gap_closed", {}).get("oracle")
        truth = (d.get("truth") or {}).get("exp_qoe_gain_vs_cubic")
        lines.append(f"  {name:16s}{d['qoe']:9.5f}{d['rebuffer_rate']:10.4f}{d['retrans_rate']:9.4f}"
                     f"{d.get('rebuffer_pct', {}).get('p85', float('nan')):9.4f}"
                     + (f"{gap:12.0%}" if gap is not None else f"{'-':>12s}")
                     + (f"{truth:+12.5f}" if truth is not None else f"{'-':>12s}"))
    return lines


def _summary(cfg: Config, manifest: dict, seconds: float, reused: list[str], no_deploy: str | None,
             probed: dict | None, emulated: dict | None = None, streamed: dict | None = None) -> str:
    from ccselect.models import registry
    p = manifest["params"]
    lines = ["", "=" * 78, f"ccselect main job: done in {seconds / 60:.1f} min"
             + (f" (reused: {', '.join(reused)})" if reused else ""), "=" * 78,
             f"fleet           : {p['nodes']} simulated nodes × {p['hours']} h from {p['start']} "
             f"({manifest.get('counts', {}).get('transport', '?'):,} connections) in {cfg.settings.simulate.out}"]
    champ = champion(cfg)
    if champ:
        s = {k: champ[k] for k in registry.SUMMARY_METRICS if isinstance(champ.get(k), float)}
        lines.append(f"model           : {registry.model_name(cfg)} v{champ['version']} @champion "
                     f"(window {champ.get('window')}, gate {champ.get('gate')})")
        lines += _selection_lines(cfg, champ)
        lines += _per_node(cfg, champ)
        if s:
            lines.append("  held-out summary logged in MLflow: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))
    else:
        lines.append("model           : no @champion (no version passed its gate)")
    lines += _table_lines(cfg)
    lines += _fleet_lines(cfg, no_deploy, probed)
    lines += _emulation_lines(emulated)
    lines += _stream_lines(streamed)
    lines += ["", "look further:",
              "  make mlflow      MLflow UI: runs, per-node tables, registered models (http://localhost:5000)",
              "  make airflow     Airflow UI: the three DAGs and these runs (http://localhost:8080)",
              "  make notebooks   Jupyter with the analysts' notebooks (notebooks/)",
              f"  reports         {os.path.join(cfg.data_root, 'reports')} (SHAP diagnostics, AutoPlex plots)",
              f"  Delta tables    {cfg.settings.lake.root}"]
    return "\n".join(lines)


def _selection_lines(cfg: Config, champ: dict) -> list[str]:
    """How the champion's variant was chosen: the leave-node-out folds of its training nodes
    (models/select.py), when `pipeline.variant` is `select`."""
    try:
        import mlflow

        from ccselect.models import registry
        registry.configure(cfg)
        sel = json.loads(mlflow.artifacts.load_text(f"runs:/{champ['run_id']}/selection/table.json"))
    except Exception:  # noqa: BLE001 — a champion trained without the selection has no such artifact
        return [f"  variant {champ.get('variant') or '?'} (set in the configuration, not selected)"]
    out = [f"  variant {sel['variant']}, selected: {sel['rule']}"]
    for r in sel["table"]:
        mark = "←" if r["variant"] == sel["variant"] else " "
        out.append(f"    {mark} {r['variant']:14s} mean {r['mean']:.3f} worst {r['worst']:.3f} std {r['std']:.3f}")
    return out


def _per_node(cfg: Config, champ: dict) -> list[str]:
    try:
        import mlflow

        from ccselect.models import registry
        registry.configure(cfg)
        rows = json.loads(mlflow.artifacts.load_text(f"runs:/{champ['run_id']}/eval/per_node.json"))
    except Exception as e:  # noqa: BLE001 — the summary reports what it can
        return [f"  (per-node table unavailable: {e})"]
    out = ["  per held-out node (the model never saw these nodes):",
           f"    {'node':18s} {'accuracy':>8s} {'wifi rec':>8s} {'4g rec':>8s} {'4G share':>8s} {'rows':>7s}"]
    for r in sorted(rows, key=lambda r: r["node_id"]):
        out.append(f"    {r['node_id']:18s} {r['accuracy']:8.3f} {_f(r.get('wifi_recall'))} {_f(r.get('cell_recall'))} "
                   f"{_f(r.get('share_cell'))} {int(r['n']):7d}")
    acc = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    if acc:
        out.append(f"    mean {sum(acc) / len(acc):.3f}, worst {min(acc):.3f} over {len(acc)} nodes")
    return out


def _f(v) -> str:
    return f"{v:8.3f}" if isinstance(v, (int, float)) and v == v else f"{'-':>8s}"


def _table_lines(cfg: Config) -> list[str]:
    from ccselect.export.tables import aggregate
    tables = aggregate.history(get_spark(cfg, "ccs-run"), cfg)
    if not tables:
        return ["table           : none exported"]
    t = tables[-1]
    try:
        man = json.load(open(t["manifest_path"]))
    except OSError:
        man = {}
    lines = [f"table           : v{t['version']} from model v{t['model_version']}, hours {json.loads(t['hours'])}, "
             f"{t['entries_v4']:,} IPv4 + {t['entries_v6']:,} IPv6 entries ({len(tables)} versions in gold.cc_tables)"]
    if man.get("entries_per_level"):
        lines.append(f"  per level      : {json.dumps(man['entries_per_level'], sort_keys=True)}")
    lines.append(f"  memory saving  : {t['memory_saving']:.1f}× (model-decided client addresses per entry)")
    lines.append(f"  coverage {t['coverage']:.3f}, agreement with per-connection decisions {t['agreement']:.3f}")
    ft = man.get("flow_tree")
    lines.append(f"  flow tree      : {ft['model']}, {ft['nodes']} nodes, depth {ft['depth']} over "
                 f"{', '.join(ft['features'])}; entries below {ft['min_purity_permille']}‰ purity are mixed, "
                 f"leaves below {ft.get('min_leaf_permille', 0)}‰ unsure"
                 if ft else "  flow tree      : none (no <name>-handshake@champion: `ccs handshake`)")
    lines.append(f"  artifact       : {t['manifest_path']} (+ .sig, Ed25519)")
    return lines


def _fleet_lines(cfg: Config, no_deploy: str | None, probed: dict | None) -> list[str]:
    fleet_obj, store = fleet_and_store_for(cfg)
    out = [f"rollout         : store {cfg.settings.export.rollout.store} current version {store.current()}"]
    if no_deploy:
        return out + [f"  not loaded into the kernel: {no_deploy}"]
    for node in fleet_obj.nodes:
        agent = node.agent()
        try:
            st = agent.status()
        except Exception as e:  # noqa: BLE001
            out.append(f"  {node.node_id:20s} status unavailable: {e}")
            continue
        finally:
            agent.close()
        t = st.get("table") or {}
        c = st.get("counters") or {}
        role = "canary" if node.canary else "node"
        e = t.get("entries") or {}
        out.append(f"  {node.node_id:20s} {role:6s} table v{t.get('version')} "
                   f"{'enforced' if t.get('enforced') else 'NOT enforced'}, {e.get('v4', 0)} + {e.get('v6', 0)} entries "
                   "in the kernel's lookup")
        shown = {k: v for k, v in sorted(c.items()) if v}
        out.append(f"    kernel counters: {json.dumps(shown) if shown else '(all zero)'}")
    if probed:
        for nid, r in probed["nodes"].items():
            out.append(f"  probe {nid}: {r['as_table']}/{r['connections']} connections from table addresses "
                       f"got the table's CC" + (f"; {r['mismatches'][:3]}" if r["mismatches"] else ""))
    return out
