"""Writers of one live table are coordinated by its lock: a batch recompute over the interval the
running stream is writing, repeated while events arrive, loses and duplicates nothing.

The stream is the real detached spark-submit job; the recomputes run in this process's Spark
session at the same time, replacing silver and gold of the very interval the stream is appending to.
Without the lock, a stream commit landing between a recompute's read of bronze and its replace of
silver would be dropped from silver.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from pipeline_helpers import send, table_rows, wait_for
from tidewater.batch.recompute import recompute_interval
from tidewater.generator.events import GeneratorConfig, expected_events, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.orchestration.supervisor import RUNNING, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
TOTAL = 4_000


def test_recompute_beside_the_running_stream_loses_nothing(spark, kafka_settings, make_topic):
    settings = kafka_settings.replace(kafka_topic_prefix=make_topic(partitions=1, prefix="cw") + "-")
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 2)
    config = GeneratorConfig(seed=17, start_time_ms=parse_ts("2026-11-21T10:00:00.000Z"), rate=10, duplicate_rate=0.03)
    records = list(generate(config, TOTAL))  # event time 10:00 .. 10:06:40
    send(settings, topic, records[:500])
    layout = PipelineLayout.of(settings, RSVPS)
    control = StreamControl(settings, "rsvps")
    recomputes: list[str] = []
    try:
        control.start(reason="test")
        wait_for(lambda: control.health().state == RUNNING, timeout_s=240, what="the stream")
        wait_for(lambda: layout.table("silver").exists(), timeout_s=120, what="silver")
        arriving = threading.Thread(
            target=lambda: [
                (send(settings, topic, records[i : i + 250]), time.sleep(0.7)) for i in range(500, TOTAL, 250)
            ],
            daemon=True,
        )
        arriving.start()
        while arriving.is_alive() or len(recomputes) < 3:
            result = recompute_interval(
                spark,
                settings,
                RSVPS,
                "2026-11-21T10:00:00Z",
                "2026-11-21T11:00:00Z",
                run_id=f"concurrent-{len(recomputes)}",
            )
            recomputes.append(str(result))
        expected = len(expected_events(config, TOTAL))
        wait_for(lambda: layout.table("silver").row_count() >= expected, timeout_s=300, what=f"{expected} silver rows")
        time.sleep(2)  # a last in-flight commit, if any, would show up as a duplicate below
    finally:
        control.stop(reason="test", timeout_s=30)

    assert len(recomputes) >= 3
    silver = table_rows(spark, settings, "silver")
    assert Counter(r["event_id"] for r in silver) == Counter(expected_events(config, TOTAL).keys())
    bronze = table_rows(spark, settings, "bronze")
    assert len(bronze) == TOTAL == len({(r["partition"], r["offset"]) for r in bronze})
