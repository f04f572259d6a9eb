"""The rsvps pipeline end to end on a real broker, real Spark and real Delta tables.

Runs use Trigger.AvailableNow tier by tier (bronze, silver, gold), so each test controls which
events a micro-batch sees.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline_helpers import gold_as_streamed, gold_from_silver, produce_generated, send, table_rows
from tidewater.generator.events import GeneratorConfig, expected_events, generate, parse_ts
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.runner import PipelineStreams

RSVPS = get_pipeline("rsvps")
START = parse_ts("2026-11-21T10:00:00.000Z")
# The generator's malformed kinds and the silver rule (or JSON check) that must catch each.
EXPECTED_REASON = {  # each reason starts so; strict parsing adds where and why
    "truncated_json": "malformed JSON: ",
    "not_utf8": "payload is not valid UTF-8",
    "null_event_id": "event_id missing",
    "lat_out_of_range": "venue lat outside [-90, 90]",
    "bad_response": "response not one of yes/no/waitlist",
    "missing_member": "member_id missing",
    "wrong_type_member_id": "payload does not match the contract: Expected `int | null`, got `str`",
    "bad_event_time": "event_time missing or not an ISO-8601 timestamp",
}


def run_available_now(spark, settings) -> PipelineStreams:
    streams = PipelineStreams(settings, RSVPS)
    try:
        streams.run_available_now(spark)
    finally:
        streams.close()
    return streams


@pytest.mark.parametrize("silver_query", [False, True], ids=["silver-in-bronze-batch", "silver-own-query"])
def test_bronze_silver_quarantine_gold(spark, rsvp_settings, silver_query):
    """Every record lands in bronze once; silver holds each valid event once; malformed records are
    quarantined with the right reason; gold equals a from-scratch batch computation. In both
    topologies: silver written in the bronze query's micro-batch, or by its own query."""
    rsvp_settings = rsvp_settings.replace(silver_query=silver_query)
    config = GeneratorConfig(
        seed=7,
        start_time_ms=START,
        rate=20,
        duplicate_rate=0.05,
        out_of_order_fraction=0.1,
        out_of_order_max_ms=20_000,
        malformed_rate=0.03,
    )
    sent = produce_generated(rsvp_settings, rsvp_settings.topic(RSVPS.source().topic), config, 3000)
    run_available_now(spark, rsvp_settings)

    bronze = table_rows(spark, rsvp_settings, "bronze")
    assert len(bronze) == len(sent)
    assert len({(r["partition"], r["offset"]) for r in bronze}) == len(sent)
    assert sorted(r["value"] for r in bronze) == sorted(r.value for r in sent)

    silver = table_rows(spark, rsvp_settings, "silver")
    expected = expected_events(config, 3000)
    assert Counter(r["event_id"] for r in silver) == Counter(expected.keys())
    for row in silver[:50]:
        record = expected[row["event_id"]]
        payload = json.loads(record.value)
        assert row["venue_id"] == payload["venue"]["venue_id"]
        assert row["response"] == payload["response"]
        assert int(row["event_time"].timestamp() * 1000) == record.event_time_ms

    quarantine = table_rows(spark, rsvp_settings, "quarantine")
    malformed = [r for r in sent if r.kind == "malformed"]
    assert len(quarantine) == len(malformed) > 0
    by_value = {r.value: r for r in malformed}
    for row in quarantine:  # the raw payload is kept as bytes, so every one (not UTF-8 too) is found
        source = by_value[row["raw_value"]]
        assert row["reason"].startswith(EXPECTED_REASON[source.malformed_reason]), (source, row["reason"])
    assert {r["reason"] for r in quarantine} >= {"venue lat outside [-90, 90]", "payload is not valid UTF-8 (byte 0)"}

    for gold in RSVPS.gold:
        assert gold_as_streamed(spark, rsvp_settings, gold.name) == gold_from_silver(spark, rsvp_settings, gold.name)


def test_late_events_are_kept_in_silver_and_counted(spark, rsvp_settings):
    """Events behind the gold watermark are not silently lost: silver keeps them, the gold query's
    progress counts what it dropped, and a batch recompute from silver includes exactly them.

    Spark counts dropped rows at the state store, after partial aggregation, so its figure is in
    partial-aggregate rows (<= events); the exact event count is the recompute difference."""
    topic = rsvp_settings.topic(RSVPS.source().topic)
    on_time = GeneratorConfig(seed=21, start_time_ms=START, rate=10)
    produce_generated(rsvp_settings, topic, on_time, 3000)  # event time 10:00 .. 10:05
    run_available_now(spark, rsvp_settings)

    late = GeneratorConfig(seed=22, start_time_ms=START, rate=10)
    late_records = list(generate(late, 50))  # event time 10:00:00 .. 10:00:05, watermark is ~10:03
    send(rsvp_settings, topic, late_records)
    run_available_now(spark, rsvp_settings)

    silver_ids = {r["event_id"] for r in table_rows(spark, rsvp_settings, "silver")}
    assert {r.event_id for r in late_records} <= silver_ids

    layout = PipelineLayout.of(rsvp_settings, RSVPS)
    progress = json.loads((layout.progress_dir() / "gold_venue_response_counts.json").read_text())
    assert 0 < progress["rows_dropped_by_watermark_total"] <= 50

    streamed = {r[:4]: r for r in gold_as_streamed(spark, rsvp_settings, "venue_response_counts")}
    recomputed = gold_from_silver(spark, rsvp_settings, "venue_response_counts")
    missing = sum(r[-1] - (streamed[r[:4]][-1] if r[:4] in streamed else 0) for r in recomputed)
    assert missing == 50


def test_reexecuted_silver_batch_changes_nothing(spark, rsvp_settings):
    """Deleting the last entry of Spark's commit log makes Spark re-run that batch: the Delta app
    transaction recognises it, so bronze, silver, quarantine and gold keep their versions and contents."""
    config = GeneratorConfig(seed=5, start_time_ms=START, rate=20, duplicate_rate=0.05, malformed_rate=0.05)
    produce_generated(rsvp_settings, rsvp_settings.topic(RSVPS.source().topic), config, 1000)
    run_available_now(spark, rsvp_settings)

    layout = PipelineLayout.of(rsvp_settings, RSVPS)
    tables = ("bronze", "silver", "quarantine", "gold/venue_response_counts")
    before = {t: LakeTable(layout.table_uri(t)).version() for t in tables}
    counts = {t: len(table_rows(spark, rsvp_settings, t)) for t in tables}
    for query in ("bronze", "gold_venue_response_counts"):  # bronze's batch also writes silver and quarantine
        commits = sorted(Path(layout.checkpoint(query), "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        commits[-1].unlink()
        commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)  # Hadoop's checksum file

    run_available_now(spark, rsvp_settings)
    assert {t: LakeTable(layout.table_uri(t)).version() for t in tables} == before
    assert {t: len(table_rows(spark, rsvp_settings, t)) for t in tables} == counts
