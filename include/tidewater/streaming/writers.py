"""foreachBatch writers: one micro-batch -> one idempotent Delta commit per table.

Spark re-executes a micro-batch after a crash with the same batch id and the same input (its
offset log is written before the batch runs). Each commit carries ``(app_id, batch_id)``; a
table that already has it skips the write. Silver and quarantine are two tables written from
one batch: each is skipped or written on its own, so a crash between them heals on re-run.
Each commit is made holding the table's lock (:mod:`tidewater.lake.locks`), so a batch
recompute or correction of the same live table never interleaves with it.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from tidewater.lake import writes
from tidewater.lake.locks import TableLock, holding
from tidewater.lake.tables import LakeTable
from tidewater.pipelines.base import GoldTable, Pipeline
from tidewater.streaming import faults

log = logging.getLogger(__name__)


class SilverWriter:
    """Bronze rows -> silver (valid, first per key) + quarantine (invalid, with the reason).

    Parsing, validation and in-batch de-duplication are the pipeline's pure Spark transforms. The
    results (one micro-batch: small) go to the driver, where delta-rs commits them: quarantine as
    an append, silver as an insert-only MERGE on (event date, key), so a duplicate is dropped
    however late it arrives. Two Spark jobs and no cross-batch shuffle per micro-batch. Events
    behind a gold watermark are *kept* here: that is what lets the late-data correction use them.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        silver: LakeTable,
        quarantine: LakeTable,
        app_id: str,
        query: str,
        locks: dict[str, TableLock] | None = None,
    ):
        self.pipeline = pipeline
        self.silver = silver
        self.quarantine = quarantine
        self.app_id = app_id
        self.query = query  # the label of this step ("<namespace>.<pipeline>.silver") in logs and faults
        self.locks = locks or {}

    def __call__(self, bronze_batch: DataFrame, batch_id: int) -> None:
        silver_done = self.silver.already_committed(self.app_id, batch_id)
        quarantine_done = self.quarantine.already_committed(self.app_id, batch_id)
        if silver_done and quarantine_done:
            log.info("%s batch %s already committed: skipped", self.query, batch_id)
            return
        parsed = self.pipeline.parse(bronze_batch).persist()
        try:
            meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
            if not quarantine_done:
                rejected = self.pipeline.quarantine(parsed).toArrow()
                with holding(self.locks.get("quarantine"), f"{self.query} batch {batch_id}"):
                    self.quarantine.append_arrow(rejected, app_id=self.app_id, batch_id=batch_id, metadata=meta)
            if not silver_done:
                fresh = self.pipeline.dedup(self.pipeline.silver(parsed)).toArrow()
                part = self.pipeline.partition_column
                dates = sorted({str(d) for d in fresh.column(part).to_pylist() if d is not None})
                with holding(self.locks.get("silver"), f"{self.query} batch {batch_id}"):
                    self.silver.merge(
                        fresh,
                        keys=(part, self.pipeline.key),
                        update=False,
                        prune={part: dates},
                        target_filter=event_time_range(fresh, self.pipeline.event_time),
                        app_id=self.app_id,
                        batch_id=batch_id,
                        metadata=meta,
                    )
        finally:
            parsed.unpersist()
        faults.after_commit(self.query, batch_id)


def event_time_range(rows: pa.Table, column: str) -> str | None:
    """``t.<column>`` within the batch's event-time range. A duplicate carries its original's event
    time, so this loses no match, and it lets delta-rs skip every silver file outside the range
    (file statistics) instead of scanning whole date partitions as silver grows."""
    if rows.num_rows == 0:
        return None
    low, high = pc.min_max(rows.column(column)).values()
    if not low.is_valid:
        return None
    iso = "%Y-%m-%dT%H:%M:%S.%fZ"
    return f"t.`{column}` >= '{low.as_py().strftime(iso)}' AND t.`{column}` <= '{high.as_py().strftime(iso)}'"


class BronzeSilverWriter:
    """Kafka records -> bronze, then silver + quarantine from those very bronze rows, in one micro-batch.

    The default streaming topology: silver is computed from bronze rows (never from Kafka directly)
    without waiting for another query to poll the bronze table, which saves a trigger cycle of
    latency and a second read of every record. Each table keeps its own idempotent commit.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        bronze: LakeTable,
        silver: SilverWriter,
        app_id: str,
        query: str,
        lock: TableLock | None = None,
    ):
        self.pipeline = pipeline
        self.bronze = bronze
        self.silver = silver
        self.app_id = app_id
        self.query = query
        self.lock = lock

    def __call__(self, kafka_batch: DataFrame, batch_id: int) -> None:
        from tidewater import transforms

        bronze_rows = transforms.to_bronze(kafka_batch).persist()
        try:
            meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
            with holding(self.lock, f"{self.query} batch {batch_id}"):
                result = writes.append(bronze_rows, self.bronze, app_id=self.app_id, batch_id=batch_id, metadata=meta)
            if result.committed:  # as in the stream sink: the fault point is a fresh commit
                faults.after_commit(self.query, batch_id)
            self.silver(bronze_rows, batch_id)
        finally:
            bronze_rows.unpersist()


class GoldWriter:
    """Updated window aggregates -> MERGE on the window keys (update-mode output)."""

    def __init__(self, gold: GoldTable, *, table: LakeTable, app_id: str, query: str, lock: TableLock | None = None):
        self.gold = gold
        self.table = table
        self.app_id = app_id
        self.query = query
        self.lock = lock

    def __call__(self, updates: DataFrame, batch_id: int) -> None:
        meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
        with holding(self.lock, f"{self.query} batch {batch_id}"):
            # A window the stream still updates is provisional again; its correction count stays.
            writes.merge(
                updates,
                self.table,
                keys=self.gold.keys,
                keep=("revision",),
                app_id=self.app_id,
                batch_id=batch_id,
                metadata=meta,
            )
        faults.after_commit(self.query, batch_id)
