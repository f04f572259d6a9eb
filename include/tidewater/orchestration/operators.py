"""The Airflow operator that runs a tidewater Spark job (spark_jobs/<job>.py) with spark-submit.

A thin SparkSubmitOperator: the Spark master comes from the ``spark_default`` connection (the
platform sets it from TIDEWATER_SPARK_MASTER), and the job's environment (TIDEWATER_* settings,
the venv's Python for PySpark workers) is read when the task runs, not when the DAG is parsed.
The Spark job's log lines, including its final ``tidewater: result {...}`` line, land in the task log;
clearing or marking the task failed kills the spark-submit process (the operator's on_kill).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from tidewater.config import Settings
from tidewater.paths import project_root
from tidewater.processes import spark_child_env


class TidewaterSparkJobOperator(SparkSubmitOperator):
    def __init__(self, *, job: str, job_args: Sequence[str] | Any, **kwargs: Any) -> None:
        super().__init__(
            application=str(project_root() / "spark_jobs" / f"{job}.py"),
            application_args=job_args,
            conn_id="spark_default",
            name=f"tidewater-{job}",
            conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
            **kwargs,
        )

    def execute(self, context: Any) -> None:
        settings = Settings.from_env()
        self._driver_memory = settings.spark_driver_memory
        self.env_vars = {**settings.to_env(), **spark_child_env()}
        return super().execute(context)


class TidewaterAuditOperator(TidewaterSparkJobOperator):
    """The audit job (spark_jobs/audit.py), with a "Data quality report" button on its task instances
    that opens the Data Docs of the run in the tidewater plugin. DAGs give it ``retries=0``: a failed
    suite fails the same way again, and a retry would only delay the red task and the gate."""

    def __init__(self, *, job_args: Sequence[str] | Any, **kwargs: Any) -> None:
        super().__init__(job="audit", job_args=job_args, **kwargs)

    @property
    def operator_extra_links(self) -> tuple[Any, ...]:  # type: ignore[override]
        from tidewater.ui.links import AuditReportLink

        return (AuditReportLink(),)
