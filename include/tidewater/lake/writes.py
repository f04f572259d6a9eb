"""Spark DataFrames into Delta tables: append, overwrite partitions, replace where, merge.

Appends and partition overwrites stay distributed: executors write Parquet files
(``mapInArrow``), the driver commits their add actions in one transaction. Merges and
replace-where go through delta-rs on the driver, which suits their inputs (aggregates, one
interval of gold). Every write can carry ``(app_id, batch_id)`` and is then idempotent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from tidewater import phase_clock
from tidewater.lake.files import ADD_ACTION_DDL, actions_from_rows, actions_to_batch, write_data_files
from tidewater.lake.tables import CommitResult, LakeTable


def stage_files(df: DataFrame, table: LakeTable) -> list[dict[str, Any]]:
    """Write ``df`` as data files of ``table`` on the executors; return their add actions."""
    snapshot = table.open()
    schema = LakeTable.arrow_schema(snapshot)
    partition_by = list(snapshot.metadata().partition_columns)
    uri = table.uri

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        actions = write_data_files(uri, batches, schema=schema, partition_by=partition_by)
        if actions:
            yield actions_to_batch(actions)

    return actions_from_rows(df.select(*schema.names).mapInArrow(write, ADD_ACTION_DDL).collect())


def _already_committed(table: LakeTable, app_id: str | None, batch_id: int | None) -> bool:
    return app_id is not None and batch_id is not None and table.already_committed(app_id, batch_id)


def append(
    df: DataFrame,
    table: LakeTable,
    *,
    app_id: str | None = None,
    batch_id: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> CommitResult:
    if _already_committed(table, app_id, batch_id):  # skip the Spark job too
        return CommitResult(False, table.version())
    with phase_clock.phase("write files"):  # the whole Spark job: its input's plan runs here
        actions = stage_files(df, table)
    with phase_clock.phase("commit"):
        return table.commit_files(actions, app_id=app_id, batch_id=batch_id, metadata=metadata)


def overwrite_partitions(
    df: DataFrame,
    table: LakeTable,
    partition_filters: list[tuple[str, str, Any]],
    *,
    app_id: str | None = None,
    batch_id: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> CommitResult:
    """Atomically replace the partitions selected by ``partition_filters`` with ``df``."""
    if _already_committed(table, app_id, batch_id):  # skip the Spark job too
        return CommitResult(False, table.version())
    return table.commit_files(
        stage_files(df, table),
        mode="overwrite",
        partition_filters=partition_filters,
        app_id=app_id,
        batch_id=batch_id,
        metadata=metadata,
    )


def merge(
    df: DataFrame,
    table: LakeTable,
    *,
    keys: Sequence[str],
    keep: Sequence[str] = (),
    app_id: str | None = None,
    batch_id: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> CommitResult:
    if _already_committed(table, app_id, batch_id):
        drain(df)
        return CommitResult(False, table.version())
    with phase_clock.phase("rows to driver"):  # the whole Spark job (a stream's state operators run here)
        rows = df.toArrow()
    with phase_clock.phase("merge"):
        return table.merge(rows, keys=keys, keep=keep, app_id=app_id, batch_id=batch_id, metadata=metadata)


def drain(df: DataFrame) -> None:
    """Run ``df``'s plan to the end and discard the rows (Spark's ``noop`` sink).

    A micro-batch whose commit the table already holds is re-run by Spark after a crash; skipping it
    would leave the batch's stateful operators (a stream-stream join's state stores) uncommitted, and
    Spark 4 fails the query for that (STATE_STORE_COMMIT_VALIDATION_FAILED). Draining commits the
    state exactly as the first run did (same input, same plan) and writes nothing.
    """
    df.write.format("noop").mode("overwrite").save()


def replace_where(
    df: DataFrame,
    table: LakeTable,
    predicate: str,
    *,
    app_id: str | None = None,
    batch_id: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> CommitResult:
    if _already_committed(table, app_id, batch_id):  # skip the Spark job too
        return CommitResult(False, table.version())
    return table.replace_where(df.toArrow(), predicate, app_id=app_id, batch_id=batch_id, metadata=metadata)
