"""A long-running job restarts one query whose Python worker missed Spark's connect-back window (no Spark:
stand-in query objects), and fails as a whole for anything else or once the restarts are spent."""

from __future__ import annotations

from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.pipelines import get_pipeline
from tidewater.streaming import runner
from tidewater.streaming.runner import MAX_WORKER_RESTARTS, WORKER_TIMEOUT, PipelineStreams, StreamFailedError, Tier


class StoppedQuery:
    isActive = False

    def __init__(self, error: str) -> None:
        self.error = error

    def exception(self) -> Exception:
        return RuntimeError(self.error)


class RunningQuery:
    isActive = True
    lastProgress = None  # no batch yet since its start


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.time, "sleep", lambda seconds: None)


def streams(tmp_path: Any) -> tuple[PipelineStreams, list[str]]:
    job = PipelineStreams(Settings(state_dir=str(tmp_path)), get_pipeline("rsvps"))
    started: list[str] = []

    def start(tier: Tier, trigger: dict[str, Any]) -> Any:
        started.append(tier.query)
        job.queries[tier.query] = RunningQuery()
        return job.queries[tier.query]

    job.start = start  # type: ignore[method-assign]
    tier = Tier("gold_trending_venues", "silver", "gold")
    job._started["gold_trending_venues"] = (tier, {"processingTime": "5 seconds"})
    return job, started


def test_a_worker_that_missed_its_window_restarts_only_that_query(tmp_path):
    job, started = streams(tmp_path)
    for _ in range(MAX_WORKER_RESTARTS):
        job.queries["gold_trending_venues"] = StoppedQuery(f"org.apache.spark.SparkException: {WORKER_TIMEOUT}.")
        job.check_queries()
    assert started == ["gold_trending_venues"] * MAX_WORKER_RESTARTS
    job.queries["gold_trending_venues"] = StoppedQuery(f"org.apache.spark.SparkException: {WORKER_TIMEOUT}.")
    with pytest.raises(StreamFailedError, match="gold_trending_venues failed"):
        job.check_queries()  # the budget is spent: the supervisor restarts the job


def test_the_budget_is_for_misses_in_a_row(tmp_path, monkeypatch):
    job, started = streams(tmp_path)
    for _ in range(MAX_WORKER_RESTARTS + 2):
        job.queries["gold_trending_venues"] = StoppedQuery(WORKER_TIMEOUT)
        job.check_queries()
        job.queries["gold_trending_venues"].lastProgress = {"batchId": 1}  # the restarted query ran a batch
        job.check_queries()
    assert len(started) == MAX_WORKER_RESTARTS + 2


def test_any_other_failure_fails_the_job(tmp_path):
    job, started = streams(tmp_path)
    job.queries["gold_trending_venues"] = StoppedQuery("DataLossError: offsets 3..9 were deleted")
    with pytest.raises(StreamFailedError, match="DataLossError"):
        job.check_queries()
    assert started == []
