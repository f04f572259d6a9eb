"""Spark's streaming-source runners, forked from one warm process instead of each importing it all.

Spark runs a Python process for every source of every streaming query over a Python data source
(``python -m pyspark.sql.streaming.python_streaming_source_runner``, started on its own, not forked
from a daemon): tidewater's Kafka sources and every gold query's silver inputs. Each imports pyspark,
pyarrow and the data source's modules (delta-rs for a silver input) into a heap of its own, ~57 MiB
PSS; the stream host running five pipelines had 20 of them, 1.15 GB of its 3.0 GB.

A **fork server** started beside the driver's JVM (:func:`start`) imports those modules once and
forks a runner per request, so the runners share its pages copy-on-write. Spark still starts its
process and that process still connects back to the JVM as before (at interpreter start:
:mod:`tidewater.worker_start`); then, instead of importing anything, it hands its connection (and its
stdin, stdout and stderr) to the fork server over a Unix socket (``SCM_RIGHTS``), and waits:

* the forked runner serves the JVM on that connection exactly as the runner would
  (``python_streaming_source_runner.main``), its output in the same place;
* the waiting process exits with the runner's exit code, so what Spark sees of its process is the same;
  it waits as a shell (``exec /bin/sh``: the same pid and pipes, ~0.3 MiB instead of a Python
  interpreter's ~10), reading that code as a line from the server;
* a runner whose waiting process is killed (Spark stopping the query) exits too (it watches it), and
  one whose JVM goes away ends on its closed connection, as before.

The server is found by its path alone: ``<tmp>/tidewater-forkservers-<uid>/<JVM pid>.sock``, the JVM
being the waiting process's parent. Anything unexpected (no server, a refused connection, a fork that
fails) leaves the process to run the runner itself, as Spark made it. The server leaves when the
process that started it (the driver) is gone. ``TIDEWATER_RUNNER_FORKSERVER=false`` turns it off.
This module imports nothing of tidewater's at import time: the ``.pth`` hook of every Spark Python
process imports it.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import sys

# The waiting process imports only the above (it is one per runner); the server's side imports the rest.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
SWITCH = "TIDEWATER_RUNNER_FORKSERVER"  # "false": runners start as Spark starts them
# What a runner imports, loaded once by the server: the runner itself and tidewater's data sources.
# (kafka-python too, which a Kafka source's offsets import after the fork, left the runners' PSS as it
# was: ads at 2,000 events/s, six runners 226-232 MiB with it, 228 without.)
PRELOAD = (RUNNER_MODULE, "tidewater.connectors.delta", "tidewater.connectors.kafka_source", "deltalake")
_HEADER = struct.Struct("!I")
SHELL = "/bin/sh"
WAITER_FD = 3
# The waiting process once handed over: the runner's exit code, read as a line; none (the server died): 1.
WAITER_SCRIPT = f'read -r code <&{WAITER_FD}; exit "${{code:-1}}"  # tidewater: a streaming-source runner, forked'


def socket_path(jvm_pid: int) -> str:
    """Where the fork server of the JVM ``jvm_pid`` listens (in the temporary folder tempfile would
    find first, without importing tempfile)."""
    base = next((os.environ[n] for n in ("TMPDIR", "TEMP", "TMP") if os.environ.get(n)), "/tmp")
    return os.path.join(base, f"tidewater-forkservers-{os.getuid()}", f"{jvm_pid}.sock")


def switched_off(environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(SWITCH, "").strip().lower() in ("false", "0", "no", "off")


# ---- the driver's side ----------------------------------------------------------------------------


_server: subprocess.Popen[bytes] | None = None  # this driver's, for its current JVM


def start(jvm_pid: int, *, python: str = sys.executable, timeout_s: float = 30.0) -> subprocess.Popen[bytes] | None:
    """Start the fork server of the JVM ``jvm_pid`` (a child of this process, in its process group) and
    wait until it listens; None when turned off or when it did not come up (runners then start as
    Spark starts them). The server of an earlier JVM of this process (a stopped session) is ended."""
    import subprocess
    import time

    global _server
    if _server is not None and _server.poll() is None:
        _server.kill()
        _server.wait()
    _server = None
    if switched_off(os.environ):
        return None
    path = socket_path(jvm_pid)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    _unlink(path)
    server = subprocess.Popen(
        [python, "-m", "tidewater.runner_forkserver", path, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        env={**os.environ, SWITCH: "false"},  # the server's own interpreter is no runner
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        if os.path.exists(path):
            _server = server
            return server
        time.sleep(0.05)
    if server.poll() is None:
        server.kill()
    return None


# ---- the waiting process's side (in every Spark Python process, through worker_start) ---------------


def hand_over(jvm_sock: socket.socket, argv: list[str]) -> None:
    """If this process is a streaming-source runner and its JVM has a fork server: give the server this
    process's connection to the JVM and its standard streams, wait for the forked runner, and exit with
    its code. Returns (the process runs the runner itself) when it cannot."""
    if switched_off(os.environ) or RUNNER_MODULE not in argv:
        return
    path = socket_path(os.getppid())
    if not os.path.exists(path):
        return
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(path)
        body = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "waiter": os.getpid()}).encode("utf-8")
        fds = array.array("i", [jvm_sock.fileno(), 0, 1, 2])
        server.sendmsg([_HEADER.pack(len(body)), body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        forked = _read_int(server)
    except (OSError, ValueError, struct.error):
        server.close()
        return
    if forked <= 0:  # the server could not fork: run it here
        server.close()
        return
    jvm_sock.close()  # the runner has it now; Spark's end stays open through the runner's copy
    _wait_in_shell(server)  # returns only if it cannot
    try:
        code = int(server.makefile("rb").readline() or b"1")
    except (OSError, ValueError):
        code = 1  # the server died: so did its runners, most likely
    os._exit(code)


def _wait_in_shell(server: socket.socket) -> None:
    """Become a shell that waits for the runner's exit code (a line from the server) and exits with it:
    the process Spark watches stays the same pid with the same pipes, and holds ~0.3 MiB instead of a
    Python interpreter's ~10 (ads: six of them; the platform's stream host: twenty)."""
    if not os.access(SHELL, os.X_OK):
        return
    try:
        if server.fileno() != WAITER_FD:
            os.dup2(server.fileno(), WAITER_FD)
        os.set_inheritable(WAITER_FD, True)  # the shell reads it (dup2 onto itself would keep close-on-exec)
        os.execv(SHELL, [SHELL, "-c", WAITER_SCRIPT])
    except OSError:
        return


def _read_int(sock: socket.socket) -> int:
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            raise ConnectionResetError("fork server closed the connection")
        data += chunk
    return int(struct.unpack("!i", data)[0])


# ---- the server -----------------------------------------------------------------------------------


def serve(path: str, parent: int) -> None:
    """Import the runners' modules once, then fork a runner for each waiting process that connects."""
    import select

    from tidewater.processes import alive
    from tidewater.warm_daemon import warm_up

    warm_up(PRELOAD)  # its objects frozen: the collector's passes leave their pages shared with the runners
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path + ".tmp"
    _unlink(temporary)
    listener.bind(temporary)
    listener.listen(64)
    os.replace(temporary, path)  # it appears only once it accepts
    waiting: dict[int, socket.socket] = {}  # runner pid -> its waiting process's connection
    parent_fd = _pidfd(parent)
    try:
        while True:
            watched = [listener] + ([parent_fd] if parent_fd is not None else [])
            readable, _, _ = select.select(watched, [], [], 1.0)
            if parent_fd in readable or (parent_fd is None and not alive(parent)):
                break  # the driver is gone: its runners end with their connections
            if listener in readable:
                conn, _ = listener.accept()
                _fork_runner(conn, listener, waiting)
            _reap(waiting)
    finally:
        _unlink(path)


def _unlink(path: str) -> None:
    import contextlib

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fork_runner(conn: socket.socket, listener: socket.socket, waiting: dict[int, socket.socket]) -> None:
    import contextlib

    received = array.array("i")
    try:
        header, fds, _, _ = conn.recvmsg(_HEADER.size, socket.CMSG_SPACE(4 * array.array("i").itemsize))
        for level, kind, data in fds:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received.frombytes(data[: len(data) - (len(data) % received.itemsize)])
        (length,) = _HEADER.unpack(header)
        body = b""
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                raise ConnectionResetError
            body += chunk
        request = json.loads(body)
        if len(received) != 4:
            raise ValueError(f"expected 4 descriptors, got {len(received)}")
    except (OSError, ValueError, struct.error):
        with contextlib.suppress(OSError):
            conn.sendall(struct.pack("!i", -1))
        conn.close()
        for fd in received:  # the waiting process keeps its own and runs the runner itself
            os.close(fd)
        return
    try:
        pid = os.fork()
    except OSError:
        conn.sendall(struct.pack("!i", -1))
        conn.close()
        for fd in received:
            os.close(fd)
        return
    if pid == 0:
        listener.close()
        conn.close()  # the waiting process learns of this runner's end from the server alone
        for other in waiting.values():
            other.close()
        code = 1
        try:
            code = _run_runner(list(received), request)
        except BaseException:
            import traceback

            traceback.print_exc()  # to the waiting process's stderr: Spark's log of the runner
        finally:
            for stream in (sys.stdout, sys.stderr):  # os._exit leaves Python's buffers unwritten
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    for fd in received:
        os.close(fd)
    conn.sendall(struct.pack("!i", pid))
    waiting[pid] = conn


def _run_runner(fds: list[int], request: dict[str, object]) -> int:
    """In the forked child: become the runner Spark started, on the connection it made."""
    import signal

    jvm_fd, stdin, stdout, stderr = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    cwd = request.get("cwd")
    if isinstance(cwd, str):
        os.chdir(cwd)
    env = request.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    waiter = int(str(request.get("waiter", 0)))
    if waiter > 0:
        _exit_with(waiter)
    from pyspark.sql.streaming import python_streaming_source_runner as runner

    sock = socket.socket(fileno=jvm_fd)
    sock.settimeout(None)
    sock_file = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
    try:
        runner.main(sock_file, sock_file)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sock_file.close()
    return 0


def _exit_with(pid: int) -> None:
    """End this runner when the process Spark started for it (``pid``) ends: Spark ended the query."""
    import select
    import threading

    fd = _pidfd(pid)
    if fd is None:
        return

    def watch() -> None:
        select.select([fd], [], [])
        os._exit(0)

    threading.Thread(target=watch, name="waiter-watch", daemon=True).start()


def _reap(waiting: dict[int, socket.socket]) -> None:
    import contextlib

    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # a line: the waiting process is a shell (_wait_in_shell)
                conn.sendall(b"%d\n" % (os.waitstatus_to_exitcode(status) & 0xFF))
            conn.close()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
