"""Render docs/results/ from the JSON the benchmarks and the evaluation commands wrote
(`make results`). Every figure on a page comes from a JSON file named on that page; a source
that is missing is listed as not measured, never filled from an older page.

    .venv/bin/python bench/report.py [--data-root var] [--out docs/results] [--only PAGE[,PAGE...]]

`--only` renders just the pages named (the benches re-run on this machine) and leaves the other
pages and their JSON as they are: on a machine whose data root lacks a source, or holds an older
one, a full render would mark that page not measured or put the older figures back.

Sources: `bench/results/<bench>.json` (`make bench`), `<data_root>/bench/*.json` (benches that
write under the data root), and `<data_root>/results/*.json` (`make run`'s main job,
`ccs evaluate`, `ccs emulate`). The JSON read is copied beside the pages (`docs/results/data/`)
so that a page and its numbers are committed together.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: page name -> (title, the command that writes its JSON, candidate JSON paths relative to the
#: repository ({data} is the data root))
SOURCES = {
    "main-job": ("The main job (`make run`)", "make run", ["{data}/results/main_job.json"]),
    "evaluate": ("Cross-node accuracy per variant", "ccs evaluate --hours FROM..TO --json", ["{data}/results/evaluate.json"]),
    "emulate": ("Emulated QoE per CC-selection policy", "ccs emulate --hours FROM..TO --json", ["{data}/results/emulate.json"]),
    "simulate": ("Simulator speed and memory", "python bench/simulate.py", ["bench/results/simulate.json"]),
    "kernel": ("Kernel enforcer cost", "python bench/kernel.py", ["bench/results/kernel.json"]),
    "kernel-flow": ("Kernel: the flow tree's cost (issue 27)", "python bench/kernel.py --flow",
                    ["bench/results/kernel_flow.json"]),
    "metrics-cost": ("Kernel: the cost of the agent's metrics scraped every second (issue 59)",
                     "python bench/metrics_cost.py", ["bench/results/metrics_cost.json"]),
    "ingest": ("Ingest: files to silver, Spark vs DuckDB", "python bench/ingest.py", ["bench/results/ingest.json"]),
    "ingest-profile": ("Ingest: where the time goes, stage by stage and in the JVM (issue 62)",
                       "python bench/ingest_profile.py --conns 500000", ["bench/results/ingest_profile.json"]),
    "ingest-reference": ("Ingest against the fair DuckDB reference, interleaved rounds (issue 62)",
                         "python bench/ingest.py --conns 100000 --out bench/results/ingest_reference.json",
                         ["bench/results/ingest_reference.json"]),
    "stream-batch": ("The stream's warm micro-batch: its fixed cost and where it goes (issue 62)",
                     "python bench/stream_batch.py", ["bench/results/stream_batch.json"]),
    "stream-batch-commits": ("The stream's warm micro-batch on a quiet machine: its Delta commits and what one costs (issue 62)",
                             "python bench/stream_batch.py --batches 8 --out bench/results/stream_batch_commits.json",
                             ["bench/results/stream_batch_commits.json"]),
    "ingest-1m": ("Ingest of 1 M connections: Spark against the fair DuckDB reference, Spark's floor and its readers "
                  "alone (issue 62)",
                  "python bench/ingest.py --conns 1000000 --rounds 3 --floor --out bench/results/ingest_1m.json",
                  ["bench/results/ingest_1m.json"]),
    "ingest-dedup": ("Ingest: the cost of deduplication by identity (issue 61)",
                     "python bench/ingest_dedup.py --data DIR --before WT --after WT", ["bench/results/ingest_dedup.json"]),
    "train": ("Training speed", "python bench/train.py", ["{data}/bench/train.json", "bench/results/train.json"]),
    "train-threads": ("Training on a shared 2-core machine: torch threads 1 against 2", "python bench/train_threads.py --fleet var/raw",
                      ["bench/results/train_threads.json"]),
    "infer": ("Inference speed", "python bench/infer.py", ["bench/results/infer.json", "{data}/bench/infer.json"]),
    "export": ("Export: predictions to a signed table, Spark vs DuckDB", "python bench/export.py", ["bench/results/export.json"]),
    "autoplex": ("AutoPlex statistics, the Arrow engine and Spark vs DuckDB", "python bench/autoplex.py", ["bench/results/autoplex.json"]),
    "invariance": ("Invariance across nodes: the default fleet and the strong-shift preset (issue 28)",
                   "python bench/invariance.py", ["bench/results/invariance.json"]),
    "handshake-window": ("The client's first window: how much of the access type it carries (issue 55)",
                         "python bench/handshake_window.py", ["bench/results/handshake_window.json"]),
    "capacity": ("Throughput goals and the capacity plan (issue 31)", "python bench/capacity.py",
                 ["bench/results/capacity.json"]),
    "freshness": ("The stream: log record to enforced table, and throughput (issue 26)", "python bench/freshness.py",
                  ["bench/results/freshness.json"]),
    "freshness-kafka": ("The stream from Kafka beside files: log record to enforced table, and the sustained rate (issue 60)",
                        "sudo python bench/freshness.py --source both --rounds 1 --reuse --minutes 15 --backlog-minutes 30 "
                        "--tail-cap 420",
                        ["bench/results/freshness_kafka.json"]),
    "freshness-table1": ("The stream at real speed with a table every minute of traffic: log record to enforced table "
                         "(issue 62)",
                         "sudo python bench/freshness.py --reuse --speed 1 --minutes 15 --table-minutes 1 "
                         "--throughput-minutes 5 --out bench/results/freshness_table1.json",
                         ["bench/results/freshness_table1.json"]),
    "freshness-kafka-speed1": ("The stream from Kafka beside files at real speed: log record to enforced table (issue 60)",
                               "sudo python bench/freshness.py --source both --rounds 1 --speed 1 --minutes 15 "
                               "--backlog-minutes 0 --tail-cap 420 --out bench/results/freshness_kafka_speed1.json",
                               ["bench/results/freshness_kafka_speed1.json"]),
    "edge-produce": ("The edge's cost per transport record: segment files, librdkafka in the agent, the Python "
                     "shipper (issue 60)", "python bench/edge_produce.py", ["bench/results/edge_produce.json"]),
    "canary": ("The canary's sequential A/B: false rollbacks and time to roll back (issue 58)", "python bench/canary.py",
               ["bench/results/canary.json"]),
    "rollout-drill": ("The rollout drill on a fleet that reacts: twenty good tables, planted bad ones (issue 58)",
                      "sudo python bench/rollout_drill.py", ["bench/results/rollout_drill.json"]),
    "rollout-drill-alternating": ("The rollout drill with alternating good and bad tables appended: does the fleet flap? "
                                  "(issue 58)", "sudo python bench/rollout_drill.py --alternate 6 --out "
                                  "bench/results/rollout_drill_alternating.json",
                                  ["bench/results/rollout_drill_alternating.json"]),
    "rollout-loop": ("The rollout loop through the stream: real agents, ccs simulate --follow, ccs stream, the canary's gate on silver (issue 58)",
                     "sudo python bench/rollout_loop.py", ["bench/results/rollout_loop.json"]),
    "rollout-loop-inflight": ("The rollout in flight through the stream: ccs stream's own looks roll a bad table back "
                              "and promote a good one cohort by cohort (issue 58)",
                              "sudo python bench/rollout_loop.py --inflight",
                              ["bench/results/rollout_loop_inflight.json"]),
    "champion-bf16": ("bf16 judged on the champion over held-out nodes (issue 55)", "python bench/champion_bf16.py",
                      ["bench/results/champion_bf16.json"]),
    "shift-sweep": ("The strong-shift stress knob swept: each variant's gain along it (issue 55)",
                    "python bench/shift_sweep.py", ["bench/results/shift_sweep.json"]),
    "default-fleet-select": ("The default fleet's knobs on 20 nodes: the protocol's pick against the MLP and GBDT (issue 55)",
                             "python bench/shift_sweep.py --nodes 20 --hours 12 --severities 0 --share 0.3 --out "
                             "bench/results/default_fleet_select.json", ["bench/results/default_fleet_select.json"]),
    "window-before-after": ("The grounded client window against the old per-type window tables: the handshake tree, the "
                            "emulation's shares of the true type's gain and the tails against Disco (issue 55)",
                            "make run twice (simulate.client_window stacks, then per_type_tables), then python "
                            "bench/window_before_after.py --after ROOT --before ROOT",
                            ["bench/results/window_before_after.json"]),
    "select-folds": ("The selection protocol on 2 folds against leave-one-node-out of make run's training nodes (issue 55)",
                     "python bench/select_folds.py --config infra/conf/local.yaml --data-root ROOT",
                     ["bench/results/select_folds.json"]),
    "issue57-rules": ("What issue 57's rules change on the default fleet's held-out nodes", "python bench/issue57_rules.py",
                      ["bench/results/issue57_rules.json"]),
}

#: leaves of a JSON longer than this many characters are shown as a block, not in the table
_LONG = 160
#: lists longer than this are summarized (length, first and last items)
_LIST = 12
#: rows of the figures table on one page; the rest stay in the copied JSON
_ROWS = 150


def _find(candidates: list[str], data_root: Path) -> Path | None:
    for c in candidates:
        p = Path(c.format(data=data_root))
        p = p if p.is_absolute() else REPO / p
        if p.exists():
            return p
    return None


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        if len(v) > _LIST:
            return f"{len(v)} values: {_fmt(v[:3])[:-1]}, …, {_fmt(v[-2:])[1:]}"
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def flatten(node, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted path, leaf) pairs of a JSON value, in the file's order."""
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(node, list) and node and all(isinstance(x, dict) for x in node) and len(node) <= _LIST:
        out = []
        for i, v in enumerate(node):
            out += flatten(v, f"{prefix}[{i}]")
        return out
    return [(prefix, node)]


def render_page(name: str, title: str, command: str, src: Path | None, data: dict | None) -> str:
    lines = [f"# {title}", "", "Generated by `bench/report.py` from the JSON below; do not edit by hand.", ""]
    if src is None or data is None:
        lines += [f"**Not measured yet**: no JSON found. Run `{command}`, then `make results`.", ""]
        return "\n".join(lines)
    measured = datetime.fromtimestamp(src.stat().st_mtime, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    shown = os.path.relpath(src, REPO) if src.is_relative_to(REPO) else str(src)
    lines += [f"- source: `{shown}` (copied to `data/{name}.json`), written {measured}",
              f"- command: `{command}`"]
    for key in ("load_avg", "loadavg", "load_average", "machine", "host", "cores", "config"):
        if key in data:
            lines.append(f"- {key.replace('_', ' ')}: `{_fmt(data[key])}`")
    lines.append("")
    if isinstance(data.get("page_markdown"), str):  # a bench's own summary, rendered as it wrote it
        lines += [data["page_markdown"].rstrip(), ""]
    rows, blocks = [], []
    for path, v in flatten({k: v for k, v in data.items() if k != "page_markdown"}):
        text = _fmt(v)
        if isinstance(v, str) and ("\n" in v or len(v) > _LONG):
            blocks.append((path, v))
        else:
            rows.append((path, text.replace("|", "\\|")))
    for path, text in blocks:  # the text a command printed (e.g. make run's summary) reads first
        lines += [f"### `{path}`", "", "```", text.rstrip(), "```", ""]
    if rows:
        lines += ["### Figures", "", "| figure | value |", "|---|---|"]
        lines += [f"| `{p}` | {t} |" for p, t in rows[:_ROWS]] + [""]
        if len(rows) > _ROWS:
            lines += [f"{len(rows) - _ROWS} more figures are in `data/{name}.json`.", ""]
    return "\n".join(lines)


def _render(name: str, title: str, command: str, src: Path | None, out: Path) -> bool:
    """Write page `name` (and its JSON beside it) from `src`; whether it is measured. A page
    without a source keeps no JSON of an older run."""
    data = None
    if src is not None:
        try:
            data = json.loads(src.read_text())
        except ValueError as exc:
            print(f"{src}: not JSON ({exc}); the page says not measured", file=sys.stderr)
            src = None
    if src is not None and not isinstance(data, dict):
        data = {"value": data}
    if src is not None:
        shutil.copyfile(src, out / "data" / f"{name}.json")
    else:
        (out / "data" / f"{name}.json").unlink(missing_ok=True)
    (out / f"{name}.md").write_text(render_page(name, title, command, src, data))
    state = "measured" if src is not None else "not measured yet"
    print(f"{name:9s} {state:16s} {src or ''}")
    return src is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=os.environ.get("CCS_DATA_ROOT", str(REPO / "var")))
    ap.add_argument("--out", default=str(REPO / "docs" / "results"))
    ap.add_argument("--only", default="", help="comma-separated page names to render; the others are kept")
    a = ap.parse_args(argv)
    out, data_root = Path(a.out), Path(a.data_root).resolve()
    only = {n for n in a.only.split(",") if n}
    if unknown := sorted(only - set(SOURCES)):
        ap.error(f"--only: unknown page(s) {unknown}; known: {sorted(SOURCES)}")
    (out / "data").mkdir(parents=True, exist_ok=True)
    index = ["# Generated results", "", "Each page is rendered by `bench/report.py` from the JSON it names "
             "(`make results`). See README.md in this folder for how to read them.", "",
             "| page | source | state |", "|---|---|---|"]
    for name, (title, command, candidates) in SOURCES.items():
        if only and name not in only:   # kept as committed: measured when its JSON is there
            measured = (out / "data" / f"{name}.json").exists()
        else:
            measured = _render(name, title, command, _find(candidates, data_root), out)
        index.append(f"| [{title}]({name}.md) | `{command}` | {'measured' if measured else 'not measured yet'} |")
    (out / "index.md").write_text("\n".join(index) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
