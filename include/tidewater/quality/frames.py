"""What an audit of one interval looks at, read with the pipeline's own transforms (no writes).

Two selections, because the layers are keyed by different clocks:

* by **arrival** (Kafka timestamp in ``[start, end)``): the bronze records, the same records parsed
  (``records``: before quarantine and de-duplication) and their quarantine rows. The reconciliation
  follows these records to silver and quarantine, wherever their event times fall.
* by **event time** in ``[start, end)``: silver rows, and gold windows starting in the interval
  (what the scheduled batch rebuilt).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater.batch import sources
from tidewater.batch.interval import Interval
from tidewater.batch.predicates import Selection
from tidewater.lake.reads import read_table
from tidewater.pipelines.base import Source
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import parse_duration


@dataclass
class SourceFrames:
    """One source's frames of the interval."""

    source: Source
    bronze: DataFrame
    records: DataFrame  # parsed bronze, with ``_error`` (null for a valid record)
    silver: DataFrame

    def unpersist(self) -> None:
        for frame in (self.bronze, self.records, self.silver):
            frame.unpersist()


@dataclass
class IntervalFrames:
    interval: Interval
    sources: dict[str, SourceFrames]  # by source name
    gold: dict[str, DataFrame]  # "gold/<name>" -> windows starting in the interval

    def unpersist(self) -> None:
        for frames in self.sources.values():
            frames.unpersist()
        for frame in self.gold.values():
            frame.unpersist()


def read_interval(
    spark: SparkSession,
    layout: PipelineLayout,
    interval: Interval,
    *,
    bronze: bool = True,
    silver: bool = True,
    gold: bool = True,
) -> IntervalFrames:
    """The frames of the interval the audit needs, cached: each feeds several expectations."""
    pipeline = layout.pipeline
    gold_frames: dict[str, DataFrame] = {}
    if gold:
        for table in pipeline.gold:
            name = f"gold/{table.name}"
            if layout.table(name).exists():
                rows = Selection(table.span[0], interval, None, ())
                gold_frames[name] = _cache(read_table(spark, layout.table_uri(name)).where(rows.column()))
    per_source = {
        source.name: _source_frames(spark, layout, source, interval, bronze=bronze, silver=silver)
        for source in pipeline.sources
    }
    return IntervalFrames(interval=interval, sources=per_source, gold=gold_frames)


def _source_frames(
    spark: SparkSession, layout: PipelineLayout, source: Source, interval: Interval, *, bronze: bool, silver: bool
) -> SourceFrames:
    nothing = spark.createDataFrame([], "x int")
    bronze_frame = records = silver_frame = nothing
    if bronze:  # a sandbox replay's namespace has no bronze: its audit checks silver and gold only
        since = interval.start - parse_duration(source.clock_skew_tolerance)
        arrived = sources.bronze_since(spark, layout.source_table(source, "bronze"), since)
        arrived = arrived.where(arrived_in(interval))
        bronze_frame = _cache(arrived)
        records = _cache(with_leads(source, source.parse(bronze_frame)))
    if silver:
        selection = Selection(source.event_time, interval, None, ())
        table = layout.source_table(source, "silver")
        silver_frame = _cache(with_leads(source, sources.silver_for(spark, table, source, selection)))
    return SourceFrames(source=source, bronze=bronze_frame, records=records, silver=silver_frame)


def arrived_in(interval: Interval) -> Column:
    """Rows whose record reached Kafka in the interval (the audit's selection by arrival)."""
    return Selection("kafka_timestamp", interval).column()


def with_leads(source: Source, frame: DataFrame) -> DataFrame:
    """Add the derived columns some expectations validate (event time ahead of ingestion, seconds)."""
    for constraint in source.arrival_checks:
        lead = F.col(constraint.column).cast("double") - F.col("ingest_time").cast("double")
        frame = frame.withColumn(constraint.lead_column, lead)
    return frame


def quarantine_of(spark: SparkSession, layout: PipelineLayout, source: Source, interval: Interval) -> DataFrame | None:
    """Quarantine rows of ``source``'s records that arrived in the interval (None: no quarantine table yet)."""
    table = layout.source_table(source, "quarantine")
    if not table.exists():
        return None
    first = (interval.start - dt.timedelta(days=1)).date().isoformat()
    dates = sorted({d for f in table.files() if (d := f.partition_values.get("quarantine_date")) and d >= first})
    rows = read_table(spark, table.uri, partition_filter={"quarantine_date": dates})
    return rows.where(arrived_in(interval))


def silver_of_records(
    spark: SparkSession, layout: PipelineLayout, source: Source, records: DataFrame
) -> DataFrame | None:
    """``source``'s silver rows in the event-date partitions the interval's valid records fall in."""
    table = layout.source_table(source, "silver")
    if not table.exists():
        return None
    dates = [
        r[0].isoformat()
        for r in records.where(F.col("_error").isNull()).select(source.partition_column).distinct().collect()
        if r[0] is not None
    ]
    return read_table(spark, table.uri, partition_filter={source.partition_column: dates})


def _cache(frame: DataFrame) -> DataFrame:
    return frame.persist(StorageLevel.MEMORY_AND_DISK)
