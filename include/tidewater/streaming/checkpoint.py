"""Checkpoint ownership: identity, a lease, and a sanity check before Spark touches it.

* **Identity** (``_tidewater.json``): which pipeline/query/namespace the checkpoint belongs to and
  a ``stream_id`` created with it. The Delta app-transaction id includes the stream id, so a
  *new* checkpoint can never be mistaken for a replay of an old one (batch ids restart at 0).
* **Lease** (``_lease``): an exclusive ``flock`` held by the driver process for as long as it runs.
  The kernel drops it when the process dies (kill -9 included), so it survives restarts of
  whatever launched the driver, and a second driver on the same checkpoint is refused. With the
  ``postgres`` lock backend the lease is a PostgreSQL advisory lock named after the query instead
  (:class:`tidewater.lake.pg_locks.PostgresLock`, timeout 0): it also refuses a driver on another
  host or another mount of a shared checkpoint folder, and the server frees it when the driver dies.
  Either way the holder is recorded as ``pid <pid> on <host> since <time>``: a supervisor signals only
  a holder on its own host, and asks any other to stop with a stop request
  (:mod:`tidewater.streaming.stop_request`), which the driver polls and answers by releasing its leases.
* **Sanity**: Spark's offset and commit logs must parse, and the state-store files a stateful
  (gold) query needs to resume its latest committed batch must exist and be whole; a corrupt one is
  reported in one line instead of a JVM stack trace.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import socket
import struct
import uuid
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from tidewater.errors import CheckpointError
from tidewater.json_files import write_json
from tidewater.lake.locks import TableLockTimeoutError, flock_holder, stamp, try_flock
from tidewater.lake.pg_locks import HeldLock, PostgresLock

IDENTITY_FILE = "_tidewater.json"
LEASE_FILE = "_lease"
_LOG_HEADER = re.compile(r"^v\d+$")
# A state-store version file: N.changelog / N.zip (RocksDB), N.delta / N.snapshot (HDFS-backed), with
# an optional _<unique id> (checkpoint format v2).
_STATE_FILE = re.compile(r"^(\d+)(?:_[0-9A-Za-z-]+)?\.(changelog|zip|delta|snapshot)$")
_SNAPSHOTS = ("zip", "snapshot")
_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = struct.Struct("<8sBiii")  # magic, token (method | level), compressed, decompressed, checksum
_REBUILD = "it cannot be resumed safely; move it aside and rebuild the affected tables with a replay"


# Spark's errors for a checkpoint whose state another layout of the query wrote (an older tidewater, or
# a changed declaration: another key, other state variables).
_STATE_LAYOUT_ERRORS = (
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
    "STATE_STORE_REMOVING_COLUMN_FAMILIES",
    "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE",
    "STATE_STORE_STATE_SCHEMA_FILES_THRESHOLD_EXCEEDED",
    "STATE_STORE_INVALID_CONFIG_AFTER_RESTART",
)


def state_layout_hint(error: str) -> str:
    """What to do about a query that failed on its checkpoint's state layout (empty for any other error)."""
    if not any(code in error for code in _STATE_LAYOUT_ERRORS):
        return ""
    return f"; its checkpoint's state was written by another layout of this query: {_REBUILD}"


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

    def __init__(self, path: Path, identity: CheckpointIdentity, lease: IO[str] | HeldLock) -> None:
        self.path = path
        self.identity = identity
        self._lease: IO[str] | HeldLock | None = lease

    @property
    def app_id(self) -> str:
        """Delta app-transaction id: stable for this checkpoint, new for a new one."""
        i = self.identity
        return f"tidewater/{i.namespace}/{i.pipeline}/{i.query}/{i.stream_id}"

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            _release_lease(lease)


def lease_holder(path: Path, lease: PostgresLock | None = None) -> str | None:
    """Who holds the lease of checkpoint ``path`` (None if nobody); ``lease``: the PostgreSQL one."""
    if lease is not None:
        return lease.holder()
    return flock_holder(path / LEASE_FILE, unknown="unknown process")


def claim(
    path: Path,
    *,
    pipeline: str,
    namespace: str,
    query: str,
    source: str,
    target: str,
    lease: PostgresLock | None = None,
) -> Checkpoint:
    """Take the lease (the flock beside the checkpoint, or ``lease``), check identity and Spark's logs,
    and return the claimed checkpoint."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot use checkpoint directory {path}: {exc.strerror}") from None
    taken = _take_lease(path, lease, f"pid {os.getpid()} on {socket.gethostname()} since {_now()}")
    try:
        wanted = CheckpointIdentity(pipeline, namespace, query, source, target, uuid.uuid4().hex, _now())
        identity = _reconcile_identity(path, wanted)
        check_spark_logs(path)
    except BaseException:
        _release_lease(taken)
        raise
    return Checkpoint(path, identity, taken)


def _release_lease(lease: IO[str] | HeldLock) -> None:
    if isinstance(lease, HeldLock):
        lease.release()
    else:
        fcntl.flock(lease, fcntl.LOCK_UN)
        lease.close()


def _take_lease(path: Path, lease: PostgresLock | None, who: str) -> IO[str] | HeldLock:
    in_use = (
        f"checkpoint {path} is in use by a running driver ({{}}); two drivers on one checkpoint would "
        "corrupt it: stop that one first"
    )
    if lease is not None:
        try:
            return lease.acquire(who)
        except TableLockTimeoutError:
            raise CheckpointError(in_use.format(lease.holder() or "another process")) from None
    try:
        handle = open(path / LEASE_FILE, "a+")  # noqa: SIM115 - held for the process lifetime
    except OSError as exc:
        raise CheckpointError(f"cannot use checkpoint directory {path}: {exc.strerror}") from None
    holder = try_flock(handle)
    if holder is not None:
        handle.close()
        raise CheckpointError(in_use.format(holder or "another process"))
    stamp(handle, who)
    return handle


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
    write_json(identity_path, asdict(wanted))
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
    check_state_store(path)


def check_state_store(path: Path) -> None:
    """The state-store files the latest committed batch left must exist and be whole.

    Resuming batch ``b + 1`` loads state version ``b + 1`` of every partition of every stateful
    operator: the newest snapshot at or below it (``N.zip`` / ``N.snapshot``) plus every
    changelog/delta after it. Each of those files must exist, must match its Hadoop ``.crc``
    checksum file when there is one, an LZ4 stream (Spark's default state compression) must end
    with its end mark, and a RocksDB snapshot's zip must open and its SST files be present at their
    recorded sizes. Spark itself would fail the first micro-batch with ``CANNOT_LOAD_STATE_STORE``
    ("Stream ended prematurely") and a long JVM trace.
    """
    state = path / "state"
    committed = _latest_batch(path / "commits")
    if committed is None or not state.is_dir():
        return
    version = committed + 1
    conf = _batch_conf(path / "offsets" / str(committed))
    lz4 = conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4").lower() == "lz4"
    hdfs = "HDFSBackedStateStoreProvider" in conf.get("spark.sql.streaming.stateStore.providerClass", "")
    for operator in sorted((d for d in state.iterdir() if d.is_dir() and d.name.isdigit()), key=_numeric):
        for store in _store_dirs(path, operator):
            _check_store(path, store, version, lz4=lz4, changes="delta" if hdfs else "changelog")


def _numeric(entry: Path) -> int:
    return int(entry.name)


def _latest_batch(log_dir: Path) -> int | None:
    if not log_dir.is_dir():
        return None
    ids = [int(entry.name) for entry in log_dir.iterdir() if entry.name.isdigit()]
    return max(ids) if ids else None


def _batch_conf(offsets_entry: Path) -> dict[str, str]:
    """The SQL conf Spark recorded with a batch (state provider, codec, shuffle partitions)."""
    try:
        lines = offsets_entry.read_text(errors="replace").splitlines()
        conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
    except (OSError, ValueError, AttributeError):
        return {}
    return conf if isinstance(conf, dict) else {}


def _store_dirs(path: Path, operator: Path) -> list[Path]:
    """One directory per (partition, store) of a stateful operator, from its metadata when Spark wrote
    it (partitions that are missing altogether included), else the partition directories found."""
    try:
        lines = (operator / "_metadata" / "metadata").read_text(errors="replace").splitlines()
        stores = json.loads(lines[1])["stateStoreInfo"]
        wanted = [(int(s["numPartitions"]), str(s["storeName"])) for s in stores]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        wanted = []
    if wanted:
        dirs = []
        for partitions, name in wanted:
            for partition in range(partitions):
                store = operator / str(partition)
                dirs.append(store if name == "default" else store / name)
        return dirs
    return sorted((d for d in operator.iterdir() if d.is_dir() and d.name.isdigit()), key=_numeric)


def _check_store(path: Path, store: Path, version: int, *, lz4: bool, changes: str) -> None:
    files: dict[int, list[Path]] = {}
    if store.is_dir():
        for entry in store.iterdir():
            match = _STATE_FILE.match(entry.name)
            if match and int(match.group(1)) <= version:
                files.setdefault(int(match.group(1)), []).append(entry)
    snapshot = max((v for v, entries in files.items() if any(_kind(e) in _SNAPSHOTS for e in entries)), default=0)
    for v in range(snapshot + 1, version + 1):  # the changelogs replayed on top of the snapshot
        if not any(_kind(e) not in _SNAPSHOTS for e in files.get(v, [])):
            missing = (store / f"{v}.{changes}").relative_to(path)
            raise CheckpointError(
                f"checkpoint {path} is corrupt (state file {missing} is missing, and resuming after the last "
                f"committed batch needs it): {_REBUILD}"
            )
    for v in range(snapshot, version + 1):
        for entry in sorted(files.get(v, [])):
            if v == snapshot and _kind(entry) not in _SNAPSHOTS:
                continue  # a snapshot replaces the changelog of its own version
            problem = _state_file_problem(entry, lz4=lz4)
            if problem:
                raise CheckpointError(
                    f"checkpoint {path} is corrupt (state file {entry.relative_to(path)} {problem}): {_REBUILD}"
                )


def _kind(entry: Path) -> str:
    return entry.suffix.lstrip(".")


def _state_file_problem(entry: Path, *, lz4: bool) -> str | None:
    """What is wrong with one state-store file, or None."""
    try:
        data = entry.read_bytes()
    except OSError as exc:
        return f"cannot be read, {exc.strerror}"
    if not data:
        return "is empty"
    structure = _zip_problem(entry) if _kind(entry) == "zip" else (_lz4_problem(data) if lz4 else None)
    return structure or _crc_problem(entry, data)


def _crc_problem(entry: Path, data: bytes) -> str | None:
    """Compare with Hadoop's checksum file ``.<name>.crc`` (CRC32 per chunk), when there is one."""
    try:
        crc = entry.with_name(f".{entry.name}.crc").read_bytes()
    except OSError:
        return None
    if len(crc) < 8 or crc[:4] != b"crc\0":
        return None  # not a checksum file we know
    chunk = struct.unpack(">i", crc[4:8])[0]
    if chunk <= 0:
        return None
    sums = crc[8:]
    chunks = (len(data) + chunk - 1) // chunk
    if len(sums) != 4 * chunks:
        return f"is truncated or extended, {len(data)} bytes do not fit its checksum file .{entry.name}.crc"
    for i in range(chunks):
        if zlib.crc32(data[i * chunk : (i + 1) * chunk]) != struct.unpack(">I", sums[4 * i : 4 * i + 4])[0]:
            return f"does not match its checksum file .{entry.name}.crc at byte {i * chunk}"
    return None


def _lz4_problem(data: bytes) -> str | None:
    """Walk an LZ4 block stream (Spark's LZ4CompressionCodec): every block whole, ending in an end mark."""
    if not data.startswith(_LZ4_MAGIC):
        return "is truncated inside its first LZ4 header" if _LZ4_MAGIC.startswith(data) else None
    offset, ended = 0, False
    while offset < len(data):
        if len(data) - offset < _LZ4_HEADER.size:
            return f"is truncated inside the LZ4 block header at byte {offset}"
        magic, token, compressed, decompressed, _checksum = _LZ4_HEADER.unpack_from(data, offset)
        method, block_size = token & 0xF0, 1 << (10 + (token & 0x0F))
        if (
            magic != _LZ4_MAGIC
            or method not in (0x10, 0x20)
            or not 0 <= decompressed <= block_size
            or compressed < 0
            or (method == 0x10 and compressed != decompressed)
        ):
            return f"is not a valid LZ4 stream, the block header at byte {offset} is damaged"
        offset += _LZ4_HEADER.size
        ended = decompressed == 0 and compressed == 0
        if offset + compressed > len(data):
            return (
                f"is truncated, the LZ4 block at byte {offset - _LZ4_HEADER.size} needs {compressed} bytes and "
                f"{len(data) - offset} are left"
            )
        offset += compressed
    return None if ended else "is truncated, its LZ4 stream has no end mark"


def _zip_problem(entry: Path) -> str | None:
    """A RocksDB snapshot: the zip opens, and the SST/log files its metadata lists are present."""
    try:
        with zipfile.ZipFile(entry) as archive:
            lines = archive.read("metadata").decode("utf-8", "replace").splitlines()
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
        return f"is not a readable RocksDB snapshot zip, {exc}"
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        return "holds unreadable RocksDB metadata"
    for key, folder in (("sstFiles", "SSTs"), ("logFiles", "logs")):
        for item in metadata.get(key) or []:
            name, size = item.get("dfsSstFileName") or item.get("dfsLogFileName"), item.get("sizeBytes")
            if not name:
                continue
            target = entry.parent / folder / name
            try:
                actual = target.stat().st_size
            except OSError:
                return f"needs {folder}/{name}, which is missing"
            if isinstance(size, int) and actual != size:
                return f"needs {folder}/{name} of {size} bytes, which has {actual}"
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
