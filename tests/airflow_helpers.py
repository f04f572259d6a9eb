"""Running DAGs in a real Airflow (SQLite metadata DB) from tests, in subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets

RUNNER = Path(__file__).with_name("airflow_runner.py")


@dataclass(frozen=True)
class AirflowTestHome:
    """An AIRFLOW_HOME with a migrated database, shared by the session's DAG tests."""

    settings: Settings  # the home's own settings (state_dir holds airflow/)

    def env(self, settings: Settings | None = None) -> dict[str, str]:
        """Airflow variables of this home plus the TIDEWATER_* of ``settings`` (the test's lake, broker)."""
        import os

        env = {**os.environ, **airflow_environment(self.settings, ensure_secrets(self.settings))}
        if settings is not None:
            env.update(settings.replace(airflow_port=self.settings.airflow_port).to_env())
        env.pop("PYTEST_CURRENT_TEST", None)
        return env

    def run(self, *args: str, settings: Settings | None = None, timeout_s: float = 600) -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, str(RUNNER), *args],
            env=self.env(settings),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not lines:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise AssertionError(f"airflow runner {args} failed ({result.returncode}):\n{tail}")
        return json.loads(lines[-1])

    def dag_test(
        self, dag_id: str, conf: dict[str, Any] | None = None, *, settings: Settings, logical_date: str | None = None
    ) -> dict[str, Any]:
        args = ["test", dag_id, json.dumps(conf or {})]
        if logical_date:
            args += ["--logical-date", logical_date]
        return self.run(*args, settings=settings)
