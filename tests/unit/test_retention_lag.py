"""Lag against what the broker retains: the progress record's ``retained`` and the streams page's verdict
per partition (pure; the broker side, tidewater.streaming.retention, is tests/integration/test_kafka_source.py's)."""

from __future__ import annotations

import pytest

from tidewater.streaming.progress import retained_share, summarize
from tidewater.ui.streams import partition_lag


def bronze_progress(ends: dict[str, int], latest: dict[str, int]) -> dict:
    return {
        "name": "live.rsvps.bronze",
        "batchId": 3,
        "sources": [{"endOffset": {"t": ends}, "latestOffset": {"t": latest}}],
    }


def test_the_record_says_how_much_each_partition_retains():
    progress = bronze_progress({"0": 900, "1": 50}, {"0": 1000, "1": 300})
    record = summarize(progress, 0, retained={"t/0": 100, "t/1": 60, "other/0": 5})
    assert record["lag"] == {"t/0": 100, "t/1": 250}
    assert record["retained"] == {"t/0": 900, "t/1": 240}  # the end minus the first offset still held
    assert summarize(progress, 0)["retained"] == {}  # before the driver's first look at the broker


@pytest.mark.parametrize(
    ("lag", "retained", "share"),
    [(0, 0, None), (0, 100, 0.0), (25, 100, 0.25), (100, 100, 1.0), (250, 240, 250 / 240), (5, 0, float("inf"))],
)
def test_the_unread_share_of_what_is_retained(lag: int, retained: int, share: float | None):
    assert retained_share(lag, retained) == share


def test_each_partition_gets_a_verdict():
    progress = bronze_progress({"0": 900, "1": 50, "2": 10, "3": 0}, {"0": 1000, "1": 300, "2": 100, "3": 0})
    record = summarize(progress, 0, retained={"t/0": 0, "t/1": 60, "t/2": 0, "t/3": 0})
    rows = {row["partition"]: row for row in partition_lag(record)}
    assert (rows["t/0"]["verdict"], rows["t/0"]["percent"], rows["t/0"]["retained"]) == ("ok", "10%", 1000)
    assert (rows["t/1"]["verdict"], rows["t/1"]["percent"]) == ("lost", "104%")  # 250 behind, 240 held
    assert (rows["t/2"]["verdict"], rows["t/2"]["percent"]) == ("at risk", "90%")
    assert (rows["t/3"]["verdict"], rows["t/3"]["percent"]) == ("", "")  # empty partition, nothing unread
    unknown = partition_lag(summarize(progress, 0))
    assert {row["verdict"] for row in unknown} == {""} and {row["retained"] for row in unknown} == {None}
