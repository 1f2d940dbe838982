"""ccs_maintain: daily, the lake's compaction, retention and VACUUM (jobs/maintain.py).
The work lives in flows.pipeline / jobs.maintain; this file only wires it."""
from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag, task

from ccselect.flows.pipeline import maintain_lake, report

DOC = """
### ccs_maintain
Daily at 03:30 UTC. Every Delta table of the lake: retention properties (`lake.retention_days`
for deleted files and the log), compaction of its closed hours (the newest `lake.open_hours`
stay the stream's), and VACUUM with the same retention. Safe beside the stream and a backfill:
a lost commit race is retried; time travel within retention still reads.
"""


@dag(
    dag_id="ccs_maintain",
    schedule="30 3 * * *",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ccselect", "lake"],
    doc_md=DOC,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
)
def ccs_maintain():
    @task
    def maintain() -> dict:
        return report("maintain", maintain_lake())

    maintain()


ccs_maintain()
