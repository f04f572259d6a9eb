"""Helpers shared by the pipeline tests: produce generated events, read tables, compare gold."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafka import KafkaProducer
from pyspark.sql import SparkSession

from tidewater.config import Settings
from tidewater.generator.events import GeneratedRecord, GeneratorConfig, generate
from tidewater.lake.layout import PipelineLayout
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline


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
