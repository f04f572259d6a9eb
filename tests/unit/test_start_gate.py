"""The start gate: streaming jobs on one host start their queries one at a time (the gate itself on real
flocks, across processes too; the runner's loop with stand-in queries, no Spark)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.pipelines import get_pipeline
from tidewater.streaming.runner import PipelineStreams, Tier
from tidewater.streaming.start_gate import StartGate, gate_path
from tidewater.streaming.startup_workers import ReadSources


def gate(tmp_path: Path, holder: str, limit_s: float = 30.0) -> StartGate:
    return StartGate(gate_path(tmp_path), limit_s=limit_s, holder=holder)


def test_the_second_job_waits_for_the_first_and_learns_who_it_waits_for(tmp_path, capsys):
    first, second = gate(tmp_path, "live.rsvps"), gate(tmp_path, "live.ads")
    assert first.wait(1.0) and first.held
    began = time.monotonic()
    assert not second.wait(0.5) and not second.held  # a slice of the wait, then back to the caller
    assert time.monotonic() - began >= 0.5
    assert "waiting for live.rsvps (pid" in capsys.readouterr().out
    first.release("started")
    assert second.wait(0.5) and second.held and not second.bypassed
    assert "starting the queries after" in capsys.readouterr().out
    second.release("started")
    assert not second.held


def test_a_job_waits_at_most_the_limit_then_starts_without_the_gate(tmp_path, capsys):
    first, second = gate(tmp_path, "live.rsvps"), gate(tmp_path, "live.ads", limit_s=0.6)
    assert first.wait(1.0)
    assert not second.wait(0.3)
    assert second.wait(1.0) and second.bypassed and not second.held
    assert "for live.rsvps (pid" in capsys.readouterr().out.split("waited")[-1]
    assert second.wait(0.1) and not second.held  # decided: it does not wait again
    assert first.held  # the holder keeps it
    first.release("started")


def test_held_longer_than_the_limit_is_overdue(tmp_path):
    holder = gate(tmp_path, "live.rsvps", limit_s=0.3)
    assert holder.wait(1.0) and not holder.overdue()
    time.sleep(0.35)
    assert holder.overdue()
    holder.release("overdue")


def test_a_killed_holder_does_not_keep_the_gate(tmp_path):
    path = gate_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    code = (
        "import fcntl, sys, time\n"
        f"h = open({str(path)!r}, 'a+'); fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        waiting = gate(tmp_path, "live.ads")
        assert not waiting.wait(0.3)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert waiting.wait(5.0) and waiting.held
        waiting.release("started")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


# ---- the runner's loop (stand-in queries) ------------------------------------------------------------


def read(rows: int) -> dict[str, Any]:
    return {"sources": [{"numInputRows": rows}]}


class Query:
    isActive = True
    name = "stand-in"

    def __init__(self) -> None:
        self.lastProgress: dict[str, Any] | None = None

    def stop(self) -> None:
        self.isActive = False


def stand_in_job(tmp_path: Path, **settings: Any) -> tuple[PipelineStreams, list[Query]]:
    job = PipelineStreams(Settings(state_dir=str(tmp_path), release_startup_workers=False, **settings), RSVPS)
    started: list[Query] = []

    def start(tier: Tier, trigger: dict[str, Any]) -> Any:
        started.append(Query())
        job.queries[tier.query] = started[-1]  # type: ignore[assignment]
        job._unplanned[tier.query] = ReadSources()  # what the real start() records
        return started[-1]

    job.prepare = lambda spark: None  # type: ignore[method-assign]
    job.start = start  # type: ignore[method-assign]
    return job, started


RSVPS = get_pipeline("rsvps")


def wait_until(condition: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def run(job: PipelineStreams, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=job.run_forever, args=(None, stop), daemon=True)
    thread.start()
    return thread


def test_a_job_starts_its_queries_once_the_gate_is_free_and_holds_it_until_every_query_read(tmp_path):
    other = gate(tmp_path, "live.pageviews")
    assert other.wait(1.0)
    job, started = stand_in_job(tmp_path)
    stop = threading.Event()
    thread = run(job, stop)
    try:
        time.sleep(1.5)
        assert started == []  # another job is starting
        other.release("started")
        wait_until(lambda: len(started) == len(job.tiers), "every query started once the gate was free")
        third = gate(tmp_path, "live.ads")
        assert not third.wait(1.5)  # the job holds the gate while its queries start
        started[0].lastProgress = read(0)  # a trigger without data plans nothing
        for query in started[1:]:
            query.lastProgress = read(40)
        assert not third.wait(1.5)
        started[0].lastProgress = read(7)  # every query has read from its source
        assert third.wait(5.0), "the job passed the gate on"
        third.release("started")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_a_job_holds_the_gate_at_most_the_limit_when_a_source_stays_quiet(tmp_path):
    job, started = stand_in_job(tmp_path, stream_start_gate_seconds=1.0)
    stop = threading.Event()
    thread = run(job, stop)
    try:
        wait_until(lambda: len(started) == len(job.tiers), "the queries started")
        waiting = gate(tmp_path, "live.ads")
        assert waiting.wait(5.0) and waiting.held and not waiting.bypassed  # released, not waited out
        waiting.release("started")
    finally:
        stop.set()
        thread.join(10)


def test_a_stop_while_waiting_at_the_gate_starts_nothing_and_frees_nothing_it_did_not_hold(tmp_path):
    other = gate(tmp_path, "live.pageviews")
    assert other.wait(1.0)
    job, started = stand_in_job(tmp_path)
    stop = threading.Event()
    thread = run(job, stop)
    time.sleep(1.2)
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and started == []
    assert other.held and not gate(tmp_path, "live.ads").wait(0.2)
    other.release("started")


def test_zero_turns_the_gate_off(tmp_path):
    job, _ = stand_in_job(tmp_path, stream_start_gate_seconds=0.0)
    assert job.start_gate() is None


@pytest.mark.parametrize(("limit", "accepted"), [(60.0, True), (239.0, True), (240.0, False), (600.0, False)])
def test_the_gate_must_end_before_the_supervisor_gives_up_on_a_start(limit, accepted):
    settings = Settings(stream_start_gate_seconds=limit, stream_startup_seconds=240.0)
    if accepted:
        settings.validate({})
    else:
        with pytest.raises(ConfigError, match="must be less than TIDEWATER_STREAM_STARTUP_SECONDS"):
            settings.validate({})
