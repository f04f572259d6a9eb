"""Timestamps as text, safe for the whole range a record can carry.

``datetime.strftime("%Y")`` does not zero-pad years before 1000 on glibc ("999-12-31"), which
delta-rs cannot parse, and ``datetime`` itself stops at year 9999 while Arrow and Spark timestamps
go further. Every timestamp that becomes text for a predicate, a statistic or a partition value goes
through here, so one event from the year 999 or 10000 can never break a commit.
"""

from __future__ import annotations

import datetime as dt
import re

from tidewater.errors import ConfigError

MIN_MICROS = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def in_range(micros: int) -> bool:
    """Whether epoch microseconds fall in years 1..9999 (what ``datetime`` and ISO-8601 text can hold)."""
    return MIN_MICROS <= micros <= MAX_MICROS


def from_micros(micros: int) -> dt.datetime | None:
    """Epoch microseconds -> aware UTC datetime, or None outside years 1..9999."""
    if not in_range(micros):
        return None
    return _EPOCH + dt.timedelta(microseconds=micros)


def iso_text(value: dt.datetime, *, sep: str = "T", suffix: str = "Z", digits: int = 6) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` with a four-digit year whatever the year (UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    fraction = f"{value.microsecond:06d}"[:digits]
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}{sep}"
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}" + (f".{fraction}" if digits else "") + suffix
    )


def micros_iso(micros: int, *, digits: int = 6) -> str | None:
    """Epoch microseconds as ISO text, or None outside years 1..9999 (callers then omit the bound)."""
    value = from_micros(micros)
    return None if value is None else iso_text(value, digits=digits)


# ---- parsing: the one owner of time and duration text in settings, params and declarations ----

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
    """A Spark-style interval of one unit (``"2 minutes"``, ``"1 hour"``, ``"interval 7 days"``) -> timedelta.

    The pipeline declares its watermark, clock-skew tolerance and window lengths this way.
    """
    match = _DURATION.match(text.strip().lower().removeprefix("interval "))
    if not match or match.group(2) not in _UNITS:
        raise ConfigError(f"duration {text!r} must look like '5 minutes' (units: {', '.join(_UNITS)})")
    return float(match.group(1)) * _UNITS[match.group(2)]


def iso(value: dt.datetime) -> str:
    """UTC, microseconds, ``Z``: one spelling for results, metadata and predicates."""
    return iso_text(value)
