"""foreachBatch writers: one micro-batch -> one idempotent Delta commit per table.

Spark re-executes a micro-batch after a crash with the same batch id and the same input (its
offset log is written before the batch runs). Each commit carries ``(app_id, batch_id)``; a
table that already has it skips the write. Silver and quarantine are two tables written from
one batch: each is skipped or written on its own, so a crash between them heals on re-run.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tidewater.lake import writes
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable
from tidewater.pipelines.base import GoldTable, Pipeline
from tidewater.streaming import faults

log = logging.getLogger(__name__)


class SilverWriter:
    """Bronze rows -> silver (valid, first per key) + quarantine (invalid, with the reason).

    Duplicates are removed within the batch and against silver's partitions for the same event
    dates (insert-if-absent), so a duplicate is dropped however late it arrives; events behind a
    gold watermark are *kept* here, which is what lets the late-data correction recompute them.
    """

    def __init__(self, pipeline: Pipeline, *, silver: LakeTable, quarantine: LakeTable, app_id: str, query: str):
        self.pipeline = pipeline
        self.silver = silver
        self.quarantine = quarantine
        self.app_id = app_id
        self.query = query  # the label of this step ("<namespace>.<pipeline>.silver") in logs and faults

    def __call__(self, bronze_batch: DataFrame, batch_id: int) -> None:
        spark = bronze_batch.sparkSession
        silver_done = self.silver.already_committed(self.app_id, batch_id)
        quarantine_done = self.quarantine.already_committed(self.app_id, batch_id)
        if silver_done and quarantine_done:
            log.info("%s batch %s already committed: skipped", self.query, batch_id)
            return
        parsed = self.pipeline.parse(bronze_batch).persist()
        try:
            meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
            if not quarantine_done:
                writes.append(
                    self.pipeline.quarantine(parsed),
                    self.quarantine,
                    app_id=self.app_id,
                    batch_id=batch_id,
                    metadata=meta,
                )
            if not silver_done:
                fresh = self.pipeline.dedup(self.pipeline.silver(parsed))
                fresh = self._drop_known(spark, fresh)
                writes.append(fresh, self.silver, app_id=self.app_id, batch_id=batch_id, metadata=meta)
        finally:
            parsed.unpersist()
        faults.after_commit(self.query, batch_id)

    def _drop_known(self, spark, fresh: DataFrame) -> DataFrame:
        part = self.pipeline.partition_column
        dates = [str(r[0]) for r in fresh.select(part).distinct().collect() if r[0] is not None]
        if not dates:
            return fresh
        known = read_table(spark, self.silver.uri, partition_filter={part: dates})
        key = self.pipeline.key
        return fresh.join(known.select(F.col(key)).distinct(), on=key, how="left_anti")


class BronzeSilverWriter:
    """Kafka records -> bronze, then silver + quarantine from those very bronze rows, in one micro-batch.

    The default streaming topology: silver is computed from bronze rows (never from Kafka directly)
    without waiting for another query to poll the bronze table, which saves a trigger cycle of
    latency and a second read of every record. Each table keeps its own idempotent commit.
    """

    def __init__(self, pipeline: Pipeline, *, bronze: LakeTable, silver: SilverWriter, app_id: str, query: str):
        self.pipeline = pipeline
        self.bronze = bronze
        self.silver = silver
        self.app_id = app_id
        self.query = query

    def __call__(self, kafka_batch: DataFrame, batch_id: int) -> None:
        from tidewater import transforms

        bronze_rows = transforms.to_bronze(kafka_batch).persist()
        try:
            meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
            writes.append(bronze_rows, self.bronze, app_id=self.app_id, batch_id=batch_id, metadata=meta)
            faults.after_commit(self.query, batch_id)
            self.silver(bronze_rows, batch_id)
        finally:
            bronze_rows.unpersist()


class GoldWriter:
    """Updated window aggregates -> MERGE on the window keys (update-mode output)."""

    def __init__(self, gold: GoldTable, *, table: LakeTable, app_id: str, query: str):
        self.gold = gold
        self.table = table
        self.app_id = app_id
        self.query = query

    def __call__(self, updates: DataFrame, batch_id: int) -> None:
        meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
        writes.merge(updates, self.table, keys=self.gold.keys, app_id=self.app_id, batch_id=batch_id, metadata=meta)
        faults.after_commit(self.query, batch_id)
