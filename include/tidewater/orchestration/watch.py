"""The supervising DAG's shape: each run's tasks check their stream once, then watch it from the triggerer.

Why not a run a minute: each run costs Airflow's database about 26 KiB (task instances, XCom,
audit log; ``benchmarks/bench_supervisor_metadata.py``), 37 MiB a day of green squares that say
nothing. With the ``@continuous`` schedule (the default) one run is active at a time:

1. each task (``supervise_<pipeline>``, :class:`SuperviseStreamOperator`) does one supervision round
   in a worker (start the stream if it should run; restart it if it died; fail when it did), then
2. defers to :class:`StreamWatchTrigger`: the triggerer looks at the stream every
   ``supervise_poll_seconds`` (the same health the round reads, written to ``health.json``), holding
   no worker slot, and wakes the task when a round would act (:func:`~tidewater.orchestration.
   supervisor.needs_round`: died, stalled, wanted running but stopped), when any stream of the run
   recorded an event (a start, a stop, a death) since the run began, or after
   ``supervise_watch_seconds``;
3. the woken task does one more round (a restart fails it: the incident is red in the grid while
   the stream is already back) and the run ends; the schedule starts the next one at once.

The second wake-up condition makes the run's tasks end together: a run whose one task restarted
its stream and failed would otherwise stay open while its other tasks watch, and the restarted
stream would go unwatched until they end. So a day costs 24 runs (one per watch) plus about two per
incident, and a death is noticed within a poll (5 s), not a minute.

A stream marked failed (crash loop) fails the round that marks it; later rounds leave it to the
streams page and wait for the resume, rather than failing one run after another without pause.

With a cron schedule instead (``TIDEWATER_SUPERVISE_SCHEDULE='*/1 * * * *'``) each run is one round,
as before: the tasks do not defer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

from tidewater.config import CONTINUOUS, Settings
from tidewater.orchestration import tasks
from tidewater.orchestration.supervisor import StreamControl, needs_round
from tidewater.times import parse_time

log = logging.getLogger(__name__)
# A watch that outlives its deadline by this much failed to report (the triggerer was down?): the
# task fails rather than waiting for ever, and the next run watches again.
DEFERRAL_GRACE = dt.timedelta(minutes=10)


def watch_reason(settings: Settings, pipeline: str, pipelines: Sequence[str], since: dt.datetime) -> str | None:
    """One look: why the run's task for ``pipeline`` should wake, or None. Records the observation."""
    reason = needs_round(StreamControl(settings, pipeline).observe())
    if reason:
        return f"{pipeline}: {reason}"
    for name in pipelines:
        changed = StreamControl(settings, name).changed_since(since)
        if changed:
            last = changed[-1]
            return f"{name}: {last.get('event')} at {last.get('at')} (after this run began)"
    return None


class StreamWatchTrigger(BaseTrigger):
    """Polls one stream's health in the triggerer until a supervision round is needed (see module)."""

    def __init__(self, *, pipeline: str, pipelines: Sequence[str], since: str, until: str, poll_seconds: float) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.pipelines = list(pipelines)
        self.since = since
        self.until = until
        self.poll_seconds = poll_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "pipelines": self.pipelines,
                "since": self.since,
                "until": self.until,
                "poll_seconds": self.poll_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        settings = Settings.from_env()
        since, until = parse_time(self.since), parse_time(self.until)
        while True:
            # File reads and a lease probe: off the triggerer's event loop.
            reason = await asyncio.to_thread(watch_reason, settings, self.pipeline, self.pipelines, since)
            now = dt.datetime.now(dt.UTC)
            if reason is None and now >= until:
                reason = f"watched since {self.since}: nothing to do"
            if reason is not None:
                yield TriggerEvent({"reason": reason, "at": now.isoformat(timespec="seconds")})
                return
            await asyncio.sleep(max(0.0, min(self.poll_seconds, (until - now).total_seconds())))


class SuperviseStreamOperator(BaseOperator):
    """``supervise_<pipeline>``: one round, then (``@continuous``) the watch, then one more round."""

    def __init__(self, *, pipeline: str, pipelines: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.pipelines = list(pipelines)

    def execute(self, context: Any) -> dict[str, Any]:
        settings = Settings.from_env()
        watching = settings.supervise_schedule == CONTINUOUS
        result = tasks.supervise_stream(self.pipeline, raise_known_failure=not watching)
        if not watching:
            return result
        since = parse_time(getattr(context.get("dag_run"), "start_date", None) or dt.datetime.now(dt.UTC))
        until = since + dt.timedelta(seconds=settings.supervise_watch_seconds)
        log.info("stream %s: %s; watching until %s", self.pipeline, result.get("state"), until.isoformat())
        self.defer(
            trigger=StreamWatchTrigger(
                pipeline=self.pipeline,
                pipelines=self.pipelines,
                since=since.isoformat(),
                until=until.isoformat(),
                poll_seconds=settings.supervise_poll_seconds,
            ),
            method_name="after_watch",
            timeout=until - dt.datetime.now(dt.UTC) + DEFERRAL_GRACE,
        )

    def after_watch(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        log.info("stream %s: the watch ended: %s", self.pipeline, (event or {}).get("reason", "no reason given"))
        return {
            **tasks.supervise_stream(self.pipeline, raise_known_failure=False),
            "woken_by": (event or {}).get("reason"),
        }
