"""delta-rs SQL spelled by the lake: literals, and the range a batch's keys bound a MERGE's target to."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from tidewater.lake.sql import range_filter, sql_literal

UTC = dt.UTC


def test_literals_quote_text_and_spell_times_in_utc_to_the_microsecond():
    assert sql_literal("o'brien") == "'o''brien'"
    assert sql_literal(True) == "true" and sql_literal(7) == "7"
    assert sql_literal(dt.datetime(2026, 11, 29, 11, 0, 0, 5, tzinfo=UTC)) == "'2026-11-29T11:00:00.000005Z'"


def test_a_range_spans_the_least_and_greatest_value_exactly():
    starts = [dt.datetime(2026, 11, 29, 10, 0, 0, 500_001, tzinfo=UTC), dt.datetime(2026, 11, 29, 9, 48, tzinfo=UTC)]
    source = pa.table(
        {
            "window_start": pa.array([*starts, None], pa.timestamp("us", tz="UTC")),
            "n": pa.array([3, -2, None], pa.int64()),
        }
    )
    assert range_filter(source, ["window_start", "n"], alias="t") == (
        "t.`window_start` >= '2026-11-29T09:48:00.000000Z' AND t.`window_start` <= '2026-11-29T10:00:00.500001Z'"
        " AND t.`n` >= -2 AND t.`n` <= 3"
    )


def test_what_cannot_be_bounded_exactly_is_left_out():
    source = pa.table(
        {
            "name": pa.array(["a", "b"]),  # text: not bounded
            "naive": pa.array([0, 1], pa.timestamp("us")),  # no zone: a UTC literal might not mean it
            "nanos": pa.array([1, 2], pa.timestamp("ns", tz="UTC")),  # microseconds would round
            "empty": pa.array([None, None], pa.int64()),
            # year 10000 has no ISO spelling: only the lower bound
            "far": pa.array([0, 253_402_300_800_000_000], pa.timestamp("us", tz="UTC")),
        }
    )
    assert range_filter(source, ["name", "naive", "nanos", "empty"], alias="t") is None
    assert range_filter(source, ["far"], alias="t") == "t.`far` >= '1970-01-01T00:00:00.000000Z'"
