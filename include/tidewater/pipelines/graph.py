"""A pipeline's declared graph, as text and as a Mermaid flowchart: what ``tidewater pipelines`` shows.

Derived from the declaration alone (no Spark, no lake): the topic, the tables every record passes
through, and each gold table with its kind, keys, how the stream emits it and how much silver a
bounded recompute reads around an interval. The README's pictures are this module's output.
"""

from __future__ import annotations

import datetime as dt

from tidewater.pipelines.base import GoldTable, Pipeline, Projection, SessionAggregate, StreamJoin, WindowAggregate


def kind_of(gold: GoldTable) -> str:
    """``window 1 hour``, ``session gap 30 minutes``, ``projection``: the kind and its parameter."""
    if isinstance(gold, WindowAggregate):
        return f"window {gold.window}"
    if isinstance(gold, SessionAggregate):
        return f"session gap {gold.gap}"
    if isinstance(gold, Projection):
        return "projection"
    if isinstance(gold, StreamJoin):
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


def describe(pipeline: Pipeline) -> list[str]:
    """One line per node of the graph, indented by depth."""
    lines = [
        f"{pipeline.name}: {pipeline.description}",
        f"  kafka topic {pipeline.topic}",
        "    bronze: every record (topic, partition, offset once), partitioned by ingest_date",
        f"    silver: one row per {pipeline.key}, event time {pipeline.event_time}, "
        f"watermark {pipeline.watermark}, partitioned by {pipeline.partition_column}",
        f"    quarantine: records the contract rejects ({len(pipeline.all_rules)} rules), with the reason",
        f"    conflicts: copies of one {pipeline.key} that differ from the kept one",
    ]
    for gold in pipeline.gold:
        before, after = gold.feed_margins()
        lines.append(
            f"      gold/{gold.name}: {kind_of(gold)}; keys {', '.join(gold.keys)}; stream {gold.output_mode}; "
            f"batch reads {_duration(before)} before / {_duration(after)} after the interval"
            + (" (widened while rows grow)" if gold.grows_until_quiet else "")
        )
    return lines


def mermaid(pipeline: Pipeline) -> str:
    """A Mermaid flowchart of the pipeline (GitHub and the Airflow docs render it)."""
    p = pipeline.name
    lines = [
        "flowchart LR",
        f'  {p}_topic[("kafka: {pipeline.topic}")] --> {p}_bronze["bronze"]',
        f'  {p}_bronze --> {p}_silver["silver<br/>one row per {pipeline.key}"]',
        f'  {p}_bronze --> {p}_quarantine["quarantine"]',
        f'  {p}_silver -.-> {p}_conflicts["conflicts"]',
    ]
    for gold in pipeline.gold:
        node = f"{p}_{gold.name}"
        lines.append(f'  {p}_silver -- "{kind_of(gold)}" --> {node}["gold/{gold.name}<br/>{gold.output_mode}"]')
    return "\n".join(lines)
