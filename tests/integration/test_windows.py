"""Event-time windows of the rsvps gold transforms: end-exclusive tumbling windows and overlapping
hopping windows (batch DataFrames: the same transforms the stream runs)."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater.pipelines.rsvps import trending_venues, venue_response_counts


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def ms(text: str) -> int:
    return int(ts(text).timestamp() * 1000)


def events(spark: SparkSession, rows: list[tuple[str, int, str]]) -> DataFrame:
    return spark.createDataFrame(
        [(f"e{i}", ts(t), venue, f"venue {venue}", response) for i, (t, venue, response) in enumerate(rows)],
        "event_id string, event_time timestamp, venue_id long, venue_name string, response string",
    )


def windows(df: DataFrame, *measures: str) -> list[tuple]:
    """Window bounds as epoch ms (collected datetimes would depend on the test process's time zone)."""
    selected = df.select(F.unix_millis("window_start"), F.unix_millis("window_end"), *measures)
    return sorted(tuple(r) for r in selected.collect())


def test_tumbling_windows_are_end_exclusive(spark):
    df = events(
        spark,
        [
            ("2026-11-21 10:00:00.000", 1, "yes"),  # the first instant of [10:00, 10:01)
            ("2026-11-21 10:00:59.999", 1, "yes"),  # the last millisecond of [10:00, 10:01)
            ("2026-11-21 10:01:00.000", 1, "yes"),  # the end is exclusive: this is [10:01, 10:02)
            ("2026-11-21 10:01:00.000", 1, "no"),
        ],
    )
    assert windows(venue_response_counts(df), "response", "rsvp_count") == [
        (ms("2026-11-21 10:00:00"), ms("2026-11-21 10:01:00"), "yes", 2),
        (ms("2026-11-21 10:01:00"), ms("2026-11-21 10:02:00"), "no", 1),
        (ms("2026-11-21 10:01:00"), ms("2026-11-21 10:02:00"), "yes", 1),
    ]


def test_hopping_windows_overlap(spark):
    df = events(spark, [("2026-11-21 10:03:30", 7, "yes"), ("2026-11-21 10:05:00", 7, "no")])
    rows = windows(trending_venues(df), "rsvp_count", "yes_count")
    # 5-minute windows every minute: 10:03:30 lies in the five windows starting 09:59 .. 10:03,
    # 10:05:00 in those starting 10:01 .. 10:05 (not 10:00, whose end 10:05 is exclusive).
    assert all(end - start == 5 * 60_000 for start, end, _, _ in rows)
    by_start = {start: (count, yes) for start, _, count, yes in rows}
    expected = {
        "09:59": (1, 1),  # only the 10:03:30 yes
        "10:00": (1, 1),
        "10:01": (2, 1),  # both events overlap here
        "10:02": (2, 1),
        "10:03": (2, 1),
        "10:04": (1, 0),  # only the 10:05 no
        "10:05": (1, 0),
    }
    assert by_start == {ms(f"2026-11-21 {hhmm}"): value for hhmm, value in expected.items()}
