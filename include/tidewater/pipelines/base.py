"""What a pipeline declares, and the pure transforms derived from the declaration.

A pipeline is one module (or package) exposing ``PIPELINE = Pipeline(...)``: its sources (each a
Kafka topic with its payload schema, how payload fields become silver columns, the validation rules,
the business key, the event-time column and its watermark) and the gold tables derived from their
silver (each of a kind below, naming the sources it reads). Everything else (tables, streams, batch
recomputes, replays, corrections, audits, checkpoints, DAGs) is derived from it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tidewater import transforms
from tidewater.connectors.kafka_client import SPARK_RECORD_DDL
from tidewater.dedup import CONFLICT_SCHEMA
from tidewater.errors import ConfigError, PipelineError
from tidewater.pipelines.contract import Constraint, NotAfterArrival, Quality
from tidewater.pipelines.samples import SampleEvents
from tidewater.times import parse_duration

# silver of each input source, in the order the table declares them -> gold rows
GoldBuilder = Callable[..., DataFrame]

# A gold row is "provisional" while its window may still change in the stream, and "final" once the
# window is behind the stream's watermark and has been reconciled with silver (late-data correction).
PROVISIONAL = "provisional"
FINAL = "final"
STATUS_COLUMNS = ("status", "revision")  # revision: how many corrections changed the row (see the ledger)
WINDOW_SPAN = ("window_start", "window_end")  # the event-time span of an aggregate's row
# The longest trigger a source or a gold table may declare: an idle query reports progress only when it
# triggers, and the supervisor takes a query silent for TIDEWATER_STREAM_STALL_SECONDS (300 s by default)
# as stalled.
MAX_TRIGGER_SECONDS = 60.0


def trigger_seconds_of(interval: str | None) -> float | None:
    """A declared ``trigger_interval`` ("5 seconds") in seconds; None: the job's trigger."""
    return None if interval is None else parse_duration(interval).total_seconds()


class Delivery(StrEnum):
    """The promise a pipeline makes about each Kafka record, and what keeps it (declared as
    ``Pipeline(delivery=...)``; the reconciliation audit checks the promise and reports the other figure).

    Every mode keeps the idempotent Delta commits (a re-run micro-batch is a no-op per table: they cost
    one lookup per commit). What differs is where the record may be repeated or dropped:

    * ``exactly_once`` (the default): the stream re-runs an unfinished micro-batch from its checkpoint's
      offsets after a crash (nothing lost), the commits make the re-run a no-op (nothing written twice),
      and silver keeps one row per business key (a producer's re-send is dropped and counted). Audit:
      no loss and no duplicate.
    * ``at_least_once``: as above, but silver keeps every copy: no key lookup on the hot path, so a
      re-sent record is a second row (counted by the audit, and counted twice by aggregates). Audit:
      no loss; duplicates reported.
    * ``at_most_once``: a restarted stream resumes at the topics' latest offsets instead of its
      checkpoint's (the Kafka source's ``resumeFrom=latest``): the micro-batch that was running and
      whatever arrived while the job was down are skipped, never processed twice. Silver still keeps one
      row per key. Audit: no duplicate; losses reported (offsets bronze never received, and records of
      an interrupted batch that reached bronze but not silver).
    """

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"

    @property
    def may_lose(self) -> bool:
        return self is Delivery.AT_MOST_ONCE

    @property
    def may_repeat(self) -> bool:
        return self is Delivery.AT_LEAST_ONCE


@dataclass(frozen=True)
class Publish:
    """A gold table's rows also written to a Kafka topic, for consumers outside the lake.

    Each micro-batch's rows go out in one Kafka transaction, with a marker on ``<topic>.batches``:
    a consumer reading committed records sees each row once, across crashes and re-runs (see
    :mod:`tidewater.connectors.kafka_publish`). Batch recomputes and corrections rewrite the Delta
    table only: what consumers were told is not retracted."""

    topic: str
    key: str  # the column whose value is the record key (consumers of one key read in order)

    @property
    def control_topic(self) -> str:
        return f"{self.topic}.batches"


@dataclass(frozen=True, kw_only=True)
class GoldTable:
    """A table derived from silver by a pure ``build`` and upserted on ``keys``: the kinds below.

    Every gold row spans event time from its :attr:`span` start (``window_start``, inclusive) to its
    end (``window_end``, exclusive) and belongs to the batch interval its start lies in, so adjacent
    intervals own each row once; a row is closed (final) once the watermark passes its end. A kind
    says what the platform cannot guess from ``build`` alone:

    * :attr:`output_mode`: how the stream emits rows (``update``: every change of an open row;
      ``append``: a row once, when the watermark closes it);
    * :meth:`feed_margins`: how much silver around an interval feeds the rows starting in it;
    * :attr:`grows_until_quiet`: a row may reach past any fixed margin (a session goes on while
      events keep coming), so a bounded recompute widens its feed until no row it owns touches the edge;
    * :attr:`rows_merge`: a late event may change which rows exist (two sessions merge into one, an
      unmatched join row becomes a match), so a correction removes the row that no longer exists,
      with a ledger entry.
    """

    name: str
    description: str
    keys: tuple[str, ...]
    build: GoldBuilder  # silver of each input -> gold rows; pure, sets its own watermarks
    # The sources whose silver feeds ``build``, in order; empty: the pipeline's only source.
    inputs: tuple[str, ...] = ()
    # Inputs a bounded recompute reads whole, from their first event to their last, whatever the
    # interval: changelogs (a machine's location) whose latest change before any horizon still holds.
    history: tuple[str, ...] = ()
    publish: Publish | None = None  # also write the stream's rows to a Kafka topic
    # How often its streaming query runs a micro-batch ("2 seconds"); None: the gold trigger
    # (TIDEWATER_GOLD_TRIGGER_SECONDS). A row is visible in gold up to this much after its silver, plus
    # a micro-batch; a table its users wait on (an alert) may trigger sooner than the rest, paying a
    # micro-batch's fixed cost more often. A query shared by several tables runs on the shortest.
    trigger_interval: str | None = None

    output_mode: ClassVar[str] = "update"
    grows_until_quiet: ClassVar[bool] = False
    rows_merge: ClassVar[bool] = False
    # The stream publishes a row only once the watermark has passed its end, and a batch may compute
    # rows the watermark has not closed yet that events to come would change or cancel: a batch keeps
    # only the closed ones (see :func:`tidewater.batch.windows.interval_gold`).
    closed_rows_only: ClassVar[bool] = False

    def rows(self, *silvers: DataFrame, status: str = PROVISIONAL) -> DataFrame:
        """Gold rows as published: the aggregate, whether it may still change, and its revision."""
        return self.build(*silvers).withColumns({"status": F.lit(status), "revision": F.lit(0).cast("int")})

    @property
    def span(self) -> tuple[str, str]:
        """The columns holding each row's event-time start and end."""
        return WINDOW_SPAN

    @property
    def range_keys(self) -> tuple[str, ...]:
        """Keys whose range in a batch of rows bounds the stored rows they can match: the span start,
        when it is a key (a row matches only a stored row of its own start). A stream's MERGE then reads
        the files of the starts its micro-batch touches, not the whole table (see
        :meth:`tidewater.lake.tables.LakeTable.merge`)."""
        start = self.span[0]
        return (start,) if start in self.keys else ()

    @property
    def trigger_seconds(self) -> float | None:
        """The declared :attr:`trigger_interval` in seconds (None: the gold trigger)."""
        return trigger_seconds_of(self.trigger_interval)

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        """(before, after): rows starting in ``[start, end)`` are fed by silver of
        ``[start - before, end + after)`` (widened further while :attr:`grows_until_quiet` rows reach
        its end)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class WindowAggregate(GoldTable):
    """Fixed event-time windows: tumbling, or hopping (see :func:`tidewater.transforms.windowed_counts`).

    ``window`` is the window length: the window ``[s, s + length)`` with ``s`` in ``[start, end)`` is
    fed by events of ``[start, end + length)``; the feed read is one window wider on the left too,
    which costs little and keeps the rule easy to check.
    """

    window: str  # e.g. "5 minutes"

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        length = parse_duration(self.window)
        return length, length


@dataclass(frozen=True, kw_only=True)
class SessionAggregate(GoldTable):
    """Session windows per key: a session ends after ``gap`` without events (see
    :func:`tidewater.transforms.session_aggregates`); ``window_end`` is the last event + ``gap``.

    Spark emits a streaming session once, when the watermark passes its end (append mode: a session's
    bounds change as it grows, so "update" has no key to upsert on). A bounded recompute of sessions
    starting in ``[start, end)`` reads from ``start - gap``: a session computed from that read that
    starts at ``s >= start`` had no event in ``[s - gap, s)``, so it truly starts at ``s``; on the
    right, the read is widened until no session it owns ends past the read's end. A late event that
    falls between two sessions of a key bridges them: the correction replaces both with one.
    """

    gap: str  # e.g. "30 minutes"

    output_mode: ClassVar[str] = "append"
    grows_until_quiet: ClassVar[bool] = True
    rows_merge: ClassVar[bool] = True

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        gap = parse_duration(self.gap)
        return gap, gap


@dataclass(frozen=True, kw_only=True)
class StreamJoin(GoldTable):
    """A time-bounded stream-stream join: each left event with the right events of the same key that
    happen from ``lookback`` before it to ``bound`` after it (inner), and for a left outer join each
    left event no right event matched, emitted once the watermark passes ``left time + bound``.

    ``build`` watermarks both sides and joins them with that time condition (see
    :func:`tidewater.transforms.bounded_join`); its rows span ``window_start`` = the left event's time to
    ``window_end`` = left time + ``bound`` (after which no match can come). Spark emits join rows in
    append mode. A batch interval owns the rows whose left event lies in it and reads ``lookback``
    before it and ``bound`` after it. A late right event can turn an unmatched row into a matched one: the correction
    writes the match and removes the unmatched row (its key no longer exists), with ledger entries.
    """

    bound: str  # e.g. "30 minutes"
    lookback: str = "0 seconds"  # how long before the left event a right event still matches

    output_mode: ClassVar[str] = "append"
    rows_merge: ClassVar[bool] = True

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        return parse_duration(self.lookback), parse_duration(self.bound)


@dataclass(frozen=True, kw_only=True)
class Projection(GoldTable):
    """One row per silver event (some of its columns, a filter, a per-event derivation): no state.

    The stream appends each event's row as it arrives (nothing waits for a watermark, so nothing is
    late; only events held back as ahead of the clock reach it through the correction); a row spans
    the instant of its ``time_column`` and is final once the watermark passes it. A recompute reads
    exactly the interval. ``keys`` must identify the event (its silver key).
    """

    time_column: str  # the event-time column the rows carry (silver's event time)

    output_mode: ClassVar[str] = "append"

    @property
    def span(self) -> tuple[str, str]:
        return self.time_column, self.time_column

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        return dt.timedelta(0), dt.timedelta(0)


@dataclass(frozen=True, kw_only=True)
class KeyedStateMachine(GoldTable):
    """What a per-key state machine outputs (fraud alerts per card, a machine gone silent): ``build``
    runs :func:`tidewater.keyed_state.keyed_state_machine`, which folds one pure ``step`` over each
    key's events in event-time order, on the stream (``transformWithState`` over Rows, RocksDB state,
    event-time timers) and on a batch (``mapInArrow``, the events clustered by key) alike.

    A row spans the instant of its ``time_column`` (the event that produced it), or up to its
    ``end_column``, and is final once the watermark passes its end. The machine looks back at most
    ``horizon`` (besides its ``history`` inputs, read whole) and a row is decided by events up to
    ``lookahead`` after its time, so a batch interval owns the rows whose time lies in it and reads
    ``horizon`` before and ``lookahead`` after it. Spark emits them in append mode (the stream
    folds an event once the watermark has passed it). A late event can change what later events
    output (a burst now crosses the velocity limit one payment earlier): the correction writes the
    rows that now exist and removes those that no longer do, with ledger entries.
    """

    time_column: str
    horizon: str  # e.g. "24 hours": nothing older than this before an event changes its output
    # How far past a row's time the events that decide it reach (a machine silent from t is known to be
    # at t + timeout; an hour's sales at its end), plus the watermark: the read must pass the deadline.
    lookahead: str = "0 seconds"
    # A row that covers a span (an hour's sales, a silence) ends at this column: it is final once the
    # watermark passes its end. None: the row is the instant of ``time_column``.
    end_column: str | None = None

    output_mode: ClassVar[str] = "append"
    rows_merge: ClassVar[bool] = True
    closed_rows_only: ClassVar[bool] = True  # a silence to come may yet be broken by a reading

    @property
    def span(self) -> tuple[str, str]:
        return self.time_column, self.end_column or self.time_column

    def feed_margins(self) -> tuple[dt.timedelta, dt.timedelta]:
        return parse_duration(self.horizon), parse_duration(self.lookahead)


@dataclass(frozen=True)
class GoldQuery:
    """One streaming query of a pipeline's gold tier, and the gold tables it writes.

    Each query reads the silver of each of its inputs once, whatever number of tables it feeds: a
    source is one read planner (a Python process on the driver) and one offset log per query. The
    tables of a shared query are computed side by side from those reads, tagged, and split again
    where the micro-batch is written (:func:`tidewater.transforms.tagged_union`).
    """

    name: str  # "gold_<table>", or "gold_<table>__<table>..." for a shared one: its checkpoint's name
    tables: tuple[GoldTable, ...]
    inputs: tuple[Source, ...]  # each table's inputs, each once, in the order the tables declare them
    table_inputs: tuple[tuple[str, ...], ...]  # the source names each table's build takes, in its order

    @property
    def shared(self) -> bool:
        return len(self.tables) > 1

    @property
    def trigger_seconds(self) -> float | None:
        """The shortest trigger its tables declare (None: none declares one; the gold trigger)."""
        declared = [seconds for table in self.tables if (seconds := table.trigger_seconds) is not None]
        return min(declared, default=None)

    def rows(self, silvers: Mapping[str, DataFrame]) -> DataFrame:
        """The query's output from the silver of each input (by source name): one table's gold rows,
        or, for a shared query, every table's rows in one column of its own, tagged with its name."""
        frames = {
            table.name: table.rows(*(silvers[name] for name in names))
            for table, names in zip(self.tables, self.table_inputs, strict=True)
        }
        if not self.shared:
            return frames[self.tables[0].name]
        return transforms.tagged_union(frames)


@dataclass(frozen=True, kw_only=True)
class Source:
    """One Kafka topic of a pipeline and its payload contract: it gets its own bronze (the records as
    they arrived), silver (parsed, validated, one row per :attr:`key`), quarantine and conflicts.

    A pipeline with one source names those tables ``bronze``, ``silver``, ...; with several, each
    source's are under its name (``impressions/bronze``, ``clicks/silver``): see :meth:`Pipeline.table_of`.
    """

    name: str
    topic: str
    payload_schema: StructType
    # silver column name -> SQL expression over the parsed payload struct ``p``
    columns: Mapping[str, str]
    # The data contract: quarantine rules and audit expectations both derive from it (see contract.py).
    constraints: tuple[Constraint, ...] = ()
    rules: tuple[transforms.Rule, ...] = ()  # free-form extra quarantine rules (SQL), after the constraints'
    key: str = "event_id"
    event_time: str = "event_time"
    watermark: str = "2 minutes"
    partition_column: str = "event_date"
    # how far event time may run ahead of the clock before it counts as "in the future" (quarantined)
    clock_skew_tolerance: str = "5 minutes"
    # How far ahead of the platform's clock (ingest time) an event may be and still feed the streaming
    # gold queries. Spark's watermark is the latest event time seen minus the delay, so one event
    # ahead by more than this would make on-time events late; such events stay in silver and reach
    # gold through the batch recompute and the late-data correction (counted as held back).
    max_event_lead: str = "10 seconds"
    # Payloads are held to the strict JSON contract (tidewater.strict_json) unless this is False:
    # then Spark's lenient reader decides (numbers as strings, trailing data ignored, last duplicate
    # key wins, invalid UTF-8 replaced).
    strict_json: bool = True
    # (producer column, sequence column) when each producer numbers its records 0, 1, 2, ...: the
    # reconciliation audit then reports the gaps (records lost upstream of Kafka). None: no such check.
    sequence: tuple[str, str] | None = None
    quality: Quality = field(default_factory=Quality)
    # How often this source's stream runs a micro-batch ("5 seconds"); None: the job's trigger
    # (TIDEWATER_TRIGGER_SECONDS). A micro-batch pays a fixed cost whatever it holds (a Spark job, a
    # Kafka read, two Delta commits): a changelog of a few records a second pays it every second for
    # little, on the cores its pipeline's busy sources need. Its silver then lags by up to this much.
    # (DLT's ``pipelines.trigger.interval``, declared per flow.)
    trigger_interval: str | None = None
    # One silver row per key (False: every valid copy). Set by the pipeline from its delivery
    # (at-least-once: False), so the stream and every batch rebuild agree; not declared per source.
    deduplicate: bool = True

    @property
    def trigger_seconds(self) -> float | None:
        """The declared :attr:`trigger_interval` in seconds (None: the job's trigger)."""
        return trigger_seconds_of(self.trigger_interval)

    @property
    def arrival_checks(self) -> list[NotAfterArrival]:
        """The contract's checks of event time against arrival: what quarantines an event from the future."""
        return [c for c in self.constraints if isinstance(c, NotAfterArrival)]

    @property
    def all_rules(self) -> tuple[transforms.Rule, ...]:
        """Quarantine rules in the order they are tried: the contract's, the free-form ones, then the
        platform's own (an event time every window, table and reader can hold)."""
        return (*(c.rule() for c in self.constraints), *self.rules, self.event_time_rule)

    @property
    def event_time_rule(self) -> transforms.Rule:
        """Years 1-9999 with a day to spare either side, so no window around the event leaves the range
        Python, Arrow conversion and Delta statistics share."""
        column = f"`{self.event_time}`"
        return transforms.Rule(
            f"{self.event_time} outside the years 0001-9999",
            f"{column} >= TIMESTAMP'0001-01-02 00:00:00' AND {column} < TIMESTAMP'9999-12-31 00:00:00'",
        )

    @property
    def compared_columns(self) -> tuple[str, ...]:
        """What makes two copies of one key the same event: every declared silver column."""
        return tuple(self.columns)

    # ---- pure transforms --------------------------------------------------------------------------

    def parse(self, bronze: DataFrame, *, carry: Sequence[str] = ()) -> DataFrame:
        """Bronze -> typed rows with lineage and ``_error`` (see :func:`transforms.parse_payload`)."""
        return transforms.parse_payload(
            bronze,
            payload_schema=self.payload_schema,
            flatten=self.columns,
            rules=self.all_rules,
            strict=self.strict_json,
            derived={self.partition_column: f"to_date({transforms.quoted(self.event_time)})"},
            carry=carry,
        )

    @property
    def silver_columns(self) -> tuple[str, ...]:
        return (*self.columns, self.partition_column, *transforms.LINEAGE_COLUMNS)

    def silver(self, parsed: DataFrame) -> DataFrame:
        """Valid rows only (duplicates still present: see :meth:`dedup`)."""
        return transforms.valid_rows(parsed, self.silver_columns)

    def quarantine(self, parsed: DataFrame) -> DataFrame:
        return transforms.quarantined_rows(parsed)

    def outcomes(self, parsed: DataFrame) -> DataFrame:
        """Every parsed row with its silver and quarantine columns: one Spark job for both tables'
        rows (divided by :meth:`split_outcomes`; see :func:`transforms.outcomes`)."""
        return transforms.outcomes(parsed, self.silver_columns)

    def outcomes_with_bronze(self, bronze: DataFrame) -> DataFrame:
        """:meth:`outcomes` of ``bronze`` parsed, each row with its bronze columns too
        (:func:`transforms.split_bronze`): a micro-batch's bronze and silver rows from one Spark job."""
        carry, keep = transforms.bronze_passthrough(bronze.columns)
        return transforms.outcomes(self.parse(bronze, carry=carry), self.silver_columns, keep=keep)

    def split_outcomes(self, rows: pa.Table) -> tuple[pa.Table, pa.Table]:
        """(quarantine rows, valid silver rows incl. copies) of :meth:`outcomes`' rows."""
        return transforms.split_outcomes(rows, self.silver_columns)

    def dedup(self, silver: DataFrame, *, kept: DataFrame | None = None) -> DataFrame:
        """One row per key; ``kept`` (lineage of the rows silver holds) keeps the stream's choices.
        A source that does not de-duplicate (at-least-once delivery) keeps every copy."""
        if not self.deduplicate:
            return silver
        return transforms.first_per_key(silver, self.key, kept=kept)

    def silver_from_bronze(self, bronze: DataFrame, *, kept: DataFrame | None = None) -> DataFrame:
        """The whole bronze -> silver step for a bounded input (batch recompute, replay)."""
        return self.dedup(self.silver(self.parse(bronze)), kept=kept)

    def schemas(self, spark: SparkSession) -> dict[str, pa.Schema]:
        """Arrow schemas of the source's tables (by tier: bronze, silver, quarantine, conflicts)."""
        kafka = spark.createDataFrame([], SPARK_RECORD_DDL)
        bronze = transforms.to_bronze(kafka)
        parsed = self.parse(bronze)
        return {
            "bronze": _arrow(bronze.schema),
            "silver": _arrow(self.silver(parsed).schema),
            "quarantine": _arrow(self.quarantine(parsed).schema),
            "conflicts": CONFLICT_SCHEMA,
        }

    def empty_silver(self, spark: SparkSession) -> DataFrame:
        """A silver frame with no rows (to derive gold schemas)."""
        kafka = spark.createDataFrame([], SPARK_RECORD_DDL)
        return self.silver(self.parse(transforms.to_bronze(kafka)))


SOURCE_TIERS = ("bronze", "silver", "quarantine", "conflicts")
# How each source table is partitioned (silver by its source's event date: see Pipeline.partitioning).
TIER_PARTITIONS = {"bronze": "ingest_date", "quarantine": "quarantine_date", "conflicts": "detected_date"}


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A pipeline: its sources, the gold tables derived from them, and what the platform needs to know
    to run, recompute, audit and feed it (see the module docstring)."""

    name: str
    description: str
    sources: tuple[Source, ...]
    gold: tuple[GoldTable, ...] = ()  # WindowAggregate, SessionAggregate, StreamJoin, Projection, KeyedStateMachine
    # The column a replay may be restricted to (e.g. one venue): every source's silver and every gold
    # table that a restricted replay rewrites carries it.
    entity_column: str | None = None
    # Folder of the committed expectation suites (<suites_dir>/<name>/*.json). Empty: the platform's
    # own (tidewater/quality/suites); a pipeline declared outside the package keeps its suites beside it.
    suites_dir: str = ""
    # What `tidewater generate --pipeline NAME` and the platform produce: events of the first source,
    # and, through ``SampleEvents.follow_ups``, the records of other sources they cause (an ad click
    # after its impression). None: the pipeline has no sample events.
    sample_events: SampleEvents | None = None
    # What the pipeline promises about each record (see Delivery): exactly_once unless declared.
    delivery: Delivery = Delivery.EXACTLY_ONCE

    def __post_init__(self) -> None:
        if not self.sources:
            raise PipelineError(f"pipeline {self.name}: declare at least one source")
        try:
            delivery = Delivery(self.delivery)
        except ValueError:
            choices = ", ".join(d.value for d in Delivery)
            raise PipelineError(f"pipeline {self.name}: delivery {self.delivery!r} is not one of {choices}") from None
        object.__setattr__(self, "delivery", delivery)
        if delivery is Delivery.AT_LEAST_ONCE:
            object.__setattr__(self, "sources", tuple(dataclasses.replace(s, deduplicate=False) for s in self.sources))
        names = [s.name for s in self.sources]
        topics = [s.topic for s in self.sources]
        if len(set(names)) < len(names) or len(set(topics)) < len(topics):
            raise PipelineError(f"pipeline {self.name}: source names and topics must be unique ({names}, {topics})")
        for source in self.sources:
            self._check_trigger(f"source {source.name}", source.trigger_interval)
        golds = [g.name for g in self.gold]
        if len(set(golds)) < len(golds):
            raise PipelineError(f"pipeline {self.name}: gold table names must be unique ({golds})")
        for table in self.gold:
            self._check_trigger(f"gold {table.name}", table.trigger_interval)
            unknown = [i for i in table.inputs if i not in names]
            if unknown:
                raise PipelineError(
                    f"pipeline {self.name}: gold {table.name} reads unknown source(s) {unknown}; sources: {names}"
                )
            outside = [h for h in table.history if h not in (table.inputs or names)]
            if outside:
                raise PipelineError(
                    f"pipeline {self.name}: gold {table.name} history {outside} must be among its inputs"
                )
            if not table.inputs and len(self.sources) > 1:
                raise PipelineError(
                    f"pipeline {self.name}: gold {table.name} must name its inputs (the pipeline has several sources)"
                )

    def _check_trigger(self, what: str, interval: str | None) -> None:
        """A declared trigger interval parses and lies in (0, MAX_TRIGGER_SECONDS], or one line says why."""
        try:
            seconds = trigger_seconds_of(interval)
        except ConfigError as exc:
            raise PipelineError(f"pipeline {self.name}: {what} trigger_interval: {exc}") from None
        if seconds is not None and not 0 < seconds <= MAX_TRIGGER_SECONDS:
            raise PipelineError(
                f"pipeline {self.name}: {what} trigger_interval {interval!r} "
                f"must be above 0 and at most {MAX_TRIGGER_SECONDS:.0f} seconds"
            )

    # ---- the graph ---------------------------------------------------------------------------------

    def source(self, name: str | None = None) -> Source:
        """The source called ``name``; without a name, the pipeline's only source."""
        if name is None:
            if len(self.sources) != 1:
                raise PipelineError(f"pipeline {self.name} has {len(self.sources)} sources: name one")
            return self.sources[0]
        for source in self.sources:
            if source.name == name:
                return source
        raise PipelineError(f"pipeline {self.name} has no source {name!r}; sources: {[s.name for s in self.sources]}")

    def table_of(self, source: Source, tier: str) -> str:
        """A source table's name in the layout: ``silver`` (one source) or ``clicks/silver`` (several)."""
        return tier if len(self.sources) == 1 else f"{source.name}/{tier}"

    def query_of(self, source: Source, tier: str) -> str:
        """A source query's name: ``bronze`` (one source) or ``bronze_clicks`` (several)."""
        return tier if len(self.sources) == 1 else f"{tier}_{source.name}"

    def inputs(self, gold: GoldTable) -> tuple[Source, ...]:
        """The sources whose silver feeds ``gold``, in the order its ``build`` takes them."""
        return tuple(self.source(name) for name in gold.inputs) if gold.inputs else self.sources

    def gold_queries(self, *, shared: bool = True) -> tuple[GoldQuery, ...]:
        """The streaming queries of the gold tier, in the order of the first table of each.

        ``shared``: gold tables emitted in append mode over the same inputs share one query. Their
        builds watermark an input with its source's delay (``Source.watermark``), and Spark's watermark
        of a query is the minimum over its inputs, so such tables close their rows when they would
        alone; a table over other inputs would not (one over a quiet changelog would hold back those
        over the readings). Tables in update mode keep a query each (Spark refuses two aggregations in
        one update-mode query), and so does a published table (the query's app id is its Kafka
        transactional id). Adding a table to a shared query changes the query's name, so it starts
        from a new checkpoint (its state rebuilt from silver; the tables' MERGEs keep re-emitted rows once).
        """
        groups: dict[tuple[str, frozenset[str]], list[GoldTable]] = {}
        for gold in self.gold:
            inputs = frozenset(s.name for s in self.inputs(gold))
            joins = shared and gold.output_mode == "append" and gold.publish is None
            key = ("append", inputs) if joins else (gold.name, frozenset())
            groups.setdefault(key, []).append(gold)
        queries = []
        for tables in groups.values():
            names = dict.fromkeys(source.name for table in tables for source in self.inputs(table))
            name = "gold_" + "__".join(table.name for table in tables)
            table_inputs = tuple(tuple(s.name for s in self.inputs(table)) for table in tables)
            queries.append(GoldQuery(name, tuple(tables), tuple(self.source(n) for n in names), table_inputs))
        return tuple(queries)

    def gold_query_of(self, gold: str, *, shared: bool = True) -> GoldQuery:
        """The query that writes the gold table ``gold``."""
        for query in self.gold_queries(shared=shared):
            if any(table.name == gold for table in query.tables):
                return query
        raise KeyError(f"pipeline {self.name} has no gold table {gold!r}")

    def source_tables(self) -> list[tuple[Source, str, str]]:
        """(source, tier, table name) of every source table."""
        return [(s, tier, self.table_of(s, tier)) for s in self.sources for tier in SOURCE_TIERS]

    def table_source(self, table: str) -> tuple[Source, str] | None:
        """(source, tier) of a source table's name, None for a gold table."""
        for source, tier, name in self.source_tables():
            if name == table:
                return source, tier
        return None

    def partitioning(self, table: str) -> tuple[str, ...]:
        """How a table is partitioned: source tables by date (silver by its event date), gold not at all."""
        found = self.table_source(table)
        if found is None:
            return ()
        source, tier = found
        return (source.partition_column,) if tier == "silver" else (TIER_PARTITIONS[tier],)

    def gold_table(self, name: str) -> GoldTable:
        for table in self.gold:
            if table.name == name:
                return table
        raise KeyError(f"pipeline {self.name} has no gold table {name!r}")

    # ---- schemas, derived by running the transforms on empty input --------------------------------

    def schemas(self, spark: SparkSession) -> dict[str, pa.Schema]:
        """Arrow schemas of every table: each source's bronze, silver, quarantine and conflicts, and each
        gold table."""
        out: dict[str, pa.Schema] = {}
        silvers = {}
        for source in self.sources:
            for tier, schema in source.schemas(spark).items():
                out[self.table_of(source, tier)] = schema
            silvers[source.name] = source.empty_silver(spark)
        for table in self.gold:
            frames = [silvers[s.name] for s in self.inputs(table)]
            out[f"gold/{table.name}"] = _arrow(table.rows(*frames).schema)
        return out


def _arrow(schema: StructType) -> pa.Schema:
    """Spark schema -> Arrow, every field nullable (Delta columns are; Spark's flags vary by plan)."""
    arrow = to_arrow_schema(schema, timezone="UTC")
    return pa.schema([f.with_nullable(True) for f in arrow])
