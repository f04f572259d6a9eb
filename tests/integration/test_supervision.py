"""Stream supervision with real detached spark-submit jobs: start, refuse a second driver, kill -9,
restart, bounded stop, and nothing lost or duplicated across it all; a stream that fails the same
way on every start is restarted a bounded number of times, marked failed, and resumed on request.

(The same supervision through the real Airflow scheduler is exercised end to end in
tests/e2e/test_platform.py; here StreamControl is driven directly, as the supervising DAG's
task does, so each step can be checked in isolation.)
"""

from __future__ import annotations

import json
import os
import shutil
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
from tidewater.orchestration import tasks
from tidewater.orchestration.supervisor import (
    DEAD,
    FAILED,
    RUNNING,
    STOPPED,
    StreamControl,
    StreamFailedError,
    StreamIncidentError,
    alive,
)
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
TOTAL = 6_000


def silver_count(settings) -> int:
    from tidewater.pipelines.layout import PipelineLayout

    table = PipelineLayout.of(settings, RSVPS).table("silver")
    return table.row_count() if table.exists() else 0


def test_supervised_stream_survives_kill_9(spark, kafka_settings, make_topic, tmp_path: Path):
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="sup") + "-",
        max_offsets_per_trigger=2000,
        stream_stop_timeout_seconds=60,
    )
    topic = settings.topic(RSVPS.source().topic)
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


def test_crash_looping_stream_is_failed_then_resumed(kafka_settings, make_topic, monkeypatch):
    """The real streaming job, launched by the supervising task's code against a checkpoint it refuses
    at every start (one line, exit 2): restarted twice, then failed with that line; not restarted by
    later rounds; resumed once the checkpoint is fixed, and then it runs."""
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="loop") + "-",
        stream_max_restarts=2,
        stream_startup_seconds=120,
        stream_stop_timeout_seconds=30,
    )
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 1)
    checkpoint = PipelineLayout.of(settings, RSVPS).checkpoint("bronze")
    (checkpoint / "offsets").mkdir(parents=True)  # left by another tool: the driver refuses it in its preflight
    for key, value in settings.to_env().items():  # the Airflow task reads its settings from the environment
        monkeypatch.setenv(key, value)
    control = StreamControl(settings, "rsvps")
    refusal = "CheckpointError: "

    def starts() -> int:
        return sum(1 for e in control.events() if e["event"] == "start")

    def died() -> bool:
        return control.health().state == DEAD

    try:
        assert tasks.supervise_stream("rsvps")["action"] == "started"
        for attempt in (1, 2):
            wait_for(died, timeout_s=120, what=f"launch {attempt} to exit", log=control.log_path)
            assert control.health().error.startswith(refusal), control.health().error
            assert "not created by this tidewater query" in control.health().error
            with pytest.raises(StreamIncidentError, match=f"{attempt} of 3 failed starts allowed in a row"):
                tasks.supervise_stream("rsvps")
        wait_for(died, timeout_s=120, what="launch 3 to exit", log=control.log_path)
        with pytest.raises(StreamFailedError) as raised:
            tasks.supervise_stream("rsvps")
        line = str(raised.value)
        assert "\n" not in line and line.startswith("stream live/rsvps failed: crash loop: 3 starts in a row")
        assert f"the same way each time: {refusal}" in line and "not created by this tidewater query" in line
        assert line.endswith("action=resume")
        assert starts() == 3

        health = control.health()
        assert health.state == FAILED and health.attempts == 3 and health.error.startswith(refusal)
        recorded = json.loads((control.dir / "health.json").read_text())
        assert (recorded["state"], recorded["attempts"], recorded["error"]) == (FAILED, 3, health.error)
        failed = [e for e in control.events() if e["event"] == "failed"]
        assert len(failed) == 1 and failed[0]["attempts"] == 3 and failed[0]["error"] == health.error

        # While failed, each round is red with the same line and starts nothing.
        time.sleep(1)
        with pytest.raises(StreamFailedError, match="crash loop: 3 starts in a row"):
            tasks.supervise_stream("rsvps")
        assert starts() == 3 and control.health().state == FAILED

        # Fix the cause, resume: it starts, holds its checkpoints and commits. (On a loaded machine a
        # Python worker may fail to start in time: supervision rounds go on as the DAG's would.)
        shutil.rmtree(checkpoint)
        send(settings, topic, generate(GeneratorConfig(seed=3, rate=50), 200))
        resumed = tasks.control_stream({"pipeline": "rsvps", "action": "resume"}, "manual__resume")
        assert resumed["state"] in ("starting", "running") and starts() == 4

        def committed() -> bool:
            if control.health().state == DEAD:
                with pytest.raises(StreamIncidentError):
                    tasks.supervise_stream("rsvps")
            return control.health().state == RUNNING and control.batches()["bronze"] is not None

        wait_for(committed, timeout_s=300, what="the resumed stream to commit a batch", log=control.log_path)
        assert tasks.supervise_stream("rsvps")["action"] == "none"
        assert not [e for e in control.events() if e["event"] == "failed"][1:]
    finally:
        control.stop(reason="test cleanup", timeout_s=20)


def _group(pgid: int) -> list[int]:
    from tidewater.processes import group_members

    return [pid for pid, _ in group_members(pgid)]
