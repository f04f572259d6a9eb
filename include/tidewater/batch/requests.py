"""A replay request, checked by one pure function on both sides of the spark-submit boundary.

A replay recomputes an event-time range ``[start, end)`` of a pipeline from bronze (the default:
every Kafka record is kept there) or from Kafka, into a sandbox namespace or into the live tables.
The Airflow task checks the trigger form's params (:mod:`tidewater.orchestration.params`) before any
Spark job starts, and the job checks its command line (:mod:`tidewater.batch.cli`) and library call
(:func:`tidewater.batch.recompute.replay`) again. All of them build the request with
:meth:`ReplayRequest.parse`, so what the validate task accepts the job accepts too, and a rule added
here holds on both sides: there is no second copy to forget.

Pure: no JVM, no broker, no lake. Whether the source still holds the range is another check (it
reads the source: :func:`tidewater.orchestration.params.check_range_held`). Each refusal is one
:class:`ConfigError` line naming the field the way the person wrote it (a form param or an option,
see :class:`Spelling`) and saying what to do.

Times are ISO-8601; a time without an offset is UTC (event times are UTC end to end).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import ByteType, DataType, IntegerType, LongType, ShortType, StructType

from tidewater.batch.interval import Interval
from tidewater.config import Settings, check_namespace
from tidewater.errors import ConfigError
from tidewater.pipelines.base import Pipeline
from tidewater.times import iso, parse_duration, parse_time

BRONZE, KAFKA = "bronze", "kafka"
SOURCES = (BRONZE, KAFKA)
SANDBOX, LIVE = "sandbox", "live"
TARGETS = (SANDBOX, LIVE)
DEFAULT_CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Spelling:
    """How a request's fields are named to the person who wrote them, so a refusal points at what
    they typed: the trigger form's params (``sandbox_namespace``, ``target=live``) or the batch
    command's options (``--sandbox-namespace``, ``--target live``)."""

    names: Mapping[str, str] = field(default_factory=dict)
    options: bool = False

    def __call__(self, name: str) -> str:
        return self.names.get(name, name)

    def assign(self, name: str, value: str) -> str:
        return f"{self(name)} {value}" if self.options else f"{self(name)}={value}"

    def omit(self, name: str) -> str:
        return f"leave out {self(name)}" if self.options else f"leave {self(name)} empty"


PARAMS = Spelling()
OPTIONS = Spelling(
    {
        "start": "--start",
        "end": "--end",
        "source": "--source",
        "target": "--target",
        "sandbox_namespace": "--sandbox-namespace",
        "entities": "--entity",
    },
    options=True,
)


@dataclass(frozen=True)
class ReplayRequest:
    """A validated replay (build it with :meth:`parse`); the batch job receives it as :meth:`to_args`."""

    pipeline: str
    start: dt.datetime  # aware UTC, inclusive
    end: dt.datetime  # aware UTC, exclusive
    source: str  # "bronze" | "kafka"
    target: str  # "sandbox" | "live"
    sandbox_namespace: str  # "" when target is "live"
    entities: tuple[str, ...] = ()  # values of the pipeline's entity column; empty: all

    @classmethod
    def parse(
        cls,
        settings: Settings,
        pipeline: Pipeline,
        *,
        start: Any,
        end: Any,
        source: Any = None,
        target: Any = None,
        sandbox_namespace: Any = None,
        entities: Any = None,
        namespace: str | None = None,
        now: dt.datetime | None = None,
        spelling: Spelling = PARAMS,
    ) -> ReplayRequest:
        """The request, or one ConfigError line saying what to fix. ``namespace`` is the one replayed
        from (default: the settings' one): a sandbox may be neither it nor the live one. An empty
        ``source``/``target`` takes the default (bronze into a sandbox)."""
        begin, finish = parse_interval(start, end, clock_skew=clock_skew(pipeline), now=now, spelling=spelling)
        chosen_source = _choice(source, "source", SOURCES, BRONZE, spelling)
        chosen_target = _choice(target, "target", TARGETS, SANDBOX, spelling)
        live = namespace or settings.namespace
        if chosen_target == SANDBOX:
            sandbox = _sandbox_namespace(sandbox_namespace, (settings.namespace, live), spelling)
        elif sandbox_namespace:
            raise ConfigError(f"{spelling('sandbox_namespace')} needs {spelling.assign('target', SANDBOX)}")
        else:
            sandbox = ""
        chosen = _entities(entities, pipeline, spelling)
        return cls(pipeline.name, begin, finish, chosen_source, chosen_target, sandbox, chosen)

    @property
    def interval(self) -> Interval:
        return Interval(self.start, self.end)

    def written_namespace(self, namespace: str) -> str:
        """Where the replay writes, given the namespace it reads (the live one unless a sandbox)."""
        return self.sandbox_namespace if self.target == SANDBOX else namespace

    def to_args(self) -> list[str]:
        """Command-line arguments of the batch job's ``replay`` command (parsed back with :data:`OPTIONS`)."""
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
        if self.target == SANDBOX:
            args += ["--sandbox-namespace", self.sandbox_namespace]
        for entity in self.entities:
            args += ["--entity", entity]
        return args


def parse_interval(
    start: Any,
    end: Any,
    *,
    clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
    now: dt.datetime | None = None,
    spelling: Spelling = PARAMS,
) -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` as aware UTC datetimes: both given, ISO-8601 (naive = UTC), end after start, and
    not starting after ``now + clock_skew`` (event times cannot be later than that: nothing holds it)."""
    begin, finish = _time(start, spelling("start")), _time(end, spelling("end"))
    if finish <= begin:
        first, last = spelling("start"), spelling("end")
        raise ConfigError(
            f"{last} {iso(finish)} is not after {first} {iso(begin)}: the range is [start, end), give {last} > {first}"
        )
    current = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    if begin > current + clock_skew:
        raise ConfigError(
            f"the range [{iso(begin)}, {iso(finish)}) starts in the future (now is {iso(current)}, clock skew "
            f"tolerance {_span(clock_skew)}): nothing can hold it yet; give a start in the past"
        )
    return begin, finish


def clock_skew(pipeline: Pipeline) -> dt.timedelta:
    """How far an event time may run ahead of its Kafka timestamp (and of the clock) for ``pipeline``
    (the most any of its sources tolerates)."""
    return max(parse_duration(s.clock_skew_tolerance) for s in pipeline.sources)


def _time(value: Any, what: str) -> dt.datetime:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{what} is required: give an ISO-8601 time, e.g. 2026-11-21T10:00:00Z")
    if not isinstance(value, str | dt.datetime):
        raise ConfigError(f"{what} {value!r} is not an ISO-8601 time (e.g. 2026-11-21T10:00:00Z)")
    return parse_time(value, what)


def _span(delta: dt.timedelta) -> str:
    return f"{delta.total_seconds() / 60:g} minutes"


def _choice(value: Any, name: str, allowed: Sequence[str], default: str, spelling: Spelling) -> str:
    if value is None or value == "":
        return default
    if value not in allowed:
        raise ConfigError(f"{spelling(name)} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _sandbox_namespace(value: Any, live: tuple[str, ...], spelling: Spelling) -> str:
    """A sandbox must be named, well formed, and neither the live namespace nor the one replayed from:
    a sandbox replay that wrote there would overwrite the tables people query."""
    what = spelling("sandbox_namespace")
    name = value.strip() if isinstance(value, str) else ""
    if not name:
        raise ConfigError(
            f"a sandbox replay needs {what} (e.g. replay_2026_11_21), a namespace other than the "
            f"live one ({live[0]!r}); or set {spelling.assign('target', LIVE)}"
        )
    check_namespace(name, what)
    if name in live:
        raise ConfigError(
            f"{what} {name!r} is the live namespace: choose another for a sandbox, or set "
            f"{spelling.assign('target', LIVE)} to replay into the live tables"
        )
    return name


def _entities(value: Any, pipeline: Pipeline, spelling: Spelling) -> tuple[str, ...]:
    """Entity values as unique, stripped strings (a list, or a comma-separated string from a form);
    refused for a pipeline whose replay cannot be restricted to them."""
    what = spelling("entities")
    if value is None or value == "":
        raw: list[Any] = []
    elif isinstance(value, str):
        raw = value.split(",")
    elif isinstance(value, Sequence):
        raw = list(value)
    else:
        raise ConfigError(f"{what} {value!r} must be a list of values (or a comma-separated string)")
    entities = tuple(dict.fromkeys(str(v).strip() for v in raw if str(v).strip()))
    if not entities:
        return ()
    column = pipeline.entity_column
    if column is None:
        raise ConfigError(
            f"pipeline {pipeline.name} has no entity column, so a replay cannot be restricted to entities "
            f"{', '.join(entities)}: {spelling.omit('entities')} to replay every entity"
        )
    for gold in pipeline.gold:
        if column not in gold.keys:  # its rows sum over entities: one entity's replay cannot replace them
            raise ConfigError(
                f"gold table {gold.name} of pipeline {pipeline.name} is not kept per {column}, so a replay "
                f"cannot be restricted to entities: {spelling.omit('entities')} to replay every entity"
            )
    if isinstance(_column_type(pipeline, column), ByteType | ShortType | IntegerType | LongType):
        bad = [e for e in entities if not re.fullmatch(r"[+-]?\d+", e)]
        if bad:
            raise ConfigError(
                f"{what} {', '.join(bad)} are not valid {column} values of pipeline {pipeline.name} (whole numbers)"
            )
    return entities


def _column_type(pipeline: Pipeline, column: str) -> DataType | None:
    """The type of a silver column that is a plain path into the payload (``p.venue.venue_id``) of the
    first source that has it, else None."""
    source = next((s for s in pipeline.sources if column in s.columns), pipeline.sources[0])
    expression = source.columns.get(column, "")
    if not re.fullmatch(r"p(\.\w+)+", expression):
        return None
    current: DataType = source.payload_schema
    for name in expression.split(".")[1:]:
        if not isinstance(current, StructType) or name not in current.fieldNames():
            return None
        current = current[name].dataType
    return current
