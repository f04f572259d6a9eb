"""One rule for lake namespace names (tidewater.config.check_namespace), applied the same way everywhere.

A namespace is a path segment under the lake and checkpoint roots, so every place that takes one
from a person (the setting, the batch command, a sandbox replay, the SQL catalog, the UI) must accept
the same names and refuse the same ones, in the same words.
"""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from tidewater.batch.requests import ReplayRequest
from tidewater.config import NAMESPACE_RULE, Settings, check_namespace, is_namespace
from tidewater.errors import ConfigError
from tidewater.pipelines import get_pipeline
from tidewater.query.catalog import resolve
from tidewater.ui.app import checked_namespace
from tidewater.ui.reports import ReportPathRefused, report_location

GOOD = ["live", "sandbox", "replay_2026-11-21", "A1", "-", "_"]
RSVPS = get_pipeline("rsvps")
BAD = ["", ".", "..", "a/b", "../live", "my sandbox!", "café", "live\n", "a.b", "x\0"]


def sandbox(tmp_path, name: str) -> ReplayRequest:
    return ReplayRequest.parse(
        Settings(state_dir=str(tmp_path)),
        RSVPS,
        start="2026-11-21T10:00:00Z",
        end="2026-11-21T11:00:00Z",
        sandbox_namespace=name,
    )


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass_everywhere(name: str, tmp_path) -> None:
    assert is_namespace(name)
    assert check_namespace(name) == name
    Settings(state_dir=str(tmp_path), namespace=name).validate({})
    assert checked_namespace(name) == name
    if name != "live":  # the live one is refused as a sandbox for being live, not for its spelling
        assert sandbox(tmp_path, name).sandbox_namespace == name
    assert report_location("file:///lake", f"{name}/rsvps/reports/r1/index.html").relative.startswith(name)


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_everywhere_in_the_same_words(name: str, tmp_path) -> None:
    assert not is_namespace(name)
    with pytest.raises(ConfigError) as caught:
        check_namespace(name, "--namespace")
    assert str(caught.value) == f"--namespace {name!r} {NAMESPACE_RULE}"

    with pytest.raises(ConfigError) as caught:
        Settings(state_dir=str(tmp_path), namespace=name).validate({})
    assert f"TIDEWATER_NAMESPACE={name!r}: {NAMESPACE_RULE}" in str(caught.value)

    if name:  # the UI treats an empty namespace as "the configured one"
        with pytest.raises(HTTPException) as http:
            checked_namespace(name)
        assert http.value.status_code == 400 and http.value.detail == f"namespace {name!r} {NAMESPACE_RULE}"
    with pytest.raises(ConfigError):  # as malformed; blank as missing; "live\n" (stripped) as the live one
        sandbox(tmp_path, name)
    with pytest.raises(ReportPathRefused):
        report_location("file:///lake", f"{name}/rsvps/reports/r1/index.html")


def test_a_sql_name_whose_first_part_is_no_namespace_resolves_to_nothing(tmp_path) -> None:
    settings = Settings(state_dir=str(tmp_path))
    assert resolve(settings, ["my sandbox!", "rsvps", "silver"]) is None
    assert resolve(settings, ["café", "rsvps", "silver"]) is None


@pytest.mark.parametrize("name", [n for n in BAD if n])
def test_a_pipeline_layout_refuses_a_bad_namespace_whoever_passed_it(tmp_path, name):
    from tidewater.pipelines.layout import PipelineLayout

    with pytest.raises(ConfigError, match=NAMESPACE_RULE.replace("-", r"\-")):
        PipelineLayout.of(Settings(state_dir=str(tmp_path)), RSVPS, name)
    assert PipelineLayout.of(Settings(state_dir=str(tmp_path)), RSVPS, "sbx").namespace == "sbx"
