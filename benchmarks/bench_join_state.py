"""A stream-stream join's trigger as its state grows, on Spark's join state formats 4 and 2.

ads' join of impressions and clicks, reduced to two rate sources on the platform's Spark session:
``--rate`` impressions a second, a twelfth as many clicks on earlier impressions, joined left outer
with clicks up to ``--bound`` seconds after the impression (a 10 s watermark each side), on a 5 s
trigger, to a no-op sink. The state grows for bound + watermark, then the join evicts what the
watermark passed and emits the impressions nobody clicked. For each format it prints, per
micro-batch, its trigger and the join's state rows, removal time (``allRemovalsTimeMs``: eviction)
and update time; then the medians while the state grows and once it evicts.

    .venv/bin/python benchmarks/bench_join_state.py [--seconds 170] [--bound 60] [--rate 2200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater.config import Settings
from tidewater.spark import JOIN_STATE_FORMAT_KEY, build_session
from tidewater.transforms import bounded_join

WATERMARK_S = 10
TRIGGER_S = 5


def joined(spark: SparkSession, rate: int, bound: int) -> DataFrame:
    impressions = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(
            F.sha2(F.col("value").cast("string"), 256).alias("impression_id"),
            F.col("timestamp").alias("shown_at"),
        )
    )
    clicks = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", max(1, rate // 12))
        .load()
        .select(  # click n is on impression 12n, shown a moment before
            F.sha2((F.col("value") * 12).cast("string"), 256).alias("clicked_impression_id"),
            F.col("timestamp").alias("clicked_at"),
            F.col("value").cast("string").alias("click_id"),
        )
    )
    return bounded_join(
        impressions,
        clicks,
        left_time="shown_at",
        right_time="clicked_at",
        key=("impression_id", "clicked_impression_id"),
        bound=f"{bound} seconds",
        watermark=f"{WATERMARK_S} seconds",
    )


def run(spark: SparkSession, fmt: str, args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    spark.conf.set(JOIN_STATE_FORMAT_KEY, fmt)
    query = (
        joined(spark, args.rate, args.bound)
        .writeStream.format("noop")
        .option("checkpointLocation", f"{root}/format-{fmt}")
        .trigger(processingTime=f"{TRIGGER_S} seconds")
        .start()
    )
    began = time.monotonic()
    try:
        while time.monotonic() - began < args.seconds and query.isActive:
            time.sleep(1)
        progress = list(query.recentProgress)
    finally:
        query.stop()
    out = []
    for p in progress:
        state = p["stateOperators"][0] if p["stateOperators"] else {}
        out.append(
            {
                "batch": p["batchId"],
                "rows": p["numInputRows"],
                "trigger_ms": p["durationMs"].get("triggerExecution", 0),
                "state_rows": state.get("numRowsTotal", 0),
                "removal_ms": state.get("allRemovalsTimeMs", 0),
                "update_ms": state.get("allUpdatesTimeMs", 0),
            }
        )
    return out


def summary(fmt: str, batches: list[dict[str, Any]], evicting_from: int) -> None:
    print(f"\nformat {fmt}: batch, input rows, trigger ms, state rows, removal ms, update ms")
    for b in batches:
        cells = (b["batch"], b["rows"], b["trigger_ms"], b["state_rows"], b["removal_ms"], b["update_ms"])
        print("  " + " ".join(f"{cell:>{width}}" for cell, width in zip(cells, (4, 7, 7, 9, 6, 6), strict=True)))
    for label, part in (
        ("state growing", [b for b in batches[2:] if b["batch"] < evicting_from]),
        ("evicting", [b for b in batches if b["batch"] >= evicting_from]),
    ):
        if part:
            med = {k: statistics.median(b[k] for b in part) for k in ("trigger_ms", "removal_ms", "update_ms")}
            print(
                f"  {label} ({len(part)} batches, state up to {max(b['state_rows'] for b in part):,} rows): "
                f"trigger {med['trigger_ms']:.0f} ms, removal {med['removal_ms']:.0f} ms, "
                f"update {med['update_ms']:.0f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=170, help="each format's run")
    parser.add_argument("--bound", type=int, default=60, help="seconds a click counts after its impression")
    parser.add_argument("--rate", type=int, default=2200, help="impressions a second")
    args = parser.parse_args()
    if args.seconds < 30 or args.bound < 1 or args.rate < 12:
        parser.error("--seconds at least 30, --bound at least 1, --rate at least 12")
    evicting_from = (args.bound + WATERMARK_S) // TRIGGER_S + 2  # the first micro-batch whose watermark passes a bound
    with tempfile.TemporaryDirectory(prefix="tw-bench-join-state-") as tmp:
        spark = build_session(Settings(state_dir=tmp), "bench-join-state", master="local[2]")
        try:
            print(
                f"{args.rate} impressions/s, {max(1, args.rate // 12)} clicks/s, bound {args.bound} s, "
                f"{TRIGGER_S} s trigger"
            )
            for fmt in ("4", "2"):
                summary(fmt, run(spark, fmt, args, tmp), evicting_from)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
