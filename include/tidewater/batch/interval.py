"""The half-open event-time interval ``[start, end)`` a bounded job works on, and the durations around it.

Pure: parsing and arithmetic only. Times are aware UTC datetimes everywhere in the batch package,
because event times are UTC end to end and a naive datetime would silently take the local zone of
whichever process (Airflow worker, spark-submit driver) happens to run the job.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from tidewater.errors import ConfigError

_UNITS = {
    "microsecond": dt.timedelta(microseconds=1),
    "millisecond": dt.timedelta(milliseconds=1),
    "second": dt.timedelta(seconds=1),
    "minute": dt.timedelta(minutes=1),
    "hour": dt.timedelta(hours=1),
    "day": dt.timedelta(days=1),
    "week": dt.timedelta(weeks=1),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*$")


def parse_time(text: str | dt.datetime, what: str = "time") -> dt.datetime:
    """ISO-8601 with an offset or ``Z`` -> aware UTC datetime; a time without an offset is UTC."""
    if isinstance(text, dt.datetime):
        value = text
    else:
        try:
            value = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise ConfigError(
                f"{what} {text!r} is not an ISO-8601 time (e.g. 2026-11-21T10:00:00Z or 2026-11-21T11:00:00+01:00)"
            ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def parse_duration(text: str) -> dt.timedelta:
    """A Spark-style interval of one unit (``"2 minutes"``, ``"1 hour"``) -> timedelta.

    The pipeline declares its watermark, clock-skew tolerance and window lengths this way.
    """
    match = _DURATION.match(text.lower())
    if not match or match.group(2) not in _UNITS:
        raise ConfigError(f"duration {text!r} must look like '5 minutes' (units: {', '.join(_UNITS)})")
    return float(match.group(1)) * _UNITS[match.group(2)]


def iso(value: dt.datetime) -> str:
    """UTC, microseconds, ``Z``: one spelling for results, metadata and predicates."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
