"""The platform warns, in one line, when it would start more streaming jobs than the host started
together when measured (one per core), and names a subset to run instead."""

from __future__ import annotations

from tidewater.orchestration.platform import crowded_host

FIVE = ["ads", "pageviews", "payments", "rsvps", "vending"]


def test_five_pipelines_on_two_cores_are_warned_about_with_a_subset_to_run():
    warning = crowded_host(FIVE, 2)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("5 streaming jobs (one JVM each) on 2 cores")
    assert warning.endswith("TIDEWATER_PIPELINES=ads,pageviews")


def test_as_many_jobs_as_cores_or_an_unknown_core_count_are_not_warned_about():
    assert crowded_host(["rsvps", "payments"], 2) is None
    assert crowded_host(FIVE, 8) is None
    assert crowded_host(FIVE, None) is None
