"""Delivery semantics as declared: what each promise changes in the pipeline (no Spark, no broker)."""

from __future__ import annotations

import dataclasses

import pytest

from tidewater.connectors.kafka_source import KafkaSourceOptions, floor_offsets
from tidewater.errors import ConfigError, PipelineError
from tidewater.pipelines import Delivery, get_pipeline
from tidewater.quality import suites

RSVPS = get_pipeline("rsvps")


def test_exactly_once_is_the_default_and_keeps_one_row_per_key():
    assert RSVPS.delivery is Delivery.EXACTLY_ONCE
    assert RSVPS.source().deduplicate
    assert not Delivery.EXACTLY_ONCE.may_lose and not Delivery.EXACTLY_ONCE.may_repeat


def test_at_least_once_sources_keep_every_copy_and_their_silver_suite_tolerates_resends():
    pipeline = dataclasses.replace(RSVPS, delivery="at_least_once")
    assert pipeline.delivery is Delivery.AT_LEAST_ONCE and pipeline.delivery.may_repeat
    assert not pipeline.source().deduplicate
    unique = [
        e for e in suites.derive(pipeline, "silver")["expectations"] if e["type"] == "expect_column_values_to_be_unique"
    ]
    strict = [
        e for e in suites.derive(RSVPS, "silver")["expectations"] if e["type"] == "expect_column_values_to_be_unique"
    ]
    assert "mostly" in unique[0]["kwargs"] and unique[0]["kwargs"]["mostly"] < 1.0
    assert "mostly" not in strict[0]["kwargs"]


def test_at_most_once_keeps_one_row_per_key():
    pipeline = dataclasses.replace(RSVPS, delivery=Delivery.AT_MOST_ONCE)
    assert pipeline.source().deduplicate and pipeline.delivery.may_lose and not pipeline.delivery.may_repeat


def test_an_unknown_promise_is_one_line():
    with pytest.raises(PipelineError, match="delivery 'twice' is not one of exactly_once, at_least_once, at_most_once"):
        dataclasses.replace(RSVPS, delivery="twice")


def test_resuming_from_latest_raises_each_partition_to_the_floor_and_counts_what_it_skips():
    start = {"t": {"0": 10, "1": 50, "2": 7}}
    floor = {"t": {"0": 25, "1": 40}}  # partition 2 unknown to the floor: kept
    raised, skipped = floor_offsets(start, floor)
    assert raised == {"t": {"0": 25, "1": 50, "2": 7}}
    assert skipped == {"t/0": 15}


def test_resume_from_is_checkpoint_or_latest():
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    assert not KafkaSourceOptions.parse(base).resume_from_latest
    assert KafkaSourceOptions.parse({**base, "resumeFrom": "latest"}).resume_from_latest
    with pytest.raises(ConfigError, match="resumeFrom='sometimes' must be checkpoint or latest"):
        KafkaSourceOptions.parse({**base, "resumeFrom": "sometimes"})
