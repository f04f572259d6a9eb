"""What the per-minute supervisor DAG costs Airflow's metadata: rows, database bytes and task log bytes per
run, and so per day.

Runs the real ``tidewater_supervise_streams`` DAG with ``airflow dags test`` in a fresh AIRFLOW_HOME
(SQLite) ``--runs`` times, every pipeline's stream wanted stopped (so a run checks the streams and starts
none: the steady state of a run that finds everything as it should be), and prints the growth of the
metadata tables (dag_run, task_instance, xcom, log, job...), of the database file, and of the task
logs, per run and per day at the default schedule (every minute: 1,440 runs).

    .venv/bin/python benchmarks/bench_supervisor_metadata.py [--runs 5]
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

from tidewater.config import Settings
from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets
from tidewater.orchestration.supervisor import STOPPED, StreamControl
from tidewater.paths import dags_folder
from tidewater.pipelines import all_pipelines

BIN = Path(sys.executable).parent
RUNS_PER_DAY = 24 * 60


def table_rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        names = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: connection.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0] for name in names}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidewater-bench-supervisor-"))
    try:
        settings = Settings(state_dir=str(root / "state"))
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
        for _ in range(args.runs):
            airflow("dags", "test", "tidewater_supervise_streams")
        rows_after, db_after, logs_after = table_rows(db), db.stat().st_size, folder_bytes(logs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    pipelines = len(all_pipelines(settings))
    print(f"{args.runs} runs of tidewater_supervise_streams ({pipelines} pipelines, one task each), SQLite:")
    grown = {t: rows_after[t] - rows_before.get(t, 0) for t in rows_after if rows_after[t] != rows_before.get(t, 0)}
    for table, delta in sorted(grown.items(), key=lambda item: -item[1]):
        print(f"  {table:<28} +{delta / args.runs:>6.1f} rows/run  +{delta / args.runs * RUNS_PER_DAY:>9,.0f} rows/day")
    for label, grown_bytes in (("database file", db_after - db_before), ("task logs", logs_after - logs_before)):
        per_run = grown_bytes / args.runs
        print(f"  {label:<28} +{per_run / 1024:>6.1f} KiB/run  +{per_run * RUNS_PER_DAY / 2**20:>9.1f} MiB/day")
    return 0


if __name__ == "__main__":
    sys.exit(main())
