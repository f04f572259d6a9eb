"""The small workload whose loaded classes become the class-data archive (see :mod:`tidewater.class_data`).

It touches what tidewater's drivers run, so the archive holds the classes they load: the session
every job builds, the Delta data source (batch and stream), SQL with an Arrow UDF, rows to Arrow,
Parquet, and streaming queries with the state the pipelines keep (a windowed aggregation and a
left-outer stream-stream join, in RocksDB), written by foreachBatch. A class it does not load is
loaded from its jar as before: the archive only makes the common ones cheaper.
"""

from __future__ import annotations

import datetime as dt
import os
import time

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from tidewater.config import Settings
from tidewater.spark import build_session
from tidewater.transforms import bounded_join

MICRO_BATCHES = 2  # with rows, then the no-data batch that evicts what the watermark passed


def run(folder: str) -> None:
    """Run the workload with its state, tables and checkpoints under ``folder``."""
    settings = Settings.from_env().replace(state_dir=os.path.join(folder, "state"), spark_master="local[2]")
    spark = build_session(settings, "tidewater-class-data", streaming=True)
    table = os.path.join(folder, "events")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = pa.table(
        {
            "event_id": [f"e-{i}" for i in range(200)],
            "event_time": pa.array([start + dt.timedelta(seconds=i) for i in range(200)], pa.timestamp("us", "UTC")),
            "venue": [f"v-{i % 7}" for i in range(200)],
        }
    )
    write_deltalake(table, events)
    write_deltalake(table, events, mode="append")

    @F.arrow_udf(StringType())  # type: ignore[call-overload, misc]
    def upper(values: pa.Array) -> pa.Array:
        return pa.compute.utf8_upper(values)

    rows = spark.read.format("tidewater-delta").load(table)
    counted = rows.groupBy("venue").agg(F.count(F.lit(1)).alias("n"), F.max("event_time").alias("last"))
    counted.select(upper(F.col("venue")).alias("venue"), "n", "last").toArrow()
    counted.write.parquet(os.path.join(folder, "counted"))
    spark.read.parquet(os.path.join(folder, "counted")).where("n > 0").toArrow()

    windowed = (
        spark.readStream.format("tidewater-delta")
        .load(table)
        .withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), "venue")
        .count()
    )
    impressions = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    clicks = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    joined = bounded_join(
        impressions.select(F.col("value").alias("shown"), F.col("timestamp").alias("shown_at")),
        clicks.select((F.col("value") * 10).alias("clicked"), F.col("timestamp").alias("clicked_at")),
        left_time="shown_at",
        right_time="clicked_at",
        key=("shown", "clicked"),
        bound="5 seconds",
        watermark="2 seconds",
    )
    queries = []
    for name, frame in (("windowed", windowed), ("joined", joined)):
        queries.append(
            frame.writeStream.foreachBatch(_to_arrow)
            .outputMode("append")
            .trigger(processingTime="1 second")
            .option("checkpointLocation", os.path.join(folder, "checkpoints", name))
            .queryName(name)
            .start()
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(_ran(q.recentProgress) for q in queries):
        time.sleep(0.2)
    for query in queries:
        query.stop()
    spark.stop()


def _ran(progress: list[dict]) -> bool:
    """A query ran its first micro-batches, one of them with rows. Only two: once the Delta stream has
    read its table it reports progress only every 10 s."""
    return len(progress) >= MICRO_BATCHES and any(p.get("numInputRows") for p in progress)


def _to_arrow(frame: DataFrame, batch_id: int) -> None:
    frame.toArrow()
