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


# ---- sessions as a bounded batch computes them (tidewater.batch.windows.interval_gold) -------------------


def views(spark: SparkSession, rows: list[tuple[str, str]]) -> DataFrame:
    return spark.createDataFrame(
        [(f"v{i}", ts(t), visitor, "/", "search", "mobile") for i, (t, visitor) in enumerate(rows)],
        "view_id string, viewed_at timestamp, visitor_id string, page string, referrer string, device string",
    )


def test_a_bounded_read_of_sessions_owns_whole_sessions_that_start_in_it(spark):
    """Sessions of [10:00, 11:00): one starting at 09:50 runs into the hour and is not the hour's; one
    starting at 10:40 runs on past the first read (10:00 + 1 h + 30 min gap) and is read to its end;
    filtering the rows on their end (what a correction does) does not cut a session short (Spark
    would push that filter below the session merge)."""
    from tidewater.batch.interval import Interval
    from tidewater.batch.predicates import Selection
    from tidewater.batch.windows import interval_gold
    from tidewater.pipelines import get_pipeline

    sessions = get_pipeline("pageviews").gold_table("visitor_sessions")
    times = ["09:50", "10:10", "10:35"]  # "a": 09:50 .. 10:35, starts before the hour
    trail = [f"{h}:{m:02d}" for h, m in [(10, 40), (11, 5), (11, 25), (11, 50), (12, 15), (12, 40)]]  # "b"
    all_views = views(
        spark,
        [(f"2026-11-21 {t}:00", "a") for t in times]
        + [(f"2026-11-21 {t}:00", "b") for t in trail]
        + [("2026-11-21 13:30:00", "clock")],
    )
    reads: list[Interval] = []

    def read(feed: Interval) -> tuple[DataFrame, ...]:  # one frame per input source
        reads.append(feed)
        return (all_views.where(Selection("viewed_at", feed).column()),)

    hour = Interval(ts("2026-11-21 10:00:00"), ts("2026-11-21 11:00:00"))
    closed = ts("2026-11-21 13:28:00")
    rows, _ = interval_gold(sessions, read, Selection("window_start", hour), closed, high=ts("2026-11-21 13:30:00"))
    owned = windows(rows, "visitor_id", "views", "status")
    assert owned == [(ms("2026-11-21 10:40:00"), ms("2026-11-21 13:10:00"), "b", 6, "final")]
    assert reads[0] == Interval(ts("2026-11-21 09:30:00"), ts("2026-11-21 11:30:00")) and len(reads) > 1
    # The correction's filter on status (on window_end) keeps the session whole.
    assert windows(rows.where(F.col("status") == "final"), "views") == [
        (ms("2026-11-21 10:40:00"), ms("2026-11-21 13:10:00"), 6)
    ]
