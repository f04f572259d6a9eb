"""Timestamps as text over the whole range a record can carry (tidewater.times)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from tidewater.lake.files import file_stats, partition_value_text
from tidewater.times import MAX_MICROS, MIN_MICROS, iso_text, micros_iso


def test_years_before_1000_are_zero_padded() -> None:
    value = dt.datetime(999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    assert iso_text(value) == "0999-12-31T23:59:59.000000Z"
    assert iso_text(dt.datetime(1, 1, 1, tzinfo=dt.UTC), digits=3) == "0001-01-01T00:00:00.000Z"
    assert partition_value_text(dt.datetime(5, 6, 7, 8, 9, 10)) == "0005-06-07 08:09:10.000000"


def test_micros_beyond_the_datetime_range_have_no_text() -> None:
    assert micros_iso(MIN_MICROS) == "0001-01-01T00:00:00.000000Z"
    assert micros_iso(MAX_MICROS) == "9999-12-31T23:59:59.999999Z"
    assert micros_iso(MAX_MICROS + 1) is None
    assert micros_iso(MIN_MICROS - 1) is None
    assert micros_iso(2**63 - 1) is None


def test_file_stats_never_fail_on_extreme_values() -> None:
    table = pa.table(
        {
            "t": pa.array([MIN_MICROS - 10**12, 0, 2**62], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "d": pa.array([-719_162, 0, 2_932_896], pa.int32()).cast(pa.date32()),
            "x": pa.array([float("nan"), float("inf"), -float("inf")]),
            "s": ["\x00", "a" * 10, "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace")],
        }
    )
    stats = file_stats(table)
    assert '"numRecords":3' in stats
    assert '"t"' not in stats.split('"minValues"')[1].split("maxValues")[0]  # no bound past year 9999
    assert '"x"' not in stats.split('"minValues"')[1].split("maxValues")[0]  # floats get none
