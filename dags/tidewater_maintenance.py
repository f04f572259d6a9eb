"""``tidewater_maintenance``: compaction, vacuum (declared retention) and a log checkpoint per table.

Each step holds the table's lock, the one the stream takes for every commit, so maintenance waits
for a micro-batch to finish instead of racing it into a failed commit. Retention comes from
``TIDEWATER_VACUUM_RETENTION_HOURS`` (default 168 h).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, task

from tidewater.config import Settings
from tidewater.orchestration import tasks
from tidewater.pipelines import all_pipelines

settings = Settings.from_env()

with DAG(
    dag_id="tidewater_maintenance",
    description="Compact, vacuum and checkpoint every Delta table",
    schedule=settings.maintenance_schedule,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=5)},
    tags=["tidewater", "maintenance"],
    doc_md=__doc__,
):
    for name in sorted(all_pipelines()):

        @task(task_id=f"maintain_{name}")
        def maintain(pipeline: str = name, run_id: str | None = None) -> list:
            assert run_id is not None
            return tasks.maintain(pipeline, run_id)

        maintain()
