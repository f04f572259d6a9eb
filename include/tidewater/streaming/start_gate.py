"""One streaming job at a time starts its queries on a host: the start gate.

Starting a query on a Python data source makes Spark fork Python workers (source lookup, creation,
read planning, then the tasks' workers) that must connect back to the JVM within a fixed 10 s
(``PythonWorkerFactory``; not configurable). When several jobs start together on two cores (the
platform starts one per pipeline) they starve each other's workers past that window: measured with
five pipelines, 8-20 misses per job in their first minutes and no silver row within 600 s. Started
one after the other, each job's start has the host to itself, and its start-up workers are given
back (:mod:`tidewater.streaming.startup_workers`) before the next job forks its own.

A job takes the gate, an ``flock`` on ``<state_dir>/stream-start.lock``, before it starts its
queries, and passes it on once its start is over: every query has run a trigger and every query over
Kafka has read rows (so its Python workers are up), or after ``limit_s``, whichever comes first.
The kernel drops an ``flock`` with its process, so a killed job does not keep it.

A waiting job waits as long as the jobs ahead of it keep passing the gate on, since each holds it at
most ``limit_s``. Only a holder that keeps it past twice that (its own loop stuck) is skipped: the
waiting job then starts without the gate. Waiting jobs do not give up together at a fixed time,
which would start them all at once, the very thing the gate is for. A job has claimed its checkpoints
before it waits (its preflight), so it writes :data:`STATUS_FILE` beside its progress files: while it
waits, whom it waits for; once past the gate, when. The supervisor then shows it as starting rather
than as a stream without heartbeats, and counts its heartbeats from its passage
(:meth:`tidewater.orchestration.supervisor.StreamControl.health`).
Only long-running jobs take the gate (:meth:`tidewater.streaming.runner.PipelineStreams.run_forever`),
and only with ``TIDEWATER_STREAM_START_GATE_SECONDS`` above 0. It is off by default: on a slow day
the platform did not start any better with it (five pipelines, each job alone at the gate still had
its queries miss the window 2-25 times; Airflow and the generator kept the host busy).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from tidewater.json_files import write_json
from tidewater.lake.locks import stamp, try_flock

GATE_FILE = "stream-start.lock"
# In the job's progress folder: ``pid``, ``host`` and, while it waits, ``behind`` and ``since_unix``;
# once past the gate, ``passed_unix`` (tidewater.json_files.read_json reads it).
STATUS_FILE = "start-gate.json"


def gate_path(state_dir: str | Path) -> Path:
    return Path(state_dir).absolute() / GATE_FILE


class StartGate:
    """The host's start gate for one job (see the module's docstring). ``holder`` names the job in
    the gate file, so a waiting job can say whom it waits for; ``status_file`` is where it says that,
    and when it passed."""

    def __init__(self, path: Path, *, limit_s: float, holder: str, status_file: Path | None = None) -> None:
        self.path = path
        self.limit_s = limit_s
        self.holder = holder
        self.status_file = status_file
        self.bypassed = False  # skipped a holder stuck past twice the limit
        self._handle: IO[str] | None = None
        self._waiting_since: float | None = None
        self._taken_at: float | None = None
        self._ahead: str | None = None  # the holder it waits for, and since when
        self._ahead_since = 0.0

    @property
    def held(self) -> bool:
        return self._handle is not None

    def wait(self, seconds: float) -> bool:
        """Try to take the gate for up to ``seconds`` (a slice of the wait, so the caller can look at
        stop requests in between). True once the job may start its queries: it holds the gate, or
        the job ahead kept it past twice the limit."""
        if self.held or self.bypassed:
            return True
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        deadline = now + seconds
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held until release()
        while True:
            ahead = try_flock(handle)
            now = time.monotonic()
            if ahead is None:
                stamp(handle, f"{self.holder} (pid {os.getpid()} on {socket.gethostname()})")
                self._handle, self._taken_at = handle, now
                if self._ahead is not None:  # it said it waits: say when that ended
                    waited = now - self._waiting_since
                    print(f"tidewater: starting the queries after {waited:.1f} s at the start gate", flush=True)
                self._write_status(passed_unix=time.time())
                return True
            ahead = ahead or "another job"
            if ahead != self._ahead:
                self._ahead, self._ahead_since = ahead, now
                print(
                    f"tidewater: waiting for {ahead} to start its queries (the start gate {self.path}; each job "
                    f"holds it at most {self.limit_s:.0f} s)",
                    flush=True,
                )
                self._write_status(behind=ahead, since_unix=time.time())
            if now - self._ahead_since >= 2 * self.limit_s:
                handle.close()
                self.bypassed = True
                self._write_status(passed_unix=time.time())
                print(
                    f"tidewater: {ahead} has held the start gate for {now - self._ahead_since:.0f} s, more than "
                    f"twice its {self.limit_s:.0f} s; starting the queries without it",
                    flush=True,
                )
                return True
            if now >= deadline:
                handle.close()
                return False
            time.sleep(min(0.25, max(0.0, deadline - now)))

    def overdue(self) -> bool:
        """Held for ``limit_s`` or longer."""
        return self._taken_at is not None and time.monotonic() - self._taken_at >= self.limit_s

    def release(self, why: str) -> None:
        """Pass the gate on, if held."""
        if self._handle is None:
            return
        held = time.monotonic() - (self._taken_at or time.monotonic())
        print(f"tidewater: start gate passed on after {held:.1f} s: {why}", flush=True)
        stamp(self._handle, "")
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None

    def _write_status(self, **fields: Any) -> None:
        if self.status_file is not None:
            write_json(self.status_file, {"pid": os.getpid(), "host": socket.gethostname(), **fields})
