"""Crash-loop detection: a pure function over a stream's events history, and what the supervisor does
with it (mark the stream failed, stop restarting it, resume on request).

The supervisor tests use a stand-in for the spark-submit launch: a real Python process that prints
the driver's one-line error and exits 2, as ``tidewater stream`` does when its preflight refuses
(tests/integration/test_supervision.py runs the real streaming job).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from supervisor_helpers import ERROR, RefusingLaunch
from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.orchestration.params import parse_control_params
from tidewater.orchestration.supervisor import (
    DEAD,
    FAILED,
    STOPPED,
    StreamControl,
    crash_loop,
    failed_attempts,
)
from tidewater.pipelines import all_pipelines

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat(timespec="seconds")


def start(t: float, pid: int, batches: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"at": at(t), "event": "start", "pid": pid, "reason": "test", "batches": batches or {}}


def died(t: float, pid: int, batches: dict[str, Any] | None = None, error: str = ERROR) -> dict[str, Any]:
    return {"at": at(t), "event": "died", "pid": pid, "error": error, "batches": batches or {}}


def loop_of(deaths: int, *, every_s: float = 60, batches: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A stream that dies ~5 s after each start, restarted every ``every_s``, never committing a batch."""
    events = []
    for i in range(deaths):
        events += [start(i * every_s, 100 + i, batches), died(i * every_s + 5, 100 + i, batches)]
    return events


# ---- the pure function ------------------------------------------------------------------------------


def test_restarts_up_to_the_limit_then_a_crash_loop():
    assert crash_loop(loop_of(3), max_restarts=3) is None  # the first start and 2 restarts died: restart again
    loop = crash_loop(loop_of(4), max_restarts=3)  # the 3rd restart died too
    assert loop is not None and loop.attempts == 4
    assert loop.error == ERROR and loop.first_at == at(5) and loop.last_at == at(185)
    line = loop.describe(3)
    assert "\n" not in line
    assert "4 starts in a row ended within 3 min without committing a batch" in line
    assert "TIDEWATER_STREAM_MAX_RESTARTS=3" in line and line.endswith(f"the same way each time: {ERROR}")


def test_zero_restarts_fails_at_the_first_death_and_a_negative_limit_is_refused():
    assert crash_loop(loop_of(1), max_restarts=0) is not None
    with pytest.raises(ConfigError, match="TIDEWATER_STREAM_MAX_RESTARTS=-1"):
        crash_loop(loop_of(1), max_restarts=-1)


def test_a_committed_batch_ends_the_streak():
    events = loop_of(3, batches={"bronze": 7, "gold_x": 2})
    # This launch committed batch 8 before dying (e.g. an OOM after an hour of work): not a crash loop.
    events += [start(200, 200, {"bronze": 7, "gold_x": 2}), died(900, 200, {"bronze": 8, "gold_x": 2})]
    assert failed_attempts(events) == []
    assert crash_loop(events, max_restarts=0) is None
    # The launches after it are counted again from zero.
    events += [start(960, 201, {"bronze": 8}), died(965, 201, {"bronze": 8, "gold_x": 2})]
    assert [e["pid"] for e in failed_attempts(events)] == [201]


def test_progress_between_launches_ends_the_streak():
    """A snapshot at a start that differs from the last death's: something committed in between (the
    stream was run by hand), so the deaths before do not count."""
    events = [*loop_of(3, batches={"bronze": 3}), start(300, 300, {"bronze": 4}), died(305, 300, {"bronze": 4})]
    assert [e["pid"] for e in failed_attempts(events)] == [300]


def test_first_batch_ever_is_progress():
    events = [*loop_of(3), start(300, 300), died(400, 300, {"bronze": 0})]
    assert failed_attempts(events) == []


def test_a_person_resuming_or_starting_resets_the_count():
    for decision in ({"event": "resume", "by": "dag run x"}, {"event": "desired", "state": "running", "by": "x"}):
        events = [*loop_of(3), {"at": at(200), **decision}, start(201, 300), died(206, 300)]
        assert len(failed_attempts(events)) == 1, decision
        assert crash_loop(events, max_restarts=3) is None


def test_deaths_outside_the_window_do_not_count():
    events = loop_of(4, every_s=1800)  # one death every 30 minutes: 4 deaths over 90 minutes
    assert len(failed_attempts(events, window_s=3600)) == 3  # the last three are within an hour of the last
    assert crash_loop(events, max_restarts=3, window_s=3600) is None
    assert crash_loop(events, max_restarts=3, window_s=2 * 3600) is not None


def test_stalls_count_and_different_errors_are_said():
    events = [
        start(0, 1),
        died(5, 1, error="BrokerUnreachableError: no broker at 127.0.0.1:9"),
        start(60, 2),
        {"at": at(400), "event": "stalled", "pid": 2, "error": "stalled: no heartbeat", "batches": {}},
        {"at": at(401), "event": "stop", "pids": [2], "reason": "stalled", "forced": True},
        start(402, 3),
        died(410, 3, error="TopicNotFoundError: topic 'rsvps' does not exist"),
    ]
    loop = crash_loop(events, max_restarts=2)
    assert loop is not None and loop.attempts == 3
    assert loop.describe(2).endswith("3 different ways, last: TopicNotFoundError: topic 'rsvps' does not exist")


def test_history_without_snapshots_and_unreadable_lines():
    """Events written before snapshots existed have no ``batches``; a death without an error line
    (killed by a signal) says so."""
    events = [{"at": at(0), "event": "start", "pid": 1}, {"at": at(5), "event": "died", "pid": 1}]
    loop = crash_loop(events, max_restarts=0)
    assert loop is not None and loop.error.startswith("no error reported")


# ---- the control DAG's params ------------------------------------------------------------------------


DECLARED = ", ".join(sorted(all_pipelines(Settings(pipelines=""))))  # the packaged pipelines


def test_control_params_are_checked_in_one_line():
    assert parse_control_params({"pipeline": "rsvps", "action": "resume"}) == ("rsvps", "resume")
    cases = [
        (
            {"pipeline": "billing", "action": "start"},
            f"unknown pipeline 'billing': known pipelines are {DECLARED}",
        ),
        ({"pipeline": "rsvps", "action": "reboot"}, "action 'reboot' is not one of start, stop, restart, resume"),
        ({"pipeline": "rsvps"}, "action is required: one of start, stop, restart, resume"),
        ({"pipeline": "rsvps", "action": "stop", "force": True}, "unknown stream-control parameter(s) force"),
    ]
    for params, message in cases:
        with pytest.raises(ConfigError) as raised:
            parse_control_params(params)
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value), raised.value


# ---- the supervisor with a driver that refuses at every start ----------------------------------------


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A job per pipeline, whose launch ``refusing`` stands in for (the stream host's supervision:
    tests/integration/test_stream_host.py)."""
    return settings.replace(stream_host=False)


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> RefusingLaunch:
    launch = RefusingLaunch()
    monkeypatch.setattr("tidewater.streaming.jobs.launch_stream_job", launch)
    return launch


def test_supervisor_marks_a_crash_loop_failed_and_resumes_on_request(settings: Settings, refusing: RefusingLaunch):
    control = StreamControl(settings.replace(stream_max_restarts=2), "rsvps")
    assert control.supervise()[0] == "started"
    assert control.health().state == DEAD and control.health().error == ERROR
    action, _ = control.supervise()
    assert action.startswith(f"restarted (died: driver exited: {ERROR}; 1 of 3 failed starts allowed in a row)")
    action, _ = control.supervise()
    assert "2 of 3 failed starts allowed" in action
    action, health = control.supervise()
    assert action == "failed (3 starts in a row ended without a batch)"
    assert len(refusing.launched) == 3
    assert health.state == FAILED and health.attempts == 3 and health.error == ERROR and health.pid is None
    assert health.detail.startswith("crash loop: 3 starts in a row ended within")
    assert health.detail.endswith("runs with action=resume") and "\n" not in health.detail
    assert "rsvps: failed; crash loop: 3 starts in a row" in health.summary()
    recorded = json.loads((control.dir / "health.json").read_text())
    assert recorded["state"] == FAILED and recorded["attempts"] == 3 and recorded["error"] == ERROR
    failed = [e for e in control.events() if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["attempts"] == 3 and failed[0]["error"] == ERROR

    # Later rounds do not restart it.
    for _ in range(2):
        action, health = control.supervise()
        assert action.startswith("none (failed") and health.state == FAILED
    assert len(refusing.launched) == 3

    # Resume: the count starts again; the cause is not fixed, so it takes 3 more deaths to fail again.
    refusing.error = "CheckpointError: still broken"
    control.resume(by="test")
    assert len(refusing.launched) == 4 and control.health().state == DEAD
    assert control.health().error == "CheckpointError: still broken"  # this launch's error, not the last run's
    assert control.supervise()[0].startswith("restarted")
    assert control.supervise()[0].startswith("restarted")
    assert control.supervise()[0].startswith("failed")
    assert control.health().detail.endswith("the same way each time: CheckpointError: still broken; "
                                            "not restarted until the cause is fixed and tidewater_stream_control "
                                            "runs with action=resume")  # fmt: skip


def test_stop_and_start_of_a_failed_stream(settings: Settings, refusing: RefusingLaunch):
    control = StreamControl(settings.replace(stream_max_restarts=0), "rsvps")
    control.supervise()
    assert control.supervise()[0].startswith("failed") and control.health().state == FAILED
    control.set_desired(STOPPED, by="test")
    control.stop(reason="test")
    assert control.health().state == STOPPED  # a stop on request shows as stopped
    with pytest.raises(ConfigError, match=r"^stream live/rsvps is stopped, not failed: nothing to resume"):
        control.resume(by="test")
    control.set_desired("running", by="test")  # a start requested by a person clears the failure
    control.start(reason="test")
    assert len(refusing.launched) == 2 and control.health().state == DEAD
    assert control.supervise()[0].startswith("failed")  # its death is counted from zero: 1 attempt, not 2
    assert control.health().attempts == 1


def test_supervising_task_fails_with_the_one_line_on_every_run(
    settings: Settings, refusing: RefusingLaunch, monkeypatch: pytest.MonkeyPatch
):
    from tidewater.orchestration import tasks
    from tidewater.orchestration.supervisor import StreamFailedError, StreamIncidentError

    for key, value in settings.replace(stream_max_restarts=1).to_env().items():
        monkeypatch.setenv(key, value)
    assert tasks.supervise_stream("rsvps")["action"] == "started"
    with pytest.raises(StreamIncidentError):
        tasks.supervise_stream("rsvps")  # restarted: red, the stream is (being) brought back
    for _ in range(3):
        with pytest.raises(StreamFailedError) as raised:
            tasks.supervise_stream("rsvps")
        message = str(raised.value)
        assert message.startswith("stream live/rsvps failed: crash loop: 2 starts in a row") and "\n" not in message
        assert ERROR in message
    assert len(refusing.launched) == 2
    with pytest.raises(ConfigError, match="not one of start, stop, restart, resume"):
        tasks.control_stream({"pipeline": "rsvps", "action": "unfail"}, "manual__1")
    health = tasks.control_stream({"pipeline": "rsvps", "action": "resume"}, "manual__1")
    assert len(refusing.launched) == 3 and health["state"] == DEAD
    assert [e["event"] for e in StreamControl(settings, "rsvps").events()][-3:] == ["resume", "desired", "start"]
