"""What one row per key costs the stream per micro-batch, as silver grows.

The silver writer looks up the batch's keys in silver and resolves copies
(``tidewater.dedup.resolve``), then appends. The lookup is the stream's :class:`KeyIndex` (hashes of
silver's keys in memory; only the files that may hold a batch's keys are read); the full scan it
replaced (``LakeTable.lookup``: the key column of every live file) is timed beside it. This benchmark
builds silver tables of growing size (random UUID keys, the rsvps silver shape, files of
``--file-rows`` rows: 100k as compaction leaves them, ~2k as a 1 s trigger at 2k events/s writes
them) and times the steps for a batch of 10,000 keys with 2% re-sends. No Spark: this is the
driver-side cost the stream pays on top of parsing. The index's first lookup reads every file's key
column once (a job's start); later ones read only the new files.

    .venv/bin/python benchmarks/bench_dedup.py [--sizes 100000,1000000,4000000] [--batch 10000] [--file-rows 100000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from tidewater.dedup import resolve
from tidewater.lake.key_index import KeyIndex
from tidewater.lake.tables import LakeTable

T0 = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
COMPARED = ("event_id", "event_time", "response", "venue_id")


def rows(count: int, first_offset: int, ids: list[str] | None = None) -> pa.Table:
    ids = ids or [str(uuid.uuid4()) for _ in range(count)]
    return pa.table(
        {
            "event_id": ids,
            "event_time": pa.array(
                [T0 + dt.timedelta(seconds=i % 86_400) for i in range(count)], pa.timestamp("us", "UTC")
            ),
            "response": ["yes"] * count,
            "venue_id": pa.array([i % 500 for i in range(count)], pa.int64()),
            "kafka_topic": ["rsvps"] * count,
            "kafka_partition": pa.array([i % 4 for i in range(count)], pa.int32()),
            "kafka_offset": pa.array(range(first_offset, first_offset + count), pa.int64()),
            "kafka_timestamp": pa.array([T0] * count, pa.timestamp("us", "UTC")),
            "event_date": pa.array([T0.date()] * count, pa.date32()),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,4000000")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--file-rows", type=int, default=100_000, help="rows per silver file")
    args = parser.parse_args()
    print(f"batch of {args.batch:,} keys (2% re-sends of silver rows), median of {args.repeat} runs")
    print(
        f"{'silver rows':>12} {'files':>6} {'scan ms':>8} {'index 1st ms':>13} {'index ms':>9} "
        f"{'index MB':>9} {'resolve ms':>11}"
    )
    with tempfile.TemporaryDirectory() as folder:
        uri = Path(folder, "silver").as_uri()
        held: list[str] = []
        for size in (int(s) for s in args.sizes.split(",")):
            while len(held) < size:
                chunk = rows(min(args.file_rows, size - len(held)), len(held))
                write_deltalake(uri, chunk, mode="append", partition_by=["event_date"])
                keep = min(200, chunk.num_rows)
                held += chunk.column("event_id").to_pylist()[:keep]  # keys to re-send
                held += [""] * (chunk.num_rows - keep)
            table = LakeTable(uri)
            resent = [k for k in held if k][: args.batch // 50]
            fresh_ids = [str(uuid.uuid4()) for _ in range(args.batch - len(resent))]
            batch = rows(args.batch, 10**9, ids=fresh_ids + resent)
            keys = batch.column("event_id").combine_chunks()
            index = KeyIndex(table, "event_id")
            began = time.perf_counter()
            index.lookup(keys)
            first = time.perf_counter() - began
            scans, lookups, resolves = [], [], []
            for _ in range(args.repeat):
                began = time.perf_counter()
                scanned = table.lookup("event_id", keys)
                scans.append(time.perf_counter() - began)
                began = time.perf_counter()
                existing = index.lookup(keys)
                lookups.append(time.perf_counter() - began)
                assert existing.num_rows == scanned.num_rows == len(resent)
                began = time.perf_counter()
                result = resolve(batch, existing, key="event_id", compared=COMPARED, at=T0)
                resolves.append(time.perf_counter() - began)
            assert result.fresh.num_rows == len(fresh_ids) and result.duplicates + result.conflicts.num_rows == len(
                resent
            )
            print(
                f"{size:>12,} {len(table.files()):>6} {statistics.median(scans) * 1000:>8.0f} {first * 1000:>13.0f} "
                f"{statistics.median(lookups) * 1000:>9.0f} {index.keys_held * 12 / 2**20:>9.1f} "
                f"{statistics.median(resolves) * 1000:>11.0f}"
            )


if __name__ == "__main__":
    main()
