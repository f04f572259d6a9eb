"""The stream's one Spark job per micro-batch: which bronze columns ride along with the parse, and how
the driver splits them off again (the Spark side is in test_hostile_records.py)."""

from __future__ import annotations

import pyarrow as pa

from tidewater.transforms import (
    BRONZE_PREFIX,
    OUTCOME_PREFIX,
    PARSED_BRONZE,
    bronze_passthrough,
    split_bronze,
    split_outcomes,
)

BRONZE = ["key", "value", "topic", "partition", "offset", "kafka_timestamp", "timestamp_type", "headers"]
BRONZE += ["ingest_time", "ingest_date", "_strict_error"]


def test_the_parse_carries_only_the_bronze_columns_it_does_not_keep_already() -> None:
    carry, keep = bronze_passthrough(BRONZE)
    assert carry == ["timestamp_type", "headers", "ingest_date", "_strict_error"]
    assert list(keep) == [BRONZE_PREFIX + name for name in BRONZE]  # every bronze column, in bronze's order
    assert keep[BRONZE_PREFIX + "value"] == "`_raw_value`" and keep[BRONZE_PREFIX + "headers"] == "`headers`"
    assert all(keep[BRONZE_PREFIX + name] == f"`{as_parsed}`" for name, as_parsed in PARSED_BRONZE.items())


def test_the_driver_splits_the_bronze_rows_off_under_their_own_names() -> None:
    rows = pa.table(
        {
            "event_id": ["a", "b"],
            "_quarantine_reason": [None, "malformed JSON"],
            BRONZE_PREFIX + "value": [b"{}", b"{"],
            BRONZE_PREFIX + "offset": [7, 8],
        }
    )
    bronze = split_bronze(rows)
    assert bronze.column_names == ["value", "offset"]
    assert bronze.to_pylist() == [{"value": b"{}", "offset": 7}, {"value": b"{", "offset": 8}]


def test_the_driver_divides_the_rows_into_quarantine_and_silver_with_only_their_own_columns() -> None:
    """A row with a reason is quarantine's, the others silver's; neither table gets the other's columns
    or bronze's (the split selects before it filters, so the payload is not copied twice)."""
    rows = pa.table(
        {
            "event_id": ["a", None, "c"],
            "kafka_offset": [7, 8, 9],
            OUTCOME_PREFIX + "reason": [None, "malformed JSON", None],
            OUTCOME_PREFIX + "raw_value": [None, b"{", None],
            BRONZE_PREFIX + "value": [b'{"id":"a"}', b"{", b'{"id":"c"}'],
        }
    )
    quarantine, silver = split_outcomes(rows, ["event_id", "kafka_offset"])
    assert quarantine.to_pylist() == [{"reason": "malformed JSON", "raw_value": b"{"}]
    assert silver.to_pylist() == [{"event_id": "a", "kafka_offset": 7}, {"event_id": "c", "kafka_offset": 9}]
