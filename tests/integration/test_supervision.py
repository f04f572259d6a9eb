"""Stream supervision with real detached spark-submit jobs: a stream that fails the same way on every
start is restarted a bounded number of times, marked failed, and resumed on request.

(Start, kill -9 and restart with nothing lost or duplicated, through the real Airflow scheduler: on
the embedded default in tests/e2e/test_platform.py, on the cluster profile (a second driver refused in
one line, a stream that outlives Airflow, a stop by request from the control DAG) in
tests/integration/test_cluster_profile.py. Here StreamControl is driven directly, as the supervising
DAG's task does, so each step can be checked in isolation.)
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from pipeline_helpers import send, wait_for
from tidewater.generator.events import GeneratorConfig, generate
from tidewater.generator.producer import ensure_topic
from tidewater.orchestration import tasks
from tidewater.orchestration.supervisor import (
    DEAD,
    FAILED,
    RUNNING,
    StreamControl,
    StreamFailedError,
    StreamIncidentError,
)
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")


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
