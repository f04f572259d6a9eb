"""The batch recompute's floor on this machine: what Spark and delta-rs alone take for an hour's rows.

Issue 13 asks a batch recompute of one hour holding 1M events (silver and gold from bronze) at
300,000 events/s: 3.3 s for the 1M. ``./tw bench`` measures tidewater's recompute in the job; this
benchmark measures what any recompute on this engine pays before a line of tidewater's logic runs,
so a target and a machine can be compared without the platform in between. For one pipeline's
sample events (generated, not produced to Kafka), in a warm local session, each step timed alone:

* **the floor** (Spark and delta-rs, nothing of ours): silver's rows read from Parquet and handed to
  Python as Arrow (``toArrow``, how a recompute's writer receives them); delta-rs writing them as a new
  table; each gold table of the pipeline computed from them (its declared ``rows``, a no-op sink).
* **for reference**, tidewater's own parse of the bronze records (the strict JSON check and the
  typing, the rules, a no-op sink), which the floor leaves out.

Silver's rows are made once by the pipeline's own parse and kept as Parquet, outside the timing. The
floor's sum is an upper bound of the recompute's rate on this host: a recompute also parses, de-
duplicates against what silver holds, commits and starts a JVM.

    ./tw bench floor [--pipeline rsvps] [--events 1000000] [--rounds 3] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_stream import TARGETS, loop_seconds, spread
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession

from tidewater import transforms
from tidewater.config import Settings
from tidewater.connectors.kafka_client import numbered_records
from tidewater.errors import ConfigError, PipelineError
from tidewater.generator.cli import sample_events_of
from tidewater.pipelines import GoldTable, Pipeline, Source, get_pipeline
from tidewater.pipelines.samples import GeneratedRecord, GeneratorConfig, SampleEvents, generate
from tidewater.spark import build_session

HOUR_MS = 3_600_000
PARTITIONS = 4  # how many Kafka partitions the generated records are spread over (by key)
DONE = "_SUCCESS"  # a folder of Parquet files complete (Spark's own marker; the bronze files get one too)


def kafka_records(records: Iterable[GeneratedRecord], topic: str) -> pa.Table:
    """Generated records as the Kafka source hands them to bronze: one topic, partitioned by key."""
    items = ((zlib.crc32(r.key) % PARTITIONS, r.key, r.value, r.timestamp_ms, ()) for r in records)
    return pa.Table.from_batches([numbered_records(topic, items)])


def bronze_files(pipeline: Pipeline, sample: SampleEvents, events: int, work: Path) -> dict[str, Path]:
    """Each source's generated Kafka records as Parquet, a file per Kafka partition so that Spark reads
    them in parallel (made once per work folder): ``events`` of the pipeline's sample events spread over
    the hour that ended an hour ago, without faults. A folder is named by its count of sample events, so a
    rerun with another ``--events`` in the same work folder makes its own."""
    paths = {source.name: work / f"bronze-{source.name}-{events}" for source in pipeline.sources}
    if all((path / DONE).exists() for path in paths.values()):
        return paths
    start_ms = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    config = GeneratorConfig(start_time_ms=start_ms, rate=events / 3600)
    by_source: dict[str, list[GeneratedRecord]] = {source.name: [] for source in pipeline.sources}
    for record in generate(config, events, sample):
        by_source[record.source or pipeline.sources[0].name].append(record)
    for source in pipeline.sources:
        records = kafka_records(by_source[source.name], source.topic)
        shutil.rmtree(paths[source.name], ignore_errors=True)  # what an interrupted run left
        paths[source.name].mkdir(parents=True)
        for partition in range(PARTITIONS):
            part = records.filter(pc.equal(records.column("partition"), partition))
            pq.write_table(part, paths[source.name] / f"part-{partition}.parquet")
        (paths[source.name] / DONE).touch()
    return paths


def silver_files(spark: SparkSession, pipeline: Pipeline, bronze: dict[str, Path], work: Path) -> dict[str, Path]:
    """Each source's silver rows, made once by the pipeline's own parse and kept as Parquet (named as its
    bronze folder is)."""
    paths = {name: work / path.name.replace("bronze-", "silver-", 1) for name, path in bronze.items()}
    for source in pipeline.sources:
        if not (paths[source.name] / DONE).exists():
            rows = source.silver(source.parse(transforms.to_bronze(spark.read.parquet(str(bronze[source.name])))))
            rows.write.mode("overwrite").parquet(str(paths[source.name]))
    return paths


def noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


Step = tuple[str, str, Callable[[], None]]


def steps(
    spark: SparkSession, pipeline: Pipeline, bronze: dict[str, Path], silver: dict[str, Path], work: Path
) -> list[Step]:
    """(name, part, step) for every timed step; part is "floor" or "reference"."""
    frames = {name: spark.read.parquet(str(path)) for name, path in silver.items()}
    arrow: dict[str, pa.Table] = {}

    def to_python(name: str) -> Callable[[], None]:
        def run() -> None:
            arrow[name] = frames[name].toArrow()

        return run

    def write(name: str) -> Callable[[], None]:
        def run() -> None:
            target = work / f"delta-{name}"
            shutil.rmtree(target, ignore_errors=True)
            write_deltalake(str(target), arrow[name])

        return run

    def gold_rows(gold: GoldTable) -> Callable[[], None]:
        return lambda: noop(gold.rows(*(frames[source.name] for source in pipeline.inputs(gold))))

    def parse(source: Source) -> Callable[[], None]:
        raw = spark.read.parquet(str(bronze[source.name]))
        return lambda: noop(source.silver(source.parse(transforms.to_bronze(raw))))

    out: list[Step] = []
    for source in pipeline.sources:
        out.append((f"silver {source.name} to Python as Arrow", "floor", to_python(source.name)))
        out.append((f"silver {source.name} written by delta-rs", "floor", write(source.name)))
    out += [(f"gold {gold.name}", "floor", gold_rows(gold)) for gold in pipeline.gold]
    out += [(f"tidewater's parse of {source.name}", "reference", parse(source)) for source in pipeline.sources]
    return out


def count_rows(paths: dict[str, Path]) -> dict[str, int]:
    """Rows of each source's folder of Parquet files, from the files' footers."""
    return {
        name: sum(pq.ParquetFile(f).metadata.num_rows for f in path.glob("*.parquet")) for name, path in paths.items()
    }


def floor_report(events: int, timings: dict[str, tuple[str, list[float]]]) -> dict[str, Any]:
    """The floor's sum (medians of its steps) and the rate it allows for ``events``."""
    floor_s = sum(statistics.median(seconds) for part, seconds in timings.values() if part == "floor")
    return {"floor_s": floor_s, "max_events_per_s": events / floor_s if floor_s else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="rsvps")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-dir", default=None, help="keeps the generated records and silver rows for a rerun")
    args = parser.parse_args(argv)
    if args.events < 1 or args.rounds < 1:
        parser.error("--events and --rounds must be at least 1")
    try:
        pipeline = get_pipeline(args.pipeline)
        sample = sample_events_of(pipeline)
    except (PipelineError, ConfigError) as exc:
        parser.error(str(exc))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tw-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return measure(pipeline, sample, args.events, args.rounds, work)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def measure(pipeline: Pipeline, sample: SampleEvents, events: int, rounds: int, work: Path) -> int:
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; 10M-step loop {spread(loop_seconds(), ' s', 2)}")
    began = time.perf_counter()
    bronze = bronze_files(pipeline, sample, events, work)
    records = sum(count_rows(bronze).values())  # a sample event may bring follow-ups (ads: clicks)
    took = time.perf_counter() - began
    print(f"{records:,} records of {events:,} {pipeline.name} sample events in {took:.1f} s ({work})", flush=True)
    spark = build_session(Settings.from_env().replace(state_dir=str(work / "state")), app_name="bench-floor")
    try:
        silver = silver_files(spark, pipeline, bronze, work)
        rows = count_rows(silver)
        print("silver rows: " + ", ".join(f"{name} {count:,}" for name, count in rows.items()), flush=True)
        plan = steps(spark, pipeline, bronze, silver, work)
        for _, _, step in plan:  # warm-up: the JVM compiles each plan's code once
            step()
        timings: dict[str, tuple[str, list[float]]] = {name: (part, []) for name, part, _ in plan}
        for round_no in range(1, rounds + 1):
            for name, _, step in plan:
                t0 = time.perf_counter()
                step()
                timings[name][1].append(time.perf_counter() - t0)
            print(f"round {round_no}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, (_, s) in timings.items()), flush=True)
    finally:
        spark.stop()
    report = floor_report(records, timings)
    print(f"\n{pipeline.name}, {records:,} records, {rounds} rounds (median [min-max]):")
    for part in ("floor", "reference"):
        for name, (step_part, seconds) in timings.items():
            if step_part == part:
                print(f"  {part:9s} {name}: {spread(seconds, ' s', 2)}")
    print(
        f"  the floor: {report['floor_s']:.2f} s for {records:,} records, so at most "
        f"{report['max_events_per_s']:,.0f} events/s (target {TARGETS['recompute_events_per_s']})"
    )
    print(
        json.dumps(
            {
                "pipeline": pipeline.name,
                "events": events,
                "records": records,
                "silver_rows": rows,
                "timings": {n: s for n, (_, s) in timings.items()},
                **report,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
