"""tidewater.warm_daemon: Spark's Python daemons import their workers' modules before forking them."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from pyspark.sql import SparkSession

from tidewater.processes import children
from tidewater.warm_daemon import MODULE, SWITCH


def start_daemon(**env: str) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon as Spark starts it (its worker module as argument, the JVM on its stdin); with the
    port it listens on, which it writes to stdout once it is ready to fork."""
    daemon = subprocess.Popen(
        [sys.executable, "-m", MODULE, "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHON_WORKER_FACTORY_SECRET": "s", **env},
    )
    assert daemon.stdout is not None
    port = struct.unpack("!i", daemon.stdout.read(4))[0]
    return daemon, port


def mapped_packages(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {part.split("/")[0] for line in maps for part in line.split("site-packages/")[1:]}


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.parametrize("switch", ["", "false"])
def test_the_daemon_is_warm_single_threaded_and_ends_with_its_jvm(switch: str) -> None:
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


def test_a_daemon_whose_imports_start_a_thread_runs_pyspark_s_own(tmp_path) -> None:
    """A fork copies only the forking thread: if an import started one, the daemon starts pyspark's
    daemon in its place, cold."""
    (tmp_path / "sitecustomize.py").write_text(  # a thread started as the warm daemon's interpreter starts
        "import sys, threading, time\n"
        f"if {MODULE!r} in sys.orig_argv:\n"
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    daemon, port = start_daemon(PYTHONPATH=path)
    try:
        assert port > 0
        with open(f"/proc/{daemon.pid}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[1:4] == [b"-m", b"pyspark.daemon", b"pyspark.worker"]
        assert threads(daemon.pid) == 1
    finally:
        daemon.kill()
        daemon.wait()


def test_the_sessions_task_workers_fork_from_the_warm_daemon(spark: SparkSession) -> None:
    """Every tidewater session names it (``spark.python.daemon.module``), and Spark runs it."""

    def passthrough(batches):  # type: ignore[no-untyped-def]
        yield from batches

    assert spark.range(1000).repartition(2).mapInArrow(passthrough, "id long").count() == 1000
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    daemons: list[int] = []
    while not daemons and time.monotonic() < deadline:
        daemons = [pid for pid, command in children(jvm) if command.rstrip().endswith(f"-m {MODULE} pyspark.worker")]
        time.sleep(0.1)
    assert len(daemons) == 1
    assert children(daemons[0]), "the task workers are the warm daemon's forks"
    assert "deltalake" in mapped_packages(children(daemons[0])[0][0])
