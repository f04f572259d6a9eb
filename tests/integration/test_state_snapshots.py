"""A streaming job's RocksDB state reaches its checkpoint as snapshots, not only as changelogs.

Regression: the streaming session once set Hadoop's raw local file system for ``file:`` paths (no
``chmod`` per checkpoint file). RocksDB uploads a snapshot with ``FileSystem.copyFromLocalFile``, which
casts ``FileSystem.getLocal`` to the checksummed ``LocalFileSystem``: every upload failed, first in
the background (a warning) and then in a commit, which ended the query. ads' CTR query died at its
121st micro-batch, ten minutes in, and every stateful pipeline would have done the same.

The job runs in a process of its own: the tests' shared session is a batch session, and a streaming
session's file-system settings apply to the JVM it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tidewater.processes import spark_child_env

# A stateful query on the streaming job's session, snapshots forced early: one every other version,
# the background maintenance every second.
JOB = r"""
import sys, time
from pathlib import Path
from tidewater.config import Settings
from tidewater.spark import build_session

checkpoint = Path(sys.argv[1])
spark = build_session(Settings.from_env(), "state-snapshots", streaming=True, master="local[2]")
spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
spark.conf.set("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
spark.conf.set("spark.sql.shuffle.partitions", "1")
counts = (
    spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    .selectExpr("value % 7 AS key").groupBy("key").count()
)
query = (
    counts.writeStream.outputMode("update").format("noop")
    .option("checkpointLocation", str(checkpoint)).trigger(processingTime="200 milliseconds").start()
)
state = checkpoint / "state"
deadline = time.monotonic() + 90
try:
    while time.monotonic() < deadline and query.isActive:
        progress = query.lastProgress
        batches = progress["batchId"] if progress else -1
        if batches >= 12 and any(state.rglob("*.zip")):
            break
        time.sleep(0.5)
    error = query.exception()
    print("ACTIVE", query.isActive, "BATCHES", batches, "ERROR", error, flush=True)
finally:
    query.stop()
    spark.stop()
"""


def test_a_stateful_streaming_query_uploads_rocksdb_snapshots(tmp_path: Path) -> None:
    env = {**os.environ, **spark_child_env(), "TIDEWATER_STATE_DIR": str(tmp_path / "state-dir")}
    checkpoint = tmp_path / "checkpoint"
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(checkpoint)], env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "ClassCastException" not in output, output[-3000:]
    summary = next(line for line in done.stdout.splitlines() if line.startswith("ACTIVE"))
    assert summary.startswith("ACTIVE True") and summary.endswith("ERROR None"), output[-3000:]
    assert int(summary.split()[3]) >= 12
    snapshots = sorted(path.name for path in (checkpoint / "state").rglob("*.zip"))
    assert snapshots, f"no RocksDB snapshot reached the checkpoint: {output[-3000:]}"
