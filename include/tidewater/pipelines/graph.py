"""A pipeline's declared graph, as text and as a Mermaid flowchart: what ``tidewater pipelines`` shows.

Derived from the declaration alone (no Spark, no lake): the topic, the tables every record passes
through, and each gold table with its kind, keys, how the stream emits it and how much silver a
bounded recompute reads around an interval. The README's pictures are this module's output.
"""

from __future__ import annotations

import datetime as dt

from tidewater.pipelines.base import (
    GoldQuery,
    GoldTable,
    KeyedStateMachine,
    Pipeline,
    Projection,
    SessionAggregate,
    StreamJoin,
    WindowAggregate,
)
from tidewater.times import parse_duration


def kind_of(gold: GoldTable) -> str:
    """``window 1 hour``, ``session gap 30 minutes``, ``projection``: the kind and its parameter."""
    if isinstance(gold, WindowAggregate):
        return f"window {gold.window}"
    if isinstance(gold, SessionAggregate):
        return f"session gap {gold.gap}"
    if isinstance(gold, Projection):
        return "projection"
    if isinstance(gold, KeyedStateMachine):
        return "state machine per key" + (f", horizon {gold.horizon}" if parse_duration(gold.horizon) else "")
    if isinstance(gold, StreamJoin):
        if parse_duration(gold.lookback):
            return f"join from {gold.lookback} before to {gold.bound} after"
        return f"join within {gold.bound}"
    return type(gold).__name__


def _duration(value: dt.timedelta) -> str:
    seconds = int(value.total_seconds())
    if seconds == 0:
        return "0"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _sharing(gold: GoldTable, query: GoldQuery) -> str:
    others = [table.name for table in query.tables if table.name != gold.name]
    return f" (one query with {', '.join(others)})" if others else ""


def describe(pipeline: Pipeline, *, shared_queries: bool = True) -> list[str]:
    """One line per node of the graph, indented by depth; a gold table that shares its streaming
    query (``TIDEWATER_GOLD_SHARED_QUERIES``) names the tables it shares it with."""
    lines = [f"{pipeline.name}: {pipeline.description}"]
    queries = {table.name: query for query in pipeline.gold_queries(shared=shared_queries) for table in query.tables}
    for source in pipeline.sources:
        t = lambda tier, s=source: pipeline.table_of(s, tier)  # noqa: E731
        lines += [
            f"  kafka topic {source.topic} (source {source.name})"
            + (f", a micro-batch every {source.trigger_interval}" if source.trigger_interval else ""),
            f"    {t('bronze')}: every record (topic, partition, offset once), partitioned by ingest_date",
            f"    {t('silver')}: "
            + (f"one row per {source.key}" if source.deduplicate else f"every valid copy of a {source.key}")
            + f", event time {source.event_time}, "
            f"watermark {source.watermark}, partitioned by {source.partition_column}",
            f"    {t('quarantine')}: records the contract rejects ({len(source.all_rules)} rules), with the reason",
            f"    {t('conflicts')}: copies of one {source.key} that differ from the kept one",
        ]
    for gold in pipeline.gold:
        before, after = gold.feed_margins()
        reads = ", ".join(pipeline.table_of(s, "silver") for s in pipeline.inputs(gold))
        lines.append(
            f"      gold/{gold.name} (from {reads}): {kind_of(gold)}; keys {', '.join(gold.keys)}; "
            f"stream {gold.output_mode}{_sharing(gold, queries[gold.name])}; "
            f"batch reads {_duration(before)} before / {_duration(after)} after the interval"
            + (" (widened while rows grow)" if gold.grows_until_quiet else "")
            + "".join(f"; {pipeline.table_of(pipeline.source(h), 'silver')} read whole" for h in gold.history)
            + (f"; a micro-batch every {gold.trigger_interval}" if gold.trigger_interval else "")
        )
        if gold.publish is not None:
            lines.append(f"        kafka topic {gold.publish.topic}: the stream's rows, keyed by {gold.publish.key}")
    return lines


def mermaid(pipeline: Pipeline) -> str:
    """A Mermaid flowchart of the pipeline (GitHub and the Airflow docs render it)."""
    p = pipeline.name
    lines = ["flowchart LR"]
    for source in pipeline.sources:
        n = f"{p}_{source.name}" if len(pipeline.sources) > 1 else p
        label = "" if len(pipeline.sources) == 1 else f"{source.name} "
        lines += [
            f'  {n}_topic[("kafka: {source.topic}")] --> {n}_bronze["{label}bronze"]',
            f'  {n}_bronze --> {n}_silver["{label}silver<br/>'
            + (f'one row per {source.key}"]' if source.deduplicate else f'every copy of a {source.key}"]'),
            f'  {n}_bronze --> {n}_quarantine["{label}quarantine"]',
            f'  {n}_silver -.-> {n}_conflicts["{label}conflicts"]',
        ]
    for gold in pipeline.gold:
        node = f"{p}_{gold.name}"
        lines.append(f'  {node}["gold/{gold.name}<br/>{gold.output_mode}"]')
        for source in pipeline.inputs(gold):
            n = f"{p}_{source.name}" if len(pipeline.sources) > 1 else p
            whole = " (read whole)" if source.name in gold.history else ""
            lines.append(f'  {n}_silver -- "{kind_of(gold)}{whole}" --> {node}')
        if gold.publish is not None:
            lines.append(f'  {node} --> {node}_out[("kafka: {gold.publish.topic}")]')
    return "\n".join(lines)
