"""Process facts and process control the platform shares (lowest layer: stdlib only).

One owner each for: whether a pid lives, signalling a process group, stopping a child we started
(SIGTERM, then SIGKILL), turning SIGINT/SIGTERM into an orderly stop, and the environment a child
Spark process (spark-submit, a Python worker) needs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType


def alive(pid: int) -> bool:
    """Is ``pid`` a live process? A zombie (exited, not yet reaped by its parent) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _running(pid, stat_fields(f"/proc/{pid}/stat")[0])
    except OSError:
        return True


def stat_fields(path: str) -> list[str]:
    """The fields of a ``/proc/<pid>[/task/<tid>]/stat`` after the command's name (which may hold
    spaces and parentheses): state, ppid, pgrp, ..."""
    with open(path) as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _running(pid: int, state: str) -> bool:
    """Is the process ``pid``, whose main thread is in ``state``, still running? Its main thread shows
    a zombie ("Z") as soon as it has exited while other threads are still exiting (a kill -9'd JVM or
    driver): the process still holds its files and their locks, a checkpoint's lease among them,
    until its last thread is gone."""
    if state != "Z":
        return True
    try:
        threads = os.scandir(f"/proc/{pid}/task")
    except OSError:
        return False
    with threads:
        for thread in threads:
            try:
                if stat_fields(f"{thread.path}/stat")[0] not in ("Z", "X"):
                    return True
            except (OSError, IndexError):
                continue
    return False


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone (or not ours to signal) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def command_line(pid: int) -> str | None:
    """``pid``'s command line, arguments joined by spaces; None when it is gone (a zombie whose
    threads have all exited)."""
    try:
        if not _running(pid, stat_fields(f"/proc/{pid}/stat")[0]):
            return None
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes in process group ``pgid``."""
    return _live_processes(lambda fields: int(fields[2]) == pgid)


def children(ppid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live child processes of ``ppid``."""
    return _live_processes(lambda fields: int(fields[1]) == ppid)


def _live_processes(wanted: Callable[[list[str]], bool]) -> list[tuple[int, str]]:
    """(pid, command line) of each live process whose ``/proc/<pid>/stat`` fields after the command
    (state, ppid, pgrp, ...) are ``wanted``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(f"/proc/{entry.name}/stat")
            if not wanted(fields) or not _running(int(entry.name), fields[0]):
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                cmd = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        found.append((int(entry.name), cmd))
    return found


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of the live processes in process group ``pgid``, summed."""
    total = 0
    for pid, _ in group_members(pgid):
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


def end_groups(groups: Mapping[int, str], *, timeout_s: float) -> list[int]:
    """SIGTERM each process group ``pgid`` of ``groups`` (leaders another process of ours started and
    recorded, each with the ``marker`` its command line must still contain: a recorded pid reused by
    another program is never signalled), all at once; SIGKILL what is left after ``timeout_s``.
    Returns the groups that were ours and are gone."""
    ours = [pgid for pgid, marker in groups.items() if marker in (command_line(pgid) or "\0")]
    for pgid in ours:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(group_members(g) for g in ours) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pgid in ours:
        if group_members(pgid):
            signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(group_members(g) for g in ours) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ours


def kill_spark_leftovers(pgid: int) -> list[int]:
    """SIGKILL what is left of a Spark job's process group ``pgid`` (a JVM whose Python driver was
    killed keeps running; the runners' fork server, its forks and their waiting shells go with it) if
    one of its members still names Spark: a recorded pid reused by another program's group is left
    alone. The pids signalled."""
    members = group_members(pgid)
    if not any("spark" in cmd.lower() for _, cmd in members):
        return []
    signal_group(pgid, signal.SIGKILL)
    return [pid for pid, _ in members]


def stop_process_group(process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """SIGTERM the group we started (graceful stop), SIGKILL it if it does not end in time.

    ``process`` must have been started with ``start_new_session=True`` so its group is its own.
    """
    if process.poll() is not None:
        return
    signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


class Terminated(SystemExit):
    """SIGTERM arrived (see :func:`exit_on_sigterm`). A ``SystemExit`` (code 143), so uncaught it ends
    the process quietly; its own type, so code that catches ``SystemExit`` from a failed child step
    can let this one through."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(143)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread, so a command killed that way (a
    benchmark stopped by ``kill``) still runs its ``finally`` blocks and stops what it started."""
    signal.signal(signal.SIGTERM, _terminate)


class StopOnSignal:
    """SIGINT/SIGTERM set an event instead of raising, so shutdown runs in order."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None

    def install(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up on the orderly stop
        self.signal = signum
        self.event.set()


# Arrow's allocator in a Spark job's Python processes (the driver that writes each micro-batch, the
# workers), which pyarrow reads as it loads: the C library's, not pyarrow's default (mimalloc), which
# drained slower and held more (why was not measured: each micro-batch allocates and frees buffers of
# tens of MB). Interleaved pairs, 2026-12-01: rsvps draining 2M in 200k-record micro-batches 46,825 /
# 47,002 events/s against 43,234 / 44,537, PSS 2.36 / 2.36 GB against 2.36 / 2.47; payments draining 1M
# 61,970 / 65,143 against 53,491 / 55,946, PSS 1.98 / 1.91 against 2.01 / 2.00; pageviews at 2,000
# events/s PSS 1.30 / 1.37 GB against 1.42 / 1.46, its latency the same (silver p95 1.42 s, 1.43-1.46).
ARROW_MEMORY_POOL = "system"
# Allocations from this size up each get pages of their own from the kernel, given back as they are
# freed. glibc's default (128 KiB, raised to the size of each large block freed, up to 32 MiB) soon
# serves a micro-batch's Arrow buffers, tens of MB each, from its heap, which keeps them after they are
# freed: a task worker that had read and parsed one batch held it while the driver wrote it, and the
# driver held the last batch's while the workers read the next. Interleaved pairs, pageviews draining
# 1M, 2026-12-01 (1 MiB, glibc's default): PSS 1.71 / 2.07 GB and 1.79 / 2.04 GB, the driver 333 / 480
# MiB, the two task workers 279 / 451 MiB; 36,621 / 40,397 and 42,089 / 40,285 events/s.
MALLOC_MMAP_THRESHOLD = str(1 << 20)
# What spark_child_env sets for Spark's processes alone: measured there, not in Airflow's (whose
# environment passes the rest on to the tasks that start Spark jobs, and those jobs set it themselves).
SPARK_PROCESSES_ONLY = frozenset({"MALLOC_MMAP_THRESHOLD_"})


def spark_child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a child Spark process needs: the venv's interpreter for driver and workers, loopback only,
    Arrow's buffers from the C library's allocator (:data:`ARROW_MEMORY_POOL`), and large blocks given
    back to the kernel as they are freed (:data:`MALLOC_MMAP_THRESHOLD`).

    A value already in ``environ`` (default: this process's environment) wins, so an operator can
    point Spark at another interpreter or address.
    """
    current = os.environ if environ is None else environ
    defaults = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "ARROW_DEFAULT_MEMORY_POOL": ARROW_MEMORY_POOL,
        "MALLOC_MMAP_THRESHOLD_": MALLOC_MMAP_THRESHOLD,
    }
    return {key: current.get(key, value) for key, value in defaults.items()}


def scratch_dir(root: str | os.PathLike[str]) -> str:
    """This process's own scratch folder under ``root``, after removing those of processes now dead.

    Spark keeps ``spark-*`` and ``blockmgr-*`` in its local folder and removes them only on an orderly
    exit: a driver killed with SIGKILL leaked ~75 MB into /tmp each time. Keeping them in a per-pid
    folder lets the next process clean up what a killed one left. (The JVM's own temporary folder,
    where RocksDB and LZ4 unpack their native libraries, follows only when the session starts the JVM;
    spark-submit starts it before any of our code runs.)"""
    base = os.path.abspath(root)
    os.makedirs(base, exist_ok=True)
    for name in os.listdir(base):
        if name.isdigit() and int(name) != os.getpid() and not alive(int(name)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    mine = os.path.join(base, str(os.getpid()))
    os.makedirs(mine, exist_ok=True)
    return mine
