"""The scheduled interval recompute against the real stream: real broker, real Spark, real Delta.

One data set for the module: generated RSVPs (duplicates, out-of-order events, malformed records)
streamed to gold with Trigger.AvailableNow in several micro-batches. The recompute of a finished
range must reproduce what the stream wrote, rerun to the same rows, repair damage and record changes
of final gold rows in the ledger. (The spark-submit entry point, spark_jobs/batch.py, runs in
tests/dags: the batch DAG's recompute_silver and publish_gold tasks.)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from pipeline_helpers import streamed_lake
from tidewater.batch.gold_diff import measure_columns
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import recompute_interval
from tidewater.batch.result import BatchResult
from tidewater.config import Settings
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

RSVPS = get_pipeline("rsvps")
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
RANGE = Interval(T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=4))
TABLES = ("silver", *(f"gold/{g.name}" for g in RSVPS.gold))


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> Settings:
    """6 minutes of events (10:00-10:06) streamed through every tier in micro-batches of 1,500 records."""
    state = str(tmp_path_factory.mktemp("recompute") / "state")
    return streamed_lake(spark, broker.bootstrap_servers, state, prefix="recompute", seed=11, count=3600)


def layout(settings: Settings, namespace: str | None = None) -> PipelineLayout:
    return PipelineLayout.of(settings, RSVPS, namespace)


def silver_rows(spark, settings: Settings, interval: Interval = RANGE, namespace: str | None = None) -> list[dict]:
    """Silver rows of the interval, every column (Arrow keeps timestamps in UTC), ordered by event id."""
    df = read_table(spark, layout(settings, namespace).table_uri("silver"))
    selected = df.where((F.col("event_time") >= F.lit(interval.start)) & (F.col("event_time") < F.lit(interval.end)))
    return sorted(selected.toArrow().to_pylist(), key=lambda r: r["event_id"])


def gold_rows(spark, settings: Settings, gold: str, interval: Interval = RANGE, namespace: str | None = None):
    df = read_table(spark, layout(settings, namespace).table_uri(f"gold/{gold}"))
    keys = RSVPS.gold_table(gold).keys
    selected = df.where(
        (F.col("window_start") >= F.lit(interval.start)) & (F.col("window_start") < F.lit(interval.end))
    )
    return sorted(selected.toArrow().to_pylist(), key=lambda r: tuple(r[k] for k in keys))


def aggregates(rows: list[dict], gold: str) -> list[tuple]:
    """Keys and measures only: the stream publishes every row as provisional, revision 0."""
    keys = RSVPS.gold_table(gold).keys
    columns = (*keys, "window_end", *measure_columns(list(rows[0]), keys)) if rows else ()
    return [tuple(r[c] for c in columns) for r in rows]


def snapshot(spark, settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"silver": silver_rows(spark, settings)}
    for gold in RSVPS.gold:
        out[gold.name] = gold_rows(spark, settings, gold.name)
    return out


def versions(settings: Settings, namespace: str | None = None) -> dict[str, int]:
    return {t: layout(settings, namespace).table(t).version() for t in ("bronze", "quarantine", *TABLES)}


@dataclass(frozen=True)
class Parity:
    before: dict[str, Any]  # the range as the stream wrote it
    after: dict[str, Any]  # the range after the first recompute
    versions_before: dict[str, int]
    versions_after: dict[str, int]
    silver_total: int
    result: BatchResult


@pytest.fixture(scope="module")
def parity(spark, lake) -> Parity:
    """The first recompute of the range, over what the stream wrote (the other tests start from its result)."""
    before, versions_before = snapshot(spark, lake), versions(lake)
    silver_total = layout(lake).table("silver").row_count()
    result = recompute_interval(
        spark, lake, RSVPS, "2026-11-21T10:01:00Z", "2026-11-21T11:04:00+01:00", run_id="parity"
    )
    return Parity(before, snapshot(spark, lake), versions_before, versions(lake), silver_total, result)


def test_recompute_reproduces_the_stream(spark, lake, parity):
    """Stream/batch parity: for a finished range, the recompute from bronze writes the very silver rows
    the stream wrote (ingest_time included: both take it from bronze) and gold with the same keys and
    measures. Only the status differs: the stream publishes rows as provisional, the recompute marks the
    windows behind the watermark final (a status change, not a value change, so no ledger entry)."""
    before, after = parity.before, parity.after
    assert len(before["silver"]) > 1500
    assert after["silver"] == before["silver"]
    assert layout(lake).table("silver").row_count() == parity.silver_total  # nothing outside the range moved
    latest = max(r["event_time"] for r in silver_rows(spark, lake, Interval(T0, T0 + dt.timedelta(hours=1))))
    closed = latest - dt.timedelta(minutes=2)
    for gold in RSVPS.gold:
        assert aggregates(after[gold.name], gold.name) == aggregates(before[gold.name], gold.name)
        assert {r["status"] for r in before[gold.name]} == {"provisional"}
        for r in after[gold.name]:
            assert r["status"] == ("final" if r["window_end"] <= closed else "provisional"), r
            assert r["revision"] == 0
    # 1-minute windows of the range end by 10:04, behind the watermark (~10:04); 5-minute ones do not.
    assert any(r["status"] == "final" for r in after["venue_response_counts"])
    assert parity.result.ledger_entries == 0

    line = str(parity.result)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["mode"] == "recompute" and parsed["run_id"] == "parity" and parsed["source"] == "bronze:live"
    assert parsed["interval"] == {"start": "2026-11-21T10:01:00.000000Z", "end": "2026-11-21T10:04:00.000000Z"}
    assert parsed["tables"]["silver"]["rows"] == len(before["silver"])
    for table in TABLES:
        assert parsed["tables"][table]["version"] == parity.versions_after[table] == parity.versions_before[table] + 1
    for table in ("bronze", "quarantine"):
        assert parity.versions_after[table] == parity.versions_before[table]  # only silver and gold are written
    history = {t: layout(lake).table(t).history(5) for t in TABLES}
    for table, commits in history.items():
        (commit,) = [c for c in commits if c.get("tidewater.run_id") == "parity"]
        assert commit["tidewater.mode"] == "recompute", table
        assert commit["tidewater.interval_start"] == "2026-11-21T10:01:00.000000Z"
        assert commit["tidewater.interval_end"] == "2026-11-21T10:04:00.000000Z"


def test_rerun_writes_the_same_rows(spark, lake, parity):
    before = snapshot(spark, lake)
    assert before == parity.after
    again = recompute_interval(spark, lake, RSVPS, RANGE.start, RANGE.end, run_id="rerun")
    assert snapshot(spark, lake) == before  # every column, status and revision included
    for table in TABLES:
        assert again.tables[table].rows == parity.result.tables[table].rows
    assert again.ledger_entries == 0


def test_recompute_repairs_silver_and_records_changed_final_gold(spark, lake, parity):
    """Lost silver rows come back; a final gold row that differs from silver is restored, the change is in
    the ledger (old and new values, run id) and the row's revision grows. Provisional rows are replaced
    without an entry: they were published as "may still change"."""
    expected = snapshot(spark, lake)
    counts = [r for r in expected["venue_response_counts"] if r["status"] == "final"]
    victim = max(counts, key=lambda r: r["rsvp_count"])
    lost = [
        r
        for r in expected["silver"]
        if r["venue_id"] == victim["venue_id"] and victim["window_start"] <= r["event_time"] < victim["window_end"]
    ]
    assert lost
    DeltaTable(layout(lake).table_uri("silver")).delete(" OR ".join(f"event_id = '{r['event_id']}'" for r in lost))
    assert len(silver_rows(spark, lake)) == len(expected["silver"]) - len(lost)
    start = victim["window_start"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    DeltaTable(layout(lake).table_uri("gold/venue_response_counts")).update(
        updates={"rsvp_count": "rsvp_count + 100"},
        predicate=f"venue_id = {victim['venue_id']} AND response = '{victim['response']}' AND window_start = '{start}'",
    )
    provisional = next(r for r in expected["trending_venues"] if r["status"] == "provisional")
    DeltaTable(layout(lake).table_uri("gold/trending_venues")).update(
        updates={"rsvp_count": "rsvp_count + 100"},
        predicate=f"venue_id = {provisional['venue_id']} AND window_start = "
        f"'{provisional['window_start'].strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'",
    )

    result = recompute_interval(spark, lake, RSVPS, RANGE.start, RANGE.end, run_id="repair")

    repaired = snapshot(spark, lake)
    assert repaired["silver"] == expected["silver"]
    assert repaired["trending_venues"] == expected["trending_venues"]
    assert result.tables["gold/venue_response_counts"].ledger_entries == result.ledger_entries == 1
    keys = ("window_start", "venue_id", "response")
    by_key = {tuple(r[k] for k in keys): r for r in repaired["venue_response_counts"]}
    row = by_key[tuple(victim[k] for k in keys)]
    assert row == {**victim, "revision": victim["revision"] + 1}
    assert [r for r in repaired["venue_response_counts"] if r is not row] == [
        r for r in expected["venue_response_counts"] if tuple(r[k] for k in keys) != tuple(victim[k] for k in keys)
    ]
    (entry,) = Ledger(layout(lake).ledger_uri()).rows(spark)
    assert entry["dag_run_id"] == "repair" and entry["table"] == "gold/venue_response_counts"
    assert entry["window_start"] == victim["window_start"] and entry["window_end"] == victim["window_end"]
    assert json.loads(entry["keys"]) == {"venue_id": victim["venue_id"], "response": victim["response"]}
    assert json.loads(entry["old_value"]) == {
        "venue_name": victim["venue_name"],
        "rsvp_count": victim["rsvp_count"] + 100,
    }
    assert json.loads(entry["new_value"]) == {"venue_name": victim["venue_name"], "rsvp_count": victim["rsvp_count"]}
    assert entry["late_events"] == 0
    assert entry["reason"].startswith("recompute: no event arrived after the window closed")


# ---- the command line ---------------------------------------------------------------------------------


def tidewater_command() -> str:
    return str(Path(sys.executable).parent / "tidewater")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWATER_", "AWS_"))}
    return {**env, **extra}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["recompute", "--start", "2026-11-21T10:04:00Z", "--end", "2026-11-21T10:01:00Z"], "must be after start"),
        (["recompute", "--start", "10 o'clock", "--end", "2026-11-21T10:01:00Z"], "not an ISO-8601 time"),
        (
            ["correct", "--pipeline", "billing", "--start", "2026-11-21T10:00Z", "--end", "2026-11-21T11:00Z"],
            "billing",
        ),
        (
            ["replay", "--start", "2026-11-21T10:00Z", "--end", "2026-11-21T11:00Z", "--sandbox-namespace", "live"],
            "is the live namespace",
        ),
        (["replay", "--start", "2026-11-21T10:00Z", "--end", "2026-11-21T11:00Z", "--source", "s3"], "--source"),
    ],
    ids=["end-before-start", "bad-time", "unknown-pipeline", "sandbox-is-live", "bad-source"],
)
def test_cli_refuses_bad_arguments_in_one_line(tmp_path, args, fragment):
    command = [tidewater_command(), "batch", args[0], "--run-id", "r1"]
    if "--pipeline" not in args:
        command += ["--pipeline", "rsvps"]
    began = time.monotonic()
    result = subprocess.run(
        [*command, *args[1:]],
        env=clean_env(TIDEWATER_STATE_DIR=str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("tidewater: ConfigError: "), result.stderr
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr and "SparkContext" not in result.stderr
    assert result.stdout == ""
    assert time.monotonic() - began < 15  # refused before any JVM starts
