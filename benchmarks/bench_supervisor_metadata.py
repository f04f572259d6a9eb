"""What the supervising DAG costs Airflow's metadata, in each of its two shapes: rows, database bytes and
task log bytes per run, and so per day.

Runs the real ``tidewater_supervise_streams`` DAG with ``airflow dags test`` in a fresh AIRFLOW_HOME
(SQLite) ``--runs`` times per shape, every pipeline's stream wanted stopped (so a run checks the streams
and starts none: the steady state of a run that finds everything as it should be), and prints the
growth of the metadata tables (dag_run, task_instance, xcom, log, job...), of the database file, and of
the task logs, per run and per day:

* ``continuous`` (the default): each task checks, defers to the stream watch, wakes at the watch's end
  and checks again (``dags test`` runs the trigger in-process; the watch is shortened to 2 s here). A
  quiet day is 86,400 / TIDEWATER_SUPERVISE_WATCH_SECONDS runs (24 at the default hour), plus about
  two per incident;
* ``cron`` (``TIDEWATER_SUPERVISE_SCHEDULE='*/1 * * * *'``): one check per run, 1,440 runs a day.

    .venv/bin/python benchmarks/bench_supervisor_metadata.py [--runs 5] [--shape continuous|cron|both]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from tidewater.config import CONTINUOUS, Settings
from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets
from tidewater.orchestration.supervisor import STOPPED, StreamControl
from tidewater.paths import dags_folder
from tidewater.pipelines import all_pipelines

BIN = Path(sys.executable).parent
PER_MINUTE = "*/1 * * * *"
SHAPES = {"continuous": CONTINUOUS, "cron": PER_MINUTE}


def table_rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        names = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: connection.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0] for name in names}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def runs_per_day(schedule: str) -> float:
    """A quiet day's runs: one per watch for the continuous shape (its default watch), one a minute else."""
    return 86_400 / Settings().supervise_watch_seconds if schedule == CONTINUOUS else 24 * 60


def measure(schedule: str, runs: int) -> dict[str, float]:
    """Per-run growth of each metadata table, the database file and the task logs for one shape."""
    root = Path(tempfile.mkdtemp(prefix="tidewater-bench-supervisor-"))
    try:
        settings = Settings(
            state_dir=str(root / "state"),
            supervise_schedule=schedule,
            supervise_watch_seconds=2.0,
            supervise_poll_seconds=0.5,
        )
        for name in all_pipelines(settings):
            StreamControl(settings, name).set_desired(STOPPED, by="bench")
        dags = root / "dags"
        dags.mkdir()
        shutil.copy(dags_folder() / "tidewater_streams.py", dags)
        env = {**os.environ, **airflow_environment(settings, ensure_secrets(settings))}
        env |= settings.to_env() | {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
        env.pop("PYTEST_CURRENT_TEST", None)

        def airflow(*command: str) -> None:
            done = subprocess.run([str(BIN / "airflow"), *command], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"airflow {' '.join(command)} failed:\n{(done.stdout + done.stderr)[-2000:]}")

        airflow("db", "migrate")
        db = settings.airflow_home / "airflow.db"
        logs = settings.airflow_home / "logs"
        airflow("dags", "test", "tidewater_supervise_streams")  # the first run also serializes the DAG
        rows_before, db_before, logs_before = table_rows(db), db.stat().st_size, folder_bytes(logs)
        for _ in range(runs):
            airflow("dags", "test", "tidewater_supervise_streams")
        rows_after, db_after, logs_after = table_rows(db), db.stat().st_size, folder_bytes(logs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    grown = {t: (rows_after[t] - rows_before.get(t, 0)) / runs for t in rows_after}
    return {
        **{t: n for t, n in grown.items() if n},
        "database file (KiB)": (db_after - db_before) / runs / 1024,
        "task logs (KiB)": (logs_after - logs_before) / runs / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    args = parser.parse_args()
    pipelines = len(all_pipelines(Settings()))
    for shape in SHAPES if args.shape == "both" else [args.shape]:
        schedule = SHAPES[shape]
        daily = runs_per_day(schedule)
        grown = measure(schedule, args.runs)
        print(
            f"{shape} ({schedule}): {args.runs} runs of tidewater_supervise_streams ({pipelines} pipelines, one "
            f"task each), SQLite; a quiet day is {daily:,.0f} runs"
        )
        for name, per_run in sorted(grown.items(), key=lambda item: (item[0].endswith(")"), -item[1])):
            if name.endswith("(KiB)"):
                label = name.removesuffix(" (KiB)")
                print(f"  {label:<28} +{per_run:>6.1f} KiB/run  +{per_run * daily / 1024:>9.2f} MiB/day")
            else:
                print(f"  {name:<28} +{per_run:>6.1f} rows/run  +{per_run * daily:>9,.0f} rows/day")
    return 0


if __name__ == "__main__":
    sys.exit(main())
