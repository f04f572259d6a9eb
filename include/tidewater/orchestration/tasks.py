"""What the DAGs' Python tasks do. DAG files only declare tasks; the bodies live here, testable alone.

Each function reads :class:`Settings` from the environment when the task runs (never at DAG-parse
time), checks everything it can before a Spark job starts, and fails with one line.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from tidewater.batch.interval import Interval
from tidewater.config import Settings
from tidewater.times import parse_time

log = logging.getLogger(__name__)

# ---- streams ----------------------------------------------------------------------------------------


def supervise_stream(pipeline: str, *, raise_known_failure: bool = True) -> dict[str, Any]:
    """One supervision round for ``pipeline``'s live stream; raise when it had died or stalled (after
    restarting it), so the incident shows red in the grid while the stream is already back.

    A crash-looping stream (see :func:`tidewater.orchestration.supervisor.crash_loop`) is marked
    failed and no longer restarted; the round that marks it raises its one line (the attempts and the
    driver's error). Later rounds raise it again unless ``raise_known_failure`` is false: a run a
    minute stays red while the stream is down; a watching run (:mod:`tidewater.orchestration.watch`),
    which would otherwise fail again the moment it started, waits for the resume instead.
    """
    from tidewater.orchestration.supervisor import (
        DEAD,
        FAILED,
        STALLED,
        STOPPED,
        StreamControl,
        StreamFailedError,
        StreamIncidentError,
    )

    control = StreamControl(Settings.from_env(), pipeline)
    before = control.health()
    action, health = control.supervise()
    log.info("stream %s: %s -> %s", pipeline, action, health.summary())
    if health.state == FAILED and (raise_known_failure or before.state != FAILED):
        raise StreamFailedError(f"stream {health.namespace}/{pipeline} failed: {health.detail}")
    if before.state in (DEAD, STALLED) and before.desired != STOPPED:
        raise StreamIncidentError(
            f"stream {pipeline} was {before.state} ({before.detail}); {action}: {health.summary()}"
        )
    return {"action": action, **health.to_dict()}


def control_stream(params: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """Start, stop, restart or resume a stream on request (the control DAG); the choice persists, so
    the supervisor does not undo a stop. ``resume`` clears a crash loop's failed state (refused in one
    line when the stream is not failed); a start or restart clears it too."""
    from tidewater.orchestration.params import parse_control_params
    from tidewater.orchestration.supervisor import RUNNING, STOPPED, StreamControl

    pipeline, action = parse_control_params(params)
    control = StreamControl(Settings.from_env(), pipeline)
    by = f"dag run {run_id}"
    if action == "resume":
        health = control.resume(by=by)
    if action in ("stop", "restart"):
        control.set_desired(STOPPED, by=by)
        health = control.stop(reason=action, by=by)
        log.info("stopped: %s", health.summary())
    if action in ("start", "restart"):
        control.set_desired(RUNNING, by=by)
        health = control.start(reason=f"{action} requested by {by}")
    log.info("stream %s after %s: %s", pipeline, action, health.summary())
    return health.to_dict()


# ---- batch, replay, correction ------------------------------------------------------------------------


def interval_plan(pipeline: str, start: Any, end: Any, run_id: str, *, dag_id: str, run_type: Any) -> dict[str, Any]:
    """The batch DAG's steps for one interval: silver, its audit, then (past the gate) gold and its audit."""
    args = interval_args(pipeline, start, end, run_id)
    common = {"trigger": audit_trigger(run_type), "dag_id": dag_id, "run_id": run_id}
    return {
        "silver": with_layers(args, "silver"),
        "audit": audit_args(
            pipeline, start, end, checks="bronze,records,silver,reconciliation", task_id="audit_interval", **common
        ),
        "gold": with_layers(args, "gold"),
        "audit_gold": audit_args(pipeline, start, end, checks="gold,parity", task_id="audit_gold", **common),
    }


def interval_args(pipeline: str, start: Any, end: Any, run_id: str) -> list[str]:
    """Arguments of ``batch recompute`` for one data interval; skip the run when nothing was ingested yet."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tidewater.pipelines import get_pipeline
    from tidewater.pipelines.layout import PipelineLayout

    settings = Settings.from_env()
    interval = Interval.parse(start, end)  # one-line ConfigError for a bad or empty interval
    begin, finish = interval.start, interval.end
    layout = PipelineLayout.of(settings, get_pipeline(pipeline))
    missing = [name for name in layout.tier_tables("bronze") if not layout.table(name).exists()]
    if missing:
        raise AirflowSkipException(f"no bronze table at {layout.table_uri(missing[0])} yet: nothing to recompute")
    arrivals = [_first_arrival(layout.table(name)) for name in layout.tier_tables("bronze")]
    files = sum(n for n, _ in arrivals)
    known = [t for _, t in arrivals if t is not None]
    first = min(known) if len(known) == len(arrivals) else None
    if files == 0 or (first is not None and first >= finish):
        # Before the lake's history (e.g. the hour before the platform first ran), not a silent
        # producer: auditing it would fail the row-count minimum for nothing.
        raise AirflowSkipException(
            f"bronze's first record reached Kafka at {first or 'no time yet'}, after {interval}: nothing was ingested"
        )
    return _batch_args("recompute", pipeline, begin, finish, run_id)


def _first_arrival(bronze: Any) -> tuple[int, dt.datetime | None]:
    """Bronze's data files and earliest Kafka timestamp, from the Delta log's file statistics (no data
    read); the time is None when a file has no statistics."""
    import pyarrow.compute as pc

    from tidewater.lake.tables import add_actions

    actions = add_actions(bronze.open())
    stat = "min.kafka_timestamp"
    if actions.num_rows == 0 or stat not in actions.column_names or actions.column(stat).null_count:
        return actions.num_rows, None
    first = pc.min(actions.column(stat)).as_py()
    return actions.num_rows, first if first.tzinfo else first.replace(tzinfo=dt.UTC)


def replay_plan(params: Mapping[str, Any], run_id: str, *, dag_id: str) -> dict[str, list[str]]:
    """Validate the replay DAG's params and what the source still holds; then the replay job's arguments
    and those of the audit of what it wrote (silver and gold of the range,
    in the namespace it wrote; a live replay also reconciles the range's records)."""
    from tidewater.orchestration.params import check_range_held, parse_replay_params

    settings = Settings.from_env()
    request = parse_replay_params(params, settings)
    held = check_range_held(settings, request)
    log.info("replay %s [%s, %s) from %s: %s", request.pipeline, request.start, request.end, request.source, held)
    live = request.target == "live"
    audit = audit_args(
        request.pipeline,
        request.start,
        request.end,
        checks="bronze,records,silver,reconciliation,gold,parity" if live else "silver,gold",
        trigger="replay",
        dag_id=dag_id,
        run_id=run_id,
        task_id="audit",
        namespace=None if live else request.sandbox_namespace,
    )
    return {"replay": ["replay", *request.to_args(), "--run-id", run_id], "audit": audit}


def correction_plan(pipeline: str, params: Mapping[str, Any], end: Any, run_id: str, *, dag_id: str) -> dict[str, Any]:
    """The correction job's arguments and those of the audit of the gold windows it may have changed."""
    args = correction_args(pipeline, params, end, run_id)
    start, finish = args[args.index("--start") + 1], args[args.index("--end") + 1]
    audit = audit_args(
        pipeline, start, finish, checks="gold,parity", trigger="correction", dag_id=dag_id, run_id=run_id,
        task_id=f"audit_{pipeline}",
    )  # fmt: skip
    return {"correct": args, "audit": audit}


def correction_args(pipeline: str, params: Mapping[str, Any], end: Any, run_id: str) -> list[str]:
    """The range a late-data correction looks at: the params' range when given, else the lookback
    window ending at the run's data interval end (or now)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tidewater.orchestration.params import parse_interval
    from tidewater.pipelines import get_pipeline
    from tidewater.pipelines.layout import PipelineLayout

    settings = Settings.from_env()
    layout = PipelineLayout.of(settings, get_pipeline(pipeline))
    for name in layout.tier_tables("silver"):
        if not layout.table(name).exists():  # its stream has not committed yet (a new pipeline)
            raise AirflowSkipException(f"no silver table at {layout.table_uri(name)} yet: nothing to correct")
    if params.get("start") or params.get("end"):
        begin, finish = parse_interval(params.get("start"), params.get("end"))
    else:
        finish = parse_time(end, "end") if end else dt.datetime.now(dt.UTC)
        begin = finish - dt.timedelta(hours=settings.correction_lookback_hours)
    return _batch_args("correct", pipeline, begin, finish, run_id)


# ---- audits --------------------------------------------------------------------------------------------


def audit_trigger(run_type: Any) -> str:
    """How the audit table labels a run: scheduled, backfill or manual (Airflow's run type)."""
    value = str(getattr(run_type, "value", run_type) or "manual").lower()
    return value if value in ("scheduled", "backfill") else "manual"


def audit_args(
    pipeline: str,
    start: Any,
    end: Any,
    *,
    checks: str,
    trigger: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    namespace: str | None = None,
) -> list[str]:
    """Arguments of ``spark_jobs/audit.py`` (see ``tidewater audit run --help``)."""
    interval = Interval.parse(start, end)
    args = [
        "--pipeline", pipeline,
        "--start", interval.start.isoformat(),
        "--end", interval.end.isoformat(),
        "--checks", checks,
        "--trigger", trigger,
        "--dag-id", dag_id,
        "--run-id", run_id,
        "--task-id", task_id,
    ]  # fmt: skip
    return [*args, "--namespace", namespace] if namespace else args


def gold_gate(pipeline: str, dag_id: str, run_id: str, audit_task_id: str) -> dict[str, Any]:
    """Let the interval's gold be published only if its audit ran and no blocking suite failed.

    Reads the audit table (not the audit task's state): a non-blocking failure (e.g. upstream noise
    in the records suite) fails the audit task but still publishes; an audit that recorded nothing
    (it crashed) holds gold back, since nothing proves the interval sound.
    """
    from deltalake import DeltaTable

    from tidewater.lake.storage import storage_options
    from tidewater.pipelines import get_pipeline
    from tidewater.pipelines.layout import PipelineLayout
    from tidewater.quality.audit import AuditFailedError

    settings = Settings.from_env()
    layout = PipelineLayout.of(settings, get_pipeline(pipeline))
    uri = layout.audit_uri()
    rows: list[dict[str, Any]] = []
    if all(layout.table(name).exists() for name in layout.tier_tables("bronze")):
        try:
            table = DeltaTable(uri, storage_options=storage_options(uri))
            rows = [
                r
                for r in table.to_pyarrow_table().to_pylist()
                if r["dag_id"] == dag_id and r["dag_run_id"] == run_id and r["task_id"] == audit_task_id
            ]
        except Exception as exc:  # no audit table yet: handled as "no audit" below
            log.warning("audit table %s unreadable: %s", uri, exc)
    if not rows:
        raise AuditFailedError(
            f"gold of {pipeline} held back: task {audit_task_id} of run {run_id} recorded no audit in {uri}"
        )
    latest = max(r["audited_at"] for r in rows)
    rows = [r for r in rows if r["audited_at"] == latest]  # the last try's audit
    blocking = [r for r in rows if r["blocking"] and not r["success"]]
    if blocking:
        reasons = "; ".join(f"{r['suite']}: {' | '.join(r['failures'][:2])}" for r in blocking)
        raise AuditFailedError(f"gold of {pipeline} held back by blocking audit failures: {reasons}")
    passed = sorted(r["suite"] for r in rows if r["success"])
    failed = sorted(r["suite"] for r in rows if not r["success"])
    log.info("gold of %s may be published: passed %s, non-blocking failures %s", pipeline, passed, failed)
    return {"passed": passed, "non_blocking_failures": failed, "audit_id": rows[0]["audit_id"]}


# ---- maintenance --------------------------------------------------------------------------------------


def maintain(pipeline: str, run_id: str) -> list[dict[str, Any]]:
    """Compact, vacuum and checkpoint each of the pipeline's live tables (and its corrections ledger)."""
    from tidewater.batch.maintenance import maintain_pipeline

    settings = Settings.from_env()
    results = maintain_pipeline(settings, pipeline, run_id=run_id, retention_hours=settings.vacuum_retention_hours)
    for result in results:
        log.info("maintenance: %s", result.to_json())
    return [result.to_dict() for result in results]


def _batch_args(mode: str, pipeline: str, start: dt.datetime, end: dt.datetime, run_id: str) -> list[str]:
    """Arguments of ``spark_jobs/batch.py <mode>`` (see ``tidewater batch --help``)."""
    return [mode, "--pipeline", pipeline, "--start", start.isoformat(), "--end", end.isoformat(), "--run-id", run_id]


def with_layers(args: list[str], layers: str) -> list[str]:
    """``batch recompute`` arguments restricted to some layers (silver first, gold after its audit)."""
    return [*args, "--layers", layers]
