"""Driver side of the lake: create tables, commit staged files idempotently, merge, replace, inspect.

Idempotency contract: a commit that carries ``(app_id, batch_id)`` records them as a Delta app
transaction. Before committing, :meth:`LakeTable.already_committed` compares the table's recorded
version for ``app_id`` with ``batch_id`` *in our code*, because delta-rs accepts an older version
and would even move the recorded version backwards. This makes a re-executed micro-batch a no-op.
It assumes one writer per (table, app_id) at a time, which the streaming runner guarantees.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, PostCommitHookProperties, Transaction

from tidewater.errors import LakePathError
from tidewater.lake.files import HIVE_NULL
from tidewater.lake.sql import range_filter
from tidewater.lake.storage import filesystem, storage_options

log = logging.getLogger(__name__)

# Tables that Spark reads through file lists must not use deletion vectors or column mapping.
DEFAULT_TABLE_CONFIGURATION = {
    "delta.enableDeletionVectors": "false",
    "delta.checkpointInterval": "20",
}


# What delta-rs does after each commit of ours: a log checkpoint every ``delta.checkpointInterval``
# commits, but not its expired-log cleanup, which by default runs after *every* commit and lists the
# whole ``_delta_log`` to find what it may delete: a cost that grows with every commit the table ever
# made (the log keeps 30 days, 86,400 commits a day at a 1 s trigger). Measured, delta-rs 1.6, 200-row
# appends, p50: 9.6 ms at 100 commits either way; at 3,000 commits 47-53 ms with it, 28 ms without (local
# files); on S3 (SeaweedFS) 24 -> 55 ms from 100 to 1,600 commits with it, 19 -> 27 ms without. The
# maintenance DAG deletes expired log files once a run instead (tidewater.batch.maintenance).
POST_COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


@dataclass(frozen=True)
class CommitResult:
    committed: bool  # False when the batch was already in the table (a replayed micro-batch)
    version: int
    files: int = 0
    rows: int = 0
    files_read: int | None = None  # a merge's: target files it scanned for matches


@dataclass(frozen=True)
class DataFile:
    """One live data file of a snapshot, with the partition values a reader must add back."""

    uri: str
    size: int
    partition_values: dict[str, str | None]
    num_records: int | None = None


def num_records_of(stats: str | None) -> int | None:
    """The rows of a data file as its add action's statistics (JSON) record them; None without them."""
    if not stats:
        return None
    try:
        count = json.loads(stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None


def read_data_file(data_file: DataFile, schema: pa.Schema, columns: Sequence[str] | None = None) -> pa.Table:
    """One data file in ``schema`` (or only its ``columns``), partition columns added back from the log."""
    names = list(columns) if columns is not None else schema.names
    fs, path = filesystem(data_file.uri)
    table = pq.read_table(path, filesystem=fs, columns=[n for n in names if n not in data_file.partition_values])
    for name, value in data_file.partition_values.items():
        if name in names and name not in table.column_names:
            raw = None if value in (None, HIVE_NULL) else value
            table = table.append_column(
                name, pa.array([raw] * table.num_rows, pa.string()).cast(schema.field(name).type)
            )
    return table.select(names).cast(pa.schema([schema.field(name) for name in names]))


def add_actions(table: DeltaTable) -> pa.Table:
    """The add actions of an opened snapshot's live files, flattened (``partition.<col>``,
    ``min.<col>``, ...), as a pyarrow Table.

    Taken through the Arrow C stream: ``pa.table(...)`` (like any pyarrow constructor of data) imports
    pandas, ~27 MiB per process, which a stream's Delta source runners otherwise never load."""
    return pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()


class LakeTable:
    """A Delta table at ``uri`` (file:// or s3://). Cheap to construct; opens lazily."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self._options = storage_options(self.uri)

    def __repr__(self) -> str:
        return f"LakeTable({self.uri!r})"

    # ---- lifecycle ------------------------------------------------------------------------------

    def exists(self) -> bool:
        try:
            DeltaTable(self.uri, storage_options=self._options)
            return True
        except TableNotFoundError:
            return False
        except (OSError, DeltaError) as exc:
            raise LakePathError(f"cannot read table {self.uri}: {_brief(exc)}") from None

    def ensure(
        self,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        description: str | None = None,
    ) -> DeltaTable:
        """Create the table if it does not exist; otherwise check the declared schema still fits."""
        try:
            table = DeltaTable.create(
                self.uri,
                schema,
                mode="ignore",
                partition_by=list(partition_by) or None,
                description=description,
                configuration=DEFAULT_TABLE_CONFIGURATION,
                storage_options=self._options,
            )
        except (OSError, DeltaError) as exc:  # deltalake's errors are not OSErrors
            raise LakePathError(
                f"cannot create table {self.uri}: {_brief(exc)} - check the lake root exists "
                "and is writable (TIDEWATER_LAKE_ROOT)"
            ) from None
        existing = set(self.arrow_schema(table).names)
        missing = [name for name in schema.names if name not in existing]
        if missing:
            raise LakePathError(
                f"table {self.uri} exists without columns {missing}: it belongs to another schema version; "
                "migrate it or point the pipeline at a new namespace"
            )
        return table

    def open(self, *, version: int | None = None, timestamp: dt.datetime | str | None = None) -> DeltaTable:
        try:
            table = DeltaTable(self.uri, version=version, storage_options=self._options)
        except TableNotFoundError:
            raise LakePathError(f"no Delta table at {self.uri}") from None
        except (OSError, DeltaError) as exc:
            raise LakePathError(f"cannot read table {self.uri}: {_brief(exc)}") from None
        if timestamp is not None:
            table.load_as_version(timestamp)
        return table

    # ---- metadata -------------------------------------------------------------------------------

    @staticmethod
    def arrow_schema(table: DeltaTable) -> pa.Schema:
        return pa.schema(table.schema().to_arrow())

    def version(self) -> int:
        return int(self.open().version())

    def committed_version(self, app_id: str, table: DeltaTable | None = None) -> int | None:
        table = table or self.open()
        found = table.transaction_version(app_id)
        return None if found is None else int(found)

    def already_committed(self, app_id: str, batch_id: int, table: DeltaTable | None = None) -> bool:
        recorded = self.committed_version(app_id, table)
        return recorded is not None and recorded >= batch_id

    def files(self, *, version: int | None = None, timestamp: dt.datetime | str | None = None) -> list[DataFile]:
        """Live data files of a snapshot, with partition values (the log's view, not a directory listing)."""
        return self.files_of(self.open(version=version, timestamp=timestamp))

    def files_of(self, table: DeltaTable) -> list[DataFile]:
        """Live data files of an opened snapshot."""
        actions = add_actions(table)
        partition_columns = [c for c in actions.column_names if c.startswith("partition.")]
        # Only the columns used: a timestamp column's to_pylist() imports pandas too.
        used = [
            "path",
            "size_bytes",
            *partition_columns,
            *(["num_records"] if "num_records" in actions.column_names else []),
        ]
        return [
            DataFile(
                f"{self.uri}/{row['path']}",
                int(row["size_bytes"]),
                {c.removeprefix("partition."): _text(row.get(c)) for c in partition_columns},
                row.get("num_records"),
            )
            for row in actions.select(used).to_pylist()
        ]

    def lookup(self, column: str, values: pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows of the current snapshot whose ``column`` is one of ``values`` (on the driver, no Spark).

        Reads the column of every live file (vectorised, with the log's file list, so old versions
        never leak in) and the other columns only of matching rows: the stream's de-duplication by
        key, which no partition or file statistic can narrow for random keys.
        """
        table = self.open()
        if len(values) == 0:
            empty = self.arrow_schema(table).empty_table()
            return empty.select(list(columns)) if columns else empty
        dataset = table.to_pyarrow_dataset()
        return dataset.to_table(
            columns=list(columns) if columns else None,
            filter=pc.field(column).isin(values.unique()),
        )

    def read_where(self, condition: pc.Expression) -> pa.Table:
        """Rows of the current snapshot matching ``condition``, on the driver (no Spark), in the table's
        column types; file statistics skip files that cannot match."""
        table = self.open()
        schema = self.arrow_schema(table)
        return table.to_pyarrow_dataset().to_table(filter=condition).select(schema.names).cast(schema)

    def row_count(self) -> int:
        """Rows in the current snapshot, from file statistics (no data is read)."""
        return sum(f.num_records or 0 for f in self.files())

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return self.open().history(limit)

    # ---- writes ---------------------------------------------------------------------------------

    def commit_files(
        self,
        actions: Sequence[dict[str, Any]],
        *,
        mode: str = "append",
        partition_filters: list[tuple[str, str, Any]] | None = None,
        app_id: str | None = None,
        batch_id: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CommitResult:
        """Commit files staged by :func:`tidewater.lake.files.write_data_files` in one transaction.

        ``mode="overwrite"`` with ``partition_filters`` atomically replaces those partitions
        (the batch recompute's "overwrite exactly this interval").
        """
        table = self.open()
        if app_id is not None and batch_id is not None and self.already_committed(app_id, batch_id, table):
            log.info("skip %s batch %s for %s: already committed", app_id, batch_id, self.uri)
            return CommitResult(False, int(table.version()))
        if not actions and mode == "append":
            return CommitResult(False, int(table.version()))
        adds = [
            AddAction(
                path=a["path"],
                size=int(a["size"]),
                partition_values=dict(a["partition_values"] or {}),
                modification_time=int(a["modification_time"]),
                data_change=True,
                stats=a["stats"],
            )
            for a in actions
        ]
        table.create_write_transaction(
            adds,
            mode=mode,
            schema=table.schema(),
            partition_by=table.metadata().partition_columns or None,
            partition_filters=partition_filters,
            commit_properties=self._commit_properties(app_id, batch_id, metadata),
            post_commithook_properties=POST_COMMIT_HOOKS,
        )
        table.update_incremental()  # unlike a write or a merge, a transaction leaves ``table`` where it was
        rows = sum(num_records_of(a["stats"]) or 0 for a in actions)
        return CommitResult(True, int(table.version()), len(adds), rows)

    def merge(
        self,
        source: pa.Table,
        *,
        keys: Sequence[str],
        app_id: str | None = None,
        batch_id: int | None = None,
        metadata: dict[str, Any] | None = None,
        update: bool = True,
        keep: Sequence[str] = (),
        range_keys: Sequence[str] = (),
        target_filter: str | None = None,
        delete: pa.Table | None = None,
    ) -> CommitResult:
        """Upsert ``source`` on ``keys`` (or insert-only when ``update`` is False); a matched row keeps
        its values of the ``keep`` columns. Rows matching a key of ``delete`` (key columns only) are
        deleted in the same commit.

        The merge reads only the files that can hold a match. delta-rs prunes no file on the key
        equality alone: it read every file of the table on every merge, so a gold table's merge grew
        with all the table ever held (measured: 10k-row merges, 37 ms at 1 file, 357 ms at 136).
        ``range_keys`` (key columns of ``source``, see :func:`tidewater.lake.sql.range_filter`) bound
        the target side to the least..greatest value ``source`` holds of each, and ``target_filter``
        (SQL on alias ``t``) further.
        """
        if not set(range_keys) <= set(keys):
            raise ValueError(f"range_keys {list(range_keys)} must be among the merge keys {list(keys)}")
        deleting = delete is not None and delete.num_rows > 0
        if deleting:
            source = source.cast(pa.schema([f.with_nullable(True) for f in source.schema]))  # deletions: nulls
            source = pa.concat_tables(
                [source.append_column(_DELETE, pa.repeat(False, source.num_rows)), _deletions(delete, source.schema)]
            )
        table, source, skipped = self._prepare_arrow_write(
            source, app_id, batch_id, allow_empty=False, extra=(_DELETE,) if deleting else ()
        )
        if skipped is not None:
            return skipped
        predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        for bound in (range_filter(source, range_keys, alias="t"), target_filter):
            if bound:
                predicate += f" AND ({bound})"
        merger = table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=self._commit_properties(app_id, batch_id, metadata),
            post_commithook_properties=POST_COMMIT_HOOKS,
        )
        columns = [c for c in source.schema.names if c != _DELETE]
        only_upserts = f"NOT s.`{_DELETE}`" if deleting else None
        if deleting:
            merger = merger.when_matched_delete(predicate=f"s.`{_DELETE}`")
        if update:
            kept = [c for c in columns if c not in keep]
            merger = merger.when_matched_update(updates={f"`{c}`": f"s.`{c}`" for c in kept}, predicate=only_upserts)
        metrics = merger.when_not_matched_insert(
            updates={f"`{c}`": f"s.`{c}`" for c in columns}, predicate=only_upserts
        ).execute()  # updates ``table`` to the version it committed: no second read of the log
        scanned = metrics.get("num_target_files_scanned")
        return CommitResult(True, int(table.version()), rows=source.num_rows, files_read=scanned)

    def append_arrow(
        self,
        source: pa.Table,
        *,
        app_id: str | None = None,
        batch_id: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CommitResult:
        """Append a small Arrow table from the driver (delta-rs writes the files) in one commit."""
        table, source, skipped = self._prepare_arrow_write(source, app_id, batch_id, allow_empty=False)
        if skipped is not None:
            return skipped
        write_deltalake(
            table,
            source,
            mode="append",
            commit_properties=self._commit_properties(app_id, batch_id, metadata),
            post_commithook_properties=POST_COMMIT_HOOKS,
        )  # delta-rs updates ``table`` to the version it committed
        return CommitResult(True, int(table.version()), rows=source.num_rows)

    def replace_where(
        self,
        source: pa.Table,
        predicate: str,
        *,
        app_id: str | None = None,
        batch_id: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CommitResult:
        """Atomically replace the rows matching ``predicate`` with ``source`` (Delta replaceWhere)."""
        table, source, skipped = self._prepare_arrow_write(source, app_id, batch_id, allow_empty=True)
        if skipped is not None:
            return skipped
        write_deltalake(
            table,
            source,
            mode="overwrite",
            predicate=predicate,
            commit_properties=self._commit_properties(app_id, batch_id, metadata),
            post_commithook_properties=POST_COMMIT_HOOKS,
        )  # delta-rs updates ``table`` to the version it committed
        return CommitResult(True, int(table.version()), rows=source.num_rows)

    def _prepare_arrow_write(
        self,
        source: pa.Table,
        app_id: str | None,
        batch_id: int | None,
        *,
        allow_empty: bool,
        extra: Sequence[str] = (),
    ) -> tuple[DeltaTable, pa.Table, CommitResult | None]:
        """Open the table; say "skip" for an already committed batch (or an empty source unless
        ``allow_empty``); otherwise return the source in the table's column order and types (plus the
        ``extra`` columns of the source, as they are)."""
        table = self.open()
        committed = app_id is not None and batch_id is not None and self.already_committed(app_id, batch_id, table)
        if committed or (source.num_rows == 0 and not allow_empty):
            return table, source, CommitResult(False, int(table.version()))
        schema = self.arrow_schema(table)
        for name in extra:
            schema = schema.append(source.schema.field(name))
        return table, source.select(schema.names).cast(schema), None

    @staticmethod
    def _commit_properties(
        app_id: str | None, batch_id: int | None, metadata: dict[str, Any] | None
    ) -> CommitProperties:
        txns = [Transaction(app_id=app_id, version=batch_id)] if app_id is not None and batch_id is not None else None
        return CommitProperties(custom_metadata=metadata or None, app_transactions=txns)

    # ---- the log, version by version ---------------------------------------------------------------

    def commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of one commit from ``_delta_log``, or None if that log file is gone."""
        fs, root = filesystem(self.uri)
        path = f"{root}/_delta_log/{version:020d}.json"
        try:
            with fs.open_input_stream(path) as stream:
                text = stream.read().decode("utf-8")
        except (FileNotFoundError, OSError):
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]


# The merge source's flag for rows to delete (see LakeTable.merge).
_DELETE = "_tidewater_delete"


def _deletions(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """Key rows to delete, in the merge source's schema: other columns null, the delete flag set."""
    columns = {
        f.name: keys.column(f.name).cast(f.type) if f.name in keys.column_names else pa.nulls(keys.num_rows, f.type)
        for f in schema
    }
    return pa.table({**columns, _DELETE: pa.repeat(True, keys.num_rows)})


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _brief(exc: BaseException) -> str:
    """delta-rs errors span lines (cause chains): fold them into one short line."""
    return " ".join(str(exc).split())[:300]


def check_lake_root(uri: str) -> None:
    """The lake root must exist (or be creatable) and be a directory/bucket we can list."""
    fs, path = filesystem(uri)
    try:
        if uri.startswith("file://"):
            fs.create_dir(path, recursive=True)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            raise LakePathError(f"lake root {uri} is a file, not a directory: fix TIDEWATER_LAKE_ROOT")
        if uri.startswith("file://") and not os.access(path, os.W_OK):
            raise LakePathError(
                f"lake root {uri} is not writable by this user: fix its permissions or TIDEWATER_LAKE_ROOT"
            )
        fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except LakePathError:
        raise
    except OSError as exc:
        raise LakePathError(
            f"cannot use lake root {uri}: {_brief(exc)} - check TIDEWATER_LAKE_ROOT and credentials"
        ) from None
