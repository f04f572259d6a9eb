"""A writer lock as Spark data source options and back: the ``tidewater-delta`` stream sink commits in
the driver's Python data source process, which rebuilds the query's table lock from its options."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tidewater.lake.locks import TableLock, WriterLock
from tidewater.lake.pg_locks import PostgresLock


def lock_options(lock: WriterLock) -> dict[str, str]:
    """``lockPath`` (flock) or ``lockDsn`` + ``lockName`` (PostgreSQL), and ``lockTimeoutSeconds``."""
    if isinstance(lock, PostgresLock):
        return {"lockDsn": lock.dsn, "lockName": lock.name, "lockTimeoutSeconds": str(lock.timeout_s)}
    if isinstance(lock, TableLock):
        return {"lockPath": str(lock.path), "lockTimeoutSeconds": str(lock.timeout_s)}
    raise TypeError(f"no data source options for a {type(lock).__name__}")


def lock_from_options(options: Mapping[str, str], table: str) -> WriterLock | None:
    """The lock the options describe (None: none); ``table`` names an flock's table in messages."""
    timeout = float(options.get("lockTimeoutSeconds") or 900)
    if options.get("lockDsn"):
        return PostgresLock(options["lockDsn"], options.get("lockName") or table, timeout)
    if options.get("lockPath"):
        return TableLock(Path(options["lockPath"]), table=table, timeout_s=timeout)
    return None
