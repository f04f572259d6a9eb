"""The streams page's plots: progress records -> series -> inline SVG (pure, no server)."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from tidewater.streaming.progress import summarize
from tidewater.ui.charts import line_chart, nice_ceiling, short_number
from tidewater.ui.data import audit_pass_rate
from tidewater.ui.streams import chart_series, progress_history

T0 = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.UTC)


def progress(query: str, batch: int, seconds: float, **fields: object) -> dict:
    """A progress record as the listener writes it (summarize over Spark's progress JSON)."""
    spark = {
        "name": f"live.rsvps.{query}",
        "batchId": batch,
        "timestamp": (T0 + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z"),
        "numInputRows": fields.get("rows", 100),
        "inputRowsPerSecond": fields.get("input", 50.0),
        "processedRowsPerSecond": fields.get("processed", 80.0),
        "durationMs": {"triggerExecution": fields.get("ms", 1500)},
        "sources": fields.get("sources", []),
        "stateOperators": fields.get("state", []),
    }
    return summarize(spark, 0, 0, None)


def kafka_source(end: int, latest: int) -> list[dict]:
    return [{"endOffset": {"rsvps": {"0": end}}, "latestOffset": {"rsvps": {"0": latest}}}]


def test_series_come_from_the_progress_records() -> None:
    history = [
        progress("bronze", 1, 0, input=100.0, processed=120.0, sources=kafka_source(100, 150)),
        progress("bronze", 2, 30, input=200.0, processed=180.0, sources=kafka_source(300, 300), ms=2500),
        progress("gold_counts", 1, 31, state=[{"numRowsTotal": 40, "numRowsDroppedByWatermark": 3}]),
        progress("gold_counts", 2, 75, state=[{"numRowsTotal": 55, "numRowsDroppedByWatermark": 0}]),
    ]
    plots = {key: series for key, _, _, series in chart_series(history)}
    start = T0.timestamp()
    assert plots["rates"]["bronze input"] == [(start, 100.0), (start + 30, 200.0)]
    assert plots["rates"]["bronze processed"] == [(start, 120.0), (start + 30, 180.0)]
    assert plots["lag"] == {"bronze": [(start, 50.0), (start + 30, 0.0)]}  # Kafka lag only
    assert plots["duration"]["bronze"] == [(start, 1.5), (start + 30, 2.5)]
    assert plots["rows"]["bronze"] == [(start, 200.0)]  # two batches in one minute
    assert plots["rows"]["gold_counts"] == [(start, 100.0), (start + 60, 100.0)]
    assert plots["late"] == {"gold_counts": [(start + 31, 3.0), (start + 75, 0.0)]}
    assert plots["state"] == {"gold_counts": [(start + 31, 40.0), (start + 75, 55.0)]}


def test_history_keeps_the_window_and_survives_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    old, new = progress("bronze", 1, -7200), progress("bronze", 2, 0)
    path.write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n" + '{"torn": ')
    assert progress_history(path, since=T0.timestamp() - 3600) == [new]
    assert progress_history(tmp_path / "missing.jsonl", since=0) == []


def test_audit_pass_rate_per_hour() -> None:
    audits = [
        {"audited_at": T0 + dt.timedelta(minutes=5), "success": True},
        {"audited_at": T0 + dt.timedelta(minutes=6), "success": False},
        {"audited_at": (T0 + dt.timedelta(hours=1)).isoformat(), "success": True},
    ]
    assert audit_pass_rate(audits) == {"suites passed": [(T0.timestamp(), 50.0), (T0.timestamp() + 3600, 100.0)]}
    assert audit_pass_rate([]) == {}


def test_a_chart_is_valid_svg_with_a_line_per_series_and_escaped_names() -> None:
    start = T0.timestamp()
    svg = line_chart(
        "Rate <of> things",
        {"a <b>": [(start, 1.0), (start + 60, 3.0)], "empty": [], "c": [(start + 30, 2.0)]},
        unit="rows/s",
        chart_id="chart-x",
    )
    root = ET.fromstring(svg)  # well-formed: every data text escaped
    assert root.get("id") == "chart-x"
    groups = [g for g in root.iter("{*}g") if g.get("class") == "series"] or [
        g for g in root.iter("g") if g.get("class") == "series"
    ]
    assert [(g.get("data-series"), g.get("data-points")) for g in groups] == [("a <b>", "2"), ("c", "1")]
    assert "Rate &lt;of&gt; things (rows/s)" in svg
    empty = line_chart("Nothing", {"a": []})
    assert "no data yet" in empty and ET.fromstring(empty) is not None


def test_axis_helpers() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 7, 11, 240, 26_000)] == [1, 1, 1, 5, 10, 20, 250, 50_000]
    assert [short_number(v) for v in (0, 2.5, 1234, 2_500_000)] == ["0", "2.5", "1.23k", "2.5M"]
