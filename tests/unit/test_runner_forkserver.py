"""The waiting process's side of the runners' fork server (tidewater.runner_forkserver), against a
stand-in server: what it hands over, how it exits, and that it runs the runner itself whenever it cannot
hand it over. (The server forking real runners for a real job: tests/integration/test_stream_host.py.)"""

from __future__ import annotations

import array
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidewater import runner_forkserver
from tidewater.runner_forkserver import RUNNER_MODULE, socket_path

RUNNER_ARGV = [sys.executable, "-m", RUNNER_MODULE]


class StandIn:
    """Listens where the fork server of JVM ``jvm_pid`` would; answers its one connection with the
    forked runner's pid (``replies[0]``, binary) and, once ``release`` is set, its exit code (a line;
    none: the server closes the connection as if it died)."""

    def __init__(self, jvm_pid: int, replies: list[int]) -> None:
        self.path = socket_path(jvm_pid)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.replies = replies
        self.release = threading.Event()
        self.release.set()
        self.request: dict = {}
        self.fds = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(16))
        for _, _, data in ancillary:
            received = array.array("i")
            received.frombytes(data[: len(data) - len(data) % received.itemsize])
            self.fds = len(received)
            for fd in received:
                os.close(fd)
        (length,) = struct.unpack("!I", header)
        body = b""
        while len(body) < length:
            body += conn.recv(length - len(body))
        self.request = json.loads(body)
        conn.sendall(struct.pack("!i", self.replies[0]))
        self.release.wait(60)
        for code in self.replies[1:]:
            conn.sendall(b"%d\n" % code)
        conn.close()

    def close(self) -> None:
        self.thread.join(10)
        self.listener.close()
        os.unlink(self.path)


@pytest.fixture(autouse=True)
def own_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of a short name (a Unix socket's path holds 107 bytes at most)."""
    short = Path(tempfile.mkdtemp(prefix="tw-fs-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.delenv(runner_forkserver.SWITCH, raising=False)
    yield short
    shutil.rmtree(short, ignore_errors=True)


def test_the_path_is_the_jvms_and_the_switch_turns_it_off(own_tmpdir):
    assert socket_path(4242) == str(own_tmpdir / f"tidewater-forkservers-{os.getuid()}" / "4242.sock")
    assert runner_forkserver.switched_off({runner_forkserver.SWITCH: "false"})
    assert not runner_forkserver.switched_off({})


def test_a_process_that_is_no_runner_or_has_no_server_runs_as_spark_made_it():
    left, right = socket.socketpair()
    try:
        runner_forkserver.hand_over(left, [sys.executable, "-m", "pyspark.daemon"])  # not a runner
        runner_forkserver.hand_over(left, RUNNER_ARGV)  # a runner, but its JVM (our parent) has no server
        left.sendall(b"x")
        assert right.recv(1) == b"x"  # its connection is its own still
    finally:
        left.close()
        right.close()


def test_a_refused_fork_leaves_the_runner_to_run_here():
    server = StandIn(os.getppid(), replies=[-1])
    left, right = socket.socketpair()
    try:
        runner_forkserver.hand_over(left, RUNNER_ARGV)
        server.close()
        assert server.fds == 4 and server.request["waiter"] == os.getpid()
        left.sendall(b"y")
        assert right.recv(1) == b"y"
    finally:
        left.close()
        right.close()


WAITER = """
import socket, sys
from tidewater import runner_forkserver
left, right = socket.socketpair()
runner_forkserver.hand_over(left, [sys.executable, "-m", runner_forkserver.RUNNER_MODULE])
sys.exit(99)  # not reached when handed over: the waiter exits with the runner's code
"""


def test_a_handed_over_runner_waits_as_a_shell_and_exits_with_the_forks_code():
    server = StandIn(os.getpid(), replies=[12345, 7])  # the waiter's parent is this process
    server.release.clear()
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER],
        env={**os.environ, "TIDEWATER_TEST_MARK": "seen"},
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while _argv(waiter.pid)[:1] != [runner_forkserver.SHELL] and time.monotonic() < deadline:
            time.sleep(0.02)
        # the same process, Spark's child with its pipes, now a shell: no Python interpreter held
        assert _argv(waiter.pid) == [runner_forkserver.SHELL, "-c", runner_forkserver.WAITER_SCRIPT]
    finally:
        server.release.set()
    _, stderr = waiter.communicate(timeout=60)
    server.close()
    assert waiter.returncode == 7, stderr
    assert server.fds == 4  # its connection to the JVM, stdin, stdout, stderr
    assert server.request["waiter"] == waiter.pid and server.request["env"]["TIDEWATER_TEST_MARK"] == "seen"


def test_a_waiter_whose_server_dies_exits_1():
    server = StandIn(os.getpid(), replies=[12345])  # the forked pid, then the connection closes
    waiter = subprocess.run([sys.executable, "-c", WAITER], capture_output=True, timeout=60)
    server.close()
    assert waiter.returncode == 1, waiter.stderr


def _argv(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [part.decode() for part in cmdline.read().split(b"\0") if part]
