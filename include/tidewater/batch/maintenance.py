"""Table maintenance: compaction, vacuum and a log checkpoint per Delta table, never racing a writer.

Why each step:

* **Compaction** (``optimize.compact``): a stream commits a few small files per micro-batch, so a
  table grows thousands of them a day and every read pays per file. Compaction rewrites them in
  a ``dataChange=false`` commit: the Delta stream sources ignore it (no row is re-read
  downstream) and the rows, and every app transaction, stay as they were. It runs partition by
  partition, each in its own short lock hold, so a stream micro-batch waiting on the lock never
  waits for a whole table's rewrite. Between runs the stream writers compact their tables' recent
  files to 16 MiB (:class:`tidewater.lake.compaction.StreamCompaction`); this packs those to the
  table's own target size. The plan and the rewrite are :mod:`tidewater.lake.compaction`'s.
* **Vacuum** (``vacuum``, full mode): deletes the files compaction and replacements removed once
  they are older than the retention, and staged files of micro-batches that were never committed
  (see :mod:`tidewater.lake.files`). Time travel to versions older than the retention stops
  working, which is the point: it bounds storage. A retention below the table's
  ``delta.deletedFileRetentionDuration`` (7 days by default) is refused unless the caller says so
  explicitly, because it also deletes the staged, not yet committed files of a writer that is
  running right now - the table lock cannot protect those (executors write them before the driver
  takes the lock to commit).
* **Checkpoint** (``create_checkpoint``): readers then load the snapshot from one Parquet file
  instead of replaying every JSON commit. Then ``cleanup_metadata`` deletes the log files older
  than ``delta.logRetentionDuration`` (30 days) and than the newest checkpoint: time travel and a
  Delta stream lagging further than that stop working, as Delta has it. delta-rs would do that
  after every commit, listing the whole log each time (see ``POST_COMMIT_HOOKS`` in
  :mod:`tidewater.lake.tables`); tidewater's writers leave it to this step, once a run. (delta-rs'
  OPTIMIZE cleans up after its commit whatever it is told, so a compaction does it too.)

Every step that writes runs holding the table's lock (:mod:`tidewater.lake.locks`), the one the
streaming writer holds for each micro-batch commit, so maintenance waits for a commit in flight
(and the stream for maintenance) instead of failing one of them on a Delta conflict.

The corrections ledger and the audit table have no entry in :attr:`PipelineLayout.table_names`;
their locks (:func:`ledger_lock`, ``PipelineLayout.audit_lock``) are in the same ``_locks``
directory, and every writer of either must take its lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import CommitProperties

from tidewater.config import Settings
from tidewater.errors import ConfigError, LakePathError, TidewaterError
from tidewater.lake.compaction import compact_partition, compaction_plan, describe, target_file_size
from tidewater.lake.locks import WriterLock
from tidewater.lake.storage import filesystem
from tidewater.lake.tables import POST_COMMIT_HOOKS, LakeTable, add_actions
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.base import Pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import parse_duration

log = logging.getLogger(__name__)

LEDGER = "corrections"
AUDITS = "audits"
_ABSENT = {LEDGER: "no corrections ledger yet", AUDITS: "no audit table yet"}
DEFAULT_DELETED_FILE_RETENTION = timedelta(days=7)  # Delta's default delta.deletedFileRetentionDuration
_JSON_FILE_LIST_LIMIT = 100  # vacuum lists in to_json(): enough to look at, small enough for an XCom


class MaintenanceError(TidewaterError):
    """One or more tables of a pipeline could not be maintained."""


@dataclass(frozen=True)
class MaintenanceResult:
    """What maintenance did to one table (or, with ``dry_run``, would do)."""

    table: str  # "bronze", "gold/<name>", "corrections"
    uri: str
    status: str  # "maintained" | "dry_run" | "skipped" | "failed"
    run_id: str
    detail: str = ""  # why it was skipped or failed (one line), or a warning (short retention)
    retention_hours: int = 0
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    partitions_compacted: int = 0  # in a dry run: partitions compaction would rewrite
    files_compacted: int = 0  # live files compaction replaced (in a dry run: would replace)
    files_written: int = 0  # files compaction wrote
    vacuum_files: tuple[str, ...] = ()  # deleted by vacuum (in a dry run: would be deleted)
    vacuum_bytes: int = 0
    log_files_before: int = 0  # entries of _delta_log (commits, checkpoints), before and after the run
    log_files_after: int = 0
    version_before: int | None = None
    version_after: int | None = None
    checkpoint_version: int | None = None
    lock_wait_s: float = 0.0  # total time spent waiting for the table's lock
    duration_s: float = 0.0

    @property
    def files_removed_by_vacuum(self) -> int:
        return len(self.vacuum_files)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["files_removed_by_vacuum"] = self.files_removed_by_vacuum
        out["vacuum_files"] = list(self.vacuum_files[:_JSON_FILE_LIST_LIMIT])
        out["vacuum_files_truncated"] = len(self.vacuum_files) > _JSON_FILE_LIST_LIMIT
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


# ---- where, and under which lock -------------------------------------------------------------------


def ledger_lock(layout: PipelineLayout) -> WriterLock:
    """The corrections ledger's lock (the one corrections hold while appending)."""
    return layout.ledger_lock()


def maintained_tables(layout: PipelineLayout) -> tuple[str, ...]:
    """Every table maintenance looks after: the pipeline's tables, then the corrections ledger and the
    audit table (both append a few rows per run: many small files without compaction)."""
    return (*layout.table_names, LEDGER, AUDITS)


def _target(layout: PipelineLayout, table: str) -> tuple[LakeTable, WriterLock]:
    if table == LEDGER:
        return LakeTable(layout.ledger_uri()), ledger_lock(layout)
    if table == AUDITS:
        return LakeTable(layout.audit_uri()), layout.audit_lock()
    if table not in layout.table_names:
        raise ConfigError(
            f"pipeline {layout.pipeline.name} has no table {table!r}: maintain one of "
            f"{', '.join(maintained_tables(layout))}"
        )
    return layout.table(table), layout.lock(table)


# ---- retention -------------------------------------------------------------------------------------


def configured_retention(table: DeltaTable) -> timedelta:
    """The table's ``delta.deletedFileRetentionDuration`` (``interval 7 days``), or Delta's default."""
    raw = table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    if not raw:
        return DEFAULT_DELETED_FILE_RETENTION
    try:
        return parse_duration(raw)
    except ConfigError:  # unreadable: assume Delta's default rather than guessing lower and deleting too much
        return DEFAULT_DELETED_FILE_RETENTION


def check_retention(uri: str, retention_hours: int, configured: timedelta, *, allow_short: bool) -> str:
    """Refuse a retention below the table's own unless ``allow_short``; return the warning to record."""
    if retention_hours < 0:
        raise ConfigError(
            f"vacuum retention {retention_hours} h is negative: set TIDEWATER_VACUUM_RETENTION_HOURS >= 0"
        )
    configured_hours = configured.total_seconds() / 3600
    if retention_hours >= configured_hours:
        return ""
    if not allow_short:
        raise ConfigError(
            f"vacuum retention {retention_hours} h is below the {configured_hours:g} h deletedFileRetentionDuration of "
            f"{uri}: it would delete files a running writer has staged but not committed yet; raise "
            "TIDEWATER_VACUUM_RETENTION_HOURS, or allow a short retention explicitly when no writer can be running"
        )
    warning = (
        f"vacuum retention {retention_hours} h is below the table's {configured_hours:g} h "
        "deletedFileRetentionDuration (explicitly allowed)"
    )
    log.warning("%s: %s", uri, warning)
    return warning


# ---- snapshot figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    version: int
    files: int
    bytes: int


def _snapshot(table: DeltaTable) -> _Snapshot:
    actions = add_actions(table)
    size = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
    return _Snapshot(int(table.version()), actions.num_rows, int(size))


# ---- the steps -------------------------------------------------------------------------------------


class _Maintenance:
    """One table's maintenance run: opens the table afresh under each lock hold (a writer may have
    committed while we waited) and accounts for the time spent waiting."""

    def __init__(self, lake: LakeTable, lock: WriterLock, run_id: str) -> None:
        self.lake = lake
        self.lock = lock
        self.run_id = run_id
        self.lock_wait_s = 0.0

    @contextmanager
    def locked(self, step: str) -> Iterator[DeltaTable]:
        asked = time.monotonic()
        with self.lock.hold(f"maintenance {self.run_id}: {step}"):
            self.lock_wait_s += time.monotonic() - asked
            try:
                yield self.lake.open()
            except (OSError, DeltaError) as exc:
                raise LakePathError(
                    f"{step} of {self.lake.uri} failed: {' '.join(str(exc).split())[:300]} - every step is safe to "
                    "repeat: fix the cause and run maintenance again"
                ) from None

    def commit_properties(self, step: str) -> CommitProperties:
        return CommitProperties(custom_metadata={"tidewater.maintenance_run": self.run_id, "tidewater.step": step})

    def compact(self, plan: list[tuple[dict[str, str | None], int]], target_size: int) -> tuple[int, int, int]:
        """Compact each planned partition in its own lock hold; (partitions, files removed, files added)."""
        partitions = removed = added = 0
        for values, _ in plan:
            with self.locked(f"compact {describe(values)}") as table:
                gone, new = compact_partition(
                    table, values, target_size=target_size, commit_properties=self.commit_properties("compact")
                )
            if gone:
                partitions += 1
                removed += gone
                added += new
        return partitions, removed, added

    def vacuum_listing(self, table: DeltaTable, retention_hours: int, enforce: bool) -> list[str]:
        """What vacuum would delete now (a dry run: nothing changes, no lock needed)."""
        try:
            return list(table.vacuum(retention_hours, dry_run=True, enforce_retention_duration=enforce, full=True))
        except (OSError, DeltaError) as exc:
            raise LakePathError(
                f"cannot list what vacuum would delete in {self.lake.uri}: {' '.join(str(exc).split())[:300]}"
            ) from None

    def vacuum(self, retention_hours: int, enforce: bool) -> tuple[list[str], int]:
        """List outside the lock (a full vacuum lists the whole directory: the stream should not wait
        for that, and the sizes must be read before the files go), delete under it."""
        listed = self.vacuum_listing(self.lake.open(), retention_hours, enforce)
        if not listed:
            return [], 0
        sizes = _sizes(self.lake.uri, listed)
        with self.locked("vacuum") as table:
            deleted = table.vacuum(
                retention_hours,
                dry_run=False,
                enforce_retention_duration=enforce,
                full=True,
                commit_properties=self.commit_properties("vacuum"),
                post_commithook_properties=POST_COMMIT_HOOKS,
            )
        return list(deleted), sum(sizes.get(path, 0) for path in deleted)

    def checkpoint(self) -> int:
        """A log checkpoint, then the expired log files deleted (see the module's docstring)."""
        with self.locked("checkpoint") as table:
            table.create_checkpoint()
            table.cleanup_metadata()
            return int(table.version())


def _log_files(uri: str) -> int:
    fs, root = filesystem(uri)
    return len(fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True)))


def _sizes(uri: str, relative_paths: list[str]) -> dict[str, int]:
    fs, root = filesystem(uri)
    infos = fs.get_file_info([f"{root}/{path}" for path in relative_paths])
    return {path: int(info.size or 0) for path, info in zip(relative_paths, infos, strict=True)}


def maintain_table(
    layout: PipelineLayout,
    table: str,
    *,
    retention_hours: int,
    run_id: str,
    dry_run: bool = False,
    allow_short_retention: bool = False,
    target_size: int | None = None,
) -> MaintenanceResult:
    """Compact, vacuum and checkpoint one table of ``layout`` (or ``"corrections"``, the ledger, or
    ``"audits"``).

    A table that does not exist yet is skipped (status ``skipped``). ``dry_run`` changes nothing
    and reports what compaction would rewrite and which files vacuum would delete. Each writing
    step holds the table's lock, waiting up to ``table_lock_timeout_seconds`` for a writer
    (:class:`~tidewater.lake.locks.TableLockTimeoutError` after that).
    """
    started = time.monotonic()
    lake, lock = _target(layout, table)
    if not lake.exists():
        what = {LEDGER: "no corrections ledger yet", AUDITS: "no audit table yet"}.get(
            table, "table does not exist yet"
        )
        log.info("maintenance %s: skipped %s: %s", run_id, lake.uri, what)
        return MaintenanceResult(table, lake.uri, "skipped", run_id, what, retention_hours)
    delta = lake.open()
    warning = check_retention(lake.uri, retention_hours, configured_retention(delta), allow_short=allow_short_retention)
    enforce = not allow_short_retention
    before = _snapshot(delta)
    size = target_file_size(delta, target_size)
    plan = compaction_plan(delta, size)
    work = _Maintenance(lake, lock, run_id)
    common = {"table": table, "uri": lake.uri, "run_id": run_id, "detail": warning, "retention_hours": retention_hours}
    if dry_run:
        listed = work.vacuum_listing(delta, retention_hours, enforce)
        dry = MaintenanceResult(
            status="dry_run",
            files_before=before.files,
            files_after=before.files,
            bytes_before=before.bytes,
            bytes_after=before.bytes,
            partitions_compacted=len(plan),
            files_compacted=sum(count for _, count in plan),
            vacuum_files=tuple(listed),
            vacuum_bytes=sum(_sizes(lake.uri, listed).values()) if listed else 0,
            version_before=before.version,
            version_after=before.version,
            duration_s=round(time.monotonic() - started, 3),
            **common,
        )
        log.info("maintenance dry run of %s: %s", lake.uri, dry.to_json())
        return dry
    logs_before = _log_files(lake.uri)
    partitions, removed, added = work.compact(plan, size)
    vacuumed, vacuum_bytes = work.vacuum(retention_hours, enforce)
    checkpoint = work.checkpoint()
    after = _snapshot(lake.open())
    result = MaintenanceResult(
        status="maintained",
        files_before=before.files,
        files_after=after.files,
        bytes_before=before.bytes,
        bytes_after=after.bytes,
        partitions_compacted=partitions,
        files_compacted=removed,
        files_written=added,
        vacuum_files=tuple(vacuumed),
        vacuum_bytes=vacuum_bytes,
        version_before=before.version,
        version_after=after.version,
        checkpoint_version=checkpoint,
        log_files_before=logs_before,
        log_files_after=_log_files(lake.uri),
        lock_wait_s=round(work.lock_wait_s, 3),
        duration_s=round(time.monotonic() - started, 3),
        **common,
    )
    log.info("maintained %s: %s", lake.uri, result.to_json())
    return result


def maintain_pipeline(
    settings: Settings,
    pipeline: Pipeline | str,
    namespace: str | None = None,
    *,
    run_id: str,
    retention_hours: int | None = None,
    dry_run: bool = False,
    allow_short_retention: bool = False,
    raise_on_failure: bool = True,
) -> list[MaintenanceResult]:
    """Maintain every table of a pipeline in a namespace, then its corrections ledger: one result each.

    The retention (default ``settings.vacuum_retention_hours``) is checked against every existing
    table before anything changes. A table that fails (e.g. its lock stayed held) does not stop the
    others: its result has status ``failed`` and the error in ``detail``; then, with
    ``raise_on_failure``, a :class:`MaintenanceError` names the failed tables (every result is in the log).
    """
    definition = get_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    layout = PipelineLayout.of(settings, definition, namespace)
    hours = settings.vacuum_retention_hours if retention_hours is None else retention_hours
    names = maintained_tables(layout)
    for name in names:  # refuse a bad retention before touching any table
        lake, _ = _target(layout, name)
        if lake.exists():
            check_retention(lake.uri, hours, configured_retention(lake.open()), allow_short=allow_short_retention)
    results: list[MaintenanceResult] = []
    for name in names:
        started = time.monotonic()
        try:
            result = maintain_table(
                layout,
                name,
                retention_hours=hours,
                run_id=run_id,
                dry_run=dry_run,
                allow_short_retention=allow_short_retention,
            )
        except TidewaterError as exc:
            uri = _target(layout, name)[0].uri
            detail = f"{type(exc).__name__}: {exc}"
            result = MaintenanceResult(
                name, uri, "failed", run_id, detail, hours, duration_s=round(time.monotonic() - started, 3)
            )
            log.error("maintenance of %s failed: %s", uri, detail)
        results.append(result)
    failed = [r for r in results if r.status == "failed"]
    if failed and raise_on_failure:
        raise MaintenanceError(
            f"maintenance {run_id} of {layout.namespace}/{definition.name} failed for {len(failed)} of "
            f"{len(names)} tables ({failed[0].table}: {failed[0].detail}{'; ...' if len(failed) > 1 else ''}); "
            "the other tables were maintained: fix the cause and run maintenance again"
        )
    return results
