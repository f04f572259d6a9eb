"""Fault injection for the chaos tests: crash the whole driver at a named point.

``TIDEWATER_FAULT_CRASH_AFTER_COMMIT=<query>:<batch id>`` makes the driver kill its own process
group with SIGKILL right after that query committed that batch to Delta, i.e. between the Delta
commit and Spark's checkpoint commit: the window in which exactly-once is hardest to keep.
Unset (the default) it does nothing.
"""

from __future__ import annotations

import os
import signal

CRASH_AFTER_COMMIT = "TIDEWATER_FAULT_CRASH_AFTER_COMMIT"
DRIVER_PGID = "TIDEWATER_DRIVER_PGID"


def after_commit(query: str, batch_id: int) -> None:
    if os.environ.get(CRASH_AFTER_COMMIT) != f"{query}:{batch_id}":
        return
    pgid = int(os.environ.get(DRIVER_PGID, os.getpgrp()))
    os.killpg(pgid, signal.SIGKILL)
