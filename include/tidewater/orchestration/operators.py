"""The Airflow operator that runs a tidewater Spark job (spark_jobs/<job>.py) with spark-submit.

A thin SparkSubmitOperator: the Spark master comes from the ``spark_default`` connection (the
platform sets it from TIDEWATER_SPARK_MASTER), and the job's environment (TIDEWATER_* settings,
the venv's Python for PySpark workers) is read when the task runs, not when the DAG is parsed.
The Spark job's log lines, including its final ``tidewater: result {...}`` line, land in the task log;
clearing or marking the task failed kills the spark-submit process (the operator's on_kill). A task
with outlets (the lake tables it writes, :mod:`tidewater.orchestration.assets`) reads that result
line to say in its asset events what the job wrote.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from tidewater import class_data
from tidewater.batch.result import RESULT_PREFIX
from tidewater.config import Settings
from tidewater.orchestration.assets import annotate_events, job_result
from tidewater.paths import project_root
from tidewater.processes import spark_child_env
from tidewater.spark import java_options_of


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
        # spark-submit starts the driver JVM: its options go here
        if options := java_options_of(settings, class_data.java_options()):
            self.conf = {**(self.conf or {}), "spark.driver.extraJavaOptions": " ".join(options)}
        self._result_lines: list[str] = []
        super().execute(context)
        if self.outlets:
            annotate_events(context["outlet_events"], self.outlets, settings, job_result(self._result_lines))

    def _get_hook(self) -> Any:
        """The provider's hook, with the job's output lines also passing by :meth:`_keep_result`."""
        hook = super()._get_hook()
        process = hook._process_spark_submit_log
        hook._process_spark_submit_log = lambda lines: process(self._keep_result(lines))
        return hook

    def _keep_result(self, lines: Iterator[Any]) -> Iterator[Any]:
        for line in lines:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
            if RESULT_PREFIX in text:
                self._result_lines.append(text[text.index(RESULT_PREFIX) :])
            yield line


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
