"""ccs_hourly: every hour, the edge logs of the hour that just ended → bronze/silver → inference
with `models:/<name>@champion` → ALICCS Algorithm 1 table → guards → rollout (canaries first).
The work lives in flows.pipeline and the packages under it; this file only wires it."""
from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, dag, task

from ccselect.flows.pipeline import TableRefused, asset_uri, export_hour, infer_hour, ingest_hour, report, rollout as do_rollout
from ccselect.hours import previous_hour
from ccselect import lake
# Imported inside the functions that use them (heavy, not needed to import this module): airflow.

#: the tables each run updates, as Airflow assets (a consumer can be scheduled on them)
SILVER, PREDICTIONS, TABLES = (Asset(name=t, uri=asset_uri(t), group="ccselect")
                               for t in (lake.CONNECTIONS, lake.PREDICTIONS, lake.CC_TABLES))

DOC = """
### ccs_hourly
The run at HH:00 works on the hour (HH-1):00–HH:00 of every edge node.

1. **ingest** — the three streams into `bronze.*`, bad lines into `bronze.quarantine` with their
   reason, `gold.ingest_audit`, then `silver.connections` (replaces the hour's partitions).
2. **infer** — `gold.predictions` for the hour with the `@champion` model; skipped (and so is
   everything after it) while no version has been promoted.
3. **export** — purity aggregation over the last `pipeline.export_window_hours` into a signed
   table recorded in `gold.cc_tables`.
4. **rollout** — guards (gate, flip share, coverage, bogons), publish to the artifact store,
   canaries → health → the rest. A refused guard fails this task, never the ingest. The fleet
   step needs root; a run's conf may say `{"deploy": false}` to stop at the signed artifact.

ingest, infer and export emit their table as an Airflow asset (`silver.connections`,
`gold.predictions`, `gold.cc_tables`, each the URI of its Delta folder): a DAG scheduled on one
runs when the hour's table is there, not at a guessed time.
"""


@dag(
    dag_id="ccs_hourly",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ccselect", "hourly"],
    doc_md=DOC,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=3)},
)
def ccs_hourly():
    @task(outlets=[SILVER])
    def ingest(logical_date=None) -> str:
        hour = previous_hour(logical_date)
        report("ingest", ingest_hour(hour))
        return hour

    @task(outlets=[PREDICTIONS])
    def infer(hour: str) -> str:
        from airflow.exceptions import AirflowSkipException

        try:
            report("infer", infer_hour(hour))
        except LookupError as e:  # no @champion yet: nothing to enforce, not a failure
            raise AirflowSkipException(str(e))
        return hour

    @task(retries=1, outlets=[TABLES])
    def export(hour: str) -> int:
        man = export_hour(hour)
        report("export", man)
        return int(man["version"])

    @task(retries=1)
    def rollout(version: int, dag_run=None) -> dict:
        from airflow.exceptions import AirflowFailException

        deploy = (dag_run.conf or {}).get("deploy") if dag_run else None
        try:
            return report("rollout", do_rollout(version, deploy_fleet=deploy))
        except TableRefused as e:  # a refusal is a verdict on this table: retrying cannot change it
            raise AirflowFailException(str(e)) from e

    rollout(export(infer(ingest())))


ccs_hourly()
