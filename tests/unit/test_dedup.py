"""One row per business key (tidewater.dedup.resolve): first arrival wins, conflicts are recorded."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from tidewater.dedup import CONFLICT_SCHEMA, resolve

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
AT = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("response", pa.string()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
COMPARED = ("event_id", "event_time", "response")


def rows(*items: tuple[str, dt.datetime, str, int, int]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "event_id": key,
                "event_time": when,
                "response": response,
                "kafka_topic": "t",
                "kafka_partition": partition,
                "kafka_offset": offset,
                "kafka_timestamp": when,
            }
            for key, when, response, partition, offset in items
        ],
        schema=SCHEMA,
    )


def test_first_copy_in_a_batch_wins_and_equal_copies_are_counted() -> None:
    batch = rows(("a", T0, "yes", 0, 5), ("a", T0, "yes", 0, 2), ("b", T0, "no", 1, 1))
    result = resolve(batch, SCHEMA.empty_table(), key="event_id", compared=COMPARED, at=AT)
    assert sorted((r["event_id"], r["kafka_offset"]) for r in result.fresh.to_pylist()) == [("a", 2), ("b", 1)]
    assert result.duplicates == 1
    assert result.conflicts.num_rows == 0
    assert result.conflicts.schema == CONFLICT_SCHEMA


def test_a_copy_with_another_day_is_a_conflict_with_both_values() -> None:
    existing = rows(("a", T0, "yes", 0, 1))
    batch = rows(("a", T0 + dt.timedelta(days=1), "yes", 2, 9), ("c", T0, "no", 0, 10))
    result = resolve(batch, existing, key="event_id", compared=COMPARED, at=AT)
    assert [r["event_id"] for r in result.fresh.to_pylist()] == ["c"]
    (conflict,) = result.conflicts.to_pylist()
    assert conflict["key"] == "a"
    assert conflict["differences"] == "event_time"
    assert '"2026-11-21T10:00:00.000000Z"' in conflict["kept_values"]
    assert '"2026-11-22T10:00:00.000000Z"' in conflict["copy_values"]
    assert (conflict["kept_kafka_partition"], conflict["kept_kafka_offset"]) == (0, 1)
    assert (conflict["copy_kafka_partition"], conflict["copy_kafka_offset"]) == (2, 9)
    assert conflict["detected_date"] == AT.date()


def test_in_batch_conflict_twenty_minutes_apart() -> None:
    batch = rows(("a", T0, "yes", 0, 1), ("a", T0 + dt.timedelta(minutes=20), "no", 0, 2))
    result = resolve(batch, SCHEMA.empty_table(), key="event_id", compared=COMPARED, at=AT)
    assert [r["kafka_offset"] for r in result.fresh.to_pylist()] == [1]
    (conflict,) = result.conflicts.to_pylist()
    assert conflict["differences"] == "event_time,response"


def test_a_rerun_after_silver_committed_resolves_the_same() -> None:
    """Silver already holds this batch's own rows (crash between commits): they do not count as earlier copies."""
    batch = rows(("a", T0, "yes", 0, 1), ("a", T0, "no", 0, 2))
    first = resolve(batch, SCHEMA.empty_table(), key="event_id", compared=COMPARED, at=AT)
    again = resolve(batch, first.fresh, key="event_id", compared=COMPARED, at=AT)
    assert again.fresh.to_pylist() == first.fresh.to_pylist()
    assert again.conflicts.to_pylist() == first.conflicts.to_pylist()


def test_nan_equals_nan_and_empty_batches() -> None:
    schema = pa.schema([("event_id", pa.string()), ("lat", pa.float64()), *(SCHEMA.field(c) for c in SCHEMA.names[3:])])
    item = {"event_id": "a", "lat": float("nan"), "kafka_topic": "t", "kafka_partition": 0, "kafka_timestamp": T0}
    batch = pa.Table.from_pylist([{**item, "kafka_offset": 1}, {**item, "kafka_offset": 2}], schema=schema)
    result = resolve(batch, schema.empty_table(), key="event_id", compared=("event_id", "lat"), at=AT)
    assert (result.fresh.num_rows, result.duplicates, result.conflicts.num_rows) == (1, 1, 0)
    empty = resolve(schema.empty_table(), schema.empty_table(), key="event_id", compared=("lat",), at=AT)
    assert (empty.fresh.num_rows, empty.duplicates) == (0, 0)
