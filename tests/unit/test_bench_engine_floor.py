"""The engine-floor bench's pure parts: the Kafka records it generates, the floor it sums, its arguments."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_engine_floor
from bench_engine_floor import PARTITIONS, floor_report, kafka_records, main

from tidewater.connectors.kafka_client import RECORD_SCHEMA
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.samples import GeneratorConfig, generate


def test_generated_records_are_kafka_records_numbered_per_partition():
    pipeline = get_pipeline("rsvps")
    records = list(generate(GeneratorConfig(start_time_ms=1_790_000_000_000, rate=100), 500, pipeline.sample_events))
    table = kafka_records(records, "rsvps")
    assert table.schema == RECORD_SCHEMA
    assert table.column("value").to_pylist() == [r.value for r in records]
    assert table.column("timestamp").cast("int64").to_pylist() == [r.timestamp_ms * 1000 for r in records]
    partitions = table.column("partition").to_pylist()
    offsets = table.column("offset").to_pylist()
    for partition in set(partitions):
        assert 0 <= partition < PARTITIONS
        numbered = [o for p, o in zip(partitions, offsets, strict=True) if p == partition]
        assert numbered == list(range(partitions.count(partition)))
    by_key: dict[bytes, set[int]] = {}
    for record, partition in zip(records, partitions, strict=True):
        by_key.setdefault(record.key, set()).add(partition)
    assert all(len(p) == 1 for p in by_key.values())  # a key keeps its partition, as a producer's would


def test_the_floor_sums_the_medians_of_its_steps_only():
    timings = {
        "read": ("floor", [2.0, 1.0, 3.0]),
        "gold": ("floor", [1.5, 0.5, 9.0]),
        "parse": ("reference", [8.0, 8.0, 8.0]),
    }
    report = floor_report(1_000_000, timings)
    assert report["floor_s"] == pytest.approx(3.5)
    assert report["max_events_per_s"] == pytest.approx(1_000_000 / 3.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pipeline", "nope"], "unknown pipeline 'nope'"),
        (["--events", "0"], "must be at least 1"),
        (["--rounds", "0"], "must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_before_spark_starts(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_pipeline_without_sample_events_is_one_line_before_spark_starts(monkeypatch, capsys):
    silent = dataclasses.replace(get_pipeline("rsvps"), sample_events=None)
    monkeypatch.setattr(bench_engine_floor, "get_pipeline", lambda name: silent)
    with pytest.raises(SystemExit) as exit_info:
        main(["--pipeline", "rsvps"])
    assert exit_info.value.code == 2
    assert "--pipeline rsvps: the pipeline declares no sample events" in capsys.readouterr().err
