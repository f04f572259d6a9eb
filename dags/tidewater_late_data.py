"""``tidewater_correct_late_data``: fold events that arrived behind the watermark into gold.

Every run looks at the last ``TIDEWATER_CORRECTION_LOOKBACK_HOURS`` (or the ``start``/``end`` params
of a manual run), recomputes from silver only the closed gold windows whose values differ, writes
them as ``final`` with a new revision, and records each change (old value, new value, late events,
reason, DAG run id) in the pipeline's corrections ledger instead of overwriting silently.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task

from tidewater.config import Settings
from tidewater.orchestration import tasks
from tidewater.orchestration.assets import tier_assets
from tidewater.orchestration.operators import TidewaterAuditOperator, TidewaterSparkJobOperator
from tidewater.pipelines import all_pipelines

settings = Settings.from_env()

with DAG(
    dag_id="tidewater_correct_late_data",
    description="Recompute gold windows that late events changed; record each correction in the ledger",
    schedule=settings.correction_schedule,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    params={
        "start": Param("", type="string", description="optional ISO-8601 range start (default: lookback)"),
        "end": Param("", type="string", description="optional ISO-8601 range end (default: the run's time)"),
    },
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=1)},
    tags=["tidewater", "late-data"],
    doc_md=__doc__,
):
    for name, pipeline in sorted(all_pipelines().items()):

        @task(task_id=f"plan_{name}", multiple_outputs=True)
        def plan(
            pipeline: str = name,
            params: dict | None = None,
            data_interval_end: dt.datetime | None = None,
            run_id: str | None = None,
        ) -> dict[str, list[str]]:
            assert run_id is not None
            dag_id = "tidewater_correct_late_data"
            return tasks.correction_plan(pipeline, params or {}, data_interval_end, run_id, dag_id=dag_id)

        planned = plan()
        correct = TidewaterSparkJobOperator(
            task_id=f"correct_{name}",
            job="batch",
            job_args=planned["correct"],
            inlets=tier_assets(settings, pipeline, "silver"),  # lineage: silver -> gold (no events)
            outlets=tier_assets(settings, pipeline, "gold"),
        )
        correct >> TidewaterAuditOperator(task_id=f"audit_{name}", job_args=planned["audit"], retries=0)
