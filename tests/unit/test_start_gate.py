"""The start gate: streaming jobs on one host start their queries one at a time (the gate itself on real
flocks, across processes too; the runner's loop with stand-in queries, no Spark)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.json_files import read_json
from tidewater.orchestration.supervisor import RUNNING, STALLED, STARTING, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.streaming.runner import PipelineStreams, Tier
from tidewater.streaming.start_gate import STATUS_FILE, StartGate, gate_path
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


def test_only_a_holder_stuck_past_twice_the_limit_is_skipped(tmp_path, capsys):
    stuck, second = gate(tmp_path, "live.rsvps", limit_s=0.3), gate(tmp_path, "live.ads", limit_s=0.3)
    assert stuck.wait(1.0)
    assert not second.wait(0.4)  # past the limit, not past twice it
    assert second.wait(1.0) and second.bypassed and not second.held
    assert "live.rsvps (pid" in capsys.readouterr().out.split("has held the start gate")[0].splitlines()[-1]
    assert second.wait(0.1) and not second.held  # decided: it does not wait again
    assert stuck.held  # the holder keeps it
    stuck.release("started")


def test_waiting_jobs_do_not_give_up_together_while_the_gate_moves_on(tmp_path):
    """Each job ahead holds the gate less than twice the limit: the last one waits longer than that in
    all, and still takes its turn instead of starting beside the others."""
    first, second, third = (gate(tmp_path, name, limit_s=0.5) for name in ("live.rsvps", "live.ads", "live.vending"))
    began = time.monotonic()
    assert first.wait(1.0)
    assert not second.wait(0.4) and not third.wait(0.4)
    first.release("started")
    assert second.wait(0.5) and second.held
    assert not third.wait(0.8)  # now behind the second: its clock starts again
    second.release("started")
    assert third.wait(0.5) and third.held and not third.bypassed
    assert time.monotonic() - began > 2 * third.limit_s
    third.release("started")


def test_a_job_records_whom_it_waits_for_and_when_it_passed(tmp_path):
    status_file = tmp_path / "progress" / STATUS_FILE
    first = gate(tmp_path, "live.rsvps")
    second = StartGate(gate_path(tmp_path), limit_s=30.0, holder="live.ads", status_file=status_file)
    assert first.wait(1.0) and not second.wait(0.2)
    record = read_json(status_file)
    assert record["pid"] == os.getpid() and record["behind"].startswith("live.rsvps (pid")
    assert record["since_unix"] <= time.time() and "passed_unix" not in record
    first.release("started")
    assert second.wait(1.0)
    passed = read_json(status_file)
    assert passed["pid"] == os.getpid() and passed["passed_unix"] >= record["since_unix"] and "behind" not in passed
    second.release("started")


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
    settings = {"release_startup_workers": False, "stream_start_gate_seconds": 120.0, **settings}
    job = PipelineStreams(Settings(state_dir=str(tmp_path), **settings), RSVPS)
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


RunningJob = tuple[StartGate, PipelineStreams, list[Query], threading.Event, threading.Thread]


def job_behind(tmp_path: Path, holder: str) -> RunningJob:
    """A job run while ``holder`` holds the gate: the holder's gate, the job, its started queries, its
    stop event and its thread."""
    ahead = gate(tmp_path, holder)
    assert ahead.wait(1.0)
    job, started = stand_in_job(tmp_path)
    stop = threading.Event()
    return ahead, job, started, stop, run(job, stop)


def test_a_job_starts_its_queries_once_the_gate_is_free_and_holds_it_until_they_run(tmp_path):
    other, job, started, stop, thread = job_behind(tmp_path, "live.pageviews")
    try:
        time.sleep(1.5)
        assert started == []  # another job is starting
        assert read_json(job.layout.progress_dir() / STATUS_FILE)["behind"].startswith("live.pageviews")
        other.release("started")
        wait_until(lambda: len(started) == len(job.tiers), "every query started once the gate was free")
        assert "passed_unix" in read_json(job.layout.progress_dir() / STATUS_FILE)
        third = gate(tmp_path, "live.ads")
        assert not third.wait(1.5)  # the job holds the gate while its queries start
        for query in started:
            query.lastProgress = read(0)  # every query ran a trigger, without data
        assert not third.wait(1.5)  # bronze has not read from Kafka yet: its workers may still be starting
        bronze = started[[t.query for t in job.tiers].index("bronze")]
        bronze.lastProgress = read(7)
        assert third.wait(5.0), "the job passed the gate on"  # gold's first read of silver is not waited for
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
    other, _, started, stop, thread = job_behind(tmp_path, "live.pageviews")
    time.sleep(1.2)
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and started == []
    assert other.held and not gate(tmp_path, "live.ads").wait(0.2)
    other.release("started")


def test_the_gate_is_off_unless_a_limit_is_set(tmp_path):
    assert PipelineStreams(Settings(state_dir=str(tmp_path)), RSVPS).start_gate() is None  # the default
    job, _ = stand_in_job(tmp_path, stream_start_gate_seconds=0.0)
    assert job.start_gate() is None
    job, _ = stand_in_job(tmp_path, stream_start_gate_seconds=30.0)
    gate = job.start_gate()
    assert gate is not None and gate.limit_s == 30.0 and gate.path == tmp_path / "stream-start.lock"


# ---- what the supervisor makes of a job waiting at the gate ------------------------------------------


def test_the_supervisor_shows_a_job_waiting_at_the_gate_as_starting_and_due_heartbeats_from_its_passage(tmp_path):
    settings = Settings(state_dir=str(tmp_path), stream_stall_seconds=1.0, stream_start_gate_seconds=120.0)
    control = StreamControl(settings, "rsvps")
    job = PipelineStreams(settings, RSVPS)
    for tier in job.tiers:  # what its preflight does before the gate: the checkpoints' leases
        job._claim(tier)
    try:
        ahead = gate(tmp_path, "live.ads")
        waiting = job.start_gate()
        assert ahead.wait(1.0) and waiting is not None and not waiting.wait(0.1)
        time.sleep(1.2)  # longer than the stall time, without a heartbeat
        health = control.health()
        assert health.state == STARTING, health
        assert health.detail.startswith("waiting at the start gate for live.ads (pid") and health.pid == os.getpid()
        ahead.release("started")
        assert waiting.wait(1.0) and waiting.held
        assert control.health().state == RUNNING  # heartbeats are due from the passage
        time.sleep(1.2)
        stalled = control.health()  # and then they are
        assert stalled.state == STALLED and "no heartbeat" in stalled.detail
        waiting.release("started")
    finally:
        job.close()


def test_a_gate_record_of_another_driver_is_not_believed(tmp_path):
    settings = Settings(state_dir=str(tmp_path), stream_stall_seconds=1.0)
    control = StreamControl(settings, "rsvps")
    job = PipelineStreams(settings, RSVPS)
    claimed = time.time()
    for tier in job.tiers:
        job._claim(tier)
    try:
        status = job.layout.progress_dir() / STATUS_FILE
        status.parent.mkdir(parents=True, exist_ok=True)
        time.sleep(1.2)
        host = socket.gethostname()
        for record in (
            {"pid": 2**22 + 1, "host": host, "behind": "live.ads", "since_unix": claimed + 1},  # another driver
            {"pid": os.getpid(), "host": host, "behind": "live.ads", "since_unix": claimed - 60},  # before the claim
        ):
            status.write_text(json.dumps(record))
            assert control.health().state == STALLED, record
    finally:
        job.close()
