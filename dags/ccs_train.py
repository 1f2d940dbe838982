"""ccs_train: daily, the previous day's silver → training set → prefix groups → GAN/RSC training
(MLflow run, registered version) → gate → (promotion only if configured) → distilled tree +
SHAP diagnostics of the champion. The work lives in flows.pipeline; this file only wires it."""
from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from ccselect.flows.pipeline import (
    distill_and_diagnose,
    handshake_tree,
    prefix_groups as groups,
    promote_if_configured,
    report,
    train as do_train,
    training_set as build,
)
from ccselect.config import load_config
from ccselect.hours import Window
# Imported inside the functions that use them (heavy, not needed to import this module): airflow.

DOC = """
### ccs_train
The run at day D 00:00 learns from the `pipeline.train_window_hours` hours before it (a manual
run may pass `{"window_hours": N}` as its conf, and `{"auto_promote": true}` to stand in for the
human decision, as `make run` does).

1. **training_set** — feature statistics (log1p + standardize) fitted on the window →
   `gold.feature_stats`; labelled, balanced connections → `gold.training_set`.
2. **prefix_groups** — per network type, K-means over per-/24 feature means → `gold.prefix_groups`.
3. **train** — ALICCS GAN/RSC on the training nodes, evaluated per held-out node, logged to MLflow,
   registered; its **gate** sets `@challenger` only when the thresholds pass.
4. **gate_passed** — stops here when the gate failed (nothing downstream runs).
5. **promote** — only with `pipeline.auto_promote: true`; otherwise a human runs `ccs promote`.
6. **distill_diagnose** — the `@champion`'s decision tree and SHAP report (skipped while there is
   no champion).

Beside them, from the training set's window: **handshake** — the per-flow tree over the handshake
features (MSS, client window, SYN-ACK→ACK time) that the next exported tables carry, registered as
`<name>-handshake` (`@champion` when it beats the majority type on held-out nodes and promotion
is automatic).
"""


@dag(
    dag_id="ccs_train",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ccselect", "training"],
    doc_md=DOC,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
)
def ccs_train():
    @task
    def training_set(logical_date=None, dag_run=None) -> list[str]:
        hours = (dag_run.conf or {}).get("window_hours") if dag_run else None
        window = Window.before(logical_date, int(hours or load_config().settings.pipeline.train_window_hours))
        report("training_set", build(window))
        return [window.lo, window.hi]

    @task
    def prefix_groups(window: list[str]) -> list[str]:
        report("prefix_groups", groups(Window.hours(*window)))
        return window

    @task
    def train(window: list[str]) -> dict:
        res = do_train(Window.hours(*window))
        report("train", res)
        return {"version": str(res["version"]), "passed": bool(res["gate"]["passed"]), "window": window}

    @task.short_circuit
    def gate_passed(result: dict) -> bool:
        print(f"gate of v{result['version']}: {'passed' if result['passed'] else 'failed'}")
        return result["passed"]

    @task
    def promote(result: dict, dag_run=None) -> dict:
        auto = (dag_run.conf or {}).get("auto_promote") if dag_run else None
        return report("promote", promote_if_configured(result["version"], auto=auto))

    @task
    def distill_diagnose(result: dict) -> dict:
        from airflow.exceptions import AirflowSkipException

        try:
            return report("distill_diagnose", distill_and_diagnose(Window.hours(*result["window"])))
        except LookupError as e:  # no @champion yet
            raise AirflowSkipException(str(e))

    @task
    def handshake(window: list[str], dag_run=None) -> dict:
        auto = (dag_run.conf or {}).get("auto_promote") if dag_run else None
        return report("handshake", handshake_tree(Window.hours(*window), auto=auto))

    window = training_set()
    t = train(prefix_groups(window))
    handshake(window)
    g = gate_passed(t)
    p = promote(t)
    g >> p >> distill_diagnose(t)


ccs_train()
