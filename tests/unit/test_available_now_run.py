"""``--available-now`` runs its queries tier by tier and, in a process that runs it once, gives back Spark's
start-up Python workers as a long-running job does (no Spark: stand-in query and worker objects)."""

from __future__ import annotations

from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.pipelines import get_pipeline
from tidewater.streaming.runner import PipelineStreams, StreamFailedError, Tier


class StandInQuery:
    """Has read rows after two waits (its read planned), and ends after ``polls`` waits or fails there."""

    isActive = True

    def __init__(self, name: str, events: list[str], polls: int, error: str | None = None) -> None:
        self.name, self.events, self.polls, self.error = name, events, polls, error
        self.lastProgress: dict[str, Any] | None = None
        self.waited = 0

    def awaitTermination(self, timeout: float | None = None) -> bool:
        assert timeout is not None and timeout > 0  # the run looks at the workers between waits
        self.polls -= 1
        self.waited += 1
        if self.waited >= 2:
            self.lastProgress = {"sources": [{"numInputRows": 10}]}
        if self.polls > 0:
            return False
        self.isActive = False
        if self.error:
            raise RuntimeError(self.error)
        self.events.append(f"done {self.name}")
        return True


class StandInWorkers:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def release(self, modules: set[str]) -> list[int]:
        self.events.append("give back " + ", ".join(sorted(m.rsplit(".", 1)[-1] for m in modules)))
        return [1]


def run(tmp_path: Any, polls: dict[str, int], errors: dict[str, str] | None = None):
    job = PipelineStreams(Settings(state_dir=str(tmp_path)), get_pipeline("rsvps"))
    events: list[str] = []

    def start(tier: Tier, trigger: dict[str, Any]) -> StandInQuery:
        assert trigger == {"availableNow": True}
        events.append(f"start {tier.query}")
        query = StandInQuery(tier.query, events, polls.get(tier.query, 1), (errors or {}).get(tier.query))
        job._follow(tier, trigger, query)  # type: ignore[arg-type]
        return query

    job.prepare = lambda spark: None  # type: ignore[method-assign]
    job.start = start  # type: ignore[method-assign]
    job._startup_workers = StandInWorkers(events)  # type: ignore[assignment]
    return job, events


def test_tier_by_tier_giving_back_the_start_up_workers_once_no_query_needs_them(tmp_path):
    job, events = run(tmp_path, {"bronze": 3, "gold_venue_response_counts": 3, "gold_trending_venues": 2})
    job.run_available_now(spark=None, give_back_startup_workers=True)
    assert events == [
        "start bronze",
        "give back create_data_source, lookup_data_sources",  # they ran inside start()
        "give back plan_data_source_read",  # bronze has read rows: its read is planned
        "done bronze",
        "start gold_venue_response_counts",
        "give back create_data_source, lookup_data_sources",
        "give back plan_data_source_read",
        "done gold_venue_response_counts",
        "start gold_trending_venues",
        "give back create_data_source, lookup_data_sources",
        "done gold_trending_venues",  # ended with its first read: the job ends, its planner with it
    ]
    assert not job._unplanned


def test_a_session_of_many_runs_keeps_them_unless_told(tmp_path):
    job, events = run(tmp_path, {"bronze": 3, "gold_venue_response_counts": 3, "gold_trending_venues": 3})
    job.run_available_now(spark=None)
    assert [event for event in events if event.startswith("give back")] == []
    assert not job._unplanned


def test_a_query_that_fails_is_raised_in_one_line_and_nothing_after_it_starts(tmp_path):
    job, events = run(tmp_path, {"gold_venue_response_counts": 2}, errors={"gold_venue_response_counts": "boom\nat x"})
    failure = r"rsvps\.gold_venue_response_counts failed: RuntimeError: boom"
    with pytest.raises(StreamFailedError, match=failure) as failed:
        job.run_available_now(spark=None)
    assert "\n" not in str(failed.value)
    assert "start gold_trending_venues" not in events
