"""Table locks that hold across hosts: PostgreSQL session advisory locks.

An ``flock`` excludes only processes that see the same file through the same mount on one host; two
drivers on two hosts (or two mounts of one shared folder) would both get it. A PostgreSQL *session*
advisory lock (``pg_try_advisory_lock``) is held by one database connection: every process that asks
for the same key waits, wherever it runs, and the server frees the lock the moment the holder's
connection ends, so a killed holder (kill -9, a lost host) releases it without anyone cleaning up.

:class:`PostgresLock` has the interface of :class:`tidewater.lake.locks.TableLock` (``hold(purpose)``,
reentrant within a thread; ``holder()``), and records who holds what since when in the table
``tidewater_locks`` (written after the lock is taken, deleted before it is released; a row whose
advisory lock is free is stale and not reported). The key of a lock is the first 8 bytes of the
SHA-256 of its name, as a signed 64-bit integer.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tidewater.lake.locks import TableLockTimeoutError

POLL_S = 0.1
_CREATE = """
CREATE TABLE IF NOT EXISTS tidewater_locks (
    name text PRIMARY KEY,
    lock_key bigint NOT NULL,
    holder text NOT NULL,
    purpose text NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
)
"""

_threads: dict[str, threading.Lock] = {}  # one per lock name: threads of this process take turns
_threads_guard = threading.Lock()
_depth = threading.local()


def lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@dataclass(frozen=True)
class PostgresLock:
    """An exclusive lock called ``name`` on the PostgreSQL server at ``dsn``."""

    dsn: str
    name: str  # e.g. "live/rsvps/gold.venue_response_counts"
    timeout_s: float

    @property
    def table(self) -> str:  # what messages call it, as TableLock does
        return self.name

    @contextmanager
    def hold(self, purpose: str) -> Iterator[None]:
        """Hold the lock for ``purpose``; other threads and processes, on any host, wait up to the timeout."""
        depths: dict[str, int] = _depth.__dict__.setdefault("held", {})
        if depths.get(self.name):
            depths[self.name] += 1
            try:
                yield
            finally:
                depths[self.name] -= 1
            return
        with _threads_guard:
            in_process = _threads.setdefault(self.name, threading.Lock())
        if not in_process.acquire(timeout=self.timeout_s):
            raise TableLockTimeoutError(
                f"lock {self.name} has been held by another thread of this process for over {self.timeout_s:g} s"
            )
        try:
            held = self.acquire(purpose)
            depths[self.name] = 1
            try:
                yield
            finally:
                depths.pop(self.name, None)
                held.release()
        finally:
            in_process.release()

    def acquire(self, purpose: str) -> HeldLock:
        """Take the lock (waiting up to the timeout; 0: one try) and keep it until :meth:`HeldLock.release`
        or the process's end: a checkpoint lease, held for a driver's lifetime. Not reentrant."""
        return HeldLock(self, self._acquire(purpose))

    def holder(self) -> str | None:
        """Who holds the lock now (None if free): the purpose its holder recorded."""
        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                # pg_locks, not a try-lock: taking the lock even for an instant could refuse a real taker.
                key = lock_key(self.name)
                cursor.execute(
                    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                    "AND classid = %s::oid AND objid = %s::oid "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
                )
                if cursor.fetchone() is None:
                    return None
                return _recorded(cursor, self.name) or "unknown"
        finally:
            connection.close()

    def _connect(self) -> Any:
        import psycopg2

        connection = psycopg2.connect(self.dsn, application_name=f"tidewater lock {self.name}"[:63])
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(_CREATE)
        return connection

    def _acquire(self, purpose: str) -> Any:
        connection = self._connect()
        key = lock_key(self.name)
        deadline = time.monotonic() + self.timeout_s
        try:
            with connection.cursor() as cursor:
                while not _try_lock(cursor, key):
                    if time.monotonic() >= deadline:
                        holder = _recorded(cursor, self.name) or "another writer"
                        raise TableLockTimeoutError(
                            f"lock {self.name} has been held by {holder} for over {self.timeout_s:g} s; "
                            "wait for it to finish or raise TIDEWATER_TABLE_LOCK_TIMEOUT_SECONDS"
                        )
                    time.sleep(POLL_S)
                cursor.execute(
                    "INSERT INTO tidewater_locks (name, lock_key, holder, purpose) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (name) DO UPDATE SET lock_key = EXCLUDED.lock_key, holder = EXCLUDED.holder, "
                    "purpose = EXCLUDED.purpose, since = now()",
                    (self.name, key, f"pid {os.getpid()} on {socket.gethostname()}", purpose),
                )
        except BaseException:
            connection.close()
            raise
        return connection

    def _release(self, connection: Any) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM tidewater_locks WHERE name = %s", (self.name,))
                cursor.execute("SELECT pg_advisory_unlock(%s)", (lock_key(self.name),))
        finally:
            connection.close()  # frees the lock in any case


class HeldLock:
    """A taken :class:`PostgresLock`: its connection holds it."""

    def __init__(self, lock: PostgresLock, connection: Any) -> None:
        self.lock = lock
        self._connection: Any = connection

    def release(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            self.lock._release(connection)


def _try_lock(cursor: Any, key: int) -> bool:
    cursor.execute("SELECT pg_try_advisory_lock(%s)", (key,))
    return bool(cursor.fetchone()[0])


def _recorded(cursor: Any, name: str) -> str | None:
    cursor.execute("SELECT purpose, holder, since FROM tidewater_locks WHERE name = %s", (name,))
    row = cursor.fetchone()
    return None if row is None else f"{row[0]} ({row[1]}, since {row[2].isoformat()})"
