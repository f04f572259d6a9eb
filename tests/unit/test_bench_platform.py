"""The platform bench's own parsing: the settings it runs the platform with, and the restarts it counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_platform import connect_back_restarts, setting_env, summary

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


def test_memory_summary_gives_each_part_and_the_total_as_pss_and_rss():
    mib = 2**20
    samples = [
        {"platform": (100 * mib, 150 * mib), "stream job rsvps": (1000 * mib, 1500 * mib)},
        {"platform": (120 * mib, 160 * mib)},  # the job ended between the two samples
    ]
    lines = summary(samples, "memory:")
    assert lines[0] == "memory:"
    assert (
        "platform" in lines[1] and "PSS peak    120 MiB  mean    110 MiB" in lines[1] and "RSS peak    160" in lines[1]
    )
    assert "stream job rsvps" in lines[2] and "PSS peak   1000 MiB  mean    500 MiB" in lines[2]
    assert lines[3] == "  total: PSS peak 1,100 MiB, mean 610 MiB; summed RSS peak 1,650 MiB, mean 905 MiB"
    assert summary([], "memory:") == ["memory: no sample (the platform ended first)"]
