"""The progress listener: a record per micro-batch, each event handed over in a few py4j calls."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import py4j.clientserver
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import JStreamingQueryListener

from tidewater.streaming import progress
from tidewater.streaming.progress import ProgressFromJson, ProgressRecorder


def test_each_progress_event_costs_three_py4j_calls_and_is_recorded_whole(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark's own wrapper built a stateful query's event with ~590 py4j calls (each Java map read
    to an exception that PySpark converts with class lookups), on the thread that posts every
    query's events. Now: the progress, its JSON, and the compile count (its histogram looked up
    once, here before the query starts)."""
    handling = threading.local()
    sent: list[str] = []
    send_command = py4j.clientserver.ClientServerConnection.send_command

    def counted_send(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(handling, "active", False):
            sent.append(command.split("\n", 1)[0])
        return send_command(self, command, *args, **kwargs)

    def counting(on_progress):  # type: ignore[no-untyped-def]
        def handled(self, jevent):  # type: ignore[no-untyped-def]
            handling.active = True
            try:
                return on_progress(self, jevent)
            finally:
                handling.active = False

        return handled

    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted_send)
    for jvm_side in (ProgressFromJson, JStreamingQueryListener):  # ours, and PySpark's were it used
        monkeypatch.setattr(jvm_side, "onQueryProgress", counting(jvm_side.__dict__["onQueryProgress"]))
    progress.codegen_compiles()
    recorder = ProgressRecorder(tmp_path / "progress")
    spark.streams.addListener(recorder)
    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .withWatermark("timestamp", "1 second")
        .groupBy((F.col("value") % 5).alias("bucket"))
        .count()
    )
    query = counts.writeStream.format("noop").queryName("rates").outputMode("update").trigger(processingTime="1 second")
    running = query.start()
    history = tmp_path / "progress" / "progress.jsonl"
    try:
        deadline = time.monotonic() + 90
        records: list[dict] = []
        while time.monotonic() < deadline:
            lines = history.read_text().splitlines() if history.exists() else []
            records = [json.loads(line) for line in lines]
            if sum(1 for r in records if r["num_input_rows"] > 0) >= 3:
                break
            time.sleep(0.5)
    finally:
        running.stop()
        spark.streams.removeListener(recorder)
    with_rows = [r for r in records if r["num_input_rows"] > 0]
    assert len(with_rows) >= 3, f"progress records: {records}"
    assert all(r["name"] == "rates" for r in records)
    assert with_rows[-1]["state_rows"] > 0  # the stateful operator's figures came through the JSON
    assert "triggerExecution" in with_rows[-1]["duration_ms"]
    assert json.loads((tmp_path / "progress" / "rates.json").read_text())["batch_id"] >= with_rows[-1]["batch_id"]
    assert sent and len(sent) <= 3 * len(records), f"{len(sent)} py4j calls for {len(records)} events"
