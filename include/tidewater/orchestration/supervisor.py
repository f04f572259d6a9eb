"""Keep each pipeline's streaming job running: start, watch, restart, stop. Airflow tasks call this.

The streaming job is a detached ``spark-submit`` (its own session), never a task that occupies a
worker slot forever. What says a driver is alive is the checkpoint lease it holds (an ``flock``
the kernel drops when the process dies, or a PostgreSQL advisory lock the server drops;
:mod:`tidewater.streaming.checkpoint`), not anything Airflow remembers: so a stream keeps running
while Airflow is down, and Airflow coming back sees the lease and starts no second copy (the driver
itself also refuses a held checkpoint).

**Stopping works wherever the driver runs.** :meth:`StreamControl.stop` first writes a stop request
beside the checkpoints (:mod:`tidewater.streaming.stop_request`), which the driver polls on any host
that shares the checkpoint storage: it stops its queries cleanly, releases its leases and exits 0.
Only if the leases are still held after the stop timeout are signals sent, and only to drivers on
this host (a lease names its holder's host); ``events.jsonl`` says how each stop ended
(``how``: ``request``, ``signal``, or ``unfinished`` when a driver elsewhere did not stop in time).

Per pipeline and namespace, ``<state_dir>/streams/<namespace>/<pipeline>/`` holds:

* ``desired.json``  "running" (default) or "stopped", set by the control DAG (a stopped stream is
  not restarted by the supervisor);
* ``driver.json``   the last launch: pid, time, where its output starts in the log, the queries'
  last batch ids at launch, whether it was stopped on purpose, and whether it was marked failed;
* ``health.json``   the last observation (what the supervising DAG also returns as XCom);
* ``events.jsonl``  every start, stop, restart, death (with the driver's one-line error and the
  queries' last batch ids), failure and resume, with its reason;
* ``driver.log``    the job's output (appended: each launch's part starts at its ``log_offset``).

Health comes from the heartbeat files the driver's StreamingQueryListener writes
(:mod:`tidewater.streaming.progress`): last batch time, input rate, lag per partition, state rows.
A launched driver is ``starting`` until it holds its checkpoints (for ``stream_startup_seconds`` at
most), and for as long as it waits at the host's start gate behind another job's start
(:mod:`tidewater.streaming.start_gate`); its heartbeats are due from its passage.

**In the stream host** (``TIDEWATER_STREAM_HOST``, the embedded default: :mod:`tidewater.streaming.host`)
a start asks the one job hosting every pipeline to start this pipeline's queries (launching the host
first when none runs), and a stop request stops this pipeline's queries alone: the host's process is
signalled only when the request goes unanswered, and its leftovers are reaped only once it is dead.
Leases, stop requests, heartbeats, the log and the crash-loop accounting stay per pipeline.

**Crash loops are bounded.** A stream that dies (or stalls) on every start, without committing a
batch in between, is restarted at most ``stream_max_restarts`` times within
:data:`CRASH_LOOP_WINDOW_SECONDS`; when it ends that way once more it is marked ``failed`` (see
:func:`crash_loop`, a pure function of ``events.jsonl``): no more restarts, the one-line error and
the number of attempts in ``health.json`` and ``events.jsonl``, and the supervising task fails with
that line on every run until someone resumes it (:meth:`StreamControl.resume`; a start or restart
requested by a person also clears it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.errors import ConfigError, TidewaterError
from tidewater.json_files import read_json, write_json
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import alive, group_members, kill_spark_leftovers, signal_group
from tidewater.streaming.checkpoint import lease_holder
from tidewater.streaming.progress import read_json_lines_tail, read_progress
from tidewater.streaming.start_gate import STATUS_FILE
from tidewater.streaming.stop_request import clear_request, read_request, write_request

RUNNING, STARTING, STALLED, DEAD, STOPPED, FAILED = "running", "starting", "stalled", "dead", "stopped", "failed"
_PID = re.compile(r"pid (\d+)")
_SINCE = re.compile(r"since (\S+)")
_HOST = re.compile(r"pid \d+ on ([^\s,()]+)")
_NO_ERROR = "no error reported (killed by a signal, or out of memory?)"

# Deaths further apart than this (first to last) are not one crash loop, however many there were.
CRASH_LOOP_WINDOW_SECONDS = 3600.0
ENDED = ("died", "stalled")  # events of a launch that ended without being asked to
RESETS = ("resume", "desired")  # a person decided: the attempts are counted again from zero
_EVENTS_TAIL_BYTES = 256 * 1024  # enough for hundreds of events; a crash loop needs the last few
# How a stop ended (the ``how`` of a ``stop`` event): the driver answered the stop request; signals to
# a driver on this host ended it; or the leases were still held when stop() gave up (a driver on
# another host that did not answer in time: the next supervision round asks again).
BY_REQUEST, BY_SIGNAL, UNFINISHED = "request", "signal", "unfinished"
SIGNAL_GRACE_SECONDS = 10.0  # after the request's timeout: SIGTERM, then SIGKILL this much later
EXIT_GRACE_SECONDS = 10.0  # a driver that released its leases may finish exiting before its JVM is reaped


class StreamIncidentError(TidewaterError):
    """The stream had died or stalled (it has been restarted); raised so the Airflow task shows red."""


class StreamFailedError(TidewaterError):
    """The stream is crash-looping: it is no longer restarted until someone resumes it."""


# ---- crash-loop detection (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class CrashLoop:
    """Launches in a row that ended (died or stalled) without committing a batch."""

    attempts: int
    first_at: str
    last_at: str
    errors: tuple[str, ...]  # each launch's one-line failure, oldest first

    @property
    def error(self) -> str:
        return self.errors[-1] if self.errors else _NO_ERROR

    def describe(self, max_restarts: int) -> str:
        """One line: how many starts, over how long, the error, and what the limit is."""
        span = _parse_at(self.last_at) - _parse_at(self.first_at)
        distinct = len(set(self.errors))
        how = "the same way each time" if distinct <= 1 else f"{distinct} different ways, last"
        return (
            f"crash loop: {self.attempts} starts in a row ended within {_duration(span)} without committing a "
            f"batch (TIDEWATER_STREAM_MAX_RESTARTS={max_restarts}), {how}: {self.error}"
        )


def failed_attempts(
    events: Iterable[Mapping[str, Any]], *, window_s: float = CRASH_LOOP_WINDOW_SECONDS
) -> list[Mapping[str, Any]]:
    """The most recent launches that ended in a row without progress, oldest first.

    ``events`` is a stream's ``events.jsonl`` history in order. A launch ended when a ``died`` or
    ``stalled`` event records it; each ``start``, ``died`` and ``stalled`` event carries ``batches``,
    the queries' last committed batch ids when it happened (from the progress files). Progress is a
    batch id that changed since the previous snapshot: it ends the streak, as does a person's decision
    (``resume``, or ``desired``: a start, stop or restart requested by hand). Only ends within
    ``window_s`` of the last one count.
    """
    streak: list[Mapping[str, Any]] = []
    seen: dict[str, Any] = {}
    for event in events:
        kind = event.get("event")
        batches = event.get("batches")
        batches = batches if isinstance(batches, Mapping) else None
        if kind in RESETS or (batches is not None and _advanced(seen, batches)):
            streak = []
        elif kind in ENDED:
            streak.append(event)
        if batches:
            seen.update({query: batch for query, batch in batches.items() if batch is not None})
    if not streak:
        return []
    last = _parse_at(streak[-1].get("at"))
    return [e for e in streak if (last - _parse_at(e.get("at"))).total_seconds() <= window_s]


def crash_loop(
    events: Iterable[Mapping[str, Any]], *, max_restarts: int, window_s: float = CRASH_LOOP_WINDOW_SECONDS
) -> CrashLoop | None:
    """A :class:`CrashLoop` when more than ``max_restarts`` launches in a row (the first start and
    ``max_restarts`` restarts) ended without committing a batch within ``window_s``; else None."""
    if max_restarts < 0:
        raise ConfigError(f"TIDEWATER_STREAM_MAX_RESTARTS={max_restarts} must be 0 or more")
    ends = failed_attempts(events, window_s=window_s)
    if len(ends) <= max_restarts:
        return None
    return CrashLoop(
        attempts=len(ends),
        first_at=str(ends[0].get("at")),
        last_at=str(ends[-1].get("at")),
        errors=tuple(str(e.get("error") or _NO_ERROR) for e in ends),
    )


def needs_round(health: StreamHealth) -> str | None:
    """Why a supervision round would act on this observation, or None when it would leave the stream
    as it is: the watch in the triggerer (:mod:`tidewater.orchestration.watch`) wakes a worker only
    for these. It mirrors :meth:`StreamControl._supervise`; a failed stream waits for a person."""
    if health.desired == STOPPED:
        if health.state in (RUNNING, STARTING, STALLED):
            return f"{health.state} but wanted stopped"
        return None
    if health.state in (DEAD, STALLED):
        return f"{health.state}: {health.detail}"
    if health.state == STOPPED:
        return f"wanted running but {health.detail or 'stopped'}"
    return None


def _advanced(seen: Mapping[str, Any], batches: Mapping[str, Any]) -> bool:
    return any(batch is not None and batch != seen.get(query) for query, batch in batches.items())


def _parse_at(value: Any) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _duration(span: dt.timedelta) -> str:
    seconds = max(0, round(span.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds / 60:.0f} min"


@dataclass(frozen=True)
class StreamHealth:
    pipeline: str
    namespace: str
    state: str  # running | starting | stalled | dead | stopped | failed
    desired: str
    pid: int | None
    detail: str
    heartbeat_age_s: float | None = None
    queries: dict[str, dict[str, Any]] = field(default_factory=dict)
    checked_at: str = ""
    error: str = ""  # dead or failed: the driver's last one-line error
    attempts: int = 0  # failed: the starts in a row that ended without committing a batch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.namespace}/{self.pipeline}: {self.state}"]
        if self.pid:
            parts.append(f"pid {self.pid}")
        for name, q in self.queries.items():
            lag = sum(q.get("lag", {}).values())
            parts.append(
                f"{name} batch {q.get('batch_id')} in {q.get('input_rows_per_second', 0):.0f}/s lag {lag}"
                f" state {q.get('state_rows', 0)}" + _state_size(q)
            )
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)


class StreamControl:
    """Start, observe, supervise and stop one pipeline's streaming job."""

    def __init__(self, settings: Settings, pipeline: str, namespace: str | None = None) -> None:
        self.settings = settings
        self.pipeline = get_pipeline(pipeline)
        self.layout = PipelineLayout.of(settings, self.pipeline, namespace)
        self.dir = Path(settings.state_dir).absolute() / "streams" / self.layout.namespace / self.pipeline.name

    # ---- recorded state ---------------------------------------------------------------------------

    @property
    def queries(self) -> list[str]:
        tiers = ("bronze", "silver") if self.settings.silver_query else ("bronze",)
        names = [self.pipeline.query_of(source, tier) for source in self.pipeline.sources for tier in tiers]
        return names + [query.name for query in self.layout.gold_queries]

    def desired(self) -> str:
        return str(read_json(self.dir / "desired.json").get("state", RUNNING))

    def set_desired(self, state: str, *, by: str) -> None:
        if state not in (RUNNING, STOPPED):
            raise ValueError(state)
        write_json(self.dir / "desired.json", {"state": state, "by": by, "at": _now()})
        self._event("desired", state=state, by=by)

    def driver(self) -> dict[str, Any]:
        return read_json(self.dir / "driver.json")

    @property
    def log_path(self) -> Path:
        return self.dir / "driver.log"

    def _event(self, kind: str, **fields: Any) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "events.jsonl", "a") as out:
            out.write(json.dumps({"at": _now(), "event": kind, **fields}) + "\n")

    def events(self) -> list[dict[str, Any]]:
        """The recent history of ``events.jsonl``, oldest first (its last 256 KB: hundreds of events)."""
        return read_json_lines_tail(self.dir / "events.jsonl", _EVENTS_TAIL_BYTES)

    def batches(self) -> dict[str, Any]:
        """Each query's last committed batch id, from its progress file (None before its first batch)."""
        return {
            q: (read_progress(self.layout.progress_dir() / f"{q}.json") or {}).get("batch_id") for q in self.queries
        }

    def changed_since(self, since: dt.datetime) -> list[dict[str, Any]]:
        """The events recorded after ``since`` (a start, stop, death, resume, ...); cheap when there
        are none (one stat). The watch ends a supervision run on them, so every task of the run ends.
        Events carry whole seconds: one in ``since``'s own second counts (at worst one short run more)."""
        since = since.replace(microsecond=0)
        path = self.dir / "events.jsonl"
        try:
            if path.stat().st_mtime < since.timestamp():
                return []
        except FileNotFoundError:
            return []
        return [e for e in self.events() if _parse_at(e.get("at")) >= since]

    def crash_loop(self) -> CrashLoop | None:
        return crash_loop(self.events(), max_restarts=self.settings.stream_max_restarts)

    # ---- observation ------------------------------------------------------------------------------

    def leases(self) -> dict[str, tuple[int, float] | None]:
        """Query -> (pid, unix time claimed) of the driver holding its checkpoint lease, None if free."""
        return {query: None if held is None else held[:2] for query, held in self.lease_holders().items()}

    def lease_holders(self) -> dict[str, tuple[int, float, str] | None]:
        """Query -> (pid, unix time claimed, host) of the driver holding its checkpoint lease, None if
        free (pid -1 and host "" when the holder did not say)."""
        out: dict[str, tuple[int, float, str] | None] = {}
        for query in self.queries:
            holder = lease_holder(self.layout.checkpoint(query), self.layout.checkpoint_lease(query))
            out[query] = None if holder is None else parse_holder(holder)
        return out

    def lease_pids(self) -> set[int]:
        """The pids of the drivers holding leases, wherever they run (see :meth:`local_lease_pids`)."""
        return {held[0] for held in self.leases().values() if held is not None}

    def local_lease_pids(self) -> set[int]:
        """The pids of lease holders running on this host: the only ones a signal can reach."""
        here = socket.gethostname()
        return {held[0] for held in self.lease_holders().values() if held and held[0] > 0 and held[2] == here}

    def health(self) -> StreamHealth:
        desired = self.desired()
        driver = self.driver()
        leases = self.leases()
        holders = {held[0] for held in leases.values() if held is not None}
        progress = {q: read_progress(self.layout.progress_dir() / f"{q}.json") or {} for q in self.queries}
        now = time.time()
        # Progress written by the driver holding the lease now (not by an earlier one).
        fresh = {q for q, held in leases.items() if held and progress[q].get("pid") == held[0]}

        def make(
            state: str, pid: int | None, detail: str, age: float | None = None, *, error: str = "", attempts: int = 0
        ) -> StreamHealth:
            return StreamHealth(
                pipeline=self.pipeline.name,
                namespace=self.layout.namespace,
                state=state,
                desired=desired,
                pid=pid,
                detail=detail,
                heartbeat_age_s=None if age is None else round(age, 1),
                queries={q: _query_view(p) for q, p in progress.items() if p and q in fresh},
                checked_at=_now(),
                error=error,
                attempts=attempts,
            )

        if holders:
            pid = max(holders)
            started = min(held[1] for held in leases.values() if held is not None)
            # A driver claims its checkpoints, then may wait at the host's start gate for another job's
            # start (tidewater.streaming.start_gate): starting meanwhile, its heartbeats due from its passage.
            gate = read_json(self.layout.progress_dir() / STATUS_FILE)
            if gate.get("pid") in holders and float(gate.get("passed_unix") or gate.get("since_unix") or 0) >= started:
                if "passed_unix" not in gate:
                    waited = now - float(gate["since_unix"])
                    return make(STARTING, pid, f"waiting at the start gate for {gate.get('behind')} ({waited:.0f} s)")
                started = max(started, float(gate["passed_unix"]))
            missing = [q for q, held in leases.items() if held is None]
            ages = {}
            for query in self.queries:
                beat = self.layout.progress_dir() / f"{query}.json"
                ages[query] = now - max(beat.stat().st_mtime if beat.exists() else 0.0, started)
            oldest = max(ages.values())
            if missing and now - started > self.settings.stream_startup_seconds:
                return make(STALLED, pid, f"queries {missing} hold no checkpoint lease", oldest)
            if oldest > self.settings.stream_stall_seconds:
                stale = [q for q, age in ages.items() if age > self.settings.stream_stall_seconds]
                return make(STALLED, pid, f"no heartbeat from {stale} for {oldest:.0f} s", oldest)
            return make(RUNNING, pid, "", oldest)
        pid = driver.get("pid")
        # A launch on another host (shared state) cannot be checked by pid here: within the start-up
        # time it is taken to be starting, rather than launching a second driver beside it.
        launched_here = driver.get("host", socket.gethostname()) == socket.gethostname()
        if (
            pid
            and (alive(int(pid)) if launched_here else not driver.get("stopped_on_purpose"))
            and now - float(driver.get("launched_unix", 0)) < self.settings.stream_startup_seconds
            and (not driver.get("hosted") or self._host_starting())
        ):
            where = "" if launched_here else f" on {driver.get('host')}"
            return make(STARTING, int(pid), f"launched{where}, not yet holding its checkpoints")
        if desired == STOPPED:
            return make(STOPPED, None, "stopped on request" if driver else "never started")
        failed = driver.get("failed")
        if isinstance(failed, dict):  # crash-looping: not restarted until resumed
            return make(
                FAILED,
                None,
                str(failed.get("detail", "")),
                error=str(failed.get("error", "")),
                attempts=int(failed.get("attempts", 0)),
            )
        if driver.get("stopped_on_purpose") or not driver or self._stop_requested_since(driver):
            return make(STOPPED, None, "stopped on request" if driver else "never started")
        error = _last_error(self.log_path, int(driver.get("log_offset", 0)))
        return make(DEAD, None, f"driver exited: {error}", error=error)

    def _host_is_up(self, launched: int) -> bool:
        """Does the stream host launched as ``launched`` hold its lease (its driver is alive)?"""
        from tidewater.streaming.host_requests import HostFiles

        holder = HostFiles(self.settings.state_dir, self.layout.namespace).holder_pid()
        return holder is not None and _pgid(holder) == launched

    def _host_starting(self) -> bool:
        """In the stream host: is this pipeline's start request still pending, or its leases held since
        the leases were read (the host claims them before it takes the request)? Otherwise the host has
        taken the request and the pipeline holds nothing: it failed to start (its log says why)."""
        from tidewater.streaming.host_requests import HostFiles

        files = HostFiles(self.settings.state_dir, self.layout.namespace)
        return any(r.pipeline == self.pipeline.name for r in files.pending()) or bool(self.lease_pids())

    # ---- actions ----------------------------------------------------------------------------------

    def start(self, *, reason: str) -> StreamHealth:
        """Launch the streaming job unless a driver already holds (or is about to hold) the checkpoints."""
        from tidewater.streaming.jobs import launch_stream_job

        current = self.health()
        if current.state in (RUNNING, STARTING, STALLED):
            return current
        self.dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        batches = self.batches()
        # The launch time goes to the driver: a stop request older than it is the last driver's and is
        # ignored. The last one is also removed (a request written from now on is for this launch).
        launched = time.time()
        clear_request(self.layout.stop_request())
        if self.settings.stream_host:
            pid = self._start_in_host(launched, reason)
        else:
            pid = launch_stream_job(
                self.settings,
                self.pipeline.name,
                self.log_path,
                extra_args=["--namespace", self.layout.namespace, "--launched-at", f"{launched:.3f}"],
            ).pid
        write_json(
            self.dir / "driver.json",
            {
                "pid": pid,
                "hosted": self.settings.stream_host,
                "host": socket.gethostname(),
                "launched_unix": launched,
                "launched_at": _now(),
                "reason": reason,
                "log_offset": offset,
                "batches": batches,
            },
        )
        self._event("start", pid=pid, reason=reason, batches=batches)
        return self.health()

    def _start_in_host(self, launched: float, reason: str) -> int:
        """Ask the stream host to start this pipeline (:mod:`tidewater.streaming.host`), launching the
        host first if none runs or is starting; the host's pid."""
        from tidewater.streaming.host_requests import HostFiles, StartRequest
        from tidewater.streaming.jobs import launch_stream_host

        files = HostFiles(self.settings.state_dir, self.layout.namespace)
        with files.launch_lock():
            pid = files.running_pid(startup_s=self.settings.stream_startup_seconds)
            if pid is None:
                pid = launch_stream_host(self.settings, self.layout.namespace, files.log_path).pid
                files.record_launch(pid, now=launched)
                self._event("host", pid=pid, log=str(files.log_path))
            files.request_start(StartRequest(self.pipeline.name, launched, reason, str(self.log_path)))
        return pid

    def resume(self, *, by: str) -> StreamHealth:
        """Clear a crash loop's ``failed`` state (the attempts count again from zero) and start the
        stream; refused in one line when the stream is not failed."""
        current = self.health()
        if current.state != FAILED:
            raise ConfigError(
                f"stream {self.layout.namespace}/{self.pipeline.name} is {current.state}, not failed: nothing to "
                "resume (use action start or restart)"
            )
        driver = self.driver()
        write_json(self.dir / "driver.json", {k: v for k, v in driver.items() if k != "failed"})
        self._event("resume", by=by, attempts=current.attempts, error=current.error)
        self.set_desired(RUNNING, by=by)
        return self.start(reason=f"resume requested by {by} (after {current.attempts} failed starts)")

    def stop(
        self, *, reason: str, timeout_s: float | None = None, by: str | None = None, signals: bool = True
    ) -> StreamHealth:
        """Stop the streaming job wherever its driver runs; returns within ``timeout_s`` + about 25 s.

        1. Write a stop request beside the checkpoints (:mod:`tidewater.streaming.stop_request`) and wait
           up to ``timeout_s`` for the leases to be free: the driver, on any host, polls the request,
           stops its queries cleanly, releases its leases and exits 0. A driver still starting (launched
           but not yet holding its checkpoints) finds the request when it gets to its loop.
        2. Only if the leases are still held then: SIGTERM the drivers on this host, SIGKILL their
           process groups :data:`SIGNAL_GRACE_SECONDS` later. A driver on another host cannot be
           signalled: the stop is recorded ``unfinished`` (a later supervision round asks again).
        3. A local job that answered gets :data:`EXIT_GRACE_SECONDS` to exit by itself; what is left of
           its process group then (its JVM) is SIGKILLed.

        ``signals=False`` sends no signal at all, as if every driver ran elsewhere. ``by`` is who asks (the
        driver logs ``stop requested by <by>: <reason>``). The ``stop`` event in ``events.jsonl`` records
        ``how`` it ended (``request``, ``signal`` or ``unfinished``) and ``forced`` (not by request).
        """
        timeout = self.settings.stream_stop_timeout_seconds if timeout_s is None else timeout_s
        driver = self.driver()
        if driver:
            write_json(self.dir / "driver.json", {**driver, "stopped_on_purpose": True})
        request = write_request(self.layout.stop_request(), by=by or _requester(), reason=reason)
        # In the stream host (tidewater.streaming.host) the request stops this pipeline's queries alone:
        # the host's process is not this pipeline's to wait for or end, unless the request goes unanswered.
        hosted = bool(driver.get("hosted"))
        if hosted:
            from tidewater.streaming.host_requests import HostFiles

            HostFiles(self.settings.state_dir, self.layout.namespace).withdraw(self.pipeline.name)
        holders = sorted({(held[0], held[2]) for held in self.lease_holders().values() if held is not None})
        here = socket.gethostname()
        local = {pid for pid, host in holders if pid > 0 and host == here}
        # The launched spark-submit, when it was launched on this host (a record without a host predates
        # hosts: it was). Before the driver holds its checkpoints, its end is what the stop waits for.
        launched = int(driver["pid"]) if driver.get("pid") and driver.get("host", here) == here else None
        launched = launched if launched is not None and not hosted and alive(launched) else None
        if not holders and launched is None:
            return self.health()  # nothing runs (a driver starting elsewhere will find the request)
        own_group = os.getpgid(0)
        groups = {g for g in (_pgid(p) for p in {*local, launched} if p) if g is not None and g != own_group}

        def running() -> bool:
            return bool(self.lease_pids()) or (launched is not None and not holders and alive(launched))

        deadline = time.monotonic() + timeout
        while running() and time.monotonic() < deadline:
            time.sleep(0.5)
        answered = not running()
        signalled = not answered and signals and (bool(local) or launched is not None)
        if signalled:
            for pid in local or {launched}:
                _kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + min(SIGNAL_GRACE_SECONDS, max(timeout, 1.0))
            while running() and time.monotonic() < deadline:
                time.sleep(0.5)
        elif answered and hosted:
            groups = set()  # the host runs on, with the other pipelines
        elif answered and groups:
            deadline = time.monotonic() + EXIT_GRACE_SECONDS  # let a local job finish exiting by itself
            while any(group_members(g) for g in groups) and time.monotonic() < deadline:
                time.sleep(0.2)
        if signals:
            for group in groups:  # the JVM and workers of the job, also after a clean driver exit
                signal_group(group, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and (running() or any(group_members(g) for g in groups)):
                time.sleep(0.2)
        how = BY_REQUEST if answered else (UNFINISHED if running() else BY_SIGNAL)
        self._event(
            "stop",
            pids=sorted(local),
            holders=[f"pid {pid} on {host or 'an unknown host'}" for pid, host in holders],
            reason=reason,
            by=request.by,
            request=request.id,
            how=how,
            forced=how != BY_REQUEST,
        )
        return self.health()

    def _stop_requested_since(self, driver: Mapping[str, Any]) -> bool:
        """Was a stop requested after the last launch (by any supervisor, on any host)?"""
        request = read_request(self.layout.stop_request())
        launched = driver.get("launched_unix")
        return request is not None and isinstance(launched, int | float) and request.requested_at >= launched

    def reap_leftovers(self) -> list[int]:
        """SIGKILL what is left of the last launched job's process group (a JVM whose Python driver was
        killed keeps running). Only processes of that group that are Spark processes are touched."""
        driver = self.driver()
        launched = driver.get("pid")
        if not launched or (driver.get("hosted") and self._host_is_up(int(launched))):
            return []  # a live stream host runs other pipelines
        victims = kill_spark_leftovers(int(launched))
        if victims:
            self._event("reap", pids=victims)
        return victims

    def observe(self) -> StreamHealth:
        """Look without acting (the watch's poll): ``health.json`` is the last observation either way."""
        health = self.health()
        write_json(self.dir / "health.json", {**health.to_dict(), "action": "none (watching)"})
        return health

    def supervise(self) -> tuple[str, StreamHealth]:
        """One supervision round: returns (action taken, health after it), also written to ``health.json``."""
        health = self.health()
        write_json(self.dir / "health.json", health.to_dict())
        action, after = self._supervise(health)
        write_json(self.dir / "health.json", {**after.to_dict(), "action": action})
        return action, after

    def _supervise(self, health: StreamHealth) -> tuple[str, StreamHealth]:
        if health.desired == STOPPED:
            if health.state in (RUNNING, STARTING, STALLED):
                return "stopped (desired state is stopped)", self.stop(reason="desired state is stopped")
            return "none (stopped on request)", health
        if health.state in (RUNNING, STARTING):
            return "none", health
        if health.state == FAILED:
            return "none (failed: not restarted until resumed)", health
        if health.state in (STALLED, DEAD):
            pid = self.driver().get("pid")
            if health.state == STALLED:
                self.stop(reason=f"stalled: {health.detail}")
                self._event("stalled", pid=pid, error=f"stalled: {health.detail}", batches=self.batches())
            else:
                self.reap_leftovers()
                self._event("died", pid=pid, error=health.error, batches=self.batches())
            loop = self.crash_loop()
            if loop is not None:
                return f"failed ({loop.attempts} starts in a row ended without a batch)", self._fail(loop)
            attempts = len(failed_attempts(self.events()))
            allowed = self.settings.stream_max_restarts
            count = (
                f"{attempts} of {allowed + 1} failed starts allowed in a row"
                if attempts
                else "it had committed batches"
            )
            what = "stalled" if health.state == STALLED else "died"
            after = self.start(reason=f"restart after {'stall' if what == 'stalled' else 'crash'}: {health.detail}")
            return f"restarted ({what}: {health.detail}; {count})", after
        after = self.start(reason="desired state is running")
        return "started", after

    def _fail(self, loop: CrashLoop) -> StreamHealth:
        """Mark the stream failed (no more restarts) with the crash loop's one line."""
        detail = (
            f"{loop.describe(self.settings.stream_max_restarts)}; not restarted until the cause is fixed and "
            "tidewater_stream_control runs with action=resume"
        )
        record = {
            "at": _now(),
            "attempts": loop.attempts,
            "error": loop.error,
            "detail": detail,
            "first_at": loop.first_at,
            "max_restarts": self.settings.stream_max_restarts,
        }
        write_json(self.dir / "driver.json", {**self.driver(), "failed": record})
        self._event("failed", attempts=loop.attempts, error=loop.error, detail=detail)
        return self.health()


def _state_size(query: dict[str, Any]) -> str:
    """`` (3.2 MiB, commit 40 ms)`` for a query that keeps state, else nothing."""
    size = max(int(query.get("state_memory_bytes") or 0), int(query.get("state_files_bytes") or 0))
    if not size:
        return ""
    return f" ({size / 2**20:.1f} MiB, commit {int(query.get('state_commit_ms') or 0)} ms)"


def _query_view(progress: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "batch_id",
        "batch_time",
        "input_rows_per_second",
        "processed_rows_per_second",
        "lag",
        "retained",
        "state_rows",
        "state_memory_bytes",
        "state_files_bytes",
        "state_commit_ms",
        "watermark",
        "rows_dropped_by_watermark_total",
    )
    return {k: progress.get(k) for k in keys}


def _last_error(log_path: Path, offset: int = 0) -> str:
    """The last one-line error the driver printed after ``offset`` (its launch's part of the log)."""
    from tidewater.streaming.jobs import last_error_line

    line = last_error_line(log_path)
    if offset <= 0 or line == "no log":
        return line
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            tail = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "no log"
    return line if f"tidewater: {line}" in tail else _NO_ERROR


def parse_holder(holder: str) -> tuple[int, float, str]:
    """(pid, unix time claimed, host) from what a lease holder recorded (``pid 12 on host-a since
    2026-01-02T03:04:05+00:00``, with the PostgreSQL backend followed by its own bookkeeping); pid -1,
    time 0 and host "" for what it did not say."""
    pid, since, host = _PID.search(holder), _SINCE.search(holder), _HOST.search(holder)
    try:
        claimed = dt.datetime.fromisoformat(since.group(1)).timestamp() if since else 0.0
    except ValueError:
        claimed = 0.0
    return (int(pid.group(1)) if pid else -1, claimed, host.group(1) if host else "")


def _requester() -> str:
    return f"supervisor on {socket.gethostname()} (pid {os.getpid()})"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
