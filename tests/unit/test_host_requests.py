"""The files supervisors and the stream host share (tidewater.streaming.host_requests): start requests,
the host's lease, its launch record."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tidewater.streaming.host_requests import HostFiles, HostRunningError, StartRequest


@pytest.fixture
def files(tmp_path) -> HostFiles:
    return HostFiles(tmp_path / "state", "live")


def request(pipeline: str, at: float) -> StartRequest:
    return StartRequest(pipeline, at, "desired state is running", f"/logs/{pipeline}.log")


def test_pending_requests_oldest_first_and_a_broken_one_skipped(files):
    files.request_start(request("rsvps", 20.0))
    files.request_start(request("ads", 30.0))
    files.request_start(request("payments", 10.0))
    (files.dir / "start" / "vending.json").write_text("{not json")
    assert [r.pipeline for r in files.pending()] == ["payments", "rsvps", "ads"]
    assert files.pending()[0] == request("payments", 10.0)


def test_taken_removes_only_the_request_the_host_read(files):
    files.request_start(request("rsvps", 10.0))
    read = files.pending()[0]
    files.request_start(request("rsvps", 11.0))  # a supervisor asked again meanwhile
    files.taken(read)
    assert files.pending() == [request("rsvps", 11.0)]
    files.taken(files.pending()[0])
    assert files.pending() == []


def test_withdraw(files):
    assert files.withdraw("rsvps") is False
    files.request_start(request("rsvps", 10.0))
    assert files.withdraw("rsvps") is True and files.pending() == []


def test_no_host_without_a_lease_or_a_recent_live_launch(files):
    assert files.running_pid(startup_s=60) is None and files.last_pid() is None
    files.record_launch(os.getpid(), now=1000.0)
    assert files.running_pid(startup_s=60, now=1030.0) == os.getpid()  # launched, not yet holding its lease
    assert files.running_pid(startup_s=60, now=1061.0) is None  # it never took it: not a host
    assert files.last_pid() == os.getpid()
    files.record_launch(os.getpid(), now=1000.0)
    files.record_leaving()
    assert files.running_pid(startup_s=60, now=1001.0) is None  # on its way out: launch a new one
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    files.record_launch(dead.pid, now=1000.0)
    assert files.running_pid(startup_s=60, now=1001.0) is None
    assert json.loads((files.dir / "launch.json").read_text())["pid"] == dead.pid


def test_the_lease_names_the_host_and_admits_one(files):
    lease = files.take_lease()
    try:
        assert files.holder_pid() == os.getpid()
        assert files.running_pid(startup_s=60) == os.getpgid(os.getpid())  # the launched job's group
        with pytest.raises(
            HostRunningError, match=f"a stream host already runs for namespace live \\(pid {os.getpid()}"
        ):
            files.take_lease()
    finally:
        lease.close()
    assert files.holder_pid() is None and files.running_pid(startup_s=60) is None


def test_a_host_that_cannot_start_says_why_in_each_waiting_pipelines_log(tmp_path):
    import threading

    from tidewater.config import Settings
    from tidewater.errors import ConfigError, one_line
    from tidewater.streaming.host import StreamHost
    from tidewater.streaming.jobs import last_error_line

    settings = Settings(state_dir=str(tmp_path / "state"))
    host = StreamHost(settings, "live", threading.Event())
    logs = {name: tmp_path / f"{name}.log" for name in ("rsvps", "ads")}
    for at, (name, log) in enumerate(logs.items()):
        host.files.request_start(StartRequest(name, float(at), "desired state is running", str(log)))
    error = ConfigError("TIDEWATER_STREAM_DRIVER_MEMORY: 'lots' is not a JVM size")
    host.fail_pending(f"tidewater: {one_line(error)} (the stream host did not start)")
    for log in logs.values():  # what the supervisor reports of the dead pipeline
        assert last_error_line(log) == f"{one_line(error)} (the stream host did not start)"
