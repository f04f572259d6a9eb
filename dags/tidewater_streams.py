"""Stream supervision and control.

* ``tidewater_supervise_streams`` (``@continuous``): per pipeline, start its detached streaming job if
  it should run and does not, then watch it from the triggerer (no worker slot) and act when it
  died or stalled: restart it and fail, so the incident is visible while the stream is already
  back. A run ends when a stream needed a hand or after ``TIDEWATER_SUPERVISE_WATCH_SECONDS``; the
  next starts at once (:mod:`tidewater.orchestration.watch` says why this shape). Each task returns
  the stream's health as XCom: last batch, input rate, lag per partition, state rows. A stream that
  dies on every start without committing a batch is restarted at most
  ``TIDEWATER_STREAM_MAX_RESTARTS`` times, then marked failed: no more restarts, that run fails with
  the attempts and the driver's one-line error, and later runs wait for the stream to be resumed.
* ``tidewater_stream_control`` (manual): start, stop, restart or resume one pipeline's stream. A
  stop is remembered: the supervisor does not restart a stream someone stopped. ``resume`` clears
  a failed (crash-looping) stream and starts it; start and restart clear it too.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task

from tidewater.config import CONTINUOUS, Settings
from tidewater.orchestration import tasks
from tidewater.orchestration.params import ACTIONS, CONTROL_DAG_ID
from tidewater.orchestration.watch import DEFERRAL_GRACE, SuperviseStreamOperator
from tidewater.pipelines import all_pipelines

settings = Settings.from_env()
PIPELINES = sorted(all_pipelines())

with DAG(
    dag_id="tidewater_supervise_streams",
    description="Keep every pipeline's streaming job running; record its health",
    schedule=settings.supervise_schedule,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    dagrun_timeout=dt.timedelta(minutes=10)
    + (
        dt.timedelta(seconds=settings.supervise_watch_seconds) + DEFERRAL_GRACE
        if settings.supervise_schedule == CONTINUOUS
        else dt.timedelta()
    ),
    default_args={"retries": 0},
    tags=["tidewater", "streams"],
):
    for name in PIPELINES:
        # execution_timeout bounds each round in a worker, not the watch (the deferral has its own).
        SuperviseStreamOperator(
            task_id=f"supervise_{name}", pipeline=name, pipelines=PIPELINES, execution_timeout=dt.timedelta(minutes=5)
        )

with DAG(
    dag_id=CONTROL_DAG_ID,
    description="Start, stop, restart or resume one pipeline's streaming job",
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    is_paused_upon_creation=False,
    params={
        "pipeline": Param(PIPELINES[0] if PIPELINES else "", enum=PIPELINES, description="which pipeline"),
        "action": Param(
            "stop",
            enum=list(ACTIONS),
            description="start, stop or restart its stream; resume: clear a crash loop's failed state and start it",
        ),
    },
    default_args={"retries": 0},
    tags=["tidewater", "streams"],
):

    @task(execution_timeout=dt.timedelta(minutes=5))
    def control(params: dict | None = None, run_id: str | None = None) -> dict:
        assert params is not None and run_id is not None
        return tasks.control_stream(params, run_id)

    control()
