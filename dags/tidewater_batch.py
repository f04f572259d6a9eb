"""Scheduled batch recompute, one DAG per pipeline: ``tidewater_batch_<pipeline>``.

For its data interval, once ``TIDEWATER_BATCH_SETTLE_MINUTES`` have passed since it ended (its
events have reached silver, its windows are behind the watermark), recompute silver from bronze
with the streaming job's own transforms, replacing exactly that interval (a rerun gives the same
tables); audit it (Great Expectations suites of bronze, the arriving records and silver, plus the
reconciliation; results in the audit table, Data Docs linked from the audit task); ``gold_gate``
holds gold back if a suite the pipeline declares blocking failed; otherwise publish the interval's
gold (recomputed from silver) and audit it. Catchup is on, so Airflow's backfill (CLI, REST API, UI) fills any range;
``max_active_runs`` keeps a backfill from starving the schedule. The interval's writes hold the
tables' locks, so they never interleave with the live stream's commits.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
from airflow.sdk import DAG, CronDataIntervalTimetable, task
from airflow.utils.trigger_rule import TriggerRule

from tidewater.config import Settings
from tidewater.orchestration import tasks
from tidewater.orchestration.assets import tier_assets
from tidewater.orchestration.operators import TidewaterAuditOperator, TidewaterSparkJobOperator
from tidewater.pipelines import all_pipelines

settings = Settings.from_env()
# Set by the platform to the hour it first ran; without it the DAGs wait, paused, for someone to choose.
START = (
    dt.datetime.fromisoformat(settings.batch_start_date)
    if settings.batch_start_date
    else dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
)

for name, pipeline in sorted(all_pipelines().items()):
    with DAG(
        dag_id=f"tidewater_batch_{name}",
        description=f"Recompute {name} silver and gold for each interval from bronze",
        # A data interval per run (Airflow 3's plain cron schedule has none): [start, end) is what runs recompute.
        schedule=CronDataIntervalTimetable(settings.batch_schedule, timezone="UTC"),
        start_date=START if START.tzinfo else START.replace(tzinfo=dt.UTC),
        catchup=True,
        max_active_runs=settings.batch_max_active_runs,
        is_paused_upon_creation=not settings.batch_start_date,
        default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=2)},
        tags=["tidewater", "batch", name],
        doc_md=__doc__,
    ):

        @task(task_id="plan_interval", multiple_outputs=True)
        def plan(
            pipeline: str = name,
            data_interval_start: dt.datetime | None = None,
            data_interval_end: dt.datetime | None = None,
            run_id: str | None = None,
            dag_run: Any = None,
        ) -> dict[str, Any]:
            assert run_id is not None and dag_run is not None
            return tasks.interval_plan(
                pipeline,
                data_interval_start,
                data_interval_end,
                run_id,
                dag_id=dag_run.dag_id,
                run_type=dag_run.run_type,
            )

        # Runs once the audit finished (passed or failed), and fails if a blocking suite failed.
        @task(task_id="gold_gate", trigger_rule=TriggerRule.NONE_SKIPPED, retries=0)
        def gate(pipeline: str = name, run_id: str | None = None, dag_run: Any = None) -> dict[str, Any]:
            assert run_id is not None and dag_run is not None
            return tasks.gold_gate(pipeline, dag_run.dag_id, run_id, "audit_interval")

        settle = TimeDeltaSensor(
            task_id="wait_for_late_data",
            delta=dt.timedelta(minutes=settings.batch_settle_minutes),
            deferrable=True,  # waits in the triggerer, not in a worker slot
        )
        planned = plan()
        settle >> planned
        silver = TidewaterSparkJobOperator(
            task_id="recompute_silver",
            job="batch",
            job_args=planned["silver"],
            inlets=tier_assets(settings, pipeline, "bronze"),  # lineage: bronze -> silver (no events)
            outlets=tier_assets(settings, pipeline, "silver"),
        )
        audit = TidewaterAuditOperator(task_id="audit_interval", job_args=planned["audit"], retries=0)
        gold = TidewaterSparkJobOperator(
            task_id="publish_gold",
            job="batch",
            job_args=planned["gold"],
            inlets=tier_assets(settings, pipeline, "silver"),
            outlets=tier_assets(settings, pipeline, "gold"),
        )
        silver >> audit >> gate() >> gold
        gold >> TidewaterAuditOperator(task_id="audit_gold", job_args=planned["audit_gold"], retries=0)
