"""Stop requests, the pure parts: which requests apply to which driver (freshness), reading and writing
them, the driver's cheap poll, the runner's loop reacting to one (stand-in queries, no Spark), and the
supervisor's side that needs no running driver (lease holders by host, a stop with nothing running,
a driver that ended after a request counted as stopped on purpose)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.orchestration.supervisor import DEAD, STARTING, STOPPED, StreamControl, parse_holder, write_json
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.runner import PipelineStreams, Tier
from tidewater.streaming.stop_request import (
    REQUEST_FILE,
    StopRequest,
    StopRequestWatch,
    clear_request,
    is_fresh,
    parse_request,
    read_request,
    write_request,
)

RSVPS = get_pipeline("rsvps")


def request_at(at: float) -> StopRequest:
    return StopRequest(id="r1", requested_at=at, by="me", reason="because")


# ---- freshness ---------------------------------------------------------------------------------------


def test_a_request_applies_to_drivers_launched_before_it():
    assert is_fresh(request_at(100.0), launched_at=99.5)
    assert is_fresh(request_at(100.0), launched_at=100.0)  # written at the very launch: it is for this one


def test_a_request_older_than_the_launch_is_the_last_drivers_and_is_stale():
    assert not is_fresh(request_at(100.0), launched_at=100.001)
    assert not is_fresh(request_at(0.0), launched_at=time.time())


# ---- the file ------------------------------------------------------------------------------------------


def test_written_requests_read_back_and_replace_the_last_one(tmp_path: Path):
    path = tmp_path / "ns" / "rsvps" / REQUEST_FILE
    first = write_request(path, by="dag run manual__1", reason="stop requested by dag run manual__1", now=10.0)
    assert read_request(path) == first and first.requested_at == 10.0 and first.host
    second = write_request(path, by="someone", reason="again")
    assert read_request(path) == second and second.id != first.id and second.requested_at > 10.0
    assert second.describe() == "stop requested by someone: again"
    assert [p.name for p in path.parent.iterdir()] == [REQUEST_FILE]  # no temporary file left behind


@pytest.mark.parametrize(
    "content",
    ["", "{", "[]", '"stop"', json.dumps({"id": "x"}), json.dumps({"id": "x", "requested_at": "soon"})],
)
def test_only_a_well_formed_request_counts(tmp_path: Path, content: str):
    path = tmp_path / REQUEST_FILE
    path.write_text(content)
    assert read_request(path) is None
    assert read_request(tmp_path / "missing.json") is None


def test_missing_who_and_why_are_filled_in():
    request = parse_request({"id": 7, "requested_at": 5})
    assert request == StopRequest(id="7", requested_at=5.0, by="unknown", reason="no reason given", host="")


def test_clearing_a_request_only_if_it_is_still_the_same_one(tmp_path: Path):
    path = tmp_path / REQUEST_FILE
    assert not clear_request(path)
    written = write_request(path, by="a", reason="b")
    assert not clear_request(path, only_id="another") and path.exists()
    assert clear_request(path, only_id=written.id) and not path.exists()
    write_request(path, by="a", reason="b")
    assert clear_request(path) and not path.exists()


# ---- the driver's poll -------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_looks_at_most_once_per_interval_and_ignores_stale_requests(tmp_path: Path):
    path, clock = tmp_path / REQUEST_FILE, Clock()
    watch = StopRequestWatch(path, launched_at=1000.0, interval_s=2.0, clock=clock)
    assert watch.poll() is None  # no file
    write_request(path, by="last supervisor", reason="old", now=999.0)
    assert watch.poll() is None  # within the interval: not looked at yet
    clock.now = 2.0
    assert watch.poll() is None  # looked at: stale, meant for the driver before this one
    fresh = write_request(path, by="supervisor", reason="stop now", now=1001.0)
    clock.now = 3.0
    assert watch.poll() is None  # not yet looked at again
    assert watch.poll(force=True) == fresh
    clock.now = 3.5
    assert watch.poll() == fresh  # remembered between looks
    path.unlink()
    clock.now = 6.0
    assert watch.poll() is None


def test_the_watch_rereads_only_a_changed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path, clock = tmp_path / REQUEST_FILE, Clock()
    write_request(path, by="a", reason="b", now=5.0)
    reads: list[Path] = []
    from tidewater.streaming import stop_request

    real = stop_request.read_request
    monkeypatch.setattr(stop_request, "read_request", lambda p: (reads.append(p), real(p))[1])
    watch = StopRequestWatch(path, launched_at=1.0, interval_s=1.0, clock=clock)
    for step in range(5):
        clock.now = float(step)
        assert watch.poll() is not None
    assert len(reads) == 1  # four more looks cost a stat each
    write_request(path, by="c", reason="d", now=6.0)
    clock.now = 10.0
    assert watch.poll().by == "c" and len(reads) == 2


# ---- the layout ----------------------------------------------------------------------------------------


def test_the_request_lives_beside_the_pipelines_checkpoints(tmp_path: Path):
    settings = Settings(state_dir=str(tmp_path), checkpoint_root=str(tmp_path / "shared" / "checkpoints"))
    live, sandbox = PipelineLayout.of(settings, RSVPS), PipelineLayout.of(settings, RSVPS, "sandbox1")
    assert live.stop_request() == tmp_path / "shared" / "checkpoints" / "live" / "rsvps" / REQUEST_FILE
    assert live.stop_request().parent == live.checkpoint("bronze").parent
    assert sandbox.stop_request() != live.stop_request()


# ---- the runner's loop (stand-in queries) ------------------------------------------------------------


class RunningQuery:
    isActive = True
    lastProgress = None
    name = "stand-in"

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def stand_in_job(tmp_path: Path, launched_at: float) -> tuple[PipelineStreams, list[RunningQuery]]:
    job = PipelineStreams(Settings(state_dir=str(tmp_path)), RSVPS, launched_at=launched_at)
    started: list[RunningQuery] = []

    def start(tier: Tier, trigger: dict[str, Any]) -> Any:
        started.append(RunningQuery())
        job.queries[tier.query] = started[-1]
        return started[-1]

    job.prepare = lambda spark: None  # type: ignore[method-assign]
    job.start = start  # type: ignore[method-assign]
    return job, started


def run_in_thread(job: PipelineStreams, stop: threading.Event) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(job.run_forever(None, stop)), daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread, result


def test_a_fresh_request_stops_the_queries_like_a_signal(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    job, started = stand_in_job(tmp_path, launched_at=time.time())
    stop = threading.Event()
    thread, result = run_in_thread(job, stop)
    time.sleep(1.5)
    assert thread.is_alive() and started and not any(q.stopped for q in started)
    request = write_request(job.layout.stop_request(), by="the supervisor on host-b", reason="maintenance")
    thread.join(timeout=10)
    assert not thread.is_alive() and result == [request]
    assert stop.is_set() and all(q.stopped for q in started) and job.queries == {}
    assert "tidewater: stop requested by the supervisor on host-b: maintenance" in capsys.readouterr().out


def test_a_request_sent_while_the_driver_started_starts_no_query(tmp_path: Path):
    job, started = stand_in_job(tmp_path, launched_at=time.time() - 30)
    write_request(job.layout.stop_request(), by="supervisor", reason="stop while starting")
    stop = threading.Event()
    began = time.monotonic()
    assert job.run_forever(None, stop).reason == "stop while starting"  # type: ignore[arg-type,union-attr]
    assert started == [] and time.monotonic() - began < 1


def test_the_last_drivers_request_does_not_stop_a_new_driver(tmp_path: Path):
    layout = PipelineLayout.of(Settings(state_dir=str(tmp_path)), RSVPS)
    write_request(layout.stop_request(), by="supervisor", reason="the last driver's stop", now=time.time() - 5)
    job, started = stand_in_job(tmp_path, launched_at=time.time())
    stop = threading.Event()
    thread, result = run_in_thread(job, stop)
    time.sleep(3.5)  # more than one poll interval
    assert thread.is_alive() and started and not any(q.stopped for q in started)
    stop.set()  # SIGTERM's way
    thread.join(timeout=10)
    assert result == [None] and all(q.stopped for q in started)


# ---- the supervisor's side, no driver ------------------------------------------------------------------


def test_lease_holders_name_their_host():
    flock = "pid 4242 on worker-7 since 2026-01-02T03:04:05+00:00"
    assert parse_holder(flock) == (4242, 1767323045.0, "worker-7")
    postgres = f"{flock} (pid 4242 on worker-7, since 2026-01-02T03:04:06.5+00:00)"
    assert parse_holder(postgres) == (4242, 1767323045.0, "worker-7")
    assert parse_holder("unknown process") == (-1, 0.0, "")


def test_stopping_with_nothing_running_leaves_a_request_for_a_driver_still_starting(tmp_path: Path):
    control = StreamControl(Settings(state_dir=str(tmp_path)), "rsvps")
    began = time.monotonic()
    health = control.stop(reason="nothing to stop", by="test", timeout_s=30)
    assert health.state == STOPPED and time.monotonic() - began < 5
    request = read_request(control.layout.stop_request())
    assert request is not None and request.by == "test" and request.reason == "nothing to stop"


def test_a_driver_that_ended_after_a_stop_request_was_stopped_not_dead(tmp_path: Path):
    control = StreamControl(Settings(state_dir=str(tmp_path)), "rsvps")
    launched = time.time() - 60
    write_json(control.dir / "driver.json", {"pid": 2**22 + 1, "launched_unix": launched, "log_offset": 0})
    assert control.health().state == DEAD  # ended, nobody asked
    write_request(control.layout.stop_request(), by="a supervisor elsewhere", reason="r", now=launched - 1)
    assert control.health().state == DEAD  # the request was the driver before's
    write_request(control.layout.stop_request(), by="a supervisor elsewhere", reason="r", now=launched + 1)
    assert control.health().state == STOPPED


def test_a_launch_on_another_host_is_not_judged_by_a_local_pid(tmp_path: Path):
    control = StreamControl(Settings(state_dir=str(tmp_path), stream_startup_seconds=60), "rsvps")
    record = {"pid": os.getpid(), "host": "another-host", "log_offset": 0}  # a pid alive here, by chance
    write_json(control.dir / "driver.json", {**record, "launched_unix": time.time() - 10})
    health = control.health()
    assert health.state == STARTING and health.detail == "launched on another-host, not yet holding its checkpoints"
    write_json(control.dir / "driver.json", {**record, "launched_unix": time.time() - 61})
    assert control.health().state == DEAD  # past its start-up time, holding nothing
    stopped = control.stop(reason="r", by="test", timeout_s=5)  # nothing here to wait for or to signal
    assert stopped.state == STOPPED and not [e for e in control.events() if e["event"] == "stop"]
