"""ccs_autoplex: every 30 minutes, AutoPlex's better-session statistics per user group for the
period that just ended at the run's logical date (AutoPlex Algorithm 1) → gold.autoplex_params.
The work lives in flows.pipeline / jobs.autoplex; this file only wires it."""
from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from ccselect.flows.pipeline import autoplex_period, previous_period, report

DOC = """
### ccs_autoplex
Every 30 minutes; the run at HH:30 works on the period HH:00–HH:30 that just ended. Per user group (region + ASN), the sessions in the better percentile band of
each configured policy (`autoplex.policies`), their mean goodput, in-flight and cwnd, and the
caps for the next period (AutoPlex Algorithm 1, eq. 1) into `gold.autoplex_params`, keyed by
period, so a re-run replaces its own rows. Export reads the caps of switched-on services.
"""


@dag(
    dag_id="ccs_autoplex",
    schedule="*/30 * * * *",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ccselect", "autoplex"],
    doc_md=DOC,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
)
def ccs_autoplex():
    @task
    def autoplex_parameters(logical_date=None) -> dict:
        return report("autoplex", autoplex_period(previous_period(logical_date)))

    autoplex_parameters()


ccs_autoplex()
