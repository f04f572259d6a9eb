"""How supervisors and the stream host talk: files under ``<state_dir>/streams/<namespace>/_host/``.

With ``TIDEWATER_STREAM_HOST=true`` one streaming job (the *host*: one JVM, one set of Python
workers) runs the queries of every supervised pipeline, instead of a job per pipeline
(:mod:`tidewater.streaming.host`). Each pipeline keeps its own supervisor, checkpoints, leases,
stop requests, log and health; what changes is how a supervisor starts a pipeline:

* ``start/<pipeline>.json``: a **start request** (when, why, the pipeline's log). A supervisor writes
  it; the host starts that pipeline's queries and removes it. A request is pending until the host
  removed it, so a host that dies before reading it leaves it to the next host.
* ``lease``: an ``flock`` the host holds for its life, stamped ``pid N on HOST``: the kernel drops it
  when the host dies, so a live lease is a live host.
* ``launch.json``: the last host launched (pid, time): a host launched but not yet holding its lease
  is starting, and a second one is not launched beside it.
* ``launch.lock``: an ``flock`` around "is a host running, else launch one; then request" on the
  supervisors' side, and around "nothing hosted, nothing pending: leave" on the host's, so a request
  is never written to a host on its way out.

Stopping is unchanged: the pipeline's stop request (:mod:`tidewater.streaming.stop_request`) makes the
host stop that pipeline's queries and release its leases; the others run on. The host leaves once it
hosts nothing and nothing is pending.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tidewater.errors import TidewaterError
from tidewater.json_files import read_json, write_json
from tidewater.lake.locks import flock_holder, stamp, try_flock
from tidewater.processes import alive

HOST_DIR = "_host"


@dataclass(frozen=True)
class StartRequest:
    pipeline: str
    at: float  # unix seconds: the pipeline's launch time (its stop requests older than it are stale)
    reason: str
    log: str  # the pipeline's driver log, where the host writes its lines about this pipeline


class HostFiles:
    """The files of one namespace's stream host (see the module's docstring)."""

    def __init__(self, state_dir: str | os.PathLike[str], namespace: str) -> None:
        self.dir = Path(state_dir).absolute() / "streams" / namespace / HOST_DIR
        self.namespace = namespace

    @property
    def log_path(self) -> Path:
        return self.dir / "host.log"

    @property
    def lease_path(self) -> Path:
        return self.dir / "lease"

    @contextmanager
    def launch_lock(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "launch.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ---- the host's life ------------------------------------------------------------------------

    def holder_pid(self) -> int | None:
        """The pid of the host holding the lease, None when no host holds it."""
        holder = flock_holder(self.lease_path)
        if holder is None:
            return None
        try:
            return int(holder.split()[1])
        except (IndexError, ValueError):
            return -1

    def take_lease(self) -> IO[str]:
        """The host's side: hold the lease for this process's life (the open file; close it to let go)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        handle = open(self.lease_path, "a+")  # noqa: SIM115 - held until the host leaves
        holder = try_flock(handle)
        if holder is not None:
            handle.close()
            raise HostRunningError(f"a stream host already runs for namespace {self.namespace} ({holder})")
        stamp(handle, f"pid {os.getpid()} on {socket.gethostname()} since {time.time():.3f}")
        launch = read_json(self.dir / "launch.json")
        if launch.get("pid") == os.getpgid(0):  # the launch a supervisor recorded is this host: it is up
            write_json(self.dir / "launch.json", {**launch, "driver_pid": os.getpid()})
        return handle

    def record_launch(self, pid: int, *, now: float | None = None) -> None:
        write_json(self.dir / "launch.json", {"pid": pid, "launched_unix": time.time() if now is None else now})

    def record_leaving(self) -> None:
        """The host is leaving: it is not starting either, so the next supervisor launches a new one."""
        write_json(self.dir / "launch.json", {**read_json(self.dir / "launch.json"), "left": True})

    def last_pid(self) -> int | None:
        """The pid of the last host launched (alive or not)."""
        pid = read_json(self.dir / "launch.json").get("pid")
        return int(pid) if pid else None

    def running_pid(self, *, startup_s: float, now: float | None = None) -> int | None:
        """The host's pid (the job launched: its process group) if one runs or is starting (launched less
        than ``startup_s`` ago, alive, and never up: a host whose driver held the lease and let go of it
        is leaving or dead, whatever is left of its process group)."""
        pid = self.holder_pid()
        if pid is not None:
            with suppress(OSError):
                return os.getpgid(pid)  # the lease holder is the job's Python driver, a child of the launch
            return pid
        launch = read_json(self.dir / "launch.json")
        launched = float(launch.get("launched_unix") or 0)
        now = time.time() if now is None else now
        starting = not launch.get("left") and not launch.get("driver_pid")  # a host up once holds the lease
        if launch.get("pid") and starting and alive(int(launch["pid"])) and now - launched < startup_s:
            return int(launch["pid"])
        return None

    # ---- start requests -------------------------------------------------------------------------

    def _request_path(self, pipeline: str) -> Path:
        return self.dir / "start" / f"{pipeline}.json"

    def request_start(self, request: StartRequest) -> None:
        write_json(
            self._request_path(request.pipeline),
            {"pipeline": request.pipeline, "at": request.at, "reason": request.reason, "log": request.log},
        )

    def withdraw(self, pipeline: str) -> bool:
        """Take back a pending start request (a stop asked before the host got to it)."""
        try:
            self._request_path(pipeline).unlink()
        except FileNotFoundError:
            return False
        return True

    def pending(self) -> list[StartRequest]:
        """The start requests the host has not taken yet, oldest first."""
        requests = []
        for path in sorted((self.dir / "start").glob("*.json")):
            data = read_json(path)
            with suppress(KeyError, TypeError, ValueError):
                pipeline, at, reason, log = data["pipeline"], data["at"], data["reason"], data["log"]
                requests.append(StartRequest(str(pipeline), float(at), str(reason), str(log)))
        return sorted(requests, key=lambda request: request.at)

    def taken(self, request: StartRequest) -> None:
        """The host took ``request`` (started its pipeline, or said in its log why it could not)."""
        path = self._request_path(request.pipeline)
        if float(read_json(path).get("at") or 0) == request.at:  # not a newer one written meanwhile
            path.unlink(missing_ok=True)


class HostRunningError(TidewaterError):
    """A second host was started for a namespace whose host runs."""
