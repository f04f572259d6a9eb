"""The platform says, when it starts the in-memory broker, how fast that broker will grow."""

from __future__ import annotations

from tidewater.orchestration.platform import IN_MEMORY_BROKER_BYTES_PER_RECORD, in_memory_broker_growth


def test_the_growth_per_hour_follows_the_generators_rate() -> None:
    line = in_memory_broker_growth(750.0)  # ./tw run's default: 150 events/s to each of five pipelines
    assert "keeps every record it is sent (no retention)" in line
    assert f"~{750 * IN_MEMORY_BROKER_BYTES_PER_RECORD * 3600 / 1e9:.1f} GB an hour" in line
    assert "~0.9 GB an hour" in line
    assert "at ~750 events/s" in line and "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS" in line


def test_without_a_generator_it_still_says_what_it_keeps_and_what_to_do() -> None:
    line = in_memory_broker_growth(0.0)
    assert "GB an hour" not in line
    assert "no retention" in line and "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS" in line
