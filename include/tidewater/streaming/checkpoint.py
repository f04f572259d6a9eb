"""Checkpoint ownership: identity, a lease, and a sanity check before Spark touches it.

* **Identity** (``_tidewater.json``): which pipeline/query/namespace the checkpoint belongs to and
  a ``stream_id`` created with it. The Delta app-transaction id includes the stream id, so a
  *new* checkpoint can never be mistaken for a replay of an old one (batch ids restart at 0).
* **Lease** (``_lease``): an exclusive ``flock`` held by the driver process for as long as it runs.
  The kernel drops it when the process dies (kill -9 included), so it survives restarts of
  whatever launched the driver, and a second driver on the same checkpoint is refused.
* **Sanity**: Spark's offset and commit logs must parse; a corrupt one is reported in one line
  instead of a JVM stack trace.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from tidewater.errors import CheckpointError
from tidewater.lake.locks import flock_holder, stamp, try_flock

IDENTITY_FILE = "_tidewater.json"
LEASE_FILE = "_lease"
_LOG_HEADER = re.compile(r"^v\d+$")


@dataclass(frozen=True)
class CheckpointIdentity:
    pipeline: str
    namespace: str
    query: str
    source: str
    target: str
    stream_id: str
    created_at: str

    def same_owner(self, other: CheckpointIdentity) -> bool:
        return (self.pipeline, self.namespace, self.query, self.source, self.target) == (
            other.pipeline,
            other.namespace,
            other.query,
            other.source,
            other.target,
        )


class Checkpoint:
    """A claimed checkpoint directory; :meth:`release` (or process exit) frees the lease."""

    def __init__(self, path: Path, identity: CheckpointIdentity, lease: IO[str]) -> None:
        self.path = path
        self.identity = identity
        self._lease: IO[str] | None = lease

    @property
    def app_id(self) -> str:
        """Delta app-transaction id: stable for this checkpoint, new for a new one."""
        i = self.identity
        return f"tidewater/{i.namespace}/{i.pipeline}/{i.query}/{i.stream_id}"

    def release(self) -> None:
        if self._lease is not None:
            fcntl.flock(self._lease, fcntl.LOCK_UN)
            self._lease.close()
            self._lease = None


def lease_holder(path: Path) -> str | None:
    """Who holds the lease of checkpoint ``path`` (None if nobody)."""
    return flock_holder(path / LEASE_FILE, unknown="unknown process")


def claim(path: Path, *, pipeline: str, namespace: str, query: str, source: str, target: str) -> Checkpoint:
    """Take the lease, check identity and Spark's logs, and return the claimed checkpoint."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        lease = open(path / LEASE_FILE, "a+")  # noqa: SIM115 - held for the process lifetime
    except OSError as exc:
        raise CheckpointError(f"cannot use checkpoint directory {path}: {exc.strerror}") from None
    holder = try_flock(lease)
    if holder is not None:
        lease.close()
        raise CheckpointError(
            f"checkpoint {path} is in use by a running driver ({holder or 'another process'}); two drivers "
            "on one checkpoint would corrupt it: stop that one first"
        )
    stamp(lease, f"pid {os.getpid()} on {socket.gethostname()} since {_now()}")
    try:
        wanted = CheckpointIdentity(pipeline, namespace, query, source, target, uuid.uuid4().hex, _now())
        identity = _reconcile_identity(path, wanted)
        check_spark_logs(path)
    except BaseException:
        fcntl.flock(lease, fcntl.LOCK_UN)
        lease.close()
        raise
    return Checkpoint(path, identity, lease)


def _reconcile_identity(path: Path, wanted: CheckpointIdentity) -> CheckpointIdentity:
    identity_path = path / IDENTITY_FILE
    if identity_path.exists():
        try:
            found = CheckpointIdentity(**json.loads(identity_path.read_text()))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {path} has an unreadable {IDENTITY_FILE} ({exc})") from None
        if not found.same_owner(wanted):
            raise CheckpointError(
                f"checkpoint {path} belongs to {found.namespace}/{found.pipeline}/{found.query} reading "
                f"{found.source} into {found.target}, not to {wanted.namespace}/{wanted.pipeline}/{wanted.query} "
                f"reading {wanted.source} into {wanted.target}: use the right checkpoint root"
            )
        return found
    spark_files = [p.name for p in path.iterdir() if p.name not in (LEASE_FILE, IDENTITY_FILE)]
    if spark_files:
        raise CheckpointError(
            f"checkpoint {path} holds Spark state ({', '.join(sorted(spark_files)[:3])}) but no {IDENTITY_FILE}: "
            "it was not created by this tidewater query; point TIDEWATER_CHECKPOINT_ROOT elsewhere"
        )
    tmp = identity_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(wanted), indent=2))
    tmp.replace(identity_path)
    return wanted


def check_spark_logs(path: Path) -> None:
    """Every entry of Spark's offset/commit logs must be a header line plus JSON lines."""
    metadata = path / "metadata"
    if metadata.exists():
        try:
            json.loads(metadata.read_text().splitlines()[0])
        except (ValueError, IndexError):
            raise CheckpointError(
                f"checkpoint {path} is corrupt (metadata is not JSON): it cannot be resumed safely; move it "
                "aside and rebuild the affected tables with a replay"
            ) from None
    for log_name in ("offsets", "commits"):
        log_dir = path / log_name
        if not log_dir.is_dir():
            continue
        for entry in log_dir.iterdir():
            if not entry.name.isdigit():
                continue
            lines = entry.read_text(errors="replace").splitlines()
            ok = bool(lines) and _LOG_HEADER.match(lines[0]) is not None
            if ok:
                try:
                    for line in lines[1:]:
                        if line.strip() and line.strip() != "-":
                            json.loads(line)
                except ValueError:
                    ok = False
            if not ok:
                raise CheckpointError(
                    f"checkpoint {path} is corrupt ({log_name}/{entry.name} is not a Spark log entry): it cannot "
                    "be resumed safely; move it aside and rebuild the affected tables with a replay"
                )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
