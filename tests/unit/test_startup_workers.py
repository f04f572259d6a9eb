"""When the streaming job gives back Spark's start-up Python workers: lookup and creation once the queries
have started, read planning only once every source of every running query has read rows (no Spark:
stand-in queries; the release itself against real Spark is in tests/integration/test_startup_workers_release.py)."""

from __future__ import annotations

from typing import Any

from tidewater.config import Settings
from tidewater.pipelines import get_pipeline
from tidewater.streaming.runner import PipelineStreams
from tidewater.streaming.startup_workers import (
    READ_PLANNING,
    SOURCE_CREATION,
    SOURCE_LOOKUP,
    STARTUP_WORKER_MODULES,
    ReadSources,
)


def batch(*rows: int) -> dict[str, Any]:
    return {"sources": [{"numInputRows": n} for n in rows]}


def every_source_read(progress: list[dict[str, Any]]) -> bool:
    sources = ReadSources()
    return any([sources.add(record) for record in progress])


def test_every_source_read_needs_rows_from_each_source_in_some_batch():
    assert not every_source_read([])
    assert not every_source_read([{"sources": []}])
    assert not every_source_read([batch(0)])  # a trigger without data plans nothing
    assert every_source_read([batch(0), batch(5)])
    assert not every_source_read([batch(5, 0), batch(3, 0)])  # the second input never had data
    assert every_source_read([batch(5, 0), batch(0, 1)])  # each input in a batch of its own
    assert every_source_read([{"sources": [{"numInputRows": None}]}, batch(2)])


def test_read_sources_accumulates_batch_by_batch():
    sources = ReadSources()
    assert not sources.add(None)  # no batch yet
    assert not sources.add(batch(7, 0))
    assert not sources.add(batch(0, 0))  # an idle trigger forgets nothing
    assert sources.add(batch(0, 3))


class Query:
    def __init__(self, progress: dict[str, Any] | None = None, active: bool = True) -> None:
        self.lastProgress = progress
        self.isActive = active


class Recorder:
    def __init__(self) -> None:
        self.released: list[set[str]] = []

    def release(self, modules: set[str]) -> list[int]:
        self.released.append(set(modules))
        return []


def job_with(tmp_path: Any, **queries: Query) -> tuple[PipelineStreams, Recorder]:
    job = PipelineStreams(Settings(state_dir=str(tmp_path)), get_pipeline("rsvps"))
    recorder = Recorder()
    job._startup_workers = recorder  # type: ignore[assignment]
    job.queries.update(queries)  # type: ignore[arg-type]
    job._unplanned.update({name: ReadSources() for name in queries})
    job._startup_pending.update(STARTUP_WORKER_MODULES)
    return job, recorder


def test_lookup_and_creation_go_at_once_planning_once_every_query_read(tmp_path):
    bronze, gold = Query(batch(2000)), Query(batch(0))
    job, recorder = job_with(tmp_path, bronze=bronze, gold=gold)
    job._follow_start_up()
    assert recorder.released == [{SOURCE_LOOKUP, SOURCE_CREATION}]  # gold has not planned its read yet
    job._follow_start_up()
    assert len(recorder.released) == 1
    gold.lastProgress = batch(40)
    job._follow_start_up()
    assert recorder.released[1:] == [{READ_PLANNING}]
    job._follow_start_up()
    assert len(recorder.released) == 2  # nothing left to give back


def test_a_query_restarted_later_makes_them_pending_again(tmp_path):
    job, recorder = job_with(tmp_path, gold=Query(batch(40)))
    job._follow_start_up()
    assert recorder.released == [set(STARTUP_WORKER_MODULES)]
    # what start() records for a restarted query: Spark starts new daemons for it
    job.queries["gold"] = Query()  # type: ignore[assignment]
    job._unplanned["gold"] = ReadSources()
    job._startup_pending.update(STARTUP_WORKER_MODULES)
    job._follow_start_up()
    assert recorder.released[1:] == [{SOURCE_LOOKUP, SOURCE_CREATION}]
    job.queries["gold"].lastProgress = batch(1)  # type: ignore[attr-defined]
    job._follow_start_up()
    assert recorder.released[2:] == [{READ_PLANNING}]


def test_a_stopped_query_keeps_planning_pending(tmp_path):
    job, recorder = job_with(tmp_path, gold=Query(batch(40), active=False))
    job._follow_start_up()
    assert recorder.released == [{SOURCE_LOOKUP, SOURCE_CREATION}]


def test_nothing_goes_while_a_restarted_query_has_not_run_a_batch(tmp_path):
    gold = Query(batch(40))
    job, recorder = job_with(tmp_path, gold=gold)
    job._restarts["gold"] = 1  # what check_queries records when it restarts a query
    job._follow_start_up()
    assert recorder.released == []  # a next restart reuses the idle workers
    del job._restarts["gold"]  # it ran a batch (see check_queries)
    job._follow_start_up()
    assert recorder.released == [set(STARTUP_WORKER_MODULES)]
