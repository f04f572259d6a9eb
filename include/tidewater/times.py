"""Timestamps as text, safe for the whole range a record can carry.

``datetime.strftime("%Y")`` does not zero-pad years before 1000 on glibc ("999-12-31"), which
delta-rs cannot parse, and ``datetime`` itself stops at year 9999 while Arrow and Spark timestamps
go further. Every timestamp that becomes text for a predicate, a statistic or a partition value goes
through here, so one event from the year 999 or 10000 can never break a commit.
"""

from __future__ import annotations

import datetime as dt

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
