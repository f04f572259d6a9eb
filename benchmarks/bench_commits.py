"""What a stream's commits cost as its table gathers files, with and without the writers' compaction.

A source query appends a file to bronze and to silver at every micro-batch (a 1 s trigger: 3,600 an
hour). This benchmark replays that on one table: ``--commits`` appends of ``--rows`` bronze-shaped
rows (the rsvps generator's records: key, JSON value, Kafka coordinates, one ingest-date partition),
each with its app transaction, as ``LakeTable.append_arrow`` makes them in the stream, and after
each the writers' :class:`~tidewater.lake.compaction.StreamCompaction` call. It runs once with the
compaction off (``TIDEWATER_STREAM_COMPACTION_FILES=0``: the maintenance DAG alone, daily) and once
with the given settings, and prints, at each step of ``--at``, the median and p95 of the last 50
commits and the live files; then the compaction rounds (how many, their median and longest time) and
each run's total. No Spark and no broker: this is the driver-side cost a trigger pays to commit.
``--store s3`` puts the tables on an embedded S3 server (SeaweedFS, as the cluster profile's lake)
instead of the local file system, whose listing of ``_delta_log`` reads every entry.

    .venv/bin/python benchmarks/bench_commits.py [--commits 6000] [--rows 2000] [--every 100]
        [--target-mb 16] [--at 500,1000,2000,4000,6000] [--store local|s3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from tidewater.connectors.kafka_client import RECORD_SCHEMA
from tidewater.generator.events import GeneratorConfig, generate, parse_ts
from tidewater.lake import storage
from tidewater.lake.compaction import StreamCompaction
from tidewater.lake.tables import LakeTable
from tidewater.s3server import S3Server

# Bronze's columns that size a file: the Kafka record's (their types from the reader's own schema), the
# Kafka timestamp and the ingest-date partition.
SCHEMA = pa.schema(
    [
        *(RECORD_SCHEMA.field(name) for name in ("key", "value", "topic", "partition", "offset")),
        RECORD_SCHEMA.field("timestamp").with_name("kafka_timestamp"),
        pa.field("ingest_date", pa.date32()),
    ]
)
TODAY = dt.date(2026, 11, 28)
WINDOW = 50  # commits each printed figure is taken over


def batches(rows: int, distinct: int = 20) -> list[pa.Table]:
    """``distinct`` batches of generated rsvps records (reused in turn, with fresh offsets)."""
    records = list(
        generate(GeneratorConfig(seed=7, start_time_ms=parse_ts("2026-11-28T00:00:00.000Z")), rows * distinct)
    )
    out = []
    for start in range(0, len(records), rows):
        part = records[start : start + rows]
        out.append(
            pa.table(
                {
                    "key": [r.key for r in part],
                    "value": [r.value for r in part],
                    "topic": ["rsvps"] * len(part),
                    "partition": pa.array([i % 4 for i in range(len(part))], pa.int32()),
                    "offset": pa.array(range(len(part)), pa.int64()),
                    "kafka_timestamp": pa.array(
                        [dt.datetime.fromtimestamp(r.timestamp_ms / 1000, dt.UTC) for r in part],
                        pa.timestamp("us", "UTC"),
                    ),
                    "ingest_date": pa.array([TODAY] * len(part), pa.date32()),
                },
                schema=SCHEMA,
            )
        )
    return out


def run(root: str, label: str, compaction: StreamCompaction, data: list[pa.Table], commits: int, at: list[int]) -> None:
    table = LakeTable(f"{root}/{label.replace(' ', '-').replace(',', '')}")
    table.ensure(SCHEMA, partition_by=["ingest_date"])
    times: list[float] = []
    rounds: list[float] = []
    started = time.perf_counter()
    print(f"\n{label}: {commits} commits of {data[0].num_rows} rows")
    print(f"{'commits':>8} {'live files':>10} {'commit p50 ms':>14} {'commit p95 ms':>14}")
    for batch_id in range(1, commits + 1):
        rows = data[batch_id % len(data)]
        began = time.perf_counter()
        result = table.append_arrow(rows, app_id="bench", batch_id=batch_id)
        times.append((time.perf_counter() - began) * 1000)
        done = compaction.after_commit(table, result)
        if done is not None and done.files_removed:
            rounds.append(done.seconds)
        if batch_id in at:
            last = times[-WINDOW:]
            p95 = statistics.quantiles(last, n=20)[-1]
            print(f"{batch_id:>8} {len(table.files()):>10} {statistics.median(last):>14.1f} {p95:>14.1f}", flush=True)
    total = time.perf_counter() - started
    if rounds:
        print(
            f"compaction rounds: {len(rounds)}, median {statistics.median(rounds):.2f} s, longest {max(rounds):.2f} s, "
            f"{sum(rounds):.1f} s in all"
        )
    print(f"total: {total:.1f} s ({total / commits * 1000:.1f} ms a commit, rounds included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=6000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100, help="TIDEWATER_STREAM_COMPACTION_FILES")
    parser.add_argument("--target-mb", type=int, default=16, help="TIDEWATER_STREAM_COMPACTION_TARGET_BYTES in MiB")
    parser.add_argument("--at", default="500,1000,2000,4000,6000")
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    args = parser.parse_args()
    if args.commits < WINDOW or args.every < 1 or args.rows < 1:
        parser.error(f"--commits must be at least {WINDOW}, --every and --rows at least 1")
    at = sorted({int(x) for x in args.at.split(",") if x.strip()} | {args.commits})
    at = [n for n in at if WINDOW <= n <= args.commits]
    print(
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    data = batches(args.rows)
    print(f"a batch: {data[0].num_rows} rows, {data[0].nbytes / 1e6:.2f} MB in Arrow")
    with tempfile.TemporaryDirectory(prefix="tw-bench-commits-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp).as_uri()
        if args.store == "s3":
            server = stack.enter_context(S3Server(Path(tmp) / "s3", buckets=["bench"]))
            os.environ.update(
                server.env(), TIDEWATER_S3_ENDPOINT_URL=server.endpoint_url, TIDEWATER_S3_ALLOW_HTTP="true"
            )
            storage.reset_cache()
            root = "s3://bench/tables"
        print(f"store: {root}")
        run(root, "compaction off", StreamCompaction(every=0), data, args.commits, at)
        on = StreamCompaction(every=args.every, target_size=args.target_mb << 20, query="bench")
        run(root, f"compaction every {args.every} commits, {args.target_mb} MiB", on, data, args.commits, at)


if __name__ == "__main__":
    main()
