"""The platform bench's own parsing: the settings it runs the platform with, and the restarts it counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_platform import connect_back_restarts, setting_env

from tidewater.config import Settings


def test_settings_become_the_platforms_variables():
    env = setting_env(["stream_start_gate_seconds=0", "TIDEWATER_RELEASE_STARTUP_WORKERS=false"])
    assert env == {"TIDEWATER_STREAM_START_GATE_SECONDS": "0", "TIDEWATER_RELEASE_STARTUP_WORKERS": "false"}
    settings = Settings.from_env(env)  # names the platform understands
    assert settings.stream_start_gate_seconds == 0 and settings.release_startup_workers is False


@pytest.mark.parametrize("bad", ["STREAM_START_GATE_SECONDS", "=5"])
def test_a_setting_without_a_name_or_value_is_one_line(bad):
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        setting_env([bad])


def test_restarts_after_a_missed_connect_back_are_counted_from_the_jobs_log(tmp_path):
    log = tmp_path / "stream.log"
    assert connect_back_restarts(log) == 0  # no log yet
    log.write_text(
        "WARNING live.ads.gold_ctr: PythonException: Python worker failed to connect back; "
        "restarting the query from its checkpoint (1 of 5)\n"
        "ERROR ... Python worker failed to connect back.\n"  # Spark's own lines are not restarts
        "WARNING live.ads.bronze_clicks: ...; restarting the query from its checkpoint (1 of 5)\n"
    )
    assert connect_back_restarts(log) == 2
