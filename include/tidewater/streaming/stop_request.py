"""Stop requests: how a supervisor on any host asks a running streaming driver to stop.

A signal reaches only a process on the same host. A stop request is a small JSON file every driver
host sees, because it lives beside the pipeline's checkpoints (shared storage on a cluster):
``<checkpoint root>/<namespace>/<pipeline>/stop-request.json``
(:meth:`tidewater.pipelines.layout.PipelineLayout.stop_request`), holding an ``id``, ``requested_at``
(unix seconds), ``by``, ``reason`` and the requesting ``host``.

* **Writing** (:func:`write_request`): the supervisor (:meth:`StreamControl.stop`) writes it, atomically
  (readers never see half of it), then waits for the driver to release its checkpoint leases.
* **Polling** (:class:`StopRequestWatch`): the driver's monitoring loop looks every couple of seconds,
  which costs one ``stat`` (the file is read only when it changed). A *fresh* request makes the driver
  stop its queries cleanly, release its leases and exit 0, the way SIGTERM does.
* **Freshness** (:func:`is_fresh`): a request applies to a driver launched at or before it was written.
  One written before the driver's launch is stale (the last driver's) and ignored, so a new driver is
  never stopped by a request that was meant for its predecessor. The launcher also clears the request
  before each launch (:func:`clear_request`). Times are wall-clock seconds of the hosts involved, so
  their clocks must agree (NTP) to well within the time between a launch and a stop.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidewater.json_files import write_json

REQUEST_FILE = "stop-request.json"
POLL_SECONDS = 2.0


@dataclass(frozen=True)
class StopRequest:
    id: str
    requested_at: float  # unix seconds, the requesting host's clock
    by: str
    reason: str
    host: str = ""

    def describe(self) -> str:
        """The driver's one log line: ``stop requested by <by>: <reason>``."""
        return f"stop requested by {self.by}: {self.reason}"


def is_fresh(request: StopRequest, launched_at: float) -> bool:
    """Does ``request`` apply to a driver launched at ``launched_at`` (unix seconds)? Only a request
    written at or after the launch does; an older one was meant for an earlier driver."""
    return request.requested_at >= launched_at


def write_request(path: Path, *, by: str, reason: str, now: float | None = None) -> StopRequest:
    """Write a new stop request to ``path`` (replacing any earlier one) and return it."""
    request = StopRequest(
        id=uuid.uuid4().hex,
        requested_at=time.time() if now is None else now,
        by=by,
        reason=reason,
        host=socket.gethostname(),
    )
    write_json(path, asdict(request))
    return request


def read_request(path: Path) -> StopRequest | None:
    """The stop request at ``path``; None when there is none, or it is unreadable (half-written by a
    foreign tool, or not a request at all): only a well-formed request may stop a driver."""
    try:
        return parse_request(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def parse_request(value: Any) -> StopRequest | None:
    """A :class:`StopRequest` from its JSON object, or None when it is not one."""
    if not isinstance(value, dict):
        return None
    try:
        requested_at = float(value["requested_at"])
        return StopRequest(
            id=str(value["id"]),
            requested_at=requested_at,
            by=str(value.get("by") or "unknown"),
            reason=str(value.get("reason") or "no reason given"),
            host=str(value.get("host") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def clear_request(path: Path, *, only_id: str | None = None) -> bool:
    """Remove the stop request at ``path`` (with ``only_id``: only if it is still that request).
    True when one was removed."""
    if only_id is not None:
        current = read_request(path)
        if current is None or current.id != only_id:
            return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


class StopRequestWatch:
    """The driver's side: :meth:`poll` returns the fresh stop request, if any, looking at the file at
    most once every ``interval_s`` (one ``stat``; the file is parsed only when it changed)."""

    def __init__(
        self,
        path: Path,
        *,
        launched_at: float,
        interval_s: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.launched_at = launched_at
        self.interval_s = interval_s
        self._clock = clock
        self._next = float("-inf")
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the file last parsed
        self._request: StopRequest | None = None  # what that file held

    def poll(self, *, force: bool = False) -> StopRequest | None:
        """The fresh request (see :func:`is_fresh`), or None; ``force``: look now, whatever the interval."""
        now = self._clock()
        if not force and now < self._next:
            return self._fresh()
        self._next = now + self.interval_s
        try:
            stat = os.stat(self.path)
        except OSError:
            self._seen, self._request = None, None
            return None
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key != self._seen:
            self._seen, self._request = key, read_request(self.path)
        return self._fresh()

    def _fresh(self) -> StopRequest | None:
        request = self._request
        return request if request is not None and is_fresh(request, self.launched_at) else None
