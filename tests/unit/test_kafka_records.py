"""Kafka records as the source hands them to Spark, built without a broker (``numbered_records``)."""

from __future__ import annotations

import datetime as dt

from tidewater.connectors.kafka_client import RECORD_SCHEMA, numbered_records


def test_each_partition_counts_its_offsets_from_the_first_in_the_order_given():
    items = [(p, f"k{i}".encode(), f"v{i}".encode(), 1_000 + i, ()) for i, p in enumerate([0, 1, 0, 2, 1, 0])]
    batch = numbered_records("t", items, first_offset=10)
    assert batch.schema == RECORD_SCHEMA
    assert batch.column("partition").to_pylist() == [0, 1, 0, 2, 1, 0]
    assert batch.column("offset").to_pylist() == [10, 10, 11, 10, 11, 12]
    assert batch.column("topic").to_pylist() == ["t"] * 6
    assert batch.column("value").to_pylist() == [f"v{i}".encode() for i in range(6)]


def test_timestamps_no_reader_holds_are_null_and_headers_are_kept():
    headers = (("trace", b"\x00\xff"), ("empty", None))
    items = [(0, None, b"{}", 1_790_000_000_123, headers), (0, b"k", None, 2**62, ()), (0, b"k", b"x", None, ())]
    batch = numbered_records("t", items)
    assert batch.column("timestamp").to_pylist() == [
        dt.datetime(2026, 9, 21, 14, 13, 20, 123_000, tzinfo=dt.UTC),
        None,
        None,
    ]
    assert batch.column("headers").to_pylist()[0] == [
        {"key": "trace", "value": b"\x00\xff"},
        {"key": "empty", "value": None},
    ]
    assert batch.column("key").to_pylist()[0] is None and batch.column("value").to_pylist()[1] is None
