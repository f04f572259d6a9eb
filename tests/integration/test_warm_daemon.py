"""tidewater.warm_daemon: Spark's Python daemons import their workers' modules before forking them."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from tidewater.processes import children
from tidewater.warm_daemon import READ_PLANNING, SWITCH

# Spark puts its pyspark.zip on every Python process's path: that is how the .pth hook knows Spark started it.
SPARK_PYTHONPATH = str(Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip")


TASK_DAEMON = "-m pyspark.daemon pyspark.worker"


def start_daemon(pythonpath: str = "", **env: str) -> tuple[subprocess.Popen[bytes], int]:
    """A daemon as Spark starts one (its worker module as argument, the JVM on its stdin); with the
    port it listens on, which it writes to stdout once it is ready to fork."""
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pyspark.daemon", "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHON_WORKER_FACTORY_SECRET": "s",
            "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, SPARK_PYTHONPATH) if p),
            **env,
        },
    )
    assert daemon.stdout is not None
    port = struct.unpack("!i", daemon.stdout.read(4))[0]
    return daemon, port


def mapped_packages(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {part.split("/")[0] for line in maps for part in line.split("site-packages/")[1:]}


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        return dict(item.decode().split("=", 1) for item in environ.read().split(b"\0") if b"=" in item)


@pytest.mark.parametrize("switch", ["", "false"])
def test_a_daemon_is_warm_single_threaded_and_ends_with_its_jvm(switch: str) -> None:
    daemon, port = start_daemon(**{SWITCH: switch})
    try:
        assert port > 0
        packages = mapped_packages(daemon.pid)
        if switch == "false":  # pyspark's daemon as it is: its workers import what they need
            assert not {"pyarrow", "deltalake"} & packages
        else:
            assert {"pyarrow", "deltalake", "confluent_kafka", "pandas", "msgspec"} <= packages
        assert threads(daemon.pid) == 1  # so a fork copies every thread there is
        assert daemon.stdin is not None
        daemon.stdin.close()  # the JVM gone
        assert daemon.wait(timeout=30) == 1  # pyspark's daemon shuts down with 1 when its JVM goes
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_daemon_whose_imports_start_a_thread_starts_again_cold(tmp_path: Path) -> None:
    """A fork copies only the forking thread: if an import started one, the daemon runs again, cold."""
    (tmp_path / "msgspec.py").write_text(  # stands in for a preloaded module that starts a thread
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    daemon, port = start_daemon(str(tmp_path))
    try:
        assert port > 0
        assert environment(daemon.pid)[SWITCH] == "false"  # the same pid, started again
        assert threads(daemon.pid) == 1
        assert "pyarrow" not in mapped_packages(daemon.pid)
    finally:
        daemon.kill()
        daemon.wait()


def test_the_sessions_task_workers_fork_from_a_warm_daemon(spark: SparkSession) -> None:
    def passthrough(batches):  # type: ignore[no-untyped-def]
        yield from batches

    assert spark.range(1000).repartition(2).mapInArrow(passthrough, "id long").count() == 1000
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    daemons: list[int] = []
    while not daemons and time.monotonic() < deadline:
        daemons = [pid for pid, command in children(jvm) if command.rstrip().endswith(TASK_DAEMON)]
        time.sleep(0.1)
    assert len(daemons) == 1
    assert "deltalake" in mapped_packages(daemons[0])  # imported before any worker asked for it
    assert children(daemons[0]), "the task workers are the daemon's forks"


def test_read_planning_workers_end_once_they_have_answered(spark: SparkSession) -> None:
    """A Python data source's read is planned in a worker that ends after its call, not one Spark keeps
    idle for a minute, forked from a cold daemon; the next plan forks another."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class NumbersReader(DataSourceReader):
        def read(self, partition):  # type: ignore[no-untyped-def]
            yield from ((n,) for n in range(10))

    class Numbers(DataSource):  # defined here, so it is pickled by value for the workers
        @classmethod
        def name(cls) -> str:
            return "tidewater-test-numbers"

        def schema(self) -> str:
            return "n int"

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return NumbersReader()

    spark.dataSource.register(Numbers)
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]
    for _ in range(2):  # a second round: its plan forks a new worker from the same daemon
        assert spark.read.format("tidewater-test-numbers").load().count() == 10
        daemons = [
            pid for pid, command in children(jvm) if command.rstrip().endswith(f"-m pyspark.daemon {READ_PLANNING}")
        ]
        assert len(daemons) == 1
        assert "deltalake" not in mapped_packages(daemons[0])  # cold: no worker would share its pages
        deadline = time.monotonic() + 10
        while children(daemons[0]):  # Spark would keep it idle for 60 s
            assert time.monotonic() < deadline, children(daemons[0])
            time.sleep(0.2)
