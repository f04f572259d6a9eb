"""Reads of a bounded job: bronze rows (from the bronze table or from Kafka), silver and gold for a range.

Every read returns what the pipeline's own transforms expect, so the batch runs the same code as
the stream: a Kafka read goes through :func:`tidewater.transforms.to_bronze` exactly as the
stream's micro-batches do. Reads prune by partition (bronze by ingest date, silver by event date)
and then filter rows; they never write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater import transforms
from tidewater.batch.interval import Interval
from tidewater.batch.predicates import Selection
from tidewater.config import Settings
from tidewater.connectors.kafka_source import source_options
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable, add_actions
from tidewater.pipelines.base import GoldTable, Source
from tidewater.pipelines.layout import PipelineLayout


def bronze_since(spark: SparkSession, table: LakeTable, since: dt.datetime | None) -> DataFrame:
    """Bronze records that reached Kafka at or after ``since`` (None: all of them).

    An event reaches Kafka no earlier than ``event_time - clock skew`` (silver quarantines any that
    claims otherwise), so with ``since = start - skew`` these rows hold every valid copy of every
    event of ``[start, ...)``; dropping the older ones changes no silver row of the interval and
    spares the de-duplication a scan of the whole history.
    """
    if since is None:
        return read_table(spark, table.uri)
    first = since.date().isoformat()
    dates = sorted({d for f in table.files() if (d := f.partition_values.get("ingest_date")) and d >= first})
    bronze = read_table(spark, table.uri, partition_filter={"ingest_date": dates})
    return bronze.where(F.coalesce("kafka_timestamp", "ingest_time") >= F.lit(since))


def kafka_since(spark: SparkSession, settings: Settings, source: Source, since: dt.datetime | None) -> DataFrame:
    """The source's topic from ``since`` (per-partition seek on record timestamps; None: from the
    earliest offset) to its current end, as bronze rows. ``ingest_time`` is this read's time, not the
    stream's: the one lineage column a replay from Kafka cannot reproduce."""
    options = source_options(settings, settings.topic(source.topic))
    options.pop("maxOffsetsPerTrigger", None)
    if since is None:
        options["startingOffsets"] = "earliest"
        return transforms.to_bronze(spark.read.format("tidewater-kafka").options(**options).load())
    options["startingTimestamp"] = str(int(since.timestamp() * 1000))
    kafka = spark.read.format("tidewater-kafka").options(**options).load()
    return transforms.to_bronze(kafka).where(F.col("kafka_timestamp") >= F.lit(since))


def silver_for(
    spark: SparkSession, table: LakeTable, source: Source, selection: Selection, *, whole: bool = False
) -> DataFrame:
    """Silver rows of ``selection``, reading only the event-date partitions it can touch; ``whole``:
    of every event time (a changelog a table reads from its first change), the entity filter kept."""
    if whole:
        return read_table(spark, table.uri).where(selection.entity_filter())
    dates = [d.isoformat() for d in selection.interval.dates()]
    silver = read_table(spark, table.uri, partition_filter={source.partition_column: dates})
    return silver.where(selection.column())


def input_reader(
    spark: SparkSession,
    layout: PipelineLayout,
    gold: GoldTable,
    *,
    entity_column: str | None = None,
    entities: Sequence[Any] = (),
    closed: dt.datetime | None = None,
) -> Callable[[Interval], tuple[DataFrame, ...]]:
    """``read(feed)``: the silver of each of ``gold``'s inputs in the event-time interval ``feed`` (the
    reader :func:`tidewater.batch.windows.interval_gold` takes). An input the table reads whole (its
    ``history``) is read up to ``closed``: the changes the stream has folded by that watermark."""
    pipeline = layout.pipeline
    inputs = pipeline.inputs(gold)

    def read(feed: Interval) -> tuple[DataFrame, ...]:
        return tuple(
            history_until(
                silver_for(
                    spark,
                    layout.source_table(source, "silver"),
                    source,
                    Selection(source.event_time, feed, entity_column, tuple(entities)),
                    whole=source.name in gold.history,
                ),
                source,
                closed if source.name in gold.history else None,
            )
            for source in inputs
        )

    return read


def history_until(events: DataFrame, source: Source, closed: dt.datetime | None) -> DataFrame:
    """A history input's events before the watermark ``closed`` (all of them when None)."""
    return events if closed is None else events.where(F.col(source.event_time) < F.lit(closed))


def silver_highs(spark: SparkSession, layout: PipelineLayout) -> dict[str, dt.datetime | None]:
    """The latest event time each source's silver holds (None: no table or no rows yet), by source name."""
    pipeline = layout.pipeline
    highs: dict[str, dt.datetime | None] = {}
    for source in pipeline.sources:
        silver = layout.source_table(source, "silver")
        highs[source.name] = max_event_time(spark, silver, source.event_time) if silver.exists() else None
    return highs


def gold_for(table: LakeTable, selection: Selection) -> pa.Table:
    """Published gold rows of ``selection`` (on ``window_start``), on the driver, read by delta-rs: an hour
    of a join can hold millions of rows (pageviews: 3.6M), which through Spark took ~9 s of its recompute."""
    return table.read_where(selection.arrow())


def max_event_time(spark: SparkSession, table: LakeTable, column: str) -> dt.datetime | None:
    """The latest event time in a table, from the Delta log's file statistics (no data read) when every
    file has them, else by scanning the column."""
    actions = add_actions(table.open())
    if actions.num_rows == 0:
        return None
    stat = f"max.{column}"
    if stat in actions.column_names and actions.column(stat).null_count == 0:
        value = pc.max(actions.column(stat)).as_py()
    else:
        value = read_table(spark, table.uri).agg(F.max(column).alias("m")).toArrow().column("m")[0].as_py()
    return None if value is None else _utc(value)


def max_of(frame: DataFrame, column: str) -> dt.datetime | None:
    """The latest value of a timestamp column of a DataFrame (via Arrow, so in UTC whatever the local zone)."""
    value = frame.agg(F.max(column).alias("m")).toArrow().column("m")[0].as_py()
    return None if value is None else _utc(value)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
