"""End to end: the platform command with the real Airflow 3 scheduler, API server, DAG processor
and triggerer, the embedded broker and detached Spark streaming jobs.

1. ``tidewater platform`` brings everything up; the supervising DAG starts the stream unaided.
2. The streaming driver is killed with SIGKILL; the supervising DAG restarts it (its run fails,
   so the incident is visible) and nothing is lost or duplicated.
3. The batch DAG catches up on the last finished hour (a REST-created backfill is the cluster
   profile's test, on Airflow's PostgreSQL).
4. ``tidewater stop`` ends every process the platform started.

That a stream outlives Airflow (and Airflow, back, starts no second copy) and a stop from the UI's
control DAG are the cluster profile's tests (tests/integration/test_cluster_profile.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline_helpers import table_rows, wait_for
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.orchestration.airflow_local import LocalAirflow
from tidewater.orchestration.supervisor import RUNNING, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import group_members

pytestmark = [pytest.mark.slow, pytest.mark.airflow]

RSVPS = get_pipeline("rsvps")
BIN = Path(sys.executable).parent


def silver_rows(settings: Settings) -> int:
    table = PipelineLayout.of(settings, RSVPS).table("silver")
    return table.row_count() if table.exists() else 0


def dag_runs(airflow: LocalAirflow, dag_id: str) -> list[dict[str, Any]]:
    return airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=-start_date")["dag_runs"]


def kill_groups(pgids: set[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def test_platform_end_to_end(spark, tmp_path: Path):
    settings = Settings(state_dir=str(tmp_path / "state"), airflow_port=free_port(), pipelines="rsvps")
    log = tmp_path / "platform.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWATER_")}  # no fixture's settings leak in
    env.update({k: v for k, v in settings.to_env().items() if k in _PLATFORM_VARS})
    # At least one finished hour to catch up on and backfill (two if the clock passes an hour meanwhile).
    batch_start = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    env["TIDEWATER_BATCH_START_DATE"] = batch_start.isoformat()
    # No settling time: within five minutes past the hour the catch-up run would wait that long.
    env["TIDEWATER_BATCH_SETTLE_MINUTES"] = "0"
    with open(log, "wb") as out:
        platform = subprocess.Popen(
            [str(BIN / "tidewater"), "platform", "--rate", "60", "--report-seconds", "15"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state_file = Path(settings.state_dir) / "platform.json"
    control = StreamControl(settings, "rsvps")
    started_groups: set[int] = set()
    try:
        wait_for(lambda: "Airflow UI at" in log.read_text(), timeout_s=300, what="Airflow to start", log=log)
        printed = re.search(r"admin password \(shown once\): (\S+)", log.read_text())
        password_file = settings.airflow_home / "simple_auth_manager_passwords.json.generated"
        assert printed and json.loads(password_file.read_text())["admin"] == printed.group(1)
        assert password_file.stat().st_mode & 0o077 == 0  # owner only
        platform_state = json.loads(state_file.read_text())
        started_groups |= set(platform_state["airflow_pids"].values()) | {platform_state["broker_pid"]}
        airflow = LocalAirflow(settings.replace(kafka_bootstrap_servers="unused"))

        # 1. The supervising DAG starts the stream, no clicks.
        wait_for(lambda: control.health().state == RUNNING, timeout_s=300, what="the supervised stream", log=log)
        wait_for(lambda: silver_rows(settings) > 0, timeout_s=300, what="silver rows", log=log)
        first = control.health().pid
        started_groups.add(os.getpgid(first))

        #    The supervising DAG's shape: a run whose task waits in the triggerer (deferred, no worker
        #    slot) once the stream is up, rather than one run a minute.
        def watching() -> list[dict[str, Any]] | None:
            runs = dag_runs(airflow, "tidewater_supervise_streams")
            active = [r for r in runs if r["state"] == "running"]
            if not active:
                return None
            path = f"/api/v2/dags/tidewater_supervise_streams/dagRuns/{active[0]['dag_run_id']}/taskInstances"
            states = [t["state"] for t in airflow.request("GET", path)["task_instances"]]
            return runs if states and all(state == "deferred" for state in states) else None

        runs = wait_for(watching, timeout_s=120, what="a supervising run watching from the triggerer", log=log)
        assert {r["run_type"] for r in runs} == {"scheduled"}, runs  # the continuous schedule's, nobody triggered
        assert len(runs) <= 3, [(r["dag_run_id"], r["state"]) for r in runs]  # the start's run, then the watch

        # 2. kill -9 the driver: the supervising DAG restarts it and its run shows the incident.
        os.kill(first, signal.SIGKILL)
        restarted = wait_for(
            lambda: control.health().state == RUNNING and control.health().pid != first and control.health().pid,
            timeout_s=300,
            what="the supervising DAG to restart the stream",
            log=log,
        )
        started_groups.add(os.getpgid(restarted))
        wait_for(  # the restart is visible in the grid: that supervision run failed
            lambda: any(r["state"] == "failed" for r in dag_runs(airflow, "tidewater_supervise_streams")),
            timeout_s=120,
            what="the supervising run that restarted the stream to show as failed",
            log=log,
        )
        before = silver_rows(settings)
        wait_for(lambda: silver_rows(settings) > before, timeout_s=240, what="silver to grow after restart", log=log)

        # 3. The batch DAG caught up on the last finished hour by itself (the scheduler's own run, on
        #    SQLite; a REST-created backfill on PostgreSQL is the cluster profile's test). Only that hour's
        #    runs are judged: if the clock passes an hour meanwhile, the new hour's run holds live data
        #    still in flight (no settling time here), and its audit may rightly fail.
        def caught_up() -> list[dict[str, Any]] | None:
            runs = [
                r
                for r in dag_runs(airflow, "tidewater_batch_rsvps")
                if r["run_type"] == "scheduled" and dt.datetime.fromisoformat(r["data_interval_start"]) == batch_start
            ]
            return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None

        runs = wait_for(caught_up, timeout_s=600, what="the catch-up run", log=log)
        assert [r["state"] for r in runs] == ["success"], runs
    finally:
        subprocess.run([str(BIN / "tidewater"), "stop", "--timeout", "240"], env=env, timeout=300)
        if platform.poll() is None:
            os.killpg(platform.pid, signal.SIGKILL)
        platform.wait(timeout=30)
        leftover = {g: group_members(g) for g in started_groups if group_members(g)}
        kill_groups(set(leftover))
        control.stop(reason="test cleanup", timeout_s=10)

    # 4. Everything the platform started has ended, and it exited cleanly.
    assert platform.returncode == 0, log.read_text()[-3000:]
    assert leftover == {}, leftover
    assert control.health().state != RUNNING

    bronze = table_rows(spark, settings, "bronze")
    for partition, offsets in _by_partition(bronze).items():  # every offset once, none missing before the last
        assert sorted(offsets) == list(range(max(offsets) + 1)), f"partition {partition}"
    silver = table_rows(spark, settings, "silver")
    assert Counter(r["event_id"] for r in silver).most_common(1)[0][1] == 1


def _by_partition(rows: list[dict[str, Any]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for row in rows:
        out.setdefault(row["partition"], []).append(row["offset"])
    return out


# The platform's own variables; the rest (TIDEWATER_KAFKA_BOOTSTRAP_SERVERS empty: embedded) stays default.
# One pipeline: the test is about supervision, and a stream job per pipeline would share 2 cores.
_PLATFORM_VARS = {"TIDEWATER_STATE_DIR", "TIDEWATER_AIRFLOW_PORT", "TIDEWATER_PIPELINES"}
