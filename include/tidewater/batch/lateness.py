"""How many of a gold row's events arrived after its window had closed: the ledger's ``late_events``.

A window's result is emitted (and its state dropped) once the stream's watermark, the highest event
time seen minus the watermark delay, passes the window's end. An event that reaches Kafka later
than ``window_end + delay`` therefore arrives behind the watermark, and the stream drops it.

Arrival is the record's Kafka timestamp, not silver's ``ingest_time``: the Kafka timestamp is on the
producers' clock, like event time, and a replay reproduces it, whereas ``ingest_time`` is the wall
clock of whichever run ingested the record (a backlog drained hours later would make every event
look late). In a live system the two agree to within the trigger interval.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from tidewater.batch.gold_diff import RowChange
from tidewater.batch.ledger import change_key
from tidewater.pipelines.base import GoldTable, Pipeline
from tidewater.times import parse_duration

ARRIVAL_COLUMN = "kafka_timestamp"


def late_events_of(
    spark: SparkSession,
    pipeline: Pipeline,
    gold: GoldTable,
    events: Sequence[DataFrame],
    changes: Sequence[RowChange],
) -> dict[tuple[Any, ...], int]:
    """:func:`late_events` of ``gold``'s changed rows, counted on its first input (``events``: the silver
    each input fed it, in order): the side whose events own the rows (a join's left side)."""
    driving = pipeline.inputs(gold)[0]
    delay = parse_duration(driving.watermark)
    return late_events(spark, events[0], changes, time_column=driving.event_time, delay=delay)


def late_events(
    spark: SparkSession,
    silver: DataFrame,
    changes: Sequence[RowChange],
    *,
    time_column: str,
    delay: dt.timedelta,
    arrival_column: str = ARRIVAL_COLUMN,
) -> dict[tuple[Any, ...], int]:
    """Silver rows of each changed gold row (its window and its key values) that arrived after
    ``window_end + delay``, keyed by :func:`tidewater.batch.ledger.change_key`.

    Key columns silver does not have (none, for rsvps) are ignored, counting the whole window."""
    if not changes:
        return {}
    group = [c for c in changes[0].group if c in silver.columns]
    fields = [
        StructField("_ws", TimestampType()),
        StructField("_we", TimestampType()),
        StructField("_late_after", TimestampType()),
        *[StructField(f"_g_{c}", silver.schema[c].dataType) for c in group],
    ]
    wanted = sorted({_join_key(change, group) for change in changes}, key=repr)
    windows = spark.createDataFrame(
        [(ws, we, we + delay, *values) for (ws, we, *values) in wanted], StructType(fields)
    ).hint("broadcast")
    condition = (F.col(time_column) >= F.col("_ws")) & (F.col(time_column) < F.col("_we"))
    for c in group:
        condition = condition & (F.col(c) == F.col(f"_g_{c}"))
    counted = (
        silver.join(windows, condition)
        .where(F.col(arrival_column) > F.col("_late_after"))
        .groupBy("_ws", "_we", *[f"_g_{c}" for c in group])
        .count()
        .toArrow()  # Arrow keeps timestamps in UTC
    )
    found = {tuple(row.values())[:-1]: int(row["count"]) for row in counted.to_pylist()}
    return {change_key(change): found.get(_join_key(change, group), 0) for change in changes}


def _join_key(change: RowChange, group: Sequence[str]) -> tuple[Any, ...]:
    return (change.window_start, change.window_end, *[change.group[c] for c in group])
