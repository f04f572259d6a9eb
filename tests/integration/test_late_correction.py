"""Late-data correction on a real stream: events the stream dropped behind its watermark end up in gold,
every change in the ledger, and a rerun changes nothing.

The data set: 10:00-10:05 of on-time RSVPs streamed first (the gold watermark reaches ~10:03), then
10:05-10:06:30 with 10% "late" events that happened 5.5 minutes before they were sent (event times
09:59:24-10:00:57). The stream keeps them in silver but drops them from every window that was
already closed, including windows of 09:59 that only late events fed.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from pyspark.sql import functions as F

from pipeline_helpers import produce_generated
from tidewater.batch.correction import correct_late_data
from tidewater.batch.gold_diff import measure_columns
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger, LedgerEntry
from tidewater.batch.recompute import recompute_interval
from tidewater.config import Settings
from tidewater.generator.events import GeneratorConfig, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.runner import PipelineStreams

RSVPS = get_pipeline("rsvps")
RANGE = Interval.parse("2026-11-21T09:50:00Z", "2026-11-21T10:10:00Z")
ON_TIME = GeneratorConfig(seed=31, start_time_ms=parse_ts("2026-11-21T10:00:00Z"), rate=10)
WITH_LATE = GeneratorConfig(
    seed=32, start_time_ms=parse_ts("2026-11-21T10:05:00Z"), rate=10, late_fraction=0.1, late_delay_ms=330_000
)


def stream(spark, settings: Settings) -> None:
    streams = PipelineStreams(settings, RSVPS)
    try:
        streams.run_available_now(spark)
    finally:
        streams.close()


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> Settings:
    settings = Settings(
        state_dir=str(tmp_path_factory.mktemp("late") / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"late-{uuid.uuid4().hex[:8]}-",
    )
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 4)
    produce_generated(settings, topic, ON_TIME, 3000)
    stream(spark, settings)
    produce_generated(settings, topic, WITH_LATE, 900)
    stream(spark, settings)
    return settings


def late_count() -> int:
    return sum(r.kind == "late" for r in generate(WITH_LATE, 900))


def layout(settings: Settings) -> PipelineLayout:
    return PipelineLayout.of(settings, RSVPS)


def closed_before(spark, settings: Settings) -> dt.datetime:
    silver = read_table(spark, layout(settings).table_uri("silver"))
    latest = silver.agg(F.max("event_time").alias("m")).toArrow().column("m")[0].as_py()
    return latest - dt.timedelta(minutes=2)


def in_range(df, closed: dt.datetime | None = None):
    selected = df.where((F.col("window_start") >= F.lit(RANGE.start)) & (F.col("window_start") < F.lit(RANGE.end)))
    return selected if closed is None else selected.where(F.col("window_end") <= F.lit(closed))


def keyed(rows: list[dict], gold: str) -> dict[tuple, dict]:
    keys = RSVPS.gold_table(gold).keys
    return {tuple(r[k] for k in keys): r for r in rows}


def published(spark, settings: Settings, gold: str, closed: dt.datetime | None = None) -> dict[tuple, dict]:
    table = read_table(spark, layout(settings).table_uri(f"gold/{gold}"))
    return keyed(in_range(table, closed).toArrow().to_pylist(), gold)


def from_silver(spark, settings: Settings, gold: str, closed: dt.datetime) -> dict[tuple, dict]:
    """The gold rows of the closed windows computed as a batch from silver (the same transform)."""
    silver = read_table(spark, layout(settings).table_uri("silver"))
    return keyed(in_range(RSVPS.gold_table(gold).build(silver), closed).toArrow().to_pylist(), gold)


def measures(rows: dict[tuple, dict], gold: str) -> dict[tuple, tuple]:
    keys = RSVPS.gold_table(gold).keys
    some = next(iter(rows.values()))
    columns = ("window_end", *measure_columns(list(some), keys))
    return {k: tuple(r[c] for c in columns) for k, r in rows.items()}


def count_of(value: str | None) -> int:
    return 0 if value is None else json.loads(value)["rsvp_count"]


def test_correction_puts_late_events_into_gold_and_records_every_change(spark, lake):
    closed = closed_before(spark, lake)
    counts = "venue_response_counts"
    streamed = published(spark, lake, counts, closed)
    recomputed = from_silver(spark, lake, counts, closed)
    missing = sum(r["rsvp_count"] - streamed.get(k, {"rsvp_count": 0})["rsvp_count"] for k, r in recomputed.items())
    assert missing == late_count() > 0  # the stream dropped every late event: they are all behind its watermark
    before_versions = {g.name: layout(lake).table(f"gold/{g.name}").version() for g in RSVPS.gold}
    before = {g.name: published(spark, lake, g.name) for g in RSVPS.gold}

    result = correct_late_data(spark, lake, RSVPS, "2026-11-21T09:50:00Z", "2026-11-21T10:10:00Z", run_id="late-1")
    assert result.mode == "correction" and result.ledger_entries > 0

    ledger = [e for e in Ledger(layout(lake).ledger_uri()).rows(spark) if e["dag_run_id"] == "late-1"]
    assert len(ledger) == result.ledger_entries
    for gold in RSVPS.gold:
        name = f"gold/{gold.name}"
        after = published(spark, lake, gold.name)
        expected = from_silver(spark, lake, gold.name, closed)
        closed_rows = {k: r for k, r in after.items() if r["window_end"] <= closed}
        assert measures(closed_rows, gold.name) == measures(expected, gold.name)  # gold == the batch recompute
        assert {r["status"] for r in closed_rows.values()} == {"final"}
        open_rows = {k: r for k, r in after.items() if r["window_end"] > closed}
        assert open_rows == {k: r for k, r in before[gold.name].items() if r["window_end"] > closed}

        entries = [e for e in ledger if e["table"] == name]
        assert entries and result.tables[name].ledger_entries == len(entries)
        assert result.tables[name].version == before_versions[gold.name] + 1
        changed_keys = set()
        for entry in entries:
            assert entry["window_start"] >= RANGE.start and entry["window_end"] <= closed
            group = json.loads(entry["keys"])
            assert set(group) == set(gold.keys) - {"window_start", "window_end"}
            key = next(k for k, r in after.items() if _matches(r, entry, group))
            changed_keys.add(key)
            assert after[key]["revision"] == 1
            new_values = {m: after[key][m] for m in measure_columns(list(after[key]), gold.keys)}
            assert json.loads(entry["new_value"]) == new_values
            old = before[gold.name].get(key)
            if old is None:
                assert entry["old_value"] is None and entry["reason"].startswith("window missing from gold")
            else:
                assert json.loads(entry["old_value"]) == {m: old[m] for m in new_values}
            assert entry["late_events"] > 0
            assert entry["reason"].endswith("arrived after the window closed (behind the watermark)")
            assert entry["corrected_at"] is not None
        flipped = [r for k, r in closed_rows.items() if k not in changed_keys]
        assert flipped and all(r["revision"] == 0 for r in flipped)  # status alone became final
        if gold.name == counts:
            # Tumbling windows: every late event of a row arrived after its window closed, and is the difference.
            for entry in entries:
                assert entry["late_events"] == count_of(entry["new_value"]) - count_of(entry["old_value"])
            assert sum(e["late_events"] for e in entries) == late_count()
            assert any(e["old_value"] is None for e in entries)  # 09:59 windows only late events fed

    # A rerun finds nothing to change and appends nothing.
    versions = {g.name: layout(lake).table(f"gold/{g.name}").version() for g in RSVPS.gold}
    ledger_table = Ledger(layout(lake).ledger_uri())
    ledger_version = ledger_table.table.version()
    again = correct_late_data(spark, lake, RSVPS, RANGE.start, RANGE.end, run_id="late-2")
    assert again.ledger_entries == 0
    assert all(not t.committed for t in again.tables.values())
    assert {g.name: layout(lake).table(f"gold/{g.name}").version() for g in RSVPS.gold} == versions
    # A retried run (same run id) whose gold commit failed after its ledger commit records nothing twice.
    assert ledger_table.record(spark, [LedgerEntry(**e) for e in ledger]) is None
    assert ledger_table.table.version() == ledger_version

    # The scheduled recompute agrees with the correction: nothing to record, final rows stay final.
    corrected = {g.name: published(spark, lake, g.name, closed) for g in RSVPS.gold}
    recompute = recompute_interval(spark, lake, RSVPS, RANGE.start, RANGE.end, run_id="after-correction")
    assert recompute.ledger_entries == 0
    for gold in RSVPS.gold:
        assert published(spark, lake, gold.name, closed) == corrected[gold.name]


def _matches(row: dict, entry: dict, group: dict) -> bool:
    return (
        row["window_start"] == entry["window_start"]
        and row["window_end"] == entry["window_end"]
        and all(row[k] == v for k, v in group.items())
    )
