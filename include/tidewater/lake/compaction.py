"""Small-file compaction of a Delta table: the plan and the rewrite (maintenance's and the stream's).

A stream adds a file to each table it appends to at every micro-batch: at a 1 s trigger that is 3,600
files an hour per table, and every commit, snapshot and read pays for them, as does the stream's key
index, which syncs with the same file list. ``benchmarks/bench_commits.py`` (6,000 appends of 2,000
rsvps records, local files, delta-rs 1.6, log cleanup off as :data:`~tidewater.lake.tables.POST_COMMIT_HOOKS`
has it): a commit's p50 went from 31 ms at 500 files to 97 ms at 6,000 without compaction, and stayed
at 24-51 ms with :class:`StreamCompaction` (65 live files at the end).

Compaction (delta-rs ``optimize.compact``) rewrites a partition's files below a target size into
files of about that size, in a ``dataChange=false`` commit: the rows and every app transaction stay
as they were, and the Delta stream sources skip it (no row is read twice downstream). Every caller
holds the table's lock (:mod:`tidewater.lake.locks`), so it never races a writer's commit.

:class:`StreamCompaction` is the stream writers' part (Delta's "auto compaction"): after every
``every`` commits of a table it compacts the partitions that have gathered at least ``every`` files
below its target size, inside the lock hold of the commit, so the table keeps tens of live files
between maintenance runs instead of tens of thousands. Its target is small (16 MiB by default): a
file at the target is left alone, so a round rewrites the files since the last round and earlier
rounds' files still below it, never the day's data; the daily maintenance then packs those files to
the table's own target.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import CommitProperties

from tidewater import phase_clock
from tidewater.errors import TidewaterError, one_line
from tidewater.lake.files import partition_value_text
from tidewater.lake.tables import POST_COMMIT_HOOKS, CommitResult, LakeTable, add_actions

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 104_857_600  # delta-rs' default when delta.targetFileSize is not set
DEFAULT_STREAM_TARGET_SIZE = 16 << 20  # Settings.stream_compaction_target_bytes

Partition = dict[str, str | None]


def target_file_size(table: DeltaTable, override: int | None = None) -> int:
    """``override``, else the table's ``delta.targetFileSize``, else delta-rs' default."""
    if override:
        return override
    configured = table.metadata().configuration.get("delta.targetFileSize")
    return int(configured) if configured and configured.isdigit() else DEFAULT_TARGET_FILE_SIZE


def compaction_plan(table: DeltaTable, target_size: int, *, min_files: int = 2) -> list[tuple[Partition, int]]:
    """Partitions worth compacting: those with at least ``min_files`` (and two or more) live files below
    the target size, which delta-rs would bin together, as (partition values, number of small files),
    largest first."""
    actions = add_actions(table)
    columns = [c for c in actions.column_names if c.startswith("partition.")]
    small: dict[tuple[tuple[str, str | None], ...], int] = {}
    for row in actions.select(["size_bytes", *columns]).to_pylist():
        if int(row["size_bytes"]) >= target_size:
            continue
        key = tuple((c.removeprefix("partition."), partition_value_text(row[c])) for c in columns)
        small[key] = small.get(key, 0) + 1
    plan = [(dict(key), count) for key, count in small.items() if count >= max(2, min_files)]
    return sorted(plan, key=lambda item: -item[1])


def partition_filters(values: Partition) -> list[tuple[str, str, Any]] | None:
    """delta-rs' filter for one partition (None: the whole of an unpartitioned table)."""
    # delta-rs cannot encode None in a filter; "" selects the null partition (Delta's null value).
    return [(column, "=", "" if value is None else value) for column, value in values.items()] or None


def describe(values: Partition) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "whole table"


def compact_partition(
    table: DeltaTable,
    values: Partition,
    *,
    target_size: int,
    commit_properties: CommitProperties,
    max_concurrent_tasks: int | None = None,
) -> tuple[int, int]:
    """Rewrite one partition's files below ``target_size`` (the caller holds the table's lock);
    (files removed, files added). ``table`` is left at the version it committed. delta-rs 1.6's
    OPTIMIZE then deletes expired log files whatever its hooks say (measured), so each compaction
    also lists the log once: once a round, where delta-rs' default would list it at every commit."""
    metrics = table.optimize.compact(
        partition_filters=partition_filters(values),
        target_size=target_size,
        max_concurrent_tasks=max_concurrent_tasks,
        commit_properties=commit_properties,
        post_commithook_properties=POST_COMMIT_HOOKS,
    )
    return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


@dataclass(frozen=True)
class CompactionRound:
    """What one :class:`StreamCompaction` round did to a table."""

    uri: str
    partitions: int
    files_removed: int
    files_added: int
    seconds: float


class StreamCompaction:
    """A stream writer's compaction of the tables it commits to (see the module's docstring).

    ``every``: commits of a table by this writer between two looks at its files, and the number of
    small files a partition must hold to be rewritten (0: never; the maintenance DAG still compacts).
    The count lives in this process only. Each table's first round comes after a share of ``every``
    of its own (:meth:`commits_to_first_round`, from its URI), so the tables one micro-batch commits
    (bronze, silver) take their rounds in different micro-batches, not one trigger paying for both.
    A round that fails is logged and left to the next one: the micro-batch it follows is committed,
    and a compaction that did not commit changed nothing (its files are vacuumed later)."""

    def __init__(
        self, *, every: int, target_size: int = DEFAULT_STREAM_TARGET_SIZE, query: str = "", stagger: bool = True
    ) -> None:
        if every < 0 or target_size <= 0:
            raise ValueError(f"stream compaction needs every >= 0 and target_size > 0, not {every}, {target_size}")
        self.every = every
        self.target_size = target_size
        self.query = query
        self.stagger = stagger  # False: every table's first round after ``every`` commits
        self._commits: dict[str, int] = {}

    def commits_to_first_round(self, table: LakeTable) -> int:
        """Commits of ``table`` from this object's start to its first round: 1..``every``, fixed per URI."""
        if not self.enabled:
            return 0
        return zlib.crc32(table.uri.encode()) % self.every + 1 if self.stagger else self.every

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def after_commit(self, table: LakeTable, result: CommitResult) -> CompactionRound | None:
        """Count the commit this writer just made to ``table`` (holding its lock; ``result`` says whether
        it made one) and, every ``every`` commits, compact it; the round, or None when none was due or
        it failed."""
        if not self.enabled or not result.committed:
            return None
        done = self._commits.get(table.uri)
        if done is None:  # this table's first commit here: start it where its first round falls
            done = self.every - self.commits_to_first_round(table)
        if done + 1 < self.every:
            self._commits[table.uri] = done + 1
            return None
        self._commits[table.uri] = 0
        try:
            with phase_clock.phase("compaction"):
                return self._compact(table)
        except (TidewaterError, DeltaError, OSError) as exc:
            log.warning("%s: compaction of %s failed, left to the next round: %s", self.query, table.uri, one_line(exc))
            return None

    def _compact(self, table: LakeTable) -> CompactionRound:
        started = time.perf_counter()
        delta = table.open()
        plan = compaction_plan(delta, self.target_size, min_files=self.every)
        removed = added = 0
        properties = CommitProperties(custom_metadata={"tidewater.query": self.query, "tidewater.step": "compact"})
        for values, _ in plan:
            # One task: the stream's other work keeps the second core of a small host.
            gone, new = compact_partition(
                delta, values, target_size=self.target_size, commit_properties=properties, max_concurrent_tasks=1
            )
            removed += gone
            added += new
        done = CompactionRound(table.uri, len(plan), removed, added, round(time.perf_counter() - started, 3))
        if plan:
            log.info(
                "%s: compacted %d files into %d in %d partition(s) of %s in %.2f s",
                self.query,
                removed,
                added,
                len(plan),
                table.uri,
                done.seconds,
            )
        return done
