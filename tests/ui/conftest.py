"""Fixtures of the UI tests: a real Airflow api-server with the tidewater plugin over a small lake,
and headless Chromium sessions.

One api-server per test module (``airflow db migrate``, one ``airflow dags test`` of a one-task DAG that
carries the audit link, and start-up take most of the time); it runs
in its own process group, which teardown kills whatever happened; every browser is quit (and its
chromedriver ended by pid if quitting fails).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_support import (
    AUDIT_DAG,
    AUDIT_DAG_FILE,
    CHROMEDRIVER,
    CHROMIUM,
    CHROMIUM_FLAGS,
    UiServer,
    build_lake,
    http,
    ui_settings,
)

from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets
from tidewater.orchestration.airflow_local import COMPONENTS
from tidewater.paths import dags_folder, project_root

# ---- the api-server ----------------------------------------------------------------------------------


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL whatever is left (its gunicorn/uvicorn workers too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """The lake plus a real ``airflow api-server`` (SimpleAuthManager, our plugin) on a free port."""
    root = tmp_path_factory.mktemp("ui")
    settings = ui_settings(root)
    secrets = ensure_secrets(settings)
    dags = root / "dags"
    dags.mkdir()
    (dags / "ui_test_audit.py").write_text(AUDIT_DAG_FILE)
    # The real control DAG, which the streams page's buttons trigger (no scheduler here: its runs stay queued).
    shutil.copy(dags_folder() / "tidewater_streams.py", dags / "tidewater_streams.py")
    # The README's DAG of a user's own, scheduled on rsvps.gold.* (a test starts a scheduler for it).
    shutil.copy(project_root() / "examples" / "rsvps_gold_consumer.py", dags / "rsvps_gold_consumer.py")
    env = {**os.environ, **airflow_environment(settings, secrets), "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    env = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}
    airflow = str(Path(sys.executable).parent / "airflow")
    # One finished run of the audit-like DAG; every DAG of the folder in the database (the control DAG).
    # The supervising DAG paused: a scheduler a test starts must not launch streams from this state folder.
    for args in (
        ["db", "migrate"],
        ["dags", "test", AUDIT_DAG],
        ["dags", "reserialize"],
        ["dags", "pause", "tidewater_supervise_streams"],
    ):
        done = subprocess.run(
            [airflow, *args], env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 0, f"airflow {args}: " + done.stdout[-2000:] + done.stderr[-2000:]
    with contextlib.closing(sqlite3.connect(settings.airflow_home / "airflow.db")) as db:
        (run_id,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ?", (AUDIT_DAG,)).fetchone()
    lake = build_lake(root, settings, run_id)
    log = root / "api-server.log"
    url = f"http://127.0.0.1:{settings.airflow_port}"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [airflow, "api-server"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise AssertionError(f"api-server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if http(url + "/api/v2/monitor/health").status == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"api-server not answering after 180 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield UiServer(url=url, lake=lake, password=secrets.admin_password, log=log, env=env)
    finally:
        _kill_group(process)


@pytest.fixture
def airflow_scheduler(ui_server: UiServer) -> Iterator[Path]:
    """A real ``airflow scheduler`` (LocalExecutor, its task processes in its process group) beside the
    module's api-server, for as long as the test runs; yields its log. Started as the platform starts
    it: without its log server, which would take port 8793 on every interface."""
    log = ui_server.log.with_name("scheduler.log")
    airflow = str(Path(sys.executable).parent / "airflow")
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [airflow, *COMPONENTS["scheduler"]],
            env=ui_server.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield log
    finally:
        _kill_group(process)


# ---- the browser ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Headless Chromium sessions (Debian's chromium + chromedriver), each with a fresh profile; all quit
    at teardown."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} missing: scripts/bootstrap.sh installs chromium and chromium-driver (as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers: list[Any] = []
    profiles: list[str] = []

    def open_browser(*, offline: bool = False) -> Any:
        """A browser; ``offline``: every host but 127.0.0.1 unresolvable, as on a closed network."""
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        if offline:
            options.add_argument("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path_factory.getbasetemp())
        profiles.append(profile)
        options.add_argument(f"--user-data-dir={profile}")
        log = Path(profile).with_suffix(".chromedriver.log")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(log)), options=options)
        driver.set_page_load_timeout(60)
        drivers.append(driver)
        return driver

    try:
        yield open_browser
    finally:
        for driver in drivers:
            with contextlib.suppress(Exception):
                driver.quit()
            process = getattr(driver.service, "process", None)  # quit failed: end chromedriver by its pid
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for profile in profiles:
            shutil.rmtree(profile, ignore_errors=True)
