"""Fault injection for the chaos tests: crash the whole driver at a named point.

``TIDEWATER_FAULT_CRASH_AFTER_COMMIT=<query name>:<batch id>`` makes the driver kill itself with
SIGKILL right after that query committed that batch to Delta, i.e. between the Delta commit and
Spark's checkpoint commit: the window in which exactly-once is hardest to keep. Unset (the
default) it does nothing.

The commit may run in a Python worker that Spark put in a process group of its own, so the
target is named explicitly by ``TIDEWATER_DRIVER_PGID``: a process-group id, or ``session`` for
the session the job was started in (``launch_stream_job`` starts every job in a new session).
"""

from __future__ import annotations

import os
import signal

CRASH_AFTER_COMMIT = "TIDEWATER_FAULT_CRASH_AFTER_COMMIT"
# A published gold table: after its Kafka transaction committed (before Spark's checkpoint commit),
# and after its records were produced but before the transaction committed.
CRASH_AFTER_PUBLISH = "TIDEWATER_FAULT_CRASH_AFTER_PUBLISH"
CRASH_BEFORE_PUBLISH_COMMIT = "TIDEWATER_FAULT_CRASH_BEFORE_PUBLISH_COMMIT"
DRIVER_PGID = "TIDEWATER_DRIVER_PGID"


def after_commit(query: str, batch_id: int) -> None:
    _crash_if(CRASH_AFTER_COMMIT, query, batch_id)


def after_publish(query: str, batch_id: int) -> None:
    _crash_if(CRASH_AFTER_PUBLISH, query, batch_id)


def before_publish_commit(query: str, batch_id: int) -> None:
    _crash_if(CRASH_BEFORE_PUBLISH_COMMIT, query, batch_id)


def _crash_if(point: str, query: str, batch_id: int) -> None:
    if os.environ.get(point) != f"{query}:{batch_id}":
        return
    target = os.environ.get(DRIVER_PGID)
    if not target:
        raise RuntimeError(f"{point} is set but {DRIVER_PGID} is not: refusing to guess what to kill")
    os.killpg(os.getsid(0) if target == "session" else int(target), signal.SIGKILL)
