"""Stopping a stream without signals: the real streaming job (spark-submit in its own session), stopped
through StreamControl with signals disabled, as if its driver ran on another host. The driver finds the
stop request beside its checkpoints, stops its queries, releases its leases and exits 0 by itself; the
supervisor records the stop as by request and does not relaunch it; a later driver is not stopped by
the request left behind, only by a new one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pipeline_helpers import send, wait_for
from tidewater.generator.events import GeneratorConfig, generate
from tidewater.generator.producer import ensure_topic
from tidewater.orchestration.supervisor import RUNNING, STOPPED, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.streaming import jobs
from tidewater.streaming.stop_request import POLL_SECONDS, read_request

RSVPS = get_pipeline("rsvps")


def log_since(path: Path, offset: int) -> str:
    with open(path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def test_a_stream_stops_on_request_without_any_signal(kafka_settings, make_topic, monkeypatch):
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="stopreq") + "-", stream_stop_timeout_seconds=60
    )
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 1)
    send(settings, topic, generate(GeneratorConfig(seed=11, rate=50), 50))
    launched: list[subprocess.Popen[bytes]] = []
    launch = jobs.launch_stream_job

    def recording_launch(*args, **kwargs):
        launched.append(launch(*args, **kwargs))
        return launched[-1]

    monkeypatch.setattr(jobs, "launch_stream_job", recording_launch)  # what StreamControl.start calls
    control = StreamControl(settings, "rsvps")

    def streaming(offset: int) -> bool:
        return (
            control.health().state == RUNNING
            and "tidewater: streaming rsvps" in log_since(control.log_path, 0)[offset:]
        )

    try:
        control.start(reason="test")
        first = launched[0]
        wait_for(lambda: streaming(0), timeout_s=120, what="the driver to stream", log=control.log_path)

        # The control DAG's stop, with the local-signal fallback unavailable.
        control.set_desired(STOPPED, by="test")
        began = time.monotonic()
        health = control.stop(reason="maintenance window", by="the stop-request test", signals=False)
        took = time.monotonic() - began
        assert first.wait(timeout=30) == 0  # exited by itself, successfully
        assert health.state == STOPPED and took < 30, (health, took)
        assert all(held is None for held in control.leases().values())
        assert "tidewater: stop requested by the stop-request test: maintenance window" in control.log_path.read_text()
        stop = [e for e in control.events() if e["event"] == "stop"][-1]
        assert (stop["how"], stop["forced"], stop["by"]) == ("request", False, "the stop-request test")
        action, after = control.supervise()
        assert action == "none (stopped on request)" and after.state == STOPPED
        assert [e["event"] for e in control.events()].count("start") == 1

        # A later driver, launched without clearing the request (as a person might, by hand): the request
        # is the last driver's, older than this launch, and does not stop it.
        stale = read_request(control.layout.stop_request())
        assert stale is not None and stale.reason == "maintenance window"
        offset = control.log_path.stat().st_size
        second = launch(
            settings,
            "rsvps",
            control.log_path,
            extra_args=["--namespace", "live", "--launched-at", f"{time.time():.3f}"],
        )
        launched.append(second)
        wait_for(lambda: streaming(offset), timeout_s=120, what="the second driver to stream", log=control.log_path)
        looking = time.monotonic()
        wait_for(lambda: control.health().queries, timeout_s=120, what="its first batches", log=control.log_path)
        time.sleep(max(0.0, 2 * POLL_SECONDS + 1 - (time.monotonic() - looking)))  # it looked twice or more
        assert second.poll() is None and control.health().state == RUNNING
        assert "stop requested" not in log_since(control.log_path, offset)

        # A new request does stop it, its queries running.
        health = control.stop(reason="end of test", by="the stop-request test", signals=False)
        assert second.wait(timeout=30) == 0 and health.state == STOPPED
        assert [e for e in control.events() if e["event"] == "stop"][-1]["how"] == "request"
    finally:
        for process in launched:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
