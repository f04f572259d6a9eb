"""Lake tables as Airflow Assets: names from the declaration, and what a job's result puts in its events."""

from __future__ import annotations

from tidewater.batch.result import RESULT_PREFIX
from tidewater.config import Settings
from tidewater.orchestration.assets import asset_name, event_extras, job_result
from tidewater.pipelines import all_pipelines
from tidewater.pipelines.layout import PipelineLayout

SETTINGS = Settings(state_dir="/tmp/tidewater-assets-test")


def test_every_table_of_every_pipeline_has_its_own_name() -> None:
    names = [
        asset_name(SETTINGS, pipeline.name, table)
        for pipeline in all_pipelines().values()
        for table in PipelineLayout.of(SETTINGS, pipeline).table_names
    ]
    assert len(names) == len(set(names))
    assert "rsvps.silver" in names and "rsvps.gold.venue_response_counts" in names
    assert asset_name(SETTINGS, "rsvps", "silver", SETTINGS.namespace) == "rsvps.silver"
    assert asset_name(SETTINGS, "rsvps", "gold/x", "try1") == "try1.rsvps.gold.x"  # another namespace: named


def test_the_last_result_line_is_the_jobs_result() -> None:
    lines = [
        "26/11/25 10:00:00 WARN something",
        f'{RESULT_PREFIX}{{"mode": "early"}}',
        f"{RESULT_PREFIX}not json",
        f'  {RESULT_PREFIX}{{"mode": "recompute"}}  ',
        "26/11/25 10:00:01 INFO ShutdownHookManager: Shutdown hook called",
    ]
    assert job_result(lines) == {"mode": "recompute"}
    assert job_result(["no result here"]) is None


def test_events_say_what_the_job_committed_per_table() -> None:
    result = {
        "mode": "correction",
        "pipeline": "rsvps",
        "run_id": "manual__1",
        "namespace": "live",
        "interval": {"start": "2026-11-21T10:00:00Z", "end": "2026-11-21T11:00:00Z"},
        "tables": {
            "gold/venue_response_counts": {"rows": 12, "version": 7, "committed": True},
            "gold/trending_venues": {"rows": 0, "version": 3, "committed": False},
        },
    }
    extras = event_extras(SETTINGS, result)
    assert set(extras) == {"rsvps.gold.venue_response_counts"}  # nothing committed, no claim of a change
    assert extras["rsvps.gold.venue_response_counts"] == {
        "mode": "correction",
        "run_id": "manual__1",
        "interval": result["interval"],
        "namespace": "live",
        "rows": 12,
        "version": 7,
    }
    sandbox = {**result, "namespace": "try1"}
    assert set(event_extras(SETTINGS, sandbox)) == {"try1.rsvps.gold.venue_response_counts"}
