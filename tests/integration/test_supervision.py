"""Stream supervision with real detached spark-submit jobs: start, refuse a second driver, kill -9,
restart, bounded stop, and nothing lost or duplicated across it all.

(The same supervision through the real Airflow scheduler is exercised end to end in
tests/e2e/test_platform.py; here StreamControl is driven directly, as the supervising DAG's
task does, so each step can be checked in isolation.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline_helpers import send, table_rows, wait_for
from tidewater.generator.events import GeneratorConfig, expected_events, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.orchestration.supervisor import DEAD, RUNNING, STOPPED, StreamControl, alive
from tidewater.pipelines import get_pipeline

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
TOTAL = 6_000


def silver_count(settings) -> int:
    from tidewater.lake.layout import PipelineLayout

    table = PipelineLayout.of(settings, RSVPS).table("silver")
    return table.row_count() if table.exists() else 0


def test_supervised_stream_survives_kill_9(spark, kafka_settings, make_topic, tmp_path: Path):
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="sup") + "-",
        max_offsets_per_trigger=2000,
        stream_stop_timeout_seconds=60,
    )
    topic = settings.topic(RSVPS.topic)
    ensure_topic(settings, topic, 4)
    config = GeneratorConfig(
        seed=7, start_time_ms=parse_ts("2026-11-21T09:00:00.000Z"), rate=50, duplicate_rate=0.02, malformed_rate=0.01
    )
    records = list(generate(config, TOTAL))
    send(settings, topic, records[: TOTAL // 3])
    control = StreamControl(settings, "rsvps")
    assert control.health().state == STOPPED  # never started
    try:
        action, _ = control.supervise()
        assert action == "started"
        wait_for(lambda: control.health().state == RUNNING, timeout_s=240, what="the stream to hold its checkpoints")
        wait_for(lambda: silver_count(settings) > 0, timeout_s=240, what="first silver rows")
        first_pid = control.health().pid
        first_group = os.getpgid(first_pid)

        # A second start is a no-op, and a second driver on the same checkpoints is refused in one line.
        assert control.start(reason="test").pid == first_pid
        second = subprocess.run(
            [str(Path(sys.executable).parent / "tidewater"), "stream", "rsvps"],
            env={**os.environ, **settings.to_env()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2
        assert "in use by a running driver" in second.stderr and "Traceback" not in second.stderr

        # kill -9 the Python driver while events arrive: its JVM lingers, the supervisor reaps it and restarts.
        trickle = threading.Thread(
            target=lambda: [
                (send(settings, topic, records[i : i + 500]), time.sleep(1.0)) for i in range(TOTAL // 3, TOTAL, 500)
            ],
            daemon=True,
        )
        trickle.start()
        time.sleep(3)
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: control.health().state == DEAD, timeout_s=60, what="the dead driver to be noticed")
        assert "killed by a signal" in control.health().detail
        action, _ = control.supervise()
        assert action.startswith("restarted (died")
        wait_for(
            lambda: not [p for p in _group(first_group) if alive(p)], timeout_s=30, what="the old JVM to be reaped"
        )
        wait_for(lambda: control.health().state == RUNNING, timeout_s=240, what="the restarted stream")
        assert control.health().pid != first_pid
        trickle.join(timeout=120)

        # Everything arrives exactly once, then a stop ends the job within the bounded time.
        expected = len(expected_events(config, TOTAL))
        wait_for(lambda: silver_count(settings) >= expected, timeout_s=300, what=f"{expected} silver rows")
        group = os.getpgid(control.health().pid)
        began = time.monotonic()
        stopped = control.stop(reason="test")
        took = time.monotonic() - began
        assert stopped.state == STOPPED and took < settings.stream_stop_timeout_seconds + 15
        assert not [p for p in _group(group) if alive(p)]
    finally:
        control.stop(reason="test cleanup", timeout_s=20)

    bronze = table_rows(spark, settings, "bronze")
    assert Counter((r["partition"], r["offset"]) for r in bronze).most_common(1)[0][1] == 1
    assert len(bronze) == TOTAL
    silver = table_rows(spark, settings, "silver")
    assert Counter(r["event_id"] for r in silver) == Counter(expected_events(config, TOTAL).keys())
    events = [line for line in (control.dir / "events.jsonl").read_text().splitlines() if '"start"' in line]
    assert len(events) == 2  # the first start and one restart: no second copy was ever launched


def _group(pgid: int) -> list[int]:
    from tidewater.orchestration.supervisor import group_members

    return [pid for pid, _ in group_members(pgid)]
