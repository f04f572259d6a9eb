"""Gold rows of an interval, as a batch computes them: the stream's transforms over a bounded read.

A gold row belongs to the interval its span's start (``window_start``) lies in, so every run of a
schedule of adjacent intervals owns each row exactly once. How much silver around the interval feeds those rows
is the table kind's to say (:meth:`GoldTable.feed_margins`); a kind whose rows grow while events
keep coming (sessions) has its read widened here until no row it owns reaches the read's end.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tidewater.batch.interval import Interval
from tidewater.batch.predicates import Selection
from tidewater.batch.sources import max_of
from tidewater.errors import PipelineError
from tidewater.pipelines.base import FINAL, PROVISIONAL, GoldTable, Source
from tidewater.times import iso, parse_duration

# Widening a session table's read more often than this means sessions that never end: refuse.
MAX_WIDENINGS = 64


def feed_interval(gold: GoldTable, interval: Interval) -> Interval:
    """Event times of silver that feed the rows starting in ``interval`` (before any widening)."""
    before, after = gold.feed_margins()
    return interval.widened(before, after)


def closed_before(high: dt.datetime | None, watermark: str) -> dt.datetime | None:
    """What Spark's watermark would be after seeing event time ``high``: windows ending at or before it
    are closed (final); None when there is no event at all."""
    return None if high is None else high - parse_duration(watermark)


def gold_closed_before(
    inputs: Sequence[Source], highs: Mapping[str, dt.datetime | None]
) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(closed, high) of a gold table fed by ``inputs`` whose latest event times are ``highs`` (by source).

    Spark's watermark over several inputs is the minimum of theirs (its default policy), so a row is
    closed once every input's watermark has passed it; ``high`` is the latest event time of any input
    (no read past it finds more events). An input with no events yet holds nothing back."""
    closeds = [closed_before(highs.get(s.name), s.watermark) for s in inputs]
    known = [c for c in closeds if c is not None]
    latest = [h for s in inputs if (h := highs.get(s.name)) is not None]
    return (min(known) if known else None), (max(latest) if latest else None)


def interval_gold(
    gold: GoldTable,
    read: Callable[[Interval], tuple[DataFrame, ...]],
    windows: Selection,
    closed: dt.datetime | None,
    *,
    high: dt.datetime | None,
) -> tuple[DataFrame, tuple[DataFrame, ...]]:
    """(``gold.rows`` of the rows ``windows`` picks (on the span's start), each final when closed; the
    silver events read, one frame per input).

    ``read(feed)`` returns silver of an event-time interval for each of the table's inputs; ``high`` is
    the latest event time they hold (no read past it can find more events)."""
    feed = feed_interval(gold, windows.interval)
    for _ in range(MAX_WIDENINGS):
        events = read(feed)
        # Materialized before any filter: Spark (4.2) pushes a filter on a session window's bounds below
        # the aggregation, where each event still has its own [t, t + gap) window, and so cuts sessions
        # short (``window_end <= x`` keeps only the events before x - gap). Filters on the rows of a
        # checkpointed plan stay above it.
        built = gold.rows(*events).localCheckpoint(eager=True)
        rows = with_status(built.where(windows.column()), closed, gold.span[1])
        if gold.closed_rows_only:
            rows = rows.where(F.col("status") == FINAL)
        if not gold.grows_until_quiet or high is None or feed.end > high:
            return rows, events
        reach = max_of(rows, gold.span[1])
        if reach is None or reach <= feed.end:
            return rows, events
        feed = Interval(feed.start, reach)  # a row ends past the read: events after it may continue it
    raise PipelineError(
        f"{gold.name}: rows of {windows.interval} still reach past the read after {MAX_WIDENINGS} widenings "
        f"(up to {iso(feed.end)}): a session that never ends; recompute a later interval or check the event times"
    )


def with_status(rows: DataFrame, closed: dt.datetime | None, end_column: str) -> DataFrame:
    """Rows ending at or before ``closed`` (the watermark) are final, the rest provisional."""
    is_final = F.lit(False) if closed is None else F.col(end_column) <= F.lit(closed)
    return rows.withColumn("status", F.when(is_final, F.lit(FINAL)).otherwise(F.lit(PROVISIONAL)))
