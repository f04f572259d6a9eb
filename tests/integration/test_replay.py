"""Replays of a range: from bronze or from Kafka, into a sandbox namespace or live, optionally one entity.

One streamed data set for the module (10:00-10:05 of generated RSVPs); every replay covers
[10:01, 10:03). A sandbox replay must give the silver and gold the stream gave for the range without
touching a live table or a live lock; a live replay restricted to an entity must change only it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from pipeline_helpers import streamed_lake
from tidewater.batch.gold_diff import measure_columns
from tidewater.batch.interval import Interval
from tidewater.batch.recompute import replay
from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

RSVPS = get_pipeline("rsvps")
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
RANGE = Interval(T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=3))
LIVE_TABLES = ("bronze", "silver", "quarantine", *(f"gold/{g.name}" for g in RSVPS.gold))


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> Settings:
    """5 minutes of events (10:00-10:05) streamed through every tier in micro-batches of 1,500 records."""
    state = str(tmp_path_factory.mktemp("replay") / "state")
    return streamed_lake(spark, broker.bootstrap_servers, state, prefix="replay", seed=3, count=3000)


def layout(settings: Settings, namespace: str | None = None) -> PipelineLayout:
    return PipelineLayout.of(settings, RSVPS, namespace)


def silver_rows(spark, settings: Settings, namespace: str | None = None, *, drop: tuple[str, ...] = ()) -> list[dict]:
    df = read_table(spark, layout(settings, namespace).table_uri("silver"))
    selected = df.where((F.col("event_time") >= F.lit(RANGE.start)) & (F.col("event_time") < F.lit(RANGE.end)))
    return sorted(selected.drop(*drop).toArrow().to_pylist(), key=lambda r: r["event_id"])


def gold_rows(spark, settings: Settings, gold: str, namespace: str | None = None) -> list[dict]:
    df = read_table(spark, layout(settings, namespace).table_uri(f"gold/{gold}"))
    keys = RSVPS.gold_table(gold).keys
    selected = df.where((F.col("window_start") >= F.lit(RANGE.start)) & (F.col("window_start") < F.lit(RANGE.end)))
    return sorted(selected.toArrow().to_pylist(), key=lambda r: tuple(r[k] for k in keys))


def aggregates(rows: list[dict], gold: str) -> list[tuple]:
    """Keys and measures: the stream publishes every row as provisional, the replay decides finality."""
    keys = RSVPS.gold_table(gold).keys
    columns = (*keys, "window_end", *measure_columns(list(rows[0]), keys)) if rows else ()
    return [tuple(r[c] for c in columns) for r in rows]


def live_state(settings: Settings) -> dict[str, object]:
    """Versions of the live tables and the bytes and mtimes of the live lock files."""
    locks = sorted(Path(layout(settings).lock("silver").path).parent.glob("*.lock"))
    assert locks  # the stream took them
    return {
        "versions": {t: layout(settings).table(t).version() for t in LIVE_TABLES},
        "locks": {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in locks},
        "ledger": layout(settings).ledger_uri(),
    }


@pytest.mark.parametrize("source", ["bronze", "kafka"])
def test_sandbox_replay_gives_what_the_stream_gave(spark, lake, source):
    """From bronze, silver is identical to live silver, lineage included. From Kafka, it is identical
    except ``ingest_time``, which is when a record was ingested: the replay's read, not the stream's."""
    sandbox = f"sandbox_{source}"
    before = live_state(lake)
    result = replay(
        spark,
        lake,
        RSVPS,
        "2026-11-21T10:01:00Z",
        "2026-11-21T10:03:00Z",
        run_id=f"replay-{source}",
        source=source,
        target="sandbox",
        sandbox_namespace=sandbox,
    )
    assert result.namespace == sandbox and result.mode == "replay"
    assert result.source == ("bronze:live" if source == "bronze" else f"kafka:{lake.topic(RSVPS.source().topic)}")

    drop = ("ingest_time",) if source == "kafka" else ()
    live_silver = silver_rows(spark, lake, drop=drop)
    assert len(live_silver) > 1000
    assert silver_rows(spark, lake, sandbox, drop=drop) == live_silver
    assert layout(lake, sandbox).table("silver").row_count() == len(live_silver)  # the range only
    for gold in RSVPS.gold:
        replayed = gold_rows(spark, lake, gold.name, sandbox)
        assert aggregates(replayed, gold.name) == aggregates(gold_rows(spark, lake, gold.name), gold.name)
        assert result.tables[f"gold/{gold.name}"].rows == len(replayed) > 0
    assert any(r["status"] == "final" for r in gold_rows(spark, lake, "venue_response_counts", sandbox))

    assert live_state(lake) == before  # no live table version moved, no live lock was taken
    assert layout(lake, sandbox).lock("silver").path.exists()  # the sandbox's own locks were
    assert not layout(lake, sandbox).table("bronze").exists()  # silver and gold only


def test_sandbox_must_not_be_live(spark, lake):
    for name in (None, lake.namespace):
        with pytest.raises(ConfigError):
            replay(spark, lake, RSVPS, RANGE.start, RANGE.end, run_id="x", target="sandbox", sandbox_namespace=name)


def test_live_replay_of_one_entity_changes_only_that_entity(spark, lake):
    """Silver and gold rows of two venues are damaged; a live replay restricted to one venue repairs that
    venue only, and every other row (the other venue's included) stays as it was."""
    silver = silver_rows(spark, lake)
    gold = {g.name: gold_rows(spark, lake, g.name) for g in RSVPS.gold}
    busiest = sorted({r["venue_id"] for r in silver}, key=lambda v: -sum(r["venue_id"] == v for r in silver))
    fixed, broken = busiest[0], busiest[1]
    in_range = "event_time >= '2026-11-21T10:01:00Z' AND event_time < '2026-11-21T10:03:00Z'"
    DeltaTable(layout(lake).table_uri("silver")).delete(f"venue_id IN ({fixed}, {broken}) AND {in_range}")
    for g in RSVPS.gold:
        DeltaTable(layout(lake).table_uri(f"gold/{g.name}")).update(
            updates={"rsvp_count": "rsvp_count + 100"}, predicate=f"venue_id IN ({fixed}, {broken})"
        )
    before = {t: layout(lake).table(t).version() for t in LIVE_TABLES}

    result = replay(
        spark,
        lake,
        RSVPS,
        RANGE.start,
        RANGE.end,
        run_id="one-venue",
        target="live",
        entities=[str(fixed)],
    )
    assert result.entities == (fixed,) and result.namespace == "live"
    after = {t: layout(lake).table(t).version() for t in LIVE_TABLES}
    assert after == {t: v + (0 if t in ("bronze", "quarantine") else 1) for t, v in before.items()}

    assert silver_rows(spark, lake) == [r for r in silver if r["venue_id"] != broken]
    for g in RSVPS.gold:
        rows = gold_rows(spark, lake, g.name)
        by_venue = {v: [r for r in rows if r["venue_id"] == v] for v in (fixed, broken)}
        original = {v: [r for r in gold[g.name] if r["venue_id"] == v] for v in (fixed, broken)}
        assert aggregates(by_venue[fixed], g.name) == aggregates(original[fixed], g.name)
        assert [r["rsvp_count"] for r in by_venue[broken]] == [r["rsvp_count"] + 100 for r in original[broken]]
        others = [r for r in rows if r["venue_id"] not in (fixed, broken)]
        assert others == [r for r in gold[g.name] if r["venue_id"] not in (fixed, broken)]
    commit = layout(lake).table("gold/trending_venues").history(1)[0]
    assert commit["tidewater.entities"] == str(fixed) and commit["tidewater.run_id"] == "one-venue"
