"""Replay, backfill and stream-control parameters, checked in the Airflow task before any Spark job starts.

A replay recomputes an event-time range ``[start, end)`` of a pipeline from bronze (the default:
every Kafka record is kept there) or from Kafka, into a sandbox namespace or into the live tables.
Every mistake a person can make in the trigger form costs a Spark job start (tens of seconds) and,
into the live tables, possibly data, so each is refused here in one :class:`ConfigError` line that
says what to do: an unknown pipeline, times that do not parse, an empty or future range, entities
for a pipeline that has no entity column, an unknown source or target, a sandbox namespace that is
empty, malformed or the live one - and a source that does not hold the range (see
:func:`check_range_held`): a replay from a source that lost the range would overwrite good rows
with nothing.

Times are ISO-8601; a time without an offset is UTC (event times are UTC end to end). The rules
are those of :mod:`tidewater.batch.interval`, which the Spark side uses on the same arguments.

The stream-control DAG's params (``pipeline``, ``action``) are checked the same way
(:func:`parse_control_params`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import ByteType, DataType, IntegerType, LongType, ShortType, StructType

from tidewater import pipelines as registry
from tidewater.config import Settings, check_namespace
from tidewater.connectors.kafka_client import KafkaPythonClient, PartitionClient
from tidewater.errors import ConfigError
from tidewater.pipelines.base import Pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import iso, parse_duration, parse_time

# What the stream control DAG can be asked to do (the DAG's enum and the check below).
ACTIONS = ("start", "stop", "restart", "resume")

SOURCES = ("bronze", "kafka")
TARGETS = ("sandbox", "live")
PARAM_KEYS = ("pipeline", "start", "end", "source", "target", "sandbox_namespace", "entities")
CONTROL_PARAM_KEYS = ("pipeline", "action")
DEFAULT_CLOCK_SKEW = dt.timedelta(minutes=5)
_PEEK_RECORDS = 16  # records read at each end of a partition to find a timestamp (control records have none)


@dataclass(frozen=True)
class ReplayRequest:
    """A validated replay: what the Spark job receives, as :meth:`to_args`."""

    pipeline: str
    start: dt.datetime  # aware UTC, inclusive
    end: dt.datetime  # aware UTC, exclusive
    source: str  # "bronze" | "kafka"
    target: str  # "sandbox" | "live"
    sandbox_namespace: str  # "" when target is "live"
    entities: tuple[str, ...] = ()  # values of the pipeline's entity column; empty: all

    def to_args(self) -> list[str]:
        """Command-line arguments of the batch job's ``replay`` command."""
        args = [
            "--pipeline",
            self.pipeline,
            "--start",
            iso(self.start),
            "--end",
            iso(self.end),
            "--source",
            self.source,
            "--target",
            self.target,
        ]
        if self.target == "sandbox":
            args += ["--sandbox-namespace", self.sandbox_namespace]
        for entity in self.entities:
            args += ["--entity", entity]
        return args


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
    pipeline = _pipeline(params.get("pipeline"))
    start, end = parse_interval(params.get("start"), params.get("end"), clock_skew=clock_skew(pipeline), now=now)
    source = _choice(params.get("source"), "source", SOURCES, default="bronze")
    target = _choice(params.get("target"), "target", TARGETS, default="sandbox")
    namespace = _sandbox_namespace(params.get("sandbox_namespace"), settings) if target == "sandbox" else ""
    entities = _entities(params.get("entities"), pipeline)
    return ReplayRequest(pipeline.name, start, end, source, target, namespace, entities)


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


def parse_interval(
    start: Any,
    end: Any,
    *,
    clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
    now: dt.datetime | None = None,
) -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` as aware UTC datetimes: both given, ISO-8601 (naive = UTC), end after start, and
    not starting after ``now + clock_skew`` (event times cannot be later than that: nothing holds it)."""
    begin, finish = _time(start, "start"), _time(end, "end")
    if finish <= begin:
        raise ConfigError(
            f"end {iso(finish)} is not after start {iso(begin)}: the range is [start, end), give end > start"
        )
    current = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    if begin > current + clock_skew:
        raise ConfigError(
            f"the range [{iso(begin)}, {iso(finish)}) starts in the future (now is {iso(current)}, clock skew "
            f"tolerance {_span(clock_skew)}): nothing can hold it yet; give a start in the past"
        )
    return begin, finish


def clock_skew(pipeline: Pipeline) -> dt.timedelta:
    """How far an event time may run ahead of its Kafka timestamp (and of the clock) for ``pipeline``."""
    return parse_duration(pipeline.clock_skew_tolerance)


def _time(value: Any, what: str) -> dt.datetime:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{what} is required: give an ISO-8601 time, e.g. 2026-11-21T10:00:00Z")
    if not isinstance(value, str | dt.datetime):
        raise ConfigError(f"{what} {value!r} is not an ISO-8601 time (e.g. 2026-11-21T10:00:00Z)")
    return parse_time(value, what)


def _span(delta: dt.timedelta) -> str:
    minutes = delta.total_seconds() / 60
    return f"{minutes:g} minutes"


def _pipeline(name: Any) -> Pipeline:
    known = registry.all_pipelines()
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"unknown pipeline {name!r}: known pipelines are {', '.join(sorted(known)) or 'none'}")
    return known[name]


def _choice(value: Any, what: str, allowed: Sequence[str], *, default: str) -> str:
    if value is None or value == "":
        return default
    if value not in allowed:
        raise ConfigError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _sandbox_namespace(value: Any, settings: Settings) -> str:
    name = value.strip() if isinstance(value, str) else ""
    if not name:
        raise ConfigError(
            "a sandbox replay needs sandbox_namespace (e.g. replay_2026_11_21), a namespace other than the "
            f"live one ({settings.namespace!r}); or set target=live"
        )
    check_namespace(name, "sandbox_namespace")
    if name == settings.namespace:
        raise ConfigError(
            f"sandbox_namespace {name!r} is the live namespace: choose another for a sandbox, or set target=live "
            "to replay into the live tables"
        )
    return name


def _entities(value: Any, pipeline: Pipeline) -> tuple[str, ...]:
    if value is None or value == "":
        raw: list[Any] = []
    elif isinstance(value, str):
        raw = value.split(",")
    elif isinstance(value, Sequence):
        raw = list(value)
    else:
        raise ConfigError(f"entities {value!r} must be a list of values (or a comma-separated string)")
    entities = tuple(dict.fromkeys(str(v).strip() for v in raw if str(v).strip()))
    if not entities:
        return ()
    if pipeline.entity_column is None:
        raise ConfigError(
            f"pipeline {pipeline.name} has no entity column, so a replay cannot be restricted to entities "
            f"{', '.join(entities)}: leave entities empty to replay every entity"
        )
    if isinstance(_column_type(pipeline, pipeline.entity_column), ByteType | ShortType | IntegerType | LongType):
        bad = [e for e in entities if not re.fullmatch(r"[+-]?\d+", e)]
        if bad:
            raise ConfigError(
                f"entities {', '.join(bad)} are not valid {pipeline.entity_column} values of pipeline {pipeline.name} "
                "(whole numbers)"
            )
    return entities


def _column_type(pipeline: Pipeline, column: str) -> DataType | None:
    """The type of a silver column that is a plain path into the payload (``p.venue.venue_id``), else None."""
    expression = pipeline.columns.get(column, "")
    if not re.fullmatch(r"p(\.\w+)+", expression):
        return None
    current: DataType = pipeline.payload_schema
    for name in expression.split(".")[1:]:
        if not isinstance(current, StructType) or name not in current.fieldNames():
            return None
        current = current[name].dataType
    return current


# ---- what the source holds -----------------------------------------------------------------------


def check_range_held(settings: Settings, request: ReplayRequest, *, client: PartitionClient | None = None) -> str:
    """One line describing what the source holds, or one ConfigError line when it cannot hold the range.

    An event at time t reached Kafka no earlier than ``t - clock skew`` (silver refuses events
    further ahead of their Kafka timestamp), so the range needs records from ``start - skew`` on.
    """
    pipeline = registry.get_pipeline(request.pipeline)
    skew = clock_skew(pipeline)
    if request.source == "bronze":
        return _bronze_holds(PipelineLayout.of(settings, pipeline), request, skew)
    own = client is None
    kafka = client or KafkaPythonClient(settings.kafka_client_config(), stall_timeout_s=15)
    try:
        return _kafka_holds(kafka, settings.topic(pipeline.topic), request, skew)
    finally:
        if own:
            kafka.close()


def _range(request: ReplayRequest) -> str:
    return f"[{iso(request.start)}, {iso(request.end)})"


def _bronze_holds(layout: PipelineLayout, request: ReplayRequest, skew: dt.timedelta) -> str:
    """From the add actions' statistics (min/max of kafka_timestamp per file): no data file is read."""
    table = layout.table("bronze")
    where = f"{layout.namespace}/{layout.pipeline.name}"
    if not table.exists():
        raise ConfigError(
            f"there is no bronze table for {where} ({table.uri}): nothing to replay from; "
            "run the stream first, or replay from source=kafka"
        )
    actions = pa.table(table.open().get_add_actions(flatten=True))
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
