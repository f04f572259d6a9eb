"""Keep each pipeline's streaming job running: start, watch, restart, stop. Airflow tasks call this.

The streaming job is a detached ``spark-submit`` (its own session), never a task that occupies a
worker slot forever. What says a driver is alive is the checkpoint lease it holds (an ``flock``
the kernel drops when the process dies; :mod:`tidewater.streaming.checkpoint`), not anything
Airflow remembers: so a stream keeps running while Airflow is down, and Airflow coming back sees
the lease and starts no second copy (the driver itself also refuses a held checkpoint).

Per pipeline and namespace, ``<state_dir>/streams/<namespace>/<pipeline>/`` holds:

* ``desired.json``  "running" (default) or "stopped", set by the control DAG (a stopped stream is
  not restarted by the supervisor);
* ``driver.json``   the last launch: pid, time, log file, and whether it was stopped on purpose;
* ``health.json``   the last observation (what the supervising DAG also returns as XCom);
* ``events.jsonl``  every start, stop and restart with its reason;
* ``driver.log``    the job's output.

Health comes from the heartbeat files the driver's StreamingQueryListener writes
(:mod:`tidewater.streaming.progress`): last batch time, input rate, lag per partition, state rows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.errors import TidewaterError
from tidewater.lake.layout import PipelineLayout
from tidewater.pipelines import get_pipeline
from tidewater.streaming.checkpoint import lease_holder
from tidewater.streaming.progress import read_progress

RUNNING, STARTING, STALLED, DEAD, STOPPED = "running", "starting", "stalled", "dead", "stopped"
_PID = re.compile(r"pid (\d+)")
_SINCE = re.compile(r"since (\S+)")


class StreamIncidentError(TidewaterError):
    """The stream had died or stalled (it has been restarted); raised so the Airflow task shows red."""


@dataclass(frozen=True)
class StreamHealth:
    pipeline: str
    namespace: str
    state: str  # running | starting | stalled | dead | stopped
    desired: str
    pid: int | None
    detail: str
    heartbeat_age_s: float | None = None
    queries: dict[str, dict[str, Any]] = field(default_factory=dict)
    checked_at: str = ""

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
                f" state {q.get('state_rows', 0)}"
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
        names = ["bronze"]
        if self.settings.silver_query:
            names.append("silver")
        return names + [f"gold_{g.name}" for g in self.pipeline.gold]

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

    # ---- observation ------------------------------------------------------------------------------

    def leases(self) -> dict[str, tuple[int, float] | None]:
        """Query -> (pid, unix time claimed) of the driver holding its checkpoint lease, None if free."""
        out: dict[str, tuple[int, float] | None] = {}
        for query in self.queries:
            holder = lease_holder(self.layout.checkpoint(query))
            if holder is None:
                out[query] = None
                continue
            pid, since = _PID.search(holder), _SINCE.search(holder)
            claimed = dt.datetime.fromisoformat(since.group(1)).timestamp() if since else 0.0
            out[query] = (int(pid.group(1)) if pid else -1, claimed)
        return out

    def lease_pids(self) -> set[int]:
        return {held[0] for held in self.leases().values() if held is not None}

    def health(self) -> StreamHealth:
        desired = self.desired()
        driver = self.driver()
        leases = self.leases()
        holders = {held[0] for held in leases.values() if held is not None}
        progress = {q: read_progress(self.layout.progress_dir() / f"{q}.json") or {} for q in self.queries}
        now = time.time()
        # Progress written by the driver holding the lease now (not by an earlier one).
        fresh = {q for q, held in leases.items() if held and progress[q].get("pid") == held[0]}

        def make(state: str, pid: int | None, detail: str, age: float | None = None) -> StreamHealth:
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
            )

        if holders:
            pid = max(holders)
            started = min(held[1] for held in leases.values() if held is not None)
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
        if (
            pid
            and alive(int(pid))
            and now - float(driver.get("launched_unix", 0)) < self.settings.stream_startup_seconds
        ):
            return make(STARTING, int(pid), "launched, not yet holding its checkpoints")
        if desired == STOPPED or driver.get("stopped_on_purpose") or not driver:
            return make(STOPPED, None, "stopped on request" if driver else "never started")
        return make(DEAD, None, f"driver exited: {_last_error(self.log_path)}")

    # ---- actions ----------------------------------------------------------------------------------

    def start(self, *, reason: str) -> StreamHealth:
        """Launch the streaming job unless a driver already holds (or is about to hold) the checkpoints."""
        from tidewater.cli import launch_stream_job

        current = self.health()
        if current.state in (RUNNING, STARTING, STALLED):
            return current
        self.dir.mkdir(parents=True, exist_ok=True)
        process = launch_stream_job(
            self.settings, self.pipeline.name, self.log_path, extra_args=["--namespace", self.layout.namespace]
        )
        write_json(
            self.dir / "driver.json",
            {"pid": process.pid, "launched_unix": time.time(), "launched_at": _now(), "reason": reason},
        )
        self._event("start", pid=process.pid, reason=reason)
        return self.health()

    def stop(self, *, reason: str, timeout_s: float | None = None) -> StreamHealth:
        """Ask the driver to stop (SIGTERM: it stops its queries cleanly), SIGKILL its process group
        if it has not released its checkpoints within ``timeout_s``. Bounded: returns within
        ``timeout_s`` + a few seconds."""
        timeout = self.settings.stream_stop_timeout_seconds if timeout_s is None else timeout_s
        driver = self.driver()
        if driver:
            write_json(self.dir / "driver.json", {**driver, "stopped_on_purpose": True})
        # SIGTERM the Python driver (it stops its queries cleanly, then its JVM ends); before it holds
        # its checkpoints, the launched spark-submit itself.
        pids = {pid for pid in self.lease_pids() if pid > 0}
        launched = int(driver["pid"]) if driver.get("pid") and alive(int(driver["pid"])) else None
        if not pids and launched is None:
            return self.health()
        groups = {g for g in (_pgid(p) for p in {*pids, launched} if p) if g is not None and g != os.getpgid(0)}
        for pid in pids or {launched}:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.lease_pids() or (launched and alive(launched) and not pids)):
            time.sleep(0.5)
        forced = bool(self.lease_pids())
        for group in groups:  # the JVM and workers of the job, also after a clean driver exit
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self._event("stop", pids=sorted(pids), reason=reason, forced=forced)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (self.lease_pids() or any(group_members(g) for g in groups)):
            time.sleep(0.2)
        return self.health()

    def reap_leftovers(self) -> list[int]:
        """SIGKILL what is left of the last launched job's process group (a JVM whose Python driver was
        killed keeps running). Only processes of that group that are Spark processes are touched."""
        launched = self.driver().get("pid")
        if not launched:
            return []
        victims = [pid for pid, cmd in group_members(int(launched)) if "spark" in cmd.lower()]
        for pid in victims:
            _kill(pid, signal.SIGKILL)
        if victims:
            self._event("reap", pids=victims)
        return victims

    def supervise(self) -> tuple[str, StreamHealth]:
        """One supervision round: returns (action taken, health after it)."""
        health = self.health()
        write_json(self.dir / "health.json", health.to_dict())
        if health.desired == STOPPED:
            if health.state in (RUNNING, STARTING, STALLED):
                return "stopped (desired state is stopped)", self.stop(reason="desired state is stopped")
            return "none (stopped on request)", health
        if health.state in (RUNNING, STARTING):
            return "none", health
        if health.state == STALLED:
            self.stop(reason=f"stalled: {health.detail}")
            after = self.start(reason=f"restart after stall: {health.detail}")
            return f"restarted (stalled: {health.detail})", after
        if health.state == DEAD:
            self.reap_leftovers()
            after = self.start(reason=f"restart after crash: {health.detail}")
            return f"restarted (died: {health.detail})", after
        after = self.start(reason="desired state is running")
        return "started", after


def _query_view(progress: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "batch_id",
        "batch_time",
        "input_rows_per_second",
        "processed_rows_per_second",
        "lag",
        "state_rows",
        "watermark",
        "rows_dropped_by_watermark_total",
    )
    return {k: progress.get(k) for k in keys}


def _last_error(log_path: Path) -> str:
    from tidewater.cli import last_error_line

    return last_error_line(log_path)


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (not a zombie)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes in process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        members.append((int(entry.name), cmd))
    return members


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when missing or unreadable."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Replace a JSON file atomically (readers never see half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str))
    tmp.replace(path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
