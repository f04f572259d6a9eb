"""The stream's Row conversions of :mod:`tidewater.keyed_state` give the values the batch's Arrow ones give."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from tidewater.keyed_state import KeyedMachine, _arrow_events, _Processor, _row_events

SCHEMA = StructType(
    [StructField("card", StringType()), StructField("at", TimestampType()), StructField("amount", DoubleType())]
)
MACHINE = KeyedMachine(
    step=lambda state, event: (state, []),
    event_columns=("card", "at", "amount"),
    time_column="at",
    order_column="card",
    output_schema=StructType([StructField("card", StringType()), StructField("at", TimestampType())]),
)

UTC = dt.UTC
TIMES = [
    dt.datetime(2026, 11, 26, 10, 0, 0, 123_999, tzinfo=UTC),  # sub-millisecond: floored
    dt.datetime(1969, 12, 31, 23, 59, 59, 999_500, tzinfo=UTC),  # before the epoch: floored, not truncated
    dt.datetime(1, 1, 2, tzinfo=UTC),
    dt.datetime(9999, 12, 30, 23, 59, 59, 999_999, tzinfo=UTC),
]


def test_rows_become_the_events_arrow_gives():
    cards = [f"c{i}" for i in range(len(TIMES))]
    amounts = [1.5, float("nan"), None, -0.0]
    rows = [Row(card=c, at=t, amount=a) for c, t, a in zip(cards, TIMES, amounts, strict=True)]
    batch = pa.RecordBatch.from_pydict(
        {"card": cards, "at": pa.array(TIMES, pa.timestamp("us", tz="UTC")), "amount": amounts}
    )
    from_rows = _row_events(rows, MACHINE)
    assert from_rows == _arrow_events(batch)
    assert from_rows[0]["at"] == 1_795_687_200_123
    assert from_rows[1]["at"] == -1  # -0.5 ms floors to -1
    assert from_rows[1]["amount"] is None  # NaN, as the batch side gives it


def test_a_naive_time_is_taken_as_utc_and_an_event_without_time_is_left_out():
    naive = Row(card="a", at=dt.datetime(2026, 11, 26, 10), amount=1.0)
    untimed = Row(card="b", at=None, amount=1.0)
    events = _row_events([naive, untimed], MACHINE)
    assert [e["card"] for e in events] == ["a"]
    assert events[0]["at"] == int(dt.datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp() * 1000)


def test_an_output_row_carries_its_times_as_utc_datetimes_in_schema_order():
    processor = _Processor(MACHINE, "card")
    row = processor._row({"at": 1_795_687_200_123, "card": "c1", "extra": 1})
    assert list(row.asDict()) == ["card", "at"]
    assert row.card == "c1"
    assert row.at == dt.datetime(2026, 11, 26, 10, 0, 0, 123_000, tzinfo=UTC)
    assert processor._row({"card": "c2", "at": None}).at is None


def test_an_output_without_timestamps_is_kept_as_given():
    machine = KeyedMachine(
        step=MACHINE.step,
        event_columns=MACHINE.event_columns,
        time_column="at",
        order_column="card",
        output_schema=StructType([StructField("card", StringType()), StructField("n", LongType())]),
    )
    assert _Processor(machine, "card")._row({"card": "x", "n": 3}) == Row(card="x", n=3)
