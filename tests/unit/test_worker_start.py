"""How Spark's Python processes start (tidewater.worker_start): which of Spark's zips leave the path, and
the connect-back at interpreter start against a stand-in for the JVM's side of Spark's worker handshake on
127.0.0.1 (what it sends, what it hands to pyspark, when it does nothing). Against real Spark:
tests/integration/test_spark_python_workers.py."""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidewater import worker_start
from tidewater.worker_start import (
    PTH_LINE,
    PTH_NAME,
    SWITCH,
    connect_at_start,
    install,
    use_installed_pyspark,
    worker_module,
)

RUNNER = ["/venv/bin/python", "-m", "pyspark.sql.streaming.python_streaming_source_runner"]


class StandInJvm:
    """Accepts one worker, checks its secret as SocketAuthHelper does, reads its pid, then echoes a line."""

    def __init__(self, secret: str = "s3cret", answer: str = "ok") -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.secret, self.answer = secret, answer
        self.received_secret: str | None = None
        self.pid: int | None = None
        self.after_pid = b""
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def environ(self) -> dict[str, str]:
        port = str(self.server.getsockname()[1])
        return {"PYTHON_WORKER_FACTORY_PORT": port, "PYTHON_WORKER_FACTORY_SECRET": self.secret}

    def serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("rwb") as stream:
            (length,) = struct.unpack("!i", stream.read(4))
            self.received_secret = stream.read(length).decode()
            answer = self.answer.encode()
            stream.write(struct.pack("!i", len(answer)) + answer)
            stream.flush()
            if self.answer != "ok":
                return
            (self.pid,) = struct.unpack("!i", stream.read(4))
            self.after_pid = stream.readline()

    def close(self) -> None:
        self.thread.join(10)
        self.server.close()


@pytest.fixture
def clean_state() -> Iterator[None]:
    yield
    sock = worker_start.take_connected()
    if sock is not None:
        sock.close()
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_PatchWorkerUtil"]


def test_only_a_pyspark_module_started_with_m_is_a_worker() -> None:
    assert worker_module(RUNNER) == "pyspark.sql.streaming.python_streaming_source_runner"
    assert worker_module(["python", "-mpyspark.daemon"]) == "pyspark.daemon"
    assert worker_module(["python", "-m", "tidewater.cli"]) is None
    assert worker_module(["python", "-u", "-X", "importtime", "-m", "pyspark.worker"]) == "pyspark.worker"
    assert worker_module(["python", "spark_jobs/stream.py", "-m", "pyspark.x"]) is None  # the script's arguments
    assert worker_module(["python", "-c", "pass", "-m", "pyspark.x"]) is None
    assert worker_module(["python", "-c", "pass"]) is None
    assert worker_module(["python", "-m"]) is None


def test_the_worker_authenticates_sends_its_pid_and_hands_the_socket_to_pyspark(clean_state: None) -> None:
    jvm = StandInJvm()
    try:
        assert connect_at_start(RUNNER, jvm.environ)
        deadline = time.monotonic() + 10  # the handshake is done before any import: the JVM has the pid now
        while jvm.pid is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert jvm.received_secret == "s3cret" and jvm.pid == os.getpid()

        def refuse(timeout: int | None = -1) -> Iterator[None]:
            raise AssertionError("pyspark's own connect ran though a socket was handed over")

        worker_util = types.SimpleNamespace(get_sock_file_to_executor=refuse)
        worker_start.patch_worker_util(worker_util)
        with worker_util.get_sock_file_to_executor(timeout=None) as sock_file:
            sock_file.write(b"first message\n")
            sock_file.flush()
        jvm.close()
        assert jvm.after_pid == b"first message\n"  # the same connection, nothing sent twice
        with (  # handed over once only
            pytest.raises(AssertionError, match="own connect ran"),
            worker_util.get_sock_file_to_executor(timeout=None),
        ):
            pass
    finally:
        jvm.close()


def test_a_refused_secret_leaves_pysparks_own_connect_to_run(clean_state: None) -> None:
    jvm = StandInJvm(answer="err")
    try:
        assert not connect_at_start(RUNNER, jvm.environ)
        assert worker_start.take_connected() is None
        assert not any(type(f).__name__ == "_PatchWorkerUtil" for f in sys.meta_path)
    finally:
        jvm.close()


def test_nothing_happens_outside_a_worker_or_when_switched_off(clean_state: None) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    environ = {"PYTHON_WORKER_FACTORY_PORT": str(closed.getsockname()[1]), "PYTHON_WORKER_FACTORY_SECRET": "x"}
    closed.close()  # nothing listens: a connect would fail, but none is tried
    assert not connect_at_start(["python", "-m", "airflow", "scheduler"], environ)
    assert not connect_at_start(RUNNER, {**environ, SWITCH: "spark"})
    assert not connect_at_start(RUNNER, environ)  # tried, refused: pyspark's own connect reports it
    assert worker_start.take_connected() is None


def test_install_writes_the_pth_line_once(tmp_path: Path) -> None:
    target = install(tmp_path)
    assert target == tmp_path / PTH_NAME and target.read_text() == PTH_LINE
    mtime = target.stat().st_mtime_ns
    assert install(tmp_path).stat().st_mtime_ns == mtime  # unchanged when current
    assert PTH_LINE.startswith("import ") and PTH_LINE.count("\n") == 1  # site executes such a line


def test_the_install_has_the_hook() -> None:
    """The bootstrap installs it into the venv the tests run in."""
    import sysconfig

    assert (Path(sysconfig.get_paths()["purelib"]) / PTH_NAME).read_text() == PTH_LINE


def fake_install(site: Path, py4j_version: str = "0.10.9.9") -> Path:
    """A site-packages with pyspark (and its zips) and py4j, as pip installs them."""
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    (site / f"py4j-{py4j_version}.dist-info").mkdir()
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    return lib


def test_sparks_zips_of_the_installed_pyspark_leave_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lib = fake_install(site)
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/job/dir", str(site)]
    assert use_installed_pyspark(path) == [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert path == ["/job/dir", str(site)]


def test_zips_of_another_spark_or_another_py4j_stay(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lib = fake_install(site, py4j_version="0.10.9.7")
    other = tmp_path / "spark-home" / "python" / "lib"
    path = [str(other / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(site)]
    assert use_installed_pyspark(path) == []  # another SPARK_HOME's pyspark; a py4j zip of another version
    assert len(path) == 3
    assert use_installed_pyspark([str(lib / "pyspark.zip")]) == []  # no installed pyspark on the path: keep it


def test_the_pth_line_run_twice_connects_once(clean_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """site runs a .pth line twice in our venvs: a second connect would wait 15 s for the JVM (it did)."""
    jvm = StandInJvm()
    calls: list[int] = []
    real_connect = worker_start.connect

    def counting_connect(environ):
        calls.append(1)
        return real_connect(environ)

    try:
        monkeypatch.setattr(worker_start, "_started", False)
        monkeypatch.setattr(worker_start, "connect", counting_connect)
        monkeypatch.setattr(sys, "orig_argv", RUNNER)
        monkeypatch.setattr(sys, "path", list(sys.path))
        for name, value in jvm.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv(SWITCH, raising=False)
        worker_start.at_interpreter_start()
        worker_start.at_interpreter_start()
        assert calls == [1] and worker_start.take_connected() is not None
    finally:
        jvm.close()
