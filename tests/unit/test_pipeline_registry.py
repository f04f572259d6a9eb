"""The pipeline registry: the package's modules plus the modules TIDEWATER_PIPELINE_MODULES names."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tidewater.config import Settings
from tidewater.errors import ConfigError, PipelineError
from tidewater.pipelines import _discover, all_pipelines, get_pipeline, pipeline_option

TOY = Path(__file__).resolve().parents[1] / "toy_pipeline" / "toy.py"


def test_the_package_pipelines_alone_by_default(monkeypatch):
    monkeypatch.delenv("TIDEWATER_PIPELINE_MODULES", raising=False)
    assert "rsvps" in all_pipelines() and "toy" not in all_pipelines()
    with pytest.raises(PipelineError, match=r"unknown pipeline 'toy'; known: .*rsvps"):
        get_pipeline("toy")
    with pytest.raises(ConfigError, match=r"^--pipeline: unknown pipeline 'toy'"):
        pipeline_option("toy")


def test_a_file_path_registers_its_pipeline(monkeypatch):
    monkeypatch.setenv("TIDEWATER_PIPELINE_MODULES", f" {TOY} ")
    assert get_pipeline("toy").source().topic == "toy-readings"
    assert set(all_pipelines()) >= {"rsvps", "toy"}


def test_a_module_name_registers_its_pipeline(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY.parent))
    monkeypatch.setenv("TIDEWATER_PIPELINE_MODULES", "toy")
    assert get_pipeline("toy").name == "toy"


def test_unloadable_or_empty_modules_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot load '.*missing\.py'"):
        _discover(str(tmp_path / "missing.py"))
    with pytest.raises(ConfigError, match="cannot load 'no_such_module_xyz'"):
        _discover("no_such_module_xyz")
    empty = tmp_path / "empty_pipeline.py"
    empty.write_text("X = 1\n")
    with pytest.raises(ConfigError, match="defines no PIPELINE"):
        _discover(str(empty))


def test_two_declarations_of_one_name_are_refused(tmp_path):
    twin = tmp_path / "twin.py"
    twin.write_text(
        "import importlib.util, sys\nfrom tidewater.pipelines import get_pipeline\nPIPELINE = get_pipeline('rsvps')\n"
    )
    with pytest.raises(PipelineError, match="two modules declare pipeline 'rsvps'"):
        _discover(str(twin))


def test_the_setting_is_checked():
    with pytest.raises(ConfigError, match="TIDEWATER_PIPELINE_MODULES"):
        Settings.from_env({"TIDEWATER_PIPELINE_MODULES": "a b;c"})


def test_table_kinds_declare_their_stream_mode_and_feed():
    """A window is fed by a window either side and updated in place; a session by its gap either side,
    emitted once closed, widened while it grows, and merged by late data; a projection by its interval."""
    pageviews = get_pipeline("pageviews")
    hourly, sessions = pageviews.gold_table("views_per_visitor_hour"), pageviews.gold_table("visitor_sessions")
    assert hourly.output_mode == "update" and not hourly.grows_until_quiet and not hourly.rows_merge
    assert hourly.feed_margins() == (dt.timedelta(hours=1), dt.timedelta(hours=1))
    assert sessions.output_mode == "append" and sessions.grows_until_quiet and sessions.rows_merge
    assert sessions.feed_margins() == (dt.timedelta(minutes=30), dt.timedelta(minutes=30))
    assert hourly.span == sessions.span == ("window_start", "window_end")
    joined = pageviews.gold_table("pricing_conversions")  # a join: append, right side read one bound further
    assert joined.output_mode == "append" and joined.rows_merge and not joined.grows_until_quiet
    assert joined.feed_margins() == (dt.timedelta(0), dt.timedelta(minutes=30))
    signups = pageviews.gold_table("signups")  # a projection: one row per event, spanning its instant
    assert signups.output_mode == "append" and not signups.grows_until_quiet and not signups.rows_merge
    assert signups.span == ("viewed_at", "viewed_at") and signups.feed_margins() == (dt.timedelta(0),) * 2
    # a stream's MERGE is bounded by the span start where it is a key; a view's time is not one
    assert hourly.range_keys == sessions.range_keys == joined.range_keys == ("window_start",)
    assert signups.range_keys == ()


def test_the_deployment_runs_the_pipelines_it_names(monkeypatch):
    monkeypatch.setenv("TIDEWATER_PIPELINES", "pageviews")
    assert list(all_pipelines()) == ["pageviews"]
    monkeypatch.setenv("TIDEWATER_PIPELINES", "pageviews, nope")
    declared = ", ".join(sorted(all_pipelines(Settings(pipelines=""))))
    with pytest.raises(ConfigError, match=rf"TIDEWATER_PIPELINES=.*nope not declared; declared: {declared}$"):
        all_pipelines()
