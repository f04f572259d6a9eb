"""One writer at a time per live table: an exclusive lock every writer takes around its commit.

Writers of one table are the stream (one micro-batch commit), a batch recompute, a live replay or
correction (read -> compute -> commit), and maintenance (compaction). Delta's optimistic
concurrency would let them race and fail one commit; worse, a recompute that read its input
before the stream's last commit and replaced an interval after it would drop that commit's
rows. So each writer holds the table's lock: the stream for one commit (milliseconds), a batch
from the moment it reads its input until it has committed. A stream micro-batch that meets a
held lock waits (up to ``table_lock_timeout_seconds``) instead of failing.

The lock is an ``flock`` on ``<checkpoint root>/<namespace>/<pipeline>/_locks/<table>.lock``: the
checkpoint root is already a file system every driver shares, and the kernel frees the lock when
its holder dies. It is reentrant within a process, so a batch holding it may call writers that
take it again.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from tidewater import phase_clock
from tidewater.errors import TidewaterError


class TableLockTimeoutError(TidewaterError):
    """Another writer held a table's lock for longer than the timeout."""


class WriterLock(Protocol):
    """What every writer of a table holds around its commit: :class:`TableLock` (``flock``, one host) or
    :class:`tidewater.lake.pg_locks.PostgresLock` (PostgreSQL advisory locks, any host), by setting."""

    @property
    def table(self) -> str: ...

    def hold(self, purpose: str) -> AbstractContextManager[None]: ...

    def holder(self) -> str | None: ...


_paths: dict[str, threading.Lock] = {}  # one per lock file: threads of this process take turns
_paths_guard = threading.Lock()  # guards _paths only; never held while waiting
_depth = threading.local()  # per thread: lock file -> how many nested holds


@dataclass(frozen=True)
class TableLock:
    path: Path
    table: str  # for messages: "<namespace>/<pipeline>/<table>"
    timeout_s: float

    @contextmanager
    def hold(self, purpose: str) -> Iterator[None]:
        """Hold the lock for ``purpose`` (written beside it, so a waiting writer can say who holds it).

        Reentrant for the thread holding it; other threads of the process, and other processes, wait.
        """
        key = str(self.path)
        depths: dict[str, int] = _depth.__dict__.setdefault("held", {})
        if depths.get(key):
            depths[key] += 1
            try:
                yield
            finally:
                depths[key] -= 1
            return
        with _paths_guard:
            in_process = _paths.setdefault(key, threading.Lock())
        if not in_process.acquire(timeout=self.timeout_s):
            raise TableLockTimeoutError(
                f"table {self.table} has been locked by another thread of this process for over "
                f"{self.timeout_s:g} s; raise TIDEWATER_TABLE_LOCK_TIMEOUT_SECONDS if that is expected"
            )
        try:
            handle = self._acquire(purpose)
            depths[key] = 1
            try:
                yield
            finally:
                depths.pop(key, None)
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
        finally:
            in_process.release()

    def holder(self) -> str | None:
        """Who holds the lock now (None if free)."""
        return flock_holder(self.path)

    def _acquire(self, purpose: str) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - kept open while the lock is held
        deadline = time.monotonic() + self.timeout_s
        while (holder := try_flock(handle)) is not None:
            if time.monotonic() >= deadline:
                handle.close()
                raise TableLockTimeoutError(
                    f"table {self.table} has been locked by {holder or 'another writer'} for over "
                    f"{self.timeout_s:g} s; wait for it to finish or raise TIDEWATER_TABLE_LOCK_TIMEOUT_SECONDS"
                )
            time.sleep(0.1)
        stamp(handle, f"{purpose} (pid {os.getpid()} on {socket.gethostname()})")
        return handle


def try_flock(handle: IO[str]) -> str | None:
    """Take an exclusive ``flock`` on the open file without waiting: None when taken, else what its
    holder wrote into it (possibly empty)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        return handle.read().strip()
    return None


def stamp(handle: IO[str], text: str) -> None:
    """Say who holds the flock on ``handle`` (read by :func:`flock_holder` and waiting takers)."""
    handle.seek(0)
    handle.truncate()
    handle.write(text + "\n")
    handle.flush()


def flock_holder(path: Path, *, unknown: str = "unknown") -> str | None:
    """What the holder of the ``flock`` on ``path`` wrote into it, or None when nobody holds it."""
    if not path.exists():
        return None
    with open(path, "a+") as handle:
        holder = try_flock(handle)
        if holder is None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
        return holder or unknown


@contextmanager
def holding(lock: WriterLock | None, purpose: str) -> Iterator[None]:
    """``lock.hold(purpose)``, or nothing when a writer was given no lock. The wait for the lock is
    phase ``lock wait`` of a timed micro-batch (:mod:`tidewater.phase_clock`)."""
    if lock is None:
        yield
        return
    with ExitStack() as held:
        with phase_clock.phase("lock wait"):
            held.enter_context(lock.hold(purpose))
        yield
