"""What the DAGs' Python tasks do. DAG files only declare tasks; the bodies live here, testable alone.

Each function reads :class:`Settings` from the environment when the task runs (never at DAG-parse
time), checks everything it can before a Spark job starts, and fails with one line.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from tidewater.batch.interval import Interval, parse_time
from tidewater.config import Settings
from tidewater.errors import ConfigError

log = logging.getLogger(__name__)

ACTIONS = ("start", "stop", "restart")


# ---- streams ----------------------------------------------------------------------------------------


def supervise_stream(pipeline: str) -> dict[str, Any]:
    """One supervision round for ``pipeline``'s live stream; raise when it had died or stalled (after
    restarting it), so the incident shows red in the grid while the stream is already back."""
    from tidewater.orchestration.supervisor import DEAD, STALLED, StreamControl, StreamIncidentError

    control = StreamControl(Settings.from_env(), pipeline)
    before = control.health()
    action, health = control.supervise()
    log.info("stream %s: %s -> %s", pipeline, action, health.summary())
    if before.state in (DEAD, STALLED) and before.desired != "stopped":
        raise StreamIncidentError(
            f"stream {pipeline} was {before.state} ({before.detail}); {action}: {health.summary()}"
        )
    return {"action": action, **health.to_dict()}


def control_stream(pipeline: str, action: str, run_id: str) -> dict[str, Any]:
    """Start, stop or restart a stream on request (the control DAG); the choice persists, so the
    supervisor does not undo a stop."""
    from tidewater.orchestration.supervisor import RUNNING, STOPPED, StreamControl

    if action not in ACTIONS:
        raise ConfigError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    control = StreamControl(Settings.from_env(), pipeline)
    by = f"dag run {run_id}"
    if action in ("stop", "restart"):
        control.set_desired(STOPPED, by=by)
        health = control.stop(reason=f"{action} requested by {by}")
        log.info("stopped: %s", health.summary())
    if action in ("start", "restart"):
        control.set_desired(RUNNING, by=by)
        health = control.start(reason=f"{action} requested by {by}")
    log.info("stream %s after %s: %s", pipeline, action, health.summary())
    return health.to_dict()


# ---- batch, replay, correction ------------------------------------------------------------------------


def interval_args(pipeline: str, start: Any, end: Any, run_id: str) -> list[str]:
    """Arguments of ``batch recompute`` for one data interval; skip the run when nothing was ingested yet."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tidewater.lake.layout import PipelineLayout
    from tidewater.pipelines import get_pipeline

    settings = Settings.from_env()
    interval = Interval.parse(start, end)  # one-line ConfigError for a bad or empty interval
    begin, finish = interval.start, interval.end
    layout = PipelineLayout.of(settings, get_pipeline(pipeline))
    if not layout.table("bronze").exists():
        raise AirflowSkipException(f"no bronze table at {layout.table_uri('bronze')} yet: nothing to recompute")
    return _batch_args("recompute", pipeline, begin, finish, run_id)


def replay_args(params: Mapping[str, Any], run_id: str) -> list[str]:
    """Validate the replay DAG's params and what the source still holds; the Spark job's arguments."""
    from tidewater.orchestration.params import check_range_held, parse_replay_params

    settings = Settings.from_env()
    request = parse_replay_params(params, settings)
    held = check_range_held(settings, request)
    log.info("replay %s [%s, %s) from %s: %s", request.pipeline, request.start, request.end, request.source, held)
    return ["replay", *request.to_args(), "--run-id", run_id]


def correction_args(pipeline: str, params: Mapping[str, Any], end: Any, run_id: str) -> list[str]:
    """The range a late-data correction looks at: the params' range when given, else the lookback
    window ending at the run's data interval end (or now)."""
    from tidewater.orchestration.params import parse_interval
    from tidewater.pipelines import get_pipeline

    settings = Settings.from_env()
    get_pipeline(pipeline)
    if params.get("start") or params.get("end"):
        begin, finish = parse_interval(params.get("start"), params.get("end"))
    else:
        finish = parse_time(end, "end") if end else dt.datetime.now(dt.UTC)
        begin = finish - dt.timedelta(hours=settings.correction_lookback_hours)
    return _batch_args("correct", pipeline, begin, finish, run_id)


# ---- maintenance --------------------------------------------------------------------------------------


def maintain(pipeline: str, run_id: str) -> list[dict[str, Any]]:
    """Compact, vacuum and checkpoint each of the pipeline's live tables (and its corrections ledger)."""
    from tidewater.lake.maintenance import maintain_pipeline

    settings = Settings.from_env()
    results = maintain_pipeline(settings, pipeline, run_id=run_id, retention_hours=settings.vacuum_retention_hours)
    for result in results:
        log.info("maintenance: %s", result.to_json())
    return [result.to_dict() for result in results]


def _batch_args(mode: str, pipeline: str, start: dt.datetime, end: dt.datetime, run_id: str) -> list[str]:
    """Arguments of ``spark_jobs/batch.py <mode>`` (see ``tidewater batch --help``)."""
    return [mode, "--pipeline", pipeline, "--start", start.isoformat(), "--end", end.isoformat(), "--run-id", run_id]
