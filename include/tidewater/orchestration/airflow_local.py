"""Run the embedded Airflow 3 deployment: api-server, scheduler, dag-processor and triggerer.

Separate processes rather than ``airflow standalone``: standalone opens log servers on 0.0.0.0
(not configurable); the scheduler and triggerer here run with ``--skip-serve-logs`` (tasks run on
this machine, so the api-server reads their log files directly). Each component gets its own
process group and log file under ``<state_dir>/airflow/logs``, and :meth:`LocalAirflow.stop` ends
exactly those groups. Streaming jobs launched by Airflow tasks run in sessions of their own, so
stopping Airflow leaves them running (see :mod:`tidewater.orchestration.supervisor`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.errors import TidewaterError
from tidewater.orchestration.airflow_env import (
    ADMIN_USER,
    AirflowSecrets,
    airflow_environment,
    api_url,
    ensure_secrets,
)
from tidewater.processes import signal_group

log = logging.getLogger(__name__)

COMPONENTS: dict[str, list[str]] = {
    "api-server": ["api-server"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
# With the CeleryExecutor, a worker runs the tasks (its log server stays off: logs are local files).
CELERY_WORKER = ["celery", "worker", "--skip-serve-logs"]


def components(settings: Settings) -> dict[str, list[str]]:
    """The Airflow processes a deployment runs: the four components, plus a Celery worker if chosen."""
    if settings.airflow_executor == "celery":
        return {**COMPONENTS, "celery-worker": CELERY_WORKER}
    return dict(COMPONENTS)


class AirflowError(TidewaterError):
    """The local Airflow deployment could not start or answer."""


@dataclass
class LocalAirflow:
    settings: Settings
    secrets: AirflowSecrets = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. the cluster profile's S3 credentials

    def __post_init__(self) -> None:
        self.secrets = ensure_secrets(self.settings)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.extra_env, **airflow_environment(self.settings, self.secrets)}

    @property
    def url(self) -> str:
        return api_url(self.settings)

    @property
    def log_dir(self) -> Path:
        path = self.settings.airflow_home / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def airflow(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command against this deployment (and fail in one line)."""
        result = subprocess.run(
            [self._airflow_bin(), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
            raise AirflowError(f"airflow {' '.join(args)} failed: {lines[-1] if lines else result.returncode}")
        return result

    def _airflow_bin(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def migrate(self) -> None:
        self.airflow("db", "migrate", timeout_s=600)

    def start(self, *, wait_s: float = 180) -> LocalAirflow:
        """Migrate the metadata database, start every component, wait until the API answers."""
        self.migrate()
        try:
            for name, args in components(self.settings).items():
                with open(self.log_dir / f"{name}.log", "ab") as out:
                    self.processes[name] = subprocess.Popen(
                        [self._airflow_bin(), *args],
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
            self.wait_healthy(wait_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise AirflowError(
                        f"airflow {name} exited with code {process.returncode}: see {self.log_dir / (name + '.log')}"
                    )
            try:
                health = self.request("GET", "/api/v2/monitor/health", auth=False)
                states = {k: (v or {}).get("status") for k, v in health.items() if isinstance(v, dict)}
                if states.get("metadatabase") == "healthy" and states.get("scheduler") == "healthy":
                    return
                last = json.dumps(states)
            except (OSError, AirflowError) as exc:
                last = str(exc)
            time.sleep(1.0)
        raise AirflowError(f"Airflow at {self.url} not healthy after {timeout_s:g} s ({last}); logs in {self.log_dir}")

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM each component's process group, SIGKILL what is left after ``timeout_s``."""
        for process in self.processes.values():
            signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            signal_group(process.pid, signal.SIGKILL)  # stragglers of the group (task runners, gunicorn)
        self.processes.clear()

    # ---- REST API ---------------------------------------------------------------------------------

    def token(self) -> str:
        answer = self.request(
            "POST",
            "/auth/token",
            {"username": ADMIN_USER, "password": self.secrets.admin_password},
            auth=False,
        )
        return str(answer["access_token"])

    def request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=30) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise AirflowError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        return json.loads(text) if text else None
