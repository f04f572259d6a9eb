"""The bench's JVM profile on a real JVM: a flight recording of the suite's Spark session (started with
jcmd here; the bench starts the job's JVM with it), read back with the JDK's jfr and grouped by kind of
work over the stretch that ran the queries."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jvm_profile import FlightRecordingError, Window, summarize

NAME = "tidewater-test"


def _jcmd(pid: int, *command: str) -> None:
    jcmd = shutil.which("jcmd")
    assert jcmd, "the JDK's jcmd is not on PATH"
    subprocess.run([jcmd, str(pid), *command], check=True, capture_output=True, timeout=60)


def test_a_recording_of_a_json_parse_and_a_string_aggregate_names_both(spark: SparkSession, tmp_path: Path) -> None:
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    path = tmp_path / "session.jfr"
    _jcmd(pid, "JFR.start", f"name={NAME}", "settings=default")
    try:
        venue = (F.col("id") % 997).alias("venue_id")
        rows = spark.range(400_000).select(
            F.to_json(F.struct(venue, F.concat(F.lit("venue "), venue).alias("name"))).alias("value")
        )
        parsed = rows.select(F.from_json("value", "venue_id long, name string").alias("p")).select("p.*")
        started = time.time()
        for _ in range(3):  # the max of a string: a sort-based aggregate (its buffer is not fixed-width)
            parsed.groupBy("venue_id").agg(F.max("name")).write.format("noop").mode("overwrite").save()
        ended = time.time()
    finally:
        _jcmd(pid, "JFR.stop", f"name={NAME}", f"filename={path}")
    profile = summarize(path, Window(started, ended))
    samples = profile["samples"]
    assert samples.get("JSON parse (from_json)", 0) > 0, samples
    assert samples.get("sort (for sort-based aggregates)", 0) + samples.get("sort-based aggregate", 0) > 0, samples
    assert profile["seconds"] == round(ended - started, 1)
    # nothing ran in a window before the queries
    assert summarize(path, Window(started - 3600, started - 3599))["samples"] == {}


def test_a_missing_recording_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(FlightRecordingError, match=r"no flight recording at .*: the JVM did not write one"):
        summarize(tmp_path / "none.jfr", Window(0.0, 1.0))
