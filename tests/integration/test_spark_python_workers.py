"""How Spark's Python processes start (tidewater.worker_start), against real Spark: its own
PythonWorkerFactory starts a streaming-source runner as a query does, with its fixed 10 s to connect
back. A runner whose start takes longer (a sitecustomize that sleeps after the .pth files, standing in
for a busy host) connects with the hook; the same start as Spark makes it (switched off) times out."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from tidewater.streaming.runner import WORKER_TIMEOUT
from tidewater.worker_start import SWITCH

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
SLOW = "TIDEWATER_TEST_SLOW_START"
# Runs in every interpreter whose PYTHONPATH holds it, after the .pth files: slows only the runner's start.
SLOW_START = textwrap.dedent(
    f"""
    import os, sys, time
    if os.environ.get("{SLOW}") and "{RUNNER}" in sys.orig_argv:
        time.sleep(float(os.environ["{SLOW}"]))
    """
)


def start_runner(spark: SparkSession, environment: dict[str, str]) -> str:
    """Spark's PythonWorkerFactory starts the runner and waits for it: "connected", or Spark's error."""
    context = spark.sparkContext
    jvm = context._jvm
    factory = jvm.org.apache.spark.api.python.PythonWorkerFactory(
        context.pythonExec, RUNNER, jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(environment), False
    )
    try:
        worker = factory.createSimpleWorker(True)._1()
        factory.stopWorker(worker)
        return "connected"
    except Py4JJavaError as error:
        return str(error.java_exception)
    finally:
        factory.stop()


def slow_runners() -> list[int]:
    """Runner processes this test started (their environment holds the slow start), still alive."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if RUNNER.encode() not in handle.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if SLOW.encode() + b"=" in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_runner_slower_than_sparks_window_still_connects(spark: SparkSession, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_START)
    slow = {"PYTHONPATH": str(site), SLOW: "10.5"}
    try:
        with ThreadPoolExecutor(2) as pool:  # both sleep at once
            hooked = pool.submit(start_runner, spark, slow)
            as_spark_starts_it = pool.submit(start_runner, spark, {**slow, SWITCH: "spark"})
            assert WORKER_TIMEOUT in as_spark_starts_it.result(60)
            assert hooked.result(60) == "connected"
    finally:
        for pid in slow_runners():  # the runner Spark gave up on: it would try to connect for 15 s more
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while slow_runners() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not slow_runners()
