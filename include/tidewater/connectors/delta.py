"""Spark Python data source ``tidewater-delta``: Delta tables through delta-rs, no JVM jars needed.

* batch read   ``spark.read.format("tidewater-delta").load(uri)``, with ``versionAsOf`` or
               ``timestampAsOf`` for time travel (file:// tables are usually read faster through
               :func:`tidewater.lake.reads.read_table`, which hands the file list to Spark's own
               Parquet reader; this reader is what works on s3://).
* stream read  rows appended since the last processed table version, so silver is computed from
               bronze and gold from silver without re-reading Kafka. Offsets are positions in the
               log (:class:`StreamPosition`). Commits that remove data (overwrite, delete, merge
               updates) cannot be followed by an append-only stream: they fail the query unless
               ``skipChangeCommits`` is true, as in Delta's own streaming source.
               ``dataChange=false`` commits (compaction) are ignored. ``maxFilesPerTrigger`` bounds a
               micro-batch in files (whole versions), ``maxRowsPerTrigger`` in rows (a soft bound, as
               Delta's ``maxBytesPerTrigger``: it ends with the data file that reaches it, inside a
               version or the first snapshot too). With ``prefetch`` true the query's source
               runner on the driver reads each micro-batch ahead (at most
               ``prefetchMaxBytes`` of data files, 32 MiB by default) and Spark keeps it in its block
               manager: no Python task per micro-batch, which is most of the cost of a small one
               (gold over silver every few seconds). Spark reports no latest offset for such a
               source, so its progress shows no lag.
* stream write executors write Parquet files; the driver commits each micro-batch in one Delta
               transaction carrying the app transaction ``(appId, batchId)`` and skips a batch
               that is already committed. Option ``appId`` is required and must be stable for
               the query's checkpoint. With ``lockPath`` (flock) or ``lockDsn`` + ``lockName``
               (PostgreSQL) the commit holds that table lock (:mod:`tidewater.lake.lock_options`;
               ``lockTimeoutSeconds``, default 900).

Credentials for s3:// come from the environment (see :mod:`tidewater.lake.storage`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tidewater import faults
from tidewater.connectors.options import flag, option, whole_number
from tidewater.errors import ConfigError, DeltaSourceError
from tidewater.lake.files import write_data_files
from tidewater.lake.lock_options import lock_from_options
from tidewater.lake.locks import WriterLock, holding
from tidewater.lake.tables import DataFile, LakeTable, num_records_of, read_data_file

SOURCE_NAME = "tidewater-delta"
PREFETCH_MAX_BYTES = 32 * 1024 * 1024  # of Parquet per prefetched micro-batch (~600k silver rows of rsvps)


@dataclass(frozen=True)
class StreamPosition:
    """How far a stream of a table has read; its offset is :meth:`offset`.

    ``{"version": v}``: every commit up to and including v. ``{"version": v, "file": k}``: every
    commit before v and the first k data files v added; with ``"snapshot": true``, the first k files
    of the table as of v (a new stream's first read, in path order). A reader stops inside a version
    for its row bound (``maxRowsPerTrigger``) and the prefetching one for its byte budget too; either
    reader resumes from either form.
    """

    version: int
    file: int | None = None
    snapshot: bool = False

    @classmethod
    def of(cls, offset: dict) -> StreamPosition:
        file = offset.get("file")
        return cls(int(offset["version"]), None if file is None else int(file), bool(offset.get("snapshot")))

    def offset(self) -> dict:
        if self.file is None:
            return {"version": self.version}
        return {"version": self.version, "file": self.file} | ({"snapshot": True} if self.snapshot else {})


@dataclass(frozen=True)
class FileSlice(InputPartition):
    """One Spark task: a few data files read with pyarrow."""

    files: tuple[DataFile, ...]


def _rows_toward(bound: int, data_file: DataFile) -> int:
    """What ``data_file`` counts toward a row bound: its rows, or, where the log does not record them,
    the whole bound (a micro-batch of its own)."""
    return bound if data_file.num_records is None else data_file.num_records


def _path(options: Any) -> str:
    path = option(options, "path")
    if not path:
        raise ConfigError("tidewater-delta needs a table path: .load(uri) / .option('path', uri)")
    return path


def read_files(files: Sequence[DataFile], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Read data files, add their partition columns back, yield batches in ``schema``."""
    for data_file in files:
        yield from read_data_file(data_file, schema).to_batches(max_chunksize=65_536)


def group_files(files: Sequence[DataFile], *, target_bytes: int = 128 * 1024 * 1024) -> list[FileSlice]:
    """Pack files into Spark partitions of roughly ``target_bytes``."""
    slices: list[FileSlice] = []
    current: list[DataFile] = []
    size = 0
    for data_file in files:
        current.append(data_file)
        size += data_file.size
        if size >= target_bytes:
            slices.append(FileSlice(tuple(current)))
            current, size = [], 0
    if current:
        slices.append(FileSlice(tuple(current)))
    return slices


class DeltaBatchReader(DataSourceReader):
    def __init__(
        self,
        table: LakeTable,
        schema: pa.Schema,
        version: int | None,
        timestamp: str | None,
        partition_filter: dict[str, list[str]] | None = None,
    ) -> None:
        from tidewater.lake.reads import select_files

        self.schema = schema
        self.slices = group_files(select_files(table.files(version=version, timestamp=timestamp), partition_filter))

    def partitions(self) -> Sequence[InputPartition]:
        return self.slices

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FileSlice):  # Spark plans one InputPartition(None) when there are no files
            return iter(())
        return read_files(partition.files, self.schema)


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: ``{"version": v}`` = every commit up to and including v has been processed."""

    def __init__(self, table: LakeTable, schema: pa.Schema, options: Any) -> None:
        self.table = table
        self.schema = schema
        self.starting = (option(options, "startingVersion", "earliest") or "earliest").lower()
        self.skip_change_commits = flag(options, "skipChangeCommits")
        self.max_files = whole_number(options, "maxFilesPerTrigger", source=SOURCE_NAME)
        self.max_rows = whole_number(options, "maxRowsPerTrigger", source=SOURCE_NAME)
        self._target: int | None = None

    def initialOffset(self) -> dict:
        if self.starting == "earliest":
            return {"version": -1}
        if self.starting == "latest":
            return {"version": self.table.version()}
        try:
            return {"version": int(self.starting) - 1}
        except ValueError:
            raise ConfigError(f"startingVersion={self.starting!r} must be earliest, latest or a version") from None

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows:  # with maxFilesPerTrigger too, both bound the micro-batch (latestOffset)
            return ReadMaxRows(self.max_rows)
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.table.version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = StreamPosition.of(start).version
        latest = self.readable_version()
        if latest <= begin:
            return {"version": begin}
        if isinstance(limit, ReadMaxRows):
            return self._bounded_by_rows(StreamPosition.of(start), latest, limit.max_rows)
        if isinstance(limit, ReadMaxFiles) and begin >= 0:
            files = 0
            for version in range(begin + 1, latest + 1):
                files += len(self._added(version))
                if files >= limit.max_files:
                    return {"version": version}
        return {"version": latest}

    def _bounded_by_rows(self, begin: StreamPosition, latest: int, max_rows: int) -> dict:
        """The offset after the data file that brings the micro-batch to ``max_rows`` rows (or to
        ``maxFilesPerTrigger`` files), else ``latest``."""
        rows = 0
        for files, (position, data_file) in enumerate(self.files_after(begin, latest), start=1):
            rows += _rows_toward(max_rows, data_file)
            if rows >= max_rows or (self.max_files and files >= self.max_files):
                return position.offset()
        return {"version": latest}

    def readable_version(self) -> int:
        """The newest version a micro-batch may read: the table's, or the one Trigger.AvailableNow started at."""
        latest = self.table.version()
        return latest if self._target is None else min(latest, self._target)

    def reportLatestOffset(self) -> dict | None:
        return {"version": self.table.version()}

    def _added(self, version: int) -> list[DataFile]:
        actions = self.table.commit_actions(version)
        if actions is None:
            raise DeltaSourceError(
                f"version {version} of {self.table.uri} is no longer in the Delta log (log retention); the "
                "stream cannot continue exactly: recompute downstream with the batch job and restart the stream "
                "from a new checkpoint with startingVersion=latest"
            )
        adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        removes = [a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)]
        if removes:
            if self.skip_change_commits:
                return []
            operation = next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), "?")
            raise DeltaSourceError(
                f"version {version} of {self.table.uri} removed data ({operation}); a stream follows appends "
                "only: set skipChangeCommits=true to ignore such commits, or restart from a new checkpoint"
            )
        return [
            DataFile(
                f"{self.table.uri}/{add['path']}",
                int(add.get("size", 0)),
                dict(add.get("partitionValues") or {}),
                num_records_of(add.get("stats")),
            )
            for add in adds
        ]

    def _snapshot(self, version: int) -> list[DataFile]:
        return sorted(self.table.files(version=version), key=lambda f: f.uri)

    def files_after(self, start: StreamPosition, stop: int) -> Iterator[tuple[StreamPosition, DataFile]]:
        """Each data file after ``start`` up to version ``stop``, with the position once it is read (a
        version's last file gives the version's whole form). A new stream's first read is the snapshot
        at ``stop``."""

        def numbered(
            version: int, files: list[DataFile], first: int, snapshot: bool
        ) -> Iterator[tuple[StreamPosition, DataFile]]:
            for index in range(first, len(files)):
                whole = index + 1 == len(files)
                yield StreamPosition(version) if whole else StreamPosition(version, index + 1, snapshot), files[index]

        if start.file is not None:
            files = self._snapshot(start.version) if start.snapshot else self._added(start.version)
            yield from numbered(start.version, files, start.file, start.snapshot)
        elif start.version < 0:
            if stop >= 0:
                yield from numbered(stop, self._snapshot(stop), 0, True)
            return
        for version in range(start.version + 1, stop + 1):
            yield from numbered(version, self._added(version), 0, False)

    def files_between(self, start: dict, end: dict) -> list[DataFile]:
        """The data files of the micro-batch from offset ``start`` to offset ``end``."""
        begin, stop = StreamPosition.of(start), StreamPosition.of(end)
        files: list[DataFile] = []
        if stop == begin:
            return files
        for position, data_file in self.files_after(begin, stop.version):
            files.append(data_file)
            if position == stop:
                break
        return files

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return group_files(self.files_between(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FileSlice):  # Spark plans one InputPartition(None) when there are no files
            return iter(())
        return read_files(partition.files, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to release: Delta versions are immutable."""


class DeltaPrefetchingStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """The same stream read on the driver, ahead of each micro-batch (option ``prefetch``).

    Spark asks :meth:`read` for the data after an offset when it plans a micro-batch (in the query's
    source runner, a Python process on the driver) and keeps the Arrow batches in its block manager, so
    the micro-batch runs no Python task. At most ``max_bytes`` of data files (and ``maxFilesPerTrigger``
    files, and ``maxRowsPerTrigger`` rows, as :class:`DeltaStreamReader` counts them) are read at a
    time, even inside one version, so a new stream over a large table does not hold the table in
    memory. Spark re-plans a micro-batch whose prefetch it no longer has (a restart) with
    :meth:`readBetweenOffsets`, in a Python task: the same files, since the log is immutable.
    """

    def __init__(self, follower: DeltaStreamReader, *, max_bytes: int) -> None:
        self.follower = follower
        self.max_bytes = max_bytes

    def initialOffset(self) -> dict:
        return self.follower.initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.follower.prepareForTriggerAvailableNow()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        begin = StreamPosition.of(start)
        stop = self.follower.readable_version()
        max_files, max_rows = self.follower.max_files, self.follower.max_rows
        files: list[DataFile] = []
        size, rows, end = 0, 0, begin
        for position, data_file in self.follower.files_after(begin, stop):
            if files and (
                size + data_file.size > self.max_bytes
                or (max_files and len(files) >= max_files)
                or (max_rows and rows >= max_rows)
            ):
                break
            files.append(data_file)
            size += data_file.size
            rows += _rows_toward(max_rows or 0, data_file)
            end = position
        else:  # everything up to stop, including commits that added no data
            end = StreamPosition(max(stop, begin.version))
        # A list's iterator: Spark copies it to replay a micro-batch from its prefetch.
        return iter(list(read_files(files, self.follower.schema))), end.offset()

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        return iter(list(read_files(self.follower.files_between(start, end), self.follower.schema)))

    def commit(self, end: dict) -> None:
        """Nothing to release: Delta versions are immutable."""


@dataclass
class StagedFiles(WriterCommitMessage):
    actions: list[dict[str, Any]]


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(
        self,
        table: LakeTable,
        schema: pa.Schema,
        partition_by: list[str],
        app_id: str,
        query_name: str,
        lock: WriterLock | None = None,
    ) -> None:
        self.query_name = query_name
        self.table = table
        self.schema = schema
        self.partition_by = partition_by
        self.app_id = app_id
        self.lock = lock

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return StagedFiles(
            write_data_files(self.table.uri, iterator, schema=self.schema, partition_by=self.partition_by)
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        actions = [a for m in messages if isinstance(m, StagedFiles) for a in m.actions]
        with holding(self.lock, f"{self.query_name} batch {batchId}"):
            result = self.table.commit_files(
                actions,
                app_id=self.app_id,
                batch_id=batchId,
                metadata={"tidewater.query": self.query_name, "tidewater.batch_id": batchId},
            )
        if result.committed:
            faults.after_commit(self.query_name, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Staged files stay uncommitted and invisible; vacuum removes them."""


class DeltaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _table(self) -> LakeTable:
        return LakeTable(_path(self.options))

    def _arrow_schema(self) -> pa.Schema:
        table = self._table()
        version = option(self.options, "versionAsOf")
        timestamp = option(self.options, "timestampAsOf")
        return LakeTable.arrow_schema(table.open(version=int(version) if version else None, timestamp=timestamp))

    def schema(self) -> Any:
        return from_arrow_schema(self._arrow_schema())

    def reader(self, schema: Any) -> DataSourceReader:
        version = option(self.options, "versionAsOf")
        return DeltaBatchReader(
            self._table(),
            self._arrow_schema(),
            int(version) if version else None,
            option(self.options, "timestampAsOf"),
            json.loads(option(self.options, "partitionFilter") or "null"),
        )

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if flag(self.options, "prefetch"):
            # Spark's way to ask for the driver-side reader instead (simpleStreamReader)
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return DeltaStreamReader(self._table(), self._arrow_schema(), self.options)

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        max_bytes = whole_number(self.options, "prefetchMaxBytes", source=SOURCE_NAME, default=PREFETCH_MAX_BYTES)
        follower = DeltaStreamReader(self._table(), self._arrow_schema(), self.options)
        return DeltaPrefetchingStreamReader(follower, max_bytes=max_bytes)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        app_id = option(self.options, "appId")
        if not app_id:
            raise ConfigError(
                "the tidewater-delta stream sink needs option appId, stable for the query's checkpoint, "
                "so that a re-executed micro-batch is recognised and skipped"
            )
        table = self._table()
        meta = table.open().metadata()
        named = ("lockPath", "lockDsn", "lockName", "lockTimeoutSeconds")
        lock = lock_from_options({k: v for k in named if (v := option(self.options, k))}, table.uri)
        return DeltaStreamWriter(
            table,
            LakeTable.arrow_schema(table.open()),
            list(meta.partition_columns),
            app_id,
            option(self.options, "queryName", app_id) or app_id,
            lock,
        )
