"""No single record can make on-time events late (issue 9, item 2).

Spark's watermark is the latest event time a query has seen minus the delay. Two records from the
issue: one whose event time *and* Kafka CreateTime are 9999-12-31 (it passed the "not in the future"
check, moved the gold watermark to year 9999 and every later on-time event was dropped), and one
4 minutes ahead of the clock, inside the 5-minute tolerance (it dropped thousands of later on-time
events until a correction ran). Now the first is quarantined (arrival is judged by the earlier of
the Kafka timestamp and the ingest time, which the producer does not control), the second is kept
in silver but held out of the streaming gold queries; on-time events that follow are all counted.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

from pipeline_helpers import gold_as_streamed, run_stream, send, table_rows
from tidewater.generator.events import GeneratedRecord, GeneratorConfig, generate
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

RSVPS = get_pipeline("rsvps")


def forged(template: GeneratedRecord, *, event_time: str, kafka_ms: int) -> GeneratedRecord:
    payload = json.loads(template.value)
    payload["event_id"] = f"forged-{uuid.uuid4()}"
    payload["event_time"] = payload["sent_time"] = event_time
    value = json.dumps(payload).encode()
    return dataclasses.replace(template, value=value, timestamp_ms=kafka_ms, event_id=payload["event_id"])


def test_one_record_ahead_of_the_clock_cannot_drop_on_time_events(spark, rsvp_settings):
    topic = rsvp_settings.topic(RSVPS.source().topic)
    now_ms = int(time.time() * 1000)
    # On-time events of the last two minutes, then the two hostile records, in the first run.
    first = list(generate(GeneratorConfig(seed=31, start_time_ms=now_ms - 120_000, rate=4), 400))
    ahead_ms = now_ms + 4 * 60_000
    ahead_text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ahead_ms / 1000))
    year_9999 = forged(first[0], event_time="9999-12-31T23:59:59Z", kafka_ms=253402300799000)
    four_minutes_ahead = forged(first[1], event_time=ahead_text, kafka_ms=now_ms)
    send(rsvp_settings, topic, [*first, year_9999, four_minutes_ahead])
    run_stream(spark, rsvp_settings)

    # On-time events that arrive after them: within the watermark delay of the clock.
    later_start = int(time.time() * 1000) - 60_000
    second = list(generate(GeneratorConfig(seed=32, start_time_ms=later_start, rate=10), 300))
    send(rsvp_settings, topic, second)
    run_stream(spark, rsvp_settings)

    silver_ids = {r["event_id"] for r in table_rows(spark, rsvp_settings, "silver")}
    assert four_minutes_ahead.event_id in silver_ids, "an event inside the skew tolerance is kept in silver"
    assert year_9999.event_id not in silver_ids
    reasons = {bytes(r["raw_value"]): r["reason"] for r in table_rows(spark, rsvp_settings, "quarantine")}
    assert "ahead of the record's arrival" in reasons[year_9999.value]

    layout = PipelineLayout.of(rsvp_settings, RSVPS)
    for gold in RSVPS.gold:
        progress = json.loads((layout.progress_dir() / f"{layout.gold_query_of(gold.name).name}.json").read_text())
        assert progress["rows_dropped_by_watermark_total"] == 0, (gold.name, progress)
        assert progress["rows_held_ahead_of_clock_total"] == 1, (gold.name, progress)
        assert progress["watermark"] < ahead_text.replace("Z", ""), progress["watermark"]

    # Every on-time event is in the streamed gold: it equals gold from silver without the held event.
    silver = read_table(spark, layout.table_uri("silver"))
    on_time = silver.where(silver.event_id != four_minutes_ahead.event_id)
    for gold in RSVPS.gold:
        expected = sorted(tuple(r) for r in gold.build(on_time).collect())
        assert gold_as_streamed(spark, rsvp_settings, gold.name) == expected, gold.name
