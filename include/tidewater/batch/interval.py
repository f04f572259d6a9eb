"""The half-open event-time interval ``[start, end)`` a bounded job works on, and the durations around it.

Pure: parsing and arithmetic only. Times are aware UTC datetimes everywhere in the batch package,
because event times are UTC end to end and a naive datetime would silently take the local zone of
whichever process (Airflow worker, spark-submit driver) happens to run the job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tidewater.errors import ConfigError
from tidewater.times import iso, parse_time


@dataclass(frozen=True)
class Interval:
    """``start <= t < end``, like Spark's windows (start-inclusive, end-exclusive)."""

    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("Interval bounds must be timezone-aware")
        if self.end <= self.start:
            raise ConfigError(f"end {iso(self.end)} must be after start {iso(self.start)}")

    @classmethod
    def parse(cls, start: str | dt.datetime, end: str | dt.datetime) -> Interval:
        return cls(parse_time(start, "start"), parse_time(end, "end"))

    def widened(self, before: dt.timedelta = dt.timedelta(0), after: dt.timedelta = dt.timedelta(0)) -> Interval:
        return Interval(self.start - before, self.end + after)

    def dates(self) -> list[dt.date]:
        """Every calendar date (UTC) the interval touches: the date partitions that can hold its rows."""
        first, last = self.start.date(), (self.end - dt.timedelta(microseconds=1)).date()
        return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]

    def __str__(self) -> str:
        return f"[{iso(self.start)}, {iso(self.end)})"
