"""The bench's JVM profile on a real JVM, the way the bench records one: a Spark driver started by
spark-submit with the recording's options, which writes the recording as it exits; read back with the
JDK's jfr and grouped by kind of work, and its allocation by site, over the stretch that ran the queries.

A JVM of its own (local[1], ~15 s): the recording must start with the JVM, and the suite's shared
session may run its tasks elsewhere or beside other tests' queries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jvm_profile import FlightRecordingError, Window, recording_options, summarize

# A JSON parse and the maximum of a string (a sort-based aggregate: its buffer is not fixed-width).
JOB = """
import sys, time
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.appName("jvm-recording-test").getOrCreate()
venue = (F.col("id") % 997).alias("venue_id")
name = F.concat(F.lit("venue "), venue).alias("name")
rows = spark.range(400_000).select(F.to_json(F.struct(venue, name)).alias("value"))
parsed = rows.select(F.from_json("value", "venue_id long, name string").alias("p")).select("p.*")
parsed.groupBy("venue_id").agg(F.max("name")).write.format("noop").mode("overwrite").save()  # warm
started = time.time()
for _ in range(3):
    parsed.groupBy("venue_id").agg(F.max("name")).write.format("noop").mode("overwrite").save()
print("WINDOW", started, time.time(), flush=True)
spark.stop()
"""


def test_a_recorded_driver_names_its_parse_its_string_aggregate_and_what_the_parse_allocates(tmp_path: Path) -> None:
    script, path = tmp_path / "job.py", tmp_path / "driver.jfr"
    script.write_text(JOB)
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false", "--conf",
         "spark.driver.host=127.0.0.1", "--driver-java-options", recording_options(path), str(script)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    window = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("WINDOW "))
    started, ended = float(window[0]), float(window[1])
    profile = summarize(path, Window(started, ended))
    samples = profile["samples"]
    assert samples.get("JSON parse (from_json)", 0) > 0, samples
    assert samples.get("sort (for sort-based aggregates)", 0) + samples.get("sort-based aggregate", 0) > 0, samples
    assert profile["seconds"] == round(ended - started, 1)
    # Spark's from_json gives every record a reader of its own, and that reader's 8 KiB buffer: 3 x 400k
    # records, ~9 GiB, the most of what the stretch allocated
    allocated = profile["allocated"]
    assert next(iter(allocated)) == "byte[] in CreateJacksonParser$.utf8String", allocated
    assert allocated["byte[] in CreateJacksonParser$.utf8String"] > 2**30, allocated
    # nothing of the queries in a stretch before them
    before = summarize(path, Window(started - 3600, started - 3599))
    assert (before["samples"], before["allocated"]) == ({}, {})


def test_a_missing_recording_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(FlightRecordingError, match=r"no flight recording at .*: the JVM did not write one"):
        summarize(tmp_path / "none.jfr", Window(0.0, 1.0))
