"""One streaming job at a time starts its queries on a host: the start gate.

Starting a query on a Python data source makes Spark fork Python workers (source lookup, creation,
read planning, then the tasks' workers) that must connect back to the JVM within a fixed 10 s
(``PythonWorkerFactory``; not configurable). When several jobs start together on two cores (the
platform starts one per pipeline) they starve each other's workers past that window: measured with
five pipelines, 8-20 misses per job in their first minutes and no silver row within 600 s. Started
one after the other, each job's start has the host to itself, and its start-up workers are given
back (:mod:`tidewater.streaming.startup_workers`) before the next job forks its own.

A job takes the gate, an ``flock`` on ``<state_dir>/stream-start.lock``, before it starts its
queries, and gives it up once every query has read rows from each of its sources (the last start-up
work: its reads are planned), or after ``limit_s``, whichever comes first (a quiet source reads
nothing for a while). A job that has waited ``limit_s`` for the gate starts anyway: the gate orders
starts, it never keeps a stream from running. The kernel drops an ``flock`` with its process, so a
job killed with the gate held does not keep it. Only long-running jobs take it
(:meth:`tidewater.streaming.runner.PipelineStreams.run_forever`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO

from tidewater.lake.locks import stamp, try_flock

GATE_FILE = "stream-start.lock"


def gate_path(state_dir: str | Path) -> Path:
    return Path(state_dir).absolute() / GATE_FILE


class StartGate:
    """The host's start gate for one job (see the module's docstring); ``holder`` names the job in
    the file, so a waiting job can say whose start it waits for."""

    def __init__(self, path: Path, *, limit_s: float, holder: str) -> None:
        self.path = path
        self.limit_s = limit_s
        self.holder = holder
        self._handle: IO[str] | None = None
        self._waiting_since: float | None = None
        self._taken_at: float | None = None
        self.bypassed = False  # waited the limit and started without it
        self._announced = False

    @property
    def held(self) -> bool:
        return self._handle is not None

    def wait(self, seconds: float) -> bool:
        """Try to take the gate for up to ``seconds`` (a slice of the wait, so the caller can look at
        stop requests in between). True once the job may start its queries: it holds the gate, or it
        has waited ``limit_s`` in all."""
        if self.held or self.bypassed:
            return True
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        deadline = now + seconds
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held until release()
        while True:
            other = try_flock(handle)
            if other is None:
                stamp(handle, f"{self.holder} (pid {os.getpid()} on {socket.gethostname()})")
                self._handle, self._taken_at = handle, time.monotonic()
                if self._announced:  # it said it waits: say when that ended
                    waited = self._taken_at - self._waiting_since
                    print(f"tidewater: starting the queries after {waited:.1f} s at the start gate", flush=True)
                return True
            waited = time.monotonic() - self._waiting_since
            if waited >= self.limit_s:
                handle.close()
                self.bypassed = True
                print(
                    f"tidewater: waited {waited:.0f} s for {other or 'another job'} to start its queries; "
                    "starting without the start gate",
                    flush=True,
                )
                return True
            if not self._announced:
                print(
                    f"tidewater: waiting for {other or 'another job'} to start its queries (the start gate, "
                    f"{self.path}; at most {self.limit_s:.0f} s)",
                    flush=True,
                )
                self._announced = True
            if time.monotonic() >= deadline:
                handle.close()
                return False
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def overdue(self) -> bool:
        """Held for ``limit_s`` or longer."""
        return self._taken_at is not None and time.monotonic() - self._taken_at >= self.limit_s

    def release(self, why: str) -> None:
        if self._handle is None:
            return
        held = time.monotonic() - (self._taken_at or time.monotonic())
        print(f"tidewater: start gate passed on after {held:.1f} s: {why}", flush=True)
        stamp(self._handle, "")
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
