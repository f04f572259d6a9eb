"""The table lock (tidewater.lake.locks): one writer at a time per live table, across processes.

Other processes are real ones: a small Python subprocess holds the lock (flock is per open file
description, so only another process shows true exclusion), and each is ended by PID in a finally.
The last two tests pin down defects found while writing them (per-process rather than per-thread
reentrancy; one guard held while waiting), now fixed.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from lock_helpers import held_elsewhere
from tidewater.errors import TidewaterError, one_line
from tidewater.lake.locks import TableLock, TableLockTimeoutError


def lock(tmp_path: Path, timeout_s: float = 5.0, name: str = "bronze") -> TableLock:
    return TableLock(path=tmp_path / "_locks" / f"{name}.lock", table=f"live/rsvps/{name}", timeout_s=timeout_s)


def test_reentrant_within_one_process(tmp_path: Path) -> None:
    """A holder may call code that takes the same lock again (a batch calling a writer): no
    self-deadlock, and the lock is released only when the outermost hold ends."""
    table_lock = lock(tmp_path, timeout_s=0.3)
    with table_lock.hold("outer"):
        with table_lock.hold("inner"):  # would time out after 0.3 s if not reentrant
            assert table_lock.holder() is not None
        assert table_lock.holder() is not None, "released by the inner hold while the outer one is active"
    assert table_lock.holder() is None


def test_holder_text_names_purpose_pid_and_host(tmp_path: Path) -> None:
    """holder(): None while nobody holds it (also before the lock file exists); otherwise the
    holder's purpose, pid and host, which is what a waiting writer reports."""
    table_lock = lock(tmp_path)
    assert table_lock.holder() is None
    with held_elsewhere(table_lock.path, "recompute 2026-11-21T10", 30) as process:
        assert table_lock.holder() == f"recompute 2026-11-21T10 (pid {process.pid} on {socket.gethostname()})"
    assert table_lock.holder() is None
    with table_lock.hold("maintenance"):
        assert table_lock.holder() == f"maintenance (pid {os.getpid()} on {socket.gethostname()})"


def test_excludes_another_process_and_times_out_with_one_line(tmp_path: Path) -> None:
    """While another process holds the lock, a writer waits for the timeout and then fails with one
    actionable line naming the table, the holder and the setting to raise."""
    table_lock = lock(tmp_path, timeout_s=0.5)
    with held_elsewhere(table_lock.path, "stream batch 7", 30) as process:
        started = time.monotonic()
        with pytest.raises(TableLockTimeoutError) as caught, table_lock.hold("maintenance"):
            pytest.fail("acquired a lock another process holds")
        waited = time.monotonic() - started
    assert 0.5 <= waited < 3, waited
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"table live/rsvps/bronze has been locked by stream batch 7 (pid {process.pid} on {socket.gethostname()}) "
        "for over 0.5 s; wait for it to finish or raise TIDEWATER_TABLE_LOCK_TIMEOUT_SECONDS"
    )
    assert isinstance(caught.value, TidewaterError)
    assert one_line(caught.value).startswith("TableLockTimeoutError: table live/rsvps/bronze has been locked by")


def test_waits_for_another_process_then_acquires(tmp_path: Path) -> None:
    """A writer that meets a held lock waits (does not fail) and gets it when the holder is done."""
    table_lock = lock(tmp_path, timeout_s=20)
    with held_elsewhere(table_lock.path, "short holder", 1.5) as process:
        started = time.monotonic()
        with table_lock.hold("waiter"):
            waited = time.monotonic() - started
            assert process.poll() is not None or process.wait(timeout=5) == 0
    assert 1.0 <= waited < 10, waited


def test_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    """kill -9 of the holder frees the lock at once (the kernel drops flock locks of a dead process):
    no stale lock file to clean up, no waiting for a lease to expire."""
    table_lock = lock(tmp_path, timeout_s=5)
    with held_elsewhere(table_lock.path, "doomed writer", 600) as process:
        assert table_lock.holder() is not None
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        started = time.monotonic()
        with table_lock.hold("survivor"):
            assert time.monotonic() - started < 1
            assert "survivor" in (table_lock.holder() or "")
    assert table_lock.holder() is None


def test_locks_of_different_tables_are_independent(tmp_path: Path) -> None:
    """Holding one table's lock elsewhere does not block a writer of another table."""
    bronze, silver = lock(tmp_path, 0.3, "bronze"), lock(tmp_path, 0.3, "silver")
    with held_elsewhere(bronze.path, "bronze writer", 30), silver.hold("silver writer"):
        assert silver.holder() is not None


def test_excludes_another_thread_of_the_same_process(tmp_path: Path) -> None:
    """Two threads of one process (e.g. two foreachBatch callbacks of one Spark driver) must not hold
    a table's lock at the same time."""
    table_lock = lock(tmp_path, timeout_s=0.5)
    release = threading.Event()
    holding = threading.Event()

    def first() -> None:
        with table_lock.hold("thread one"):
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert holding.wait(5)
        with pytest.raises(TableLockTimeoutError), table_lock.hold("thread two"):
            pass
    finally:
        release.set()
        thread.join(10)


def test_waiting_for_one_table_does_not_block_another_table(tmp_path: Path) -> None:
    """A thread waiting for gold's lock (held by a recompute in another process) must not stop another
    thread of the same driver from taking bronze's lock."""
    gold, bronze = lock(tmp_path, 3.0, "gold"), lock(tmp_path, 3.0, "bronze")
    with held_elsewhere(gold.path, "gold recompute", 30):

        def wait_for_gold() -> None:
            try:
                with gold.hold("gold stream"):
                    pass
            except TableLockTimeoutError:
                pass  # expected: the other process holds gold for longer than the timeout

        waiter = threading.Thread(target=wait_for_gold)
        waiter.start()
        try:
            time.sleep(0.3)  # the waiter is now inside gold's _acquire
            started = time.monotonic()
            with bronze.hold("bronze stream"):
                took = time.monotonic() - started
        finally:
            waiter.join(10)
    assert took < 1, f"bronze's lock took {took:.1f} s while another thread waited for gold's"
