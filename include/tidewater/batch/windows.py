"""Gold rows of an interval, as a batch computes them: pure DataFrame transforms, no I/O.

A window belongs to the interval its *start* lies in, so every run of a schedule of adjacent
intervals owns each window exactly once. The window ``[s, s + length)`` with ``s`` in
``[start, end)`` is fed by events of ``[start, end + length)``; the feed read here,
``[start - length, end + length)``, is one window wider on the left, which costs little and keeps
the rule easy to check.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tidewater.batch.interval import Interval
from tidewater.batch.predicates import Selection
from tidewater.pipelines.base import FINAL, PROVISIONAL, GoldTable
from tidewater.times import parse_duration


def feed_interval(gold: GoldTable, interval: Interval) -> Interval:
    """Event times of silver that can fall into windows starting in ``interval``."""
    length = parse_duration(gold.window)
    return interval.widened(length, length)


def closed_before(high: dt.datetime | None, watermark: str) -> dt.datetime | None:
    """What Spark's watermark would be after seeing event time ``high``: windows ending at or before it
    are closed (final); None when there is no event at all."""
    return None if high is None else high - parse_duration(watermark)


def interval_gold(gold: GoldTable, silver: DataFrame, selection: Selection, closed: dt.datetime | None) -> DataFrame:
    """``gold.rows`` of the windows ``selection`` picks (on ``window_start``), each final when closed."""
    is_final = F.lit(False) if closed is None else F.col("window_end") <= F.lit(closed)
    return (
        gold.rows(silver)
        .where(selection.column())
        .withColumn("status", F.when(is_final, F.lit(FINAL)).otherwise(F.lit(PROVISIONAL)))
    )
