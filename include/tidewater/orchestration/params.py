"""Replay, backfill and stream-control parameters, checked in the Airflow task before any Spark job starts.

Every mistake a person can make in the trigger form costs a Spark job start (tens of seconds) and,
into the live tables, possibly data, so each is refused here in one :class:`ConfigError` line that
says what to do. The replay's rules (times, an empty or future range, source, target, the sandbox
namespace, entities) are those of :class:`tidewater.batch.requests.ReplayRequest`, which the Spark
job applies to the same request again: this module only decodes the form (unknown keys, the
pipeline's name) and adds what needs the source itself - a source that does not hold the range (see
:func:`check_range_held`): a replay from a source that lost the range would overwrite good rows
with nothing.

The stream-control DAG's params (``pipeline``, ``action``) are checked the same way
(:func:`parse_control_params`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from tidewater import pipelines as registry
from tidewater.batch.requests import (
    DEFAULT_CLOCK_SKEW,
    LIVE,
    PARAMS,
    SOURCES,
    TARGETS,
    ReplayRequest,
    clock_skew,
    parse_interval,
)
from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaPythonClient, PartitionClient, kafka_python_config
from tidewater.errors import ConfigError
from tidewater.lake.tables import add_actions
from tidewater.pipelines.base import Pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import iso

__all__ = [
    "ACTIONS",
    "CONTROL_DAG_ID",
    "DEFAULT_CLOCK_SKEW",
    "PARAM_KEYS",
    "SOURCES",
    "TARGETS",
    "ReplayRequest",
    "check_range_held",
    "clock_skew",
    "parse_control_params",
    "parse_interval",
    "parse_replay_params",
]

# What the stream control DAG can be asked to do (the DAG's enum and the check below).
ACTIONS = ("start", "stop", "restart", "resume")
CONTROL_DAG_ID = "tidewater_stream_control"  # the DAG, and the streams page's buttons that trigger it

PARAM_KEYS = ("pipeline", "start", "end", "source", "target", "sandbox_namespace", "entities")
CONTROL_PARAM_KEYS = ("pipeline", "action")
_PEEK_RECORDS = 16  # records read at each end of a partition to find a timestamp (control records have none)


# ---- parameters ----------------------------------------------------------------------------------


def parse_replay_params(
    params: Mapping[str, Any], settings: Settings, *, now: dt.datetime | None = None
) -> ReplayRequest:
    """The trigger form's params -> a :class:`ReplayRequest`, or one ConfigError line saying what to fix."""
    unknown = sorted(set(params) - set(PARAM_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown replay parameter(s) {', '.join(unknown)}: the parameters are {', '.join(PARAM_KEYS)}"
        )
    # The form always carries sandbox_namespace (its field has a default), so a live replay ignores it.
    sandbox = None if params.get("target") == LIVE else params.get("sandbox_namespace")
    return ReplayRequest.parse(
        settings,
        _pipeline(params.get("pipeline")),
        start=params.get("start"),
        end=params.get("end"),
        source=params.get("source"),
        target=params.get("target"),
        sandbox_namespace=sandbox,
        entities=params.get("entities"),
        now=now,
        spelling=PARAMS,
    )


def parse_control_params(params: Mapping[str, Any]) -> tuple[str, str]:
    """The stream-control DAG's params -> (pipeline, action), or one ConfigError line saying what to fix."""
    unknown = sorted(set(params) - set(CONTROL_PARAM_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown stream-control parameter(s) {', '.join(unknown)}: the parameters are "
            f"{', '.join(CONTROL_PARAM_KEYS)}"
        )
    pipeline = _pipeline(params.get("pipeline"))
    action = params.get("action")
    if action is None or action == "":
        raise ConfigError(f"action is required: one of {', '.join(ACTIONS)}")
    if action not in ACTIONS:
        raise ConfigError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    return pipeline.name, str(action)


def _pipeline(name: Any) -> Pipeline:
    known = registry.all_pipelines()
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"unknown pipeline {name!r}: known pipelines are {', '.join(sorted(known)) or 'none'}")
    return known[name]


# ---- what the source holds -----------------------------------------------------------------------


def check_range_held(settings: Settings, request: ReplayRequest, *, client: PartitionClient | None = None) -> str:
    """One line describing what the source holds, or one ConfigError line when it cannot hold the range.

    An event at time t reached Kafka no earlier than ``t - clock skew`` (silver refuses events
    further ahead of their Kafka timestamp), so the range needs records from ``start - skew`` on.
    """
    pipeline = registry.get_pipeline(request.pipeline)
    skew = clock_skew(pipeline)
    if request.source == "bronze":
        layout = PipelineLayout.of(settings, pipeline)
        return "; ".join(
            _bronze_holds(layout, pipeline.table_of(source, "bronze"), request, skew) for source in pipeline.sources
        )
    own = client is None
    kafka = client or KafkaPythonClient(kafka_python_config(settings), stall_timeout_s=15)
    try:
        return "; ".join(_kafka_holds(kafka, settings.topic(s.topic), request, skew) for s in pipeline.sources)
    finally:
        if own:
            kafka.close()


def _range(request: ReplayRequest) -> str:
    return f"[{iso(request.start)}, {iso(request.end)})"


def _bronze_holds(layout: PipelineLayout, name: str, request: ReplayRequest, skew: dt.timedelta) -> str:
    """From the add actions' statistics (min/max of kafka_timestamp per file): no data file is read."""
    table = layout.table(name)
    where = f"{layout.namespace}/{layout.pipeline.name}" + ("" if name == "bronze" else f"/{name.split('/')[0]}")
    if not table.exists():
        raise ConfigError(
            f"there is no bronze table for {where} ({table.uri}): nothing to replay from; "
            "run the stream first, or replay from source=kafka"
        )
    actions = add_actions(table.open())
    records = sum(n or 0 for n in actions.column("num_records").to_pylist()) if actions.num_rows else 0
    if not records:
        raise ConfigError(f"bronze {where} holds no records; nothing to replay in {_range(request)}")
    mins = _non_null(actions, "min.kafka_timestamp")
    maxs = _non_null(actions, "max.kafka_timestamp")
    if len(mins) < actions.num_rows or len(maxs) < actions.num_rows:
        # Files without statistics: the span cannot be bounded without a scan, so do not refuse on it.
        return f"bronze {where} holds {records} records in {actions.num_rows} files (some without statistics)"
    first, last = min(mins), max(maxs)
    if last < request.start - skew or first >= request.end:
        raise ConfigError(
            f"bronze holds events from {iso(first)} to {iso(last)}; nothing to replay in {_range(request)}"
        )
    return f"bronze {where} holds {records} records in {actions.num_rows} files, Kafka time {iso(first)} to {iso(last)}"


def _non_null(actions: pa.Table, column: str) -> list[dt.datetime]:
    if column not in actions.column_names:
        return []
    return [v for v in actions.column(column).to_pylist() if v is not None]


def _kafka_holds(client: PartitionClient, topic: str, request: ReplayRequest, skew: dt.timedelta) -> str:
    partitions = client.partitions(topic)  # TopicNotFoundError / BrokerUnreachableError: one line already
    earliest = client.earliest_offsets(topic, partitions)
    ends = client.end_offsets(topic, partitions)
    held = {p: ends[p] - earliest[p] for p in partitions}
    if not any(held.values()):
        if any(ends.values()):
            raise ConfigError(
                f"Kafka retains none of {topic}'s records (older records were deleted by retention): "
                "replay from source=bronze"
            )
        raise ConfigError(f"Kafka topic {topic} is empty; nothing to replay in {_range(request)}")
    needed_from = request.start - skew
    firsts: dict[int, dt.datetime] = {}
    lasts: dict[int, dt.datetime] = {}
    for p in partitions:
        if not held[p]:
            continue
        first = _timestamp(client, topic, p, earliest[p], min(ends[p], earliest[p] + _PEEK_RECORDS), last=False)
        last = _timestamp(client, topic, p, max(earliest[p], ends[p] - _PEEK_RECORDS), ends[p], last=True)
        if first is not None:
            firsts[p] = first
        if last is not None:
            lasts[p] = last
    truncated = [p for p in partitions if earliest[p] > 0]  # retention deleted records of these
    if any(p not in firsts for p in truncated):
        # Nothing (readable) left in a truncated partition: when its records ended is unknown.
        lost = next(p for p in truncated if p not in firsts)
        raise ConfigError(
            f"Kafka retains none of the older records of {topic}/{lost} (deleted by retention): "
            "replay from source=bronze"
        )
    since = max((firsts[p] for p in truncated), default=None)
    if since is not None and since > needed_from:
        raise ConfigError(
            f"Kafka retains {topic} only from {iso(since)} (older records were deleted by retention): "
            "replay from source=bronze"
        )
    records = sum(held.values())
    if not firsts or not lasts:
        return f"Kafka topic {topic} holds {records} records in {len(partitions)} partitions"
    first, last = min(firsts.values()), max(lasts.values())
    if last < needed_from or first >= request.end:
        raise ConfigError(
            f"Kafka holds {topic} from {iso(first)} to {iso(last)}; nothing to replay in {_range(request)}"
        )
    return (
        f"Kafka topic {topic} holds {records} records in {len(partitions)} partitions from {iso(first)} to {iso(last)}"
    )


def _timestamp(
    client: PartitionClient, topic: str, partition: int, start: int, end: int, *, last: bool
) -> dt.datetime | None:
    """The Kafka timestamp of the first (or last) record in ``[start, end)``; None if there is none
    (transaction markers occupy offsets but are not records)."""
    found: dt.datetime | None = None
    for batch in client.read_arrow(topic, partition, start, end, batch_rows=_PEEK_RECORDS):
        if batch.num_rows:
            found = batch.column("timestamp")[batch.num_rows - 1 if last else 0].as_py()
            if not last:
                break
    return found.astimezone(dt.UTC) if found is not None else None
