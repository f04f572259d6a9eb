"""The streaming job as a child process: launching spark_jobs/stream.py, and reading why it ended.

The supervisor (orchestration), the chaos tests and the benchmarks all start the stream this way,
so the job always runs in a session of its own (stoppable as a group, targetable by fault
injection) with the same Spark environment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tidewater import class_data, faults
from tidewater.config import Settings
from tidewater.paths import spark_job
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import spark_child_env
from tidewater.spark import java_options_of, stream_master


def job_master(settings: Settings, pipeline: str) -> str:
    """The master ``pipeline``'s streaming job runs on: on a local master, at least a task slot more
    than it has source queries (:func:`tidewater.spark.stream_master`)."""
    return stream_master(settings, PipelineLayout.of(settings, get_pipeline(pipeline)).source_queries)


def stream_job_command(settings: Settings, pipeline: str, extra_args: Sequence[str] = ()) -> list[str]:
    """The spark-submit command line of ``pipeline``'s streaming job. spark-submit starts the JVM before
    any of our code reads the session's conf, so the job's heap and JVM options are given here."""
    return _submit(settings, job_master(settings, pipeline), "stream", [pipeline, *extra_args])


def stream_host_command(settings: Settings, namespace: str) -> list[str]:
    """The spark-submit command line of the stream host (:mod:`tidewater.streaming.host`)."""
    from tidewater.streaming.host import host_master

    return _submit(settings, host_master(settings), "stream_host", ["--namespace", namespace])


def _submit(settings: Settings, master: str, job: str, args: Sequence[str]) -> list[str]:
    java_options = " ".join(java_options_of(settings, class_data.java_options(), streaming=True))
    return [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        master,
        "--driver-memory",
        settings.stream_driver_memory,
        "--conf",
        "spark.driver.host=127.0.0.1",
        *(["--driver-java-options", java_options] if java_options else []),
        str(spark_job(job)),
        *args,
    ]


def launch_stream_job(
    settings: Settings,
    pipeline: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """spark-submit the streaming job in its own process group (so it can be stopped as a whole)."""
    return _launch(settings, stream_job_command(settings, pipeline, extra_args), log_path, extra_env)


def launch_stream_host(settings: Settings, namespace: str, log_path: Path) -> subprocess.Popen[bytes]:
    """spark-submit the stream host in its own process group."""
    return _launch(settings, stream_host_command(settings, namespace), log_path)


def _launch(
    settings: Settings, command: list[str], log_path: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # The child's environment only: the caller's (a test process, an Airflow task) stays as it was.
            # A new session holds exactly this job, so fault injection may target it as a whole.
            env={
                **os.environ,
                **spark_child_env(),
                **settings.to_env(),
                faults.DRIVER_PGID: "session",
                **(extra_env or {}),
            },
            start_new_session=True,
        )


def last_error_line(log_path: Path) -> str:
    """The last one-line error a tidewater process printed to ``log_path`` (``tidewater: <Kind>Error: ...``)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line.removeprefix("tidewater: ")
    return "no error reported (killed by a signal, or out of memory?)"


_ERROR_LINE = re.compile(r"^tidewater: [A-Z]\w*(Error|Exception|Failure|Exit)\b")
