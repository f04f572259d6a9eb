"""How tidewater's data sources read their options (:mod:`tidewater.connectors.options`): any case,
and a numeric option outside its range is one ``ConfigError`` line, never a bound quietly switched off."""

from __future__ import annotations

import pytest

from tidewater.connectors.delta import DeltaDataSource
from tidewater.connectors.kafka_source import KafkaSourceOptions
from tidewater.connectors.options import flag, option, whole_number
from tidewater.errors import ConfigError

KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def test_options_are_read_in_any_case() -> None:
    given = {"maxFilesPerTrigger": "5", "PREFETCH": "TRUE"}
    assert option(given, "maxfilespertrigger") == "5" and option(given, "MAXFILESPERTRIGGER") == "5"
    assert option(given, "absent") is None and option(given, "absent", "x") == "x"
    assert flag(given, "prefetch") and not flag(given, "absent") and not flag({"prefetch": "yes"}, "prefetch")


def test_a_whole_number_within_its_range_or_one_line() -> None:
    assert whole_number({"n": "7"}, "N", source="s") == 7
    assert whole_number({}, "n", source="s") is None and whole_number({"n": " "}, "n", source="s", default=3) == 3
    assert whole_number({"n": "0"}, "n", source="s", minimum=0) == 0
    for bad in ("0", "-1", "1.5", "many", "1e3"):
        with pytest.raises(ConfigError, match=rf"^s option n={bad!r} must be a whole number of at least 1$"):
            whole_number({"n": bad}, "n", source="s")


def test_kafka_source_numeric_options() -> None:
    parsed = KafkaSourceOptions.parse(
        {**KAFKA, "maxOffsetsPerTrigger": "200000", "minRecordsPerTask": "0", "startingTimestamp": "0"}
    )
    assert parsed.max_offsets_per_trigger == 200_000
    assert parsed.min_records_per_task == 0 and parsed.starting_timestamp_ms == 0
    default = KafkaSourceOptions.parse(KAFKA)
    assert (default.max_offsets_per_trigger, default.max_records_per_partition, default.min_records_per_task) == (
        None,
        500_000,
        20_000,
    )
    # Before, 0 read as "no bound", a negative bound was taken as given, 0 records per partition clamped to 1.
    for name, bad in (
        ("maxOffsetsPerTrigger", "0"),
        ("maxOffsetsPerTrigger", "-5"),
        ("maxRecordsPerPartition", "0"),
        ("minRecordsPerTask", "-1"),
        ("startingTimestamp", "yesterday"),
    ):
        with pytest.raises(ConfigError, match=rf"^tidewater-kafka option {name}={bad!r} must be a whole number"):
            KafkaSourceOptions.parse({**KAFKA, name: bad})


def test_delta_source_prefetch_budget() -> None:
    for bad in ("0", "-1", "32MB"):
        source = DeltaDataSource({"path": "/nonexistent", "prefetch": "true", "prefetchMaxBytes": bad})
        with pytest.raises(ConfigError, match=rf"^tidewater-delta option prefetchMaxBytes={bad!r} must be a whole"):
            source.simpleStreamReader(None)
