"""The supervising DAG's watch (tidewater.orchestration.watch): when the triggerer wakes a task, and
what the task does before and after.

The stream stand-in is the crash-loop tests' real process that prints a driver's one-line error and
exits; the trigger runs its real ``run()`` on an event loop, as the triggerer (or ``dags test``) does.
The whole shape under a real scheduler and triggerer is tests/e2e/test_platform.py's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from supervisor_helpers import ERROR, RefusingLaunch
from tidewater.config import CONTINUOUS, Settings
from tidewater.orchestration.supervisor import (
    DEAD,
    FAILED,
    RUNNING,
    STALLED,
    STARTING,
    STOPPED,
    StreamControl,
    StreamFailedError,
    StreamHealth,
    StreamIncidentError,
    needs_round,
)
from tidewater.orchestration.watch import StreamWatchTrigger, SuperviseStreamOperator, watch_reason
from tidewater.pipelines import all_pipelines

PIPELINES = sorted(all_pipelines())


def health(state: str, desired: str = RUNNING, detail: str = "") -> StreamHealth:
    return StreamHealth(pipeline="rsvps", namespace="live", state=state, desired=desired, pid=None, detail=detail)


@pytest.mark.parametrize(
    ("state", "desired", "expected"),
    [
        (RUNNING, RUNNING, None),
        (STARTING, RUNNING, None),
        (FAILED, RUNNING, None),  # waits for a person
        (DEAD, RUNNING, "dead: driver exited: boom"),
        (STALLED, RUNNING, "stalled: driver exited: boom"),
        (STOPPED, RUNNING, "wanted running but driver exited: boom"),
        (STOPPED, STOPPED, None),
        (FAILED, STOPPED, None),
        (RUNNING, STOPPED, "running but wanted stopped"),
        (STALLED, STOPPED, "stalled but wanted stopped"),
    ],
)
def test_a_round_is_needed_exactly_when_it_would_act(state: str, desired: str, expected: str | None):
    assert needs_round(health(state, desired, "driver exited: boom")) == expected


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The trigger and the operator read their settings from the environment, as in Airflow. A job per
    pipeline: the launch is stood in for (the stream host's supervision: tests/integration/test_stream_host.py)."""
    watched = settings.replace(
        supervise_schedule=CONTINUOUS, supervise_poll_seconds=0.2, stream_max_restarts=1, stream_host=False
    )
    for key, value in watched.to_env().items():
        monkeypatch.setenv(key, value)
    return watched


def trigger_for(pipeline: str, since: dt.datetime, watch_s: float) -> StreamWatchTrigger:
    return StreamWatchTrigger(
        pipeline=pipeline,
        pipelines=PIPELINES,
        since=since.isoformat(),
        until=(since + dt.timedelta(seconds=watch_s)).isoformat(),
        poll_seconds=0.2,
    )


def first_event(trigger: StreamWatchTrigger, timeout_s: float = 30) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout_s))


def stop_all(settings: Settings) -> None:
    for name in PIPELINES:
        StreamControl(settings, name).set_desired(STOPPED, by="test")


def test_the_trigger_survives_its_serialization():
    trigger = trigger_for("rsvps", dt.datetime(2026, 11, 26, tzinfo=dt.UTC), 60)
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert classpath == "tidewater.orchestration.watch.StreamWatchTrigger"


def test_a_quiet_watch_ends_at_its_deadline_and_records_what_it_saw(env: Settings):
    stop_all(env)
    since = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)  # after the stops above: nothing new
    began = time.monotonic()
    event = first_event(trigger_for("rsvps", since, 1.5))
    assert event["reason"].startswith("watched since") and event["reason"].endswith("nothing to do")
    assert time.monotonic() - began >= 1.5
    seen = json.loads((StreamControl(env, "rsvps").dir / "health.json").read_text())
    assert seen["state"] == STOPPED and seen["action"] == "none (watching)"


def test_a_stream_wanted_running_wakes_its_task_at_once(env: Settings):
    stop_all(env)
    StreamControl(env, "rsvps").set_desired(RUNNING, by="test")
    since = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    event = first_event(trigger_for("rsvps", since, 600), timeout_s=10)
    assert event["reason"] == "rsvps: wanted running but never started"


def test_another_streams_event_ends_every_task_of_the_run(env: Settings):
    """So the run ends together: no stream goes unwatched while a sibling task watches on."""
    stop_all(env)
    since = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert watch_reason(env, "rsvps", PIPELINES, since) is None
    time.sleep(1.1)
    other = next(p for p in PIPELINES if p != "rsvps")
    StreamControl(env, other).set_desired(STOPPED, by="a person")  # e.g. the control DAG
    event = first_event(trigger_for("rsvps", since, 600), timeout_s=10)
    assert event["reason"].startswith(f"{other}: desired at ") and "after this run began" in event["reason"]


def run_operator(env: Settings, start_date: dt.datetime) -> StreamWatchTrigger:
    operator = SuperviseStreamOperator(task_id="supervise_rsvps", pipeline="rsvps", pipelines=PIPELINES)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({"dag_run": SimpleNamespace(start_date=start_date)})
    assert deferred.value.method_name == "after_watch"
    trigger = deferred.value.trigger
    assert isinstance(trigger, StreamWatchTrigger) and trigger.since == start_date.isoformat()
    return trigger


def test_the_task_starts_watches_restarts_then_a_crash_loop_waits_for_a_resume(
    env: Settings, monkeypatch: pytest.MonkeyPatch
):
    refusing = RefusingLaunch()
    monkeypatch.setattr("tidewater.streaming.jobs.launch_stream_job", refusing)
    stop_all(env)
    StreamControl(env, "rsvps").set_desired(RUNNING, by="test")
    operator = SuperviseStreamOperator(task_id="supervise_rsvps", pipeline="rsvps", pipelines=PIPELINES)

    # Run 1: the round starts the stream (its start event ends the run's watch at once).
    start = dt.datetime.now(dt.UTC)
    trigger = run_operator(env, start)
    assert len(refusing.launched) == 1 and trigger.until == (start + dt.timedelta(seconds=3600)).isoformat()
    event = first_event(trigger)
    assert event["reason"].startswith("rsvps: dead: driver exited: ") and ERROR in event["reason"]
    with pytest.raises(StreamIncidentError, match=r"^stream rsvps was dead"):  # restarted: the run is red
        operator.after_watch({}, event)
    assert len(refusing.launched) == 2

    # Run 2: the restarted driver died too: the round marks the crash loop failed and fails.
    time.sleep(1.1)
    with pytest.raises(StreamFailedError, match=r"^stream live/rsvps failed: crash loop: 2 starts"):
        operator.execute({"dag_run": SimpleNamespace(start_date=dt.datetime.now(dt.UTC))})
    assert StreamControl(env, "rsvps").health().state == FAILED

    # Run 3 (next at once): known failed, so it does not fail again but watches, until the resume.
    time.sleep(1.1)
    trigger = run_operator(env, dt.datetime.now(dt.UTC))
    assert watch_reason(env, "rsvps", PIPELINES, dt.datetime.fromisoformat(trigger.since)) is None
    from tidewater.orchestration import tasks

    tasks.control_stream({"pipeline": "rsvps", "action": "resume"}, "manual__1")
    event = first_event(trigger)
    assert event["reason"].startswith("rsvps: ")  # dead again, or the resume's events: either wakes it
    assert len(refusing.launched) == 3
