"""Helpers shared by the pipeline tests: produce generated events, read tables, compare gold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from tidewater.config import Settings
from tidewater.connectors.kafka_client import RECORD_SCHEMA
from tidewater.generator.events import GeneratedRecord, GeneratorConfig, generate
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import group_members

# Bronze's Arrow schema, for tests that commit bronze files directly (no Spark).
BRONZE_SCHEMA = pa.schema(
    [
        *(RECORD_SCHEMA.field(n) for n in ("key", "value", "topic", "partition", "offset")),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        RECORD_SCHEMA.field("headers"),
        pa.field("ingest_time", pa.timestamp("us", tz="UTC")),
        pa.field("ingest_date", pa.date32()),
    ]
)


def send(settings: Settings, topic: str, records: Iterable[GeneratedRecord]) -> list[GeneratedRecord]:
    """Produce records exactly as generated (key, value, Kafka timestamp); return them."""
    sent = list(records)
    producer = KafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=5
    )
    try:
        for record in sent:
            producer.send(topic, key=record.key, value=record.value, timestamp_ms=record.timestamp_ms)
        producer.flush(timeout=60)
    finally:
        producer.close()
    return sent


def produce_generated(settings: Settings, topic: str, config: GeneratorConfig, count: int) -> list[GeneratedRecord]:
    return send(settings, topic, generate(config, count))


def table_rows(spark: SparkSession, settings: Settings, table: str, pipeline: str = "rsvps") -> list[dict[str, Any]]:
    layout = PipelineLayout.of(settings, get_pipeline(pipeline))
    return [row.asDict() for row in read_table(spark, layout.table_uri(table)).collect()]


def gold_from_silver(spark: SparkSession, settings: Settings, gold: str, pipeline: str = "rsvps") -> list[tuple]:
    """The gold table computed from scratch, as a batch, from silver (the same transform)."""
    definition = get_pipeline(pipeline)
    layout = PipelineLayout.of(settings, definition)
    silver = read_table(spark, layout.table_uri("silver"))
    rows = definition.gold_table(gold).build(silver).collect()
    return sorted(tuple(r) for r in rows)


def gold_as_streamed(spark: SparkSession, settings: Settings, gold: str, pipeline: str = "rsvps") -> list[tuple]:
    definition = get_pipeline(pipeline)
    layout = PipelineLayout.of(settings, definition)
    table = read_table(spark, layout.table_uri(f"gold/{gold}"))
    silver = read_table(spark, layout.table_uri("silver"))
    order = definition.gold_table(gold).build(silver.limit(0)).columns  # the batch computation's order
    return sorted(tuple(r) for r in table.select(*order).collect())


def delta_rows(layout: PipelineLayout, table: str) -> list[dict[str, Any]]:
    """A table's rows as delta-rs alone reads them (not the project's Spark read path)."""
    from deltalake import DeltaTable

    return DeltaTable(layout.table_uri(table)).to_pyarrow_table().to_pylist()


def final_watermark_ms(layout: PipelineLayout, query: str) -> int:
    """The watermark of a gold query's last micro-batch (Spark's offset log): what its last fold passed."""
    offsets = layout.checkpoint(query) / "offsets"
    last = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return int(json.loads(last.read_text().splitlines()[1])["batchWatermarkMs"])


def run_stream(spark: SparkSession, settings: Settings, pipeline: str = "rsvps") -> None:
    """Process everything in Kafka through every tier with the streaming job's code (Trigger.AvailableNow)."""
    from tidewater.streaming.runner import PipelineStreams

    streams = PipelineStreams(settings, get_pipeline(pipeline))
    try:
        streams.run_available_now(spark)
    finally:
        streams.close()


def streamed_lake(
    spark: SparkSession, bootstrap_servers: str, state_dir: str, *, prefix: str, seed: int, count: int, **config: Any
) -> Settings:
    """A lake the streaming job wrote from ``count`` generated events starting 10:00 at 10/s, in
    micro-batches of 1,500 records; duplicates, out-of-order and malformed records unless overridden."""
    from tidewater.generator.events import parse_ts
    from tidewater.generator.producer import ensure_topic

    settings = Settings(
        state_dir=state_dir,
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=bootstrap_servers,
        kafka_topic_prefix=f"{prefix}-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=1500,
    )
    topic = settings.topic(get_pipeline("rsvps").source().topic)
    ensure_topic(settings, topic, 4)
    knobs = {
        "rate": 10,
        "duplicate_rate": 0.05,
        "out_of_order_fraction": 0.1,
        "out_of_order_max_ms": 20_000,
        "malformed_rate": 0.02,
        **config,
    }
    knobs.setdefault("start_time_ms", parse_ts("2026-11-21T10:00:00Z"))
    produce_generated(settings, topic, GeneratorConfig(seed=seed, **knobs), count)
    run_stream(spark, settings)
    return settings


def wait_for(predicate: Callable[[], Any], *, timeout_s: float, what: str, log: Path | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail naming ``what``, with
    the tail of ``log`` if given."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")


def kill_job(job: subprocess.Popen[bytes]) -> int:
    """kill -9 a streaming job's whole process group (a crash), and return once every process of it is
    gone: the job's exit status. The launcher is reaped first; the Python driver, which holds the
    checkpoints' leases, lets go of them only when its own exit ends, and a claim made in between is
    refused ("in use by a running driver")."""
    os.killpg(job.pid, signal.SIGKILL)
    status = job.wait(timeout=30)
    wait_for(lambda: not group_members(job.pid), timeout_s=30, what=f"the killed job's processes (group {job.pid})")
    return status
