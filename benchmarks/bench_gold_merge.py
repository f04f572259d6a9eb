"""What a stream's gold MERGE costs as its table ages, bounded by the batch's span starts or not.

A gold query MERGEs each micro-batch's rows into its table on the table's keys (a 5 s gold trigger:
720 merges an hour). delta-rs prunes no file on the keys' equality alone, so unbounded, every merge
reads the whole table; :attr:`tidewater.pipelines.base.GoldTable.range_keys` bounds the target side to
the span starts the batch holds (:meth:`tidewater.lake.tables.LakeTable.merge`). This benchmark
replays ``--merges`` micro-batches of ``--rows`` rows shaped like ads' ``clicked_impressions`` (keys
window_start, campaign_id, impression_id, click_id): event time moves on ``--step`` seconds a batch,
and a batch's starts spread over the ``--spread`` seconds before it (a join's rows start when their
impression was shown, up to its bound and watermark before). A join's rows are each written once, so
its MERGE only inserts; ``--updates`` makes that share of each batch updates of rows the last 20
batches wrote (an update-mode window's open rows), whose files the MERGE then rewrites. Each run
has the writers' compaction (:class:`~tidewater.lake.compaction.StreamCompaction`, every 100 commits)
and prints, at each step of ``--at``, the median and p95 of the last 50 merges, the files they read
and the table's live files. No Spark, no broker: the driver-side cost of a gold commit.

    .venv/bin/python benchmarks/bench_gold_merge.py [--merges 1000] [--rows 2000] [--step 5]
        [--spread 720] [--updates 0] [--at 100,250,500,1000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from tidewater.lake.compaction import StreamCompaction
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline

SCHEMA = pa.schema(
    [
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("window_end", pa.timestamp("us", tz="UTC")),
        ("campaign_id", pa.string()),
        ("impression_id", pa.string()),
        ("click_id", pa.string()),
        ("ad_id", pa.string()),
        ("clicked", pa.bool_()),
        ("revision", pa.int32()),
    ]
)
# The table it stands for: its keys and range keys as the stream's GoldWriter passes them.
GOLD = get_pipeline("ads").gold_table("clicked_impressions")
START = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
WINDOW = 50  # merges each printed figure is taken over


def batch(rng: random.Random, n: int, args: argparse.Namespace, written: list[dict]) -> pa.Table:
    """Micro-batch ``n``: rows starting in the ``spread`` seconds before its time, the ``updates`` share
    of them updates of rows the last 20 batches wrote."""
    rows, spread = args.rows, args.spread
    now = START + dt.timedelta(seconds=n * args.step)
    out = [dict(row, clicked=True) for row in rng.sample(written, min(len(written), int(rows * args.updates)))]
    while len(out) < rows:
        start = now - dt.timedelta(microseconds=rng.randrange(int(spread * 1e6)))
        out.append(
            {
                "window_start": start,
                "window_end": start + dt.timedelta(minutes=10),
                "campaign_id": f"c-{rng.randrange(24):03d}",
                "impression_id": f"{rng.getrandbits(64):016x}",
                "click_id": "",
                "ad_id": f"ad-{rng.randrange(4)}",
                "clicked": False,
                "revision": 0,
            }
        )
    written[:] = (written + out)[-rows * 20 :]  # what later batches may update: the recent rows
    return pa.Table.from_pylist(out, schema=SCHEMA)


def run(root: str, label: str, range_keys: tuple[str, ...], args: argparse.Namespace, at: list[int]) -> None:
    table = LakeTable(f"{root}/{label.replace(' ', '-')}")
    table.ensure(SCHEMA)
    compaction = StreamCompaction(every=100, query="bench")
    rng = random.Random(7)
    written: list[dict] = []
    times: list[float] = []
    read: list[int] = []
    started = time.perf_counter()
    print(f"\n{label}: {args.merges} merges of {args.rows} rows")
    print(f"{'merges':>7} {'live files':>10} {'merge p50 ms':>13} {'merge p95 ms':>13} {'files read p50':>15}")
    for batch_id in range(1, args.merges + 1):
        rows = batch(rng, batch_id, args, written)
        began = time.perf_counter()
        result = table.merge(
            rows, keys=GOLD.keys, range_keys=range_keys, keep=("revision",), app_id="b", batch_id=batch_id
        )
        times.append((time.perf_counter() - began) * 1000)
        read.append(result.files_read or 0)
        compaction.after_commit(table, result)
        if batch_id in at:
            last = times[-WINDOW:]
            p95 = statistics.quantiles(last, n=20)[-1]
            files = statistics.median(read[-WINDOW:])
            print(
                f"{batch_id:>7} {len(table.files()):>10} {statistics.median(last):>13.1f} {p95:>13.1f} {files:>15.0f}"
            )
    total = time.perf_counter() - started
    print(f"total: {total:.1f} s ({total / args.merges * 1000:.1f} ms a merge, compaction included)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--merges", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--step", type=float, default=5.0, help="seconds of event time between two batches")
    parser.add_argument("--spread", type=float, default=720.0, help="seconds a batch's starts spread over")
    parser.add_argument("--updates", type=float, default=0.0, help="share of each batch updating earlier rows")
    parser.add_argument("--at", default="100,250,500,1000")
    args = parser.parse_args()
    if args.merges < WINDOW or args.rows < 10 or args.step <= 0 or args.spread <= 0 or not 0 <= args.updates <= 1:
        parser.error(
            f"--merges must be at least {WINDOW}, --rows at least 10, --step and --spread above 0, --updates 0-1"
        )
    at = sorted({int(x) for x in args.at.split(",") if x.strip()} | {args.merges})
    at = [n for n in at if WINDOW <= n <= args.merges]
    print(
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    print(
        f"a batch: {args.rows} rows every {args.step:g} s of event time, starts spread over {args.spread:g} s, "
        f"{args.updates:.0%} updates"
    )
    with tempfile.TemporaryDirectory(prefix="tw-bench-gold-merge-") as tmp:
        root = Path(tmp).as_uri()
        run(root, f"bounded by {', '.join(GOLD.range_keys)}", GOLD.range_keys, args, at)
        run(root, "unbounded", (), args, at)


if __name__ == "__main__":
    main()
