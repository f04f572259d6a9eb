"""Giving back Spark's start-up Python workers, against real Spark and the real broker: the daemons (and
their forked workers) of source lookup, creation and read planning end; a running query goes on without
them; a query started afterwards makes Spark start them again and runs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from kafka import KafkaProducer
from pyspark.sql import DataFrame, SparkSession

from tidewater.broker import EmbeddedBroker
from tidewater.processes import stat_fields
from tidewater.streaming.startup_workers import (
    READ_PLANNING,
    SOURCE_CREATION,
    STARTUP_WORKER_MODULES,
    ReadSources,
    StartupWorkers,
)


def startup_processes(jvm: int) -> dict[int, str]:
    """This JVM's start-up daemons and the workers forked from them: pid -> worker module. Another JVM's
    (a second pytest worker's session) are not this one's, though their command lines are the same."""
    return {pid: module for pid, (module, _) in startup_tree(jvm).items()}


def startup_tree(jvm: int) -> dict[int, tuple[str, int]]:
    """:func:`startup_processes` with each one's parent: pid -> (worker module, parent pid)."""
    parents: dict[int, int] = {}
    modules: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
            parents[int(entry)] = int(stat_fields(f"/proc/{entry}/stat")[1])
        except (OSError, IndexError, ValueError):
            continue
        if "pyspark.daemon" in argv and argv[-1] in STARTUP_WORKER_MODULES:
            modules[int(entry)] = argv[-1]
    daemons = {pid for pid in modules if parents[pid] == jvm}
    return {pid: (module, parents[pid]) for pid, module in modules.items() if pid in daemons or parents[pid] in daemons}


def not_released(before: dict[int, tuple[str, int]], stopped: list[int]) -> set[int]:
    """Of the processes alive before this test's first query, the daemons the release did not stop and
    their workers: not this session's factories' (the release stops every daemon its factories hold).
    Suspected at the ninth stop, on a pytest worker whose session earlier modules had used."""
    daemons = {pid for pid, (_, parent) in before.items() if pid not in stopped and parent not in stopped}
    return {pid for pid, (_, parent) in before.items() if pid in daemons or parent in daemons}


def produce(servers: str, topic: str, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=servers)
    try:
        for i in range(count):
            producer.send(topic, value=b'{"n": %d}' % i, partition=i % 2)
        producer.flush()
    finally:
        producer.close()


def wait_for(
    condition: Callable[[], bool], what: str, seconds: float = 90, detail: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s {detail()}"
        time.sleep(0.5)


def test_start_up_workers_end_and_come_back_when_needed(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    rows: dict[str, int] = {"first": 0, "second": 0}

    def start(name: str, topic: str):
        def count(df: DataFrame, batch_id: int) -> None:
            rows[name] += df.count()

        return (
            spark.readStream.format("tidewater-kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("subscribe", topic)
            .load()
            .writeStream.foreachBatch(count)
            .trigger(processingTime="1 second")
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )

    first_topic, second_topic = make_topic(2), make_topic(2)
    produce(broker.bootstrap_servers, first_topic, 100)
    earlier = startup_tree(jvm)  # left by earlier tests on this shared session, if any
    first = start("first", first_topic)
    second = None
    try:
        read = ReadSources()
        wait_for(lambda: read.add(first.lastProgress), "the first query read its rows")
        before = startup_processes(jvm)
        assert {SOURCE_CREATION, READ_PLANNING} <= set(before.values()), before  # what the start left

        stopped = StartupWorkers(spark).release(STARTUP_WORKER_MODULES)
        assert stopped and set(stopped) <= set(before)  # daemons only: their workers end with them
        foreign = not_released(earlier, stopped)
        if foreign:
            print(f"start-up processes older than this test, not of this session's factories: {foreign}")
        wait_for(
            lambda: not set(startup_processes(jvm)) - foreign,
            "every start-up daemon and worker ended",
            20,
            detail=lambda: (
                f"left: {startup_processes(jvm)} (older: {earlier}); queries: {[q.name for q in spark.streams.active]}"
            ),
        )
        assert StartupWorkers(spark).release(STARTUP_WORKER_MODULES) == []  # nothing left to stop

        produce(broker.bootstrap_servers, first_topic, 50)  # the running query needs none of them
        wait_for(lambda: rows["first"] == 150, "the running query read the new rows")

        produce(broker.bootstrap_servers, second_topic, 30)  # a new query: Spark starts them again
        second = start("second", second_topic)
        wait_for(lambda: rows["second"] == 30, "a query started after the release ran")
        assert {SOURCE_CREATION, READ_PLANNING} <= {
            m for pid, m in startup_processes(jvm).items() if pid not in foreign
        }
        assert first.isActive and second.isActive and first.exception() is None and second.exception() is None
    finally:
        first.stop()
        if second is not None:
            second.stop()
