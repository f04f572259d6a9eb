"""Exactly-once publication of micro-batches to Kafka (tidewater.connectors.kafka_publish), real broker.

The two kill points of the exactly-once argument are exercised with real processes killed by SIGKILL:
a child that dies inside ``publish`` after its records reached the broker but before the commit (the
re-run must publish the batch and the zombie's records must never be read), and a child that dies
right after the commit (the re-run must skip the batch). Every child runs in its own session and is
killed by PID in a finalizer, also when a test fails.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaConnection, KafkaPythonClient, kafka_python_config
from tidewater.connectors.kafka_publish import BatchPublisher, OutgoingRecord, read_committed
from tidewater.errors import BrokerUnreachableError, TopicNotFoundError

# A child publisher. "before-commit": dies inside publish() after its records (and marker) reached the
# broker, before the commit; "after-commit": dies right after publish() committed.
CHILD = r"""
import json, sys, time
from tidewater.connectors.kafka_publish import BatchPublisher, OutgoingRecord

args = json.loads(sys.argv[1])
publisher = BatchPublisher(
    args["config"], topic=args["topic"], control_topic=args["control"],
    transactional_id=args["txn"], app_id=args["app"], timeout_s=10,
)
records = [OutgoingRecord(k.encode(), v.encode()) for k, v in args["records"]]
if args["mode"] == "before-commit":
    real = publisher._producer

    class StopBeforeCommit:
        def __getattr__(self, name):
            return getattr(real, name)

        def commit_transaction(self, timeout=None):
            real.flush(10)  # the records and the marker are on the broker, the transaction open
            print("produced", flush=True)
            time.sleep(600)

    publisher._producer = StopBeforeCommit()
    publisher.publish(args["batch"], records)
else:
    assert publisher.publish(args["batch"], records)
    print("committed", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture
def topics(make_topic: Callable[..., str]) -> tuple[str, str]:
    """(a 3-partition data topic, its 1-partition control topic)."""
    return make_topic(partitions=3, prefix="pub"), make_topic(partitions=1, prefix="pub-batches")


def batch(n: int, size: int = 8) -> list[OutgoingRecord]:
    return [OutgoingRecord(f"k{i}".encode(), f"{n}-{i}".encode(), (("batch", str(n).encode()),)) for i in range(size)]


def values(rows: list[tuple[bytes | None, bytes, int, int]]) -> list[bytes]:
    return [value for _, value, _, _ in rows]


def run_child(
    children: list[subprocess.Popen[str]], tmp_path: Path, mode: str, ready: str, **args: Any
) -> subprocess.Popen[str]:
    """Start a child publisher and wait for its ``ready`` line; it is then sleeping, to be killed."""
    log = tmp_path / f"child-{mode}.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps({"mode": mode, **args})],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    children.append(process)
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline().strip() if readable else ""
    assert line == ready, f"child said {line!r}; stderr: {log.read_text()[-2000:]}"
    return process


def kill9(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def log_end(config: dict[str, Any], topic: str) -> int:
    """Offsets written to the 3 partitions of ``topic``, committed or not (high watermarks)."""
    probe = KafkaPythonClient(config, stall_timeout_s=10)
    try:
        return sum(probe.end_offsets(topic, [0, 1, 2]).values())
    finally:
        probe.close()


def publisher(config: dict[str, Any], topic: str, control: str, app: str = "query-1") -> BatchPublisher:
    return BatchPublisher(config, topic=topic, control_topic=control, transactional_id=f"txn-{app}", app_id=app)


def test_batches_published_once_and_reruns_skipped(kafka_settings: Settings, topics: tuple[str, str]) -> None:
    topic, control = topics
    config = kafka_python_config(kafka_settings)
    first = publisher(config, topic, control)
    try:
        assert first.last_published() is None
        assert [first.publish(n, batch(n)) for n in range(3)] == [True, True, True]
        rows = read_committed(config, topic)
        assert first.publish(1, batch(1)) is False  # a re-run: nothing produced
    finally:
        first.close()
    published = [r.value for n in range(3) for r in batch(n)]
    assert sorted(values(rows)) == sorted(published)  # each record once
    for partition in {p for _, _, p, _ in rows}:  # in publish order within each partition
        in_partition = [(offset, value) for _, value, p, offset in rows if p == partition]
        assert [v for _, v in sorted(in_partition)] == [v for v in published if v in dict(in_partition).values()]
    assert all(key == b"k" + value.split(b"-")[1] for key, value, _, _ in rows)

    # A new process: the last batch comes from the control topic, not from memory.
    second = publisher(config, topic, control)
    try:
        assert second.last_published() == 2
        assert second.publish(2, batch(2)) is False
        assert second.publish(3, batch(3, size=2)) is True
    finally:
        second.close()
    assert sorted(values(read_committed(config, topic))) == sorted([*published, b"3-0", b"3-1"])
    markers = [json.loads(v) for v in values(read_committed(config, control))]
    assert markers == [{"app_id": "query-1", "batch_id": n, "records": 8 if n < 3 else 2} for n in range(4)]


def test_killed_before_commit_rerun_publishes_once(
    kafka_settings: Settings,
    topics: tuple[str, str],
    make_topic: Callable[..., str],
    children: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    topic, control = topics
    config = kafka_python_config(kafka_settings)
    earlier = publisher(config, topic, control)
    try:
        assert earlier.publish(0, batch(0))
    finally:
        earlier.close()
    logged = log_end(config, topic)

    records = batch(1)
    child = run_child(
        children, tmp_path, "before-commit", "produced",
        config=config, topic=topic, control=control, txn="txn-query-1", app="query-1", batch=1,
        records=[(r.key.decode(), r.value.decode()) for r in records if r.key is not None],
    )  # fmt: skip
    # The zombie's records are in the log, its transaction open: they are not readable.
    assert log_end(config, topic) >= logged + len(records)
    assert sorted(values(read_committed(config, topic))) == sorted(r.value for r in batch(0))
    # Another query sharing the control topic: its markers count although they follow the open transaction.
    other = make_topic(partitions=1, prefix="pub-other")
    for expected in (True, False):
        neighbour = publisher(config, other, control, app="query-2")
        try:
            assert neighbour.publish(0, batch(0)) is expected
        finally:
            neighbour.close()
    kill9(child)

    rerun = publisher(config, topic, control)  # fences the dead process's transaction (aborts it)
    try:
        assert rerun.last_published() == 0  # the zombie's marker was aborted: it does not count
        assert rerun.publish(1, records) is True
        assert rerun.publish(1, records) is False
    finally:
        rerun.close()
    assert sorted(values(read_committed(config, topic))) == sorted(r.value for n in (0, 1) for r in batch(n))
    markers = [(m["app_id"], m["batch_id"]) for m in map(json.loads, values(read_committed(config, control)))]
    assert markers == [("query-1", 0), ("query-2", 0), ("query-1", 1)]


def test_killed_after_commit_rerun_skips(
    kafka_settings: Settings, topics: tuple[str, str], children: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    topic, control = topics
    config = kafka_python_config(kafka_settings)
    records = batch(0)
    child = run_child(
        children, tmp_path, "after-commit", "committed",
        config=config, topic=topic, control=control, txn="txn-query-1", app="query-1", batch=0,
        records=[(r.key.decode(), r.value.decode()) for r in records if r.key is not None],
    )  # fmt: skip
    kill9(child)  # before Spark could commit its checkpoint: the batch will run again

    rerun = publisher(config, topic, control)
    try:
        assert rerun.publish(0, records) is False
        assert rerun.publish(1, batch(1)) is True
    finally:
        rerun.close()
    assert sorted(values(read_committed(config, topic))) == sorted(r.value for n in (0, 1) for r in batch(n))


def test_one_line_errors(kafka_settings: Settings, topics: tuple[str, str]) -> None:
    topic, control = topics
    config = kafka_python_config(kafka_settings)
    for data, marker in (("no-such-topic", control), (topic, "no-such-topic.batches")):
        with pytest.raises(TopicNotFoundError, match="does not exist") as found:
            publisher(config, data, marker)
        assert "\n" not in str(found.value)
    with pytest.raises(TopicNotFoundError, match="no-such-topic"):
        read_committed(config, "no-such-topic")

    nobody = KafkaConnection(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1500).kafka_python()
    started = time.monotonic()
    with pytest.raises(BrokerUnreachableError, match="cannot reach a Kafka broker") as unreachable:
        publisher(nobody, topic, control)
    assert "\n" not in str(unreachable.value)
    with pytest.raises(BrokerUnreachableError):
        read_committed(nobody, topic)
    assert time.monotonic() - started < 15
