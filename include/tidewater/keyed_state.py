"""Per-key state machines: one pure ``step`` function, run by the stream and by the batch alike.

A machine is declared as :class:`KeyedMachine`: ``step(state, event) -> (state, outputs)``, pure
Python over plain values (the state is anything JSON can hold; times are epoch milliseconds). The
platform folds it over each key's events **in event-time order** (ties broken by an id column):

* on a stream, :func:`keyed_state_machine` runs ``transformWithState`` (Rows, event-time mode,
  RocksDB state store: see :mod:`tidewater.spark`) grouped not by key but by one of
  :data:`BUCKETS` hash buckets of keys: PySpark pays ~0.6 ms of protocol per group and per timer,
  which made a key the unit of cost (a payments batch has a card per payment). In a bucket, each key's
  machine state is an entry of a map state; incoming events are buffered in time slots of
  :data:`SLOT_MS` (a map state, so a fold reads only the slots the watermark has reached, not every
  buffered event) and one event-time timer is kept just after the earliest of them; when the
  watermark passes it (the timer fires) each key's events it passed are folded in order, the key's
  machine state is saved and its outputs are emitted (append mode). The watermark delay is the
  price of determinism: an event is never folded before every event that precedes it could have
  arrived;
* on a batch (a recompute, a replay, a correction), the same fold runs in ``mapInArrow`` over each
  key's events (clustered by key, one Python call per partition) sorted the same way, from no state.

A machine may also act on **silence**: its ``deadline(state)`` names an event time (a machine gone
quiet, an hour to close) and ``on_deadline(state, at)`` runs once event time passes it with no earlier
event left to fold. The stream buffers a marker at that time beside the events; the fold fires a
deadline before any event at or after it, and, at the end of what it folds, every deadline the
watermark has passed. A batch fires them all: the rows a deadline emits after the watermark are not
kept (see :attr:`tidewater.pipelines.base.KeyedStateMachine.closed_rows_only`).

A key whose state becomes ``None`` is **forgotten**: the stream removes its entry. That is how a
machine bounds its state: a deadline at which nothing it keeps can matter any more (a card's last
payment plus the rules' horizon) whose ``on_deadline`` returns ``None``. Such deadlines lie far
ahead (a day), and a marker per key a day ahead would spread the buffer over a day of slots, so a
deadline more than :data:`SWEEP_MS` past the watermark may get no marker: each bucket instead keeps
a timer every :data:`SWEEP_MS` of event time while it holds one (each bucket at its own phase), and
then reads its keys' states (one pass, in batches), fires what is due and buffers markers for what
falls due before its next pass. Deadlines still fire in the same order, and in the same micro-batch,
as with markers alone.

So both give the same outputs for the same events. An event that arrives after the watermark passed
it (late) cannot be folded in order any more: Spark drops it before the processor sees it (and the
processor drops one older than what it already folded); it stays in silver, and the batch recompute
and the late-data correction fold it where it belongs. A machine whose rules look back at most a
fixed ``horizon`` (its state keeps nothing older) gives the same outputs from any read that starts
``horizon`` before them, which is what lets a batch rebuild an interval without all of history.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from tidewater.errors import one_line

log = logging.getLogger(__name__)

Event = dict[str, Any]
Output = dict[str, Any]
Step = Callable[[Any, Event], tuple[Any, list[Output]]]

# Keys hash into this many state groups (fixed for a checkpoint's life: a key's state lives in its bucket).
BUCKETS = 64
BUCKET_COLUMN = "_tw_key_bucket"
# Buffered events are kept in slots of this much event time: a fold reads the slots the watermark reached.
SLOT_MS = 1_000
# A deadline up to this past the watermark gets a marker; a later one may be left to a pass over the states.
SWEEP_MS = 60 * 60 * 1000

_MACHINE_KEY = StructType([StructField("key", StringType())])  # the machine's key, as JSON
_STATE = StructType([StructField("json", StringType())])
_SLOT_KEY = StructType([StructField("slot", LongType())])
# A slot's entries: JSON [[at_ms, order, key JSON, event or null (a deadline marker)], ...]
_ENTRIES = StructType([StructField("json", StringType())])
_SLOTS = StructType([StructField("json", StringType())])  # the bucket's slots holding entries, JSON
_FOLDED = StructType([StructField("before_ms", LongType())])
_TIMER = StructType([StructField("at_ms", LongType())])
_SWEEP = StructType([StructField("at_ms", LongType())])  # the watermark the bucket's next pass waits for
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class KeyedMachine:
    """A per-key state machine: which event columns it reads, its pure ``step``, what it outputs."""

    step: Step
    event_columns: tuple[str, ...]  # silver columns an event carries into ``step``
    time_column: str  # the event time (given to ``step`` as epoch ms, as is every timestamp column)
    order_column: str  # breaks ties between events of one key at the same time (an event id)
    output_schema: StructType  # the outputs' columns; timestamp columns come back from ``step`` as epoch ms
    # When the state wants to act without an event (epoch ms; None: it does not), and what it then does.
    deadline: Callable[[Any], int | None] | None = None
    on_deadline: Callable[[Any, int], tuple[Any, list[Output]]] | None = None
    # Output columns identifying a row: a later output of one fold with the same values replaces an
    # earlier one (a version opened, then closed, in one micro-batch). Empty: every output is a row.
    output_key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.deadline is None) != (self.on_deadline is None):
            raise ValueError("a KeyedMachine declares deadline and on_deadline together, or neither")


# A batch fires every deadline: it cannot know the watermark, so the platform keeps only the rows the
# watermark has closed (a silence not yet confirmed by time is the stream's to emit, or not).
_END_OF_TIME_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z

# One fold fires at most this many deadlines per key: a machine whose deadline never moves on is a bug.
MAX_DEADLINES = 100_000


def fold(
    machine: KeyedMachine, state: Any, events: Iterable[Event], *, until_ms: int | None = None
) -> tuple[Any, list[Output]]:
    """``step`` over ``events`` in (time, order) order: the one definition of running a machine.

    Deadlines (:attr:`KeyedMachine.deadline`) fire before any event at or after them, and at the end
    every deadline before ``until_ms`` (the watermark: event time no event can arrive before any more).
    An event ``step`` fails on is skipped (state unchanged) and logged, the same way in the stream
    and in a batch, so one odd event cannot crash-loop the query."""
    outputs: list[Output] = []
    for event in sorted(events, key=lambda e: (e[machine.time_column], str(e[machine.order_column]))):
        state = _expire(machine, state, event[machine.time_column] + 1, outputs)
        try:
            state, produced = machine.step(state, event)
        except Exception as exc:
            log.warning("state machine skipped event %s: %s", event.get(machine.order_column), one_line(exc))
            continue
        outputs += produced
    if until_ms is not None:
        state = _expire(machine, state, until_ms, outputs)
    if machine.output_key:
        last = {tuple(o.get(c) for c in machine.output_key): i for i, o in enumerate(outputs)}
        outputs = [o for i, o in enumerate(outputs) if last[tuple(o.get(c) for c in machine.output_key)] == i]
    return state, outputs


def _deadline(machine: KeyedMachine, state: Any) -> int | None:
    """The state's next deadline (None: the machine declares none, or the state waits for none)."""
    return None if machine.deadline is None else machine.deadline(state)


def _expire(machine: KeyedMachine, state: Any, before_ms: int, outputs: list[Output]) -> Any:
    """Fire the state's deadlines earlier than ``before_ms``, in order."""
    due = _deadline(machine, state)
    for _ in range(MAX_DEADLINES):
        if due is None or due >= before_ms or machine.on_deadline is None:
            return state
        try:
            state, produced = machine.on_deadline(state, due)
        except Exception as exc:
            log.warning("state machine failed at its deadline %s: %s", due, one_line(exc))
            return state
        outputs += produced
        following = _deadline(machine, state)
        if following is not None and following <= due:
            log.error("state machine deadline %s did not move on: stopped firing it", due)
            return state
        due = following
    return state


def keyed_state_machine(events: DataFrame, *, machine: KeyedMachine, key: str, watermark: str) -> DataFrame:
    """``machine`` folded over each ``key``'s events: its outputs as rows of ``machine.output_schema``.

    Streaming input: ``transformWithState`` (Rows) with state and event-time timers; batch input:
    ``mapInArrow`` over the events clustered by key, from no state. Both fold with :func:`fold` (see the
    module docstring)."""
    columns = list(dict.fromkeys([key, *machine.event_columns]))
    selected = events.select(*columns)
    if not events.isStreaming:
        # One Python call per partition, its keys' events side by side: applyInPandas made a pandas
        # frame per key, and a payments hour has ~400k cards of one payment each (~1.3 ms per card).
        clustered = selected.repartition(key).sortWithinPartitions(key)
        return clustered.mapInArrow(_batch_fold(machine, key), schema=machine.output_schema)
    bucketed = selected.withColumn(BUCKET_COLUMN, F.pmod(F.xxhash64(key), F.lit(BUCKETS)))
    return (
        bucketed.withWatermark(machine.time_column, watermark)
        .groupBy(BUCKET_COLUMN)
        .transformWithState(
            statefulProcessor=_Processor(machine, key),
            outputStructType=machine.output_schema,
            outputMode="Append",
            timeMode="EventTime",
        )
    )


# ---- conversions between Spark rows (Rows on the stream, Arrow on a batch) and plain values -----------


def _row_events(rows: Iterable[Row], machine: KeyedMachine) -> list[Event]:
    """A stream group's rows as the machine's plain values, as :func:`_arrow_events` gives the batch
    side: timestamps (UTC datetimes from Spark's Arrow rows) as epoch milliseconds, floored; NaN as None."""
    events = []
    for row in rows:
        event = row.asDict()
        for name, value in event.items():
            if isinstance(value, dt.datetime):
                event[name] = _epoch_micros(value) // 1000
            elif isinstance(value, float) and value != value:
                event[name] = None
        events.append(event)
    return _timed(events, machine)


def _epoch_micros(value: dt.datetime) -> int:
    """Microseconds since the epoch, exactly (a naive value is UTC, as Arrow takes it)."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    return (aware - _EPOCH) // dt.timedelta(microseconds=1)


def _batch_fold(machine: KeyedMachine, key: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The batch side: each key's events (contiguous: the partition is sorted by key) folded from no
    state, as :func:`fold` does on the stream's side; outputs as Arrow batches of ``output_schema``."""
    schema = to_arrow_schema(machine.output_schema, timezone="UTC")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        outputs: list[Output] = []
        current: list[Event] = []
        for batch in batches:
            for event in _arrow_events(batch):
                if current and event[key] != current[0][key]:
                    outputs += fold(machine, None, _timed(current, machine), until_ms=_END_OF_TIME_MS)[1]
                    current = []
                current.append(event)
            if len(outputs) >= 10_000:
                yield _arrow_batch(outputs, schema)
                outputs = []
        if current:
            outputs += fold(machine, None, _timed(current, machine), until_ms=_END_OF_TIME_MS)[1]
        if outputs:
            yield _arrow_batch(outputs, schema)

    return run


def _arrow_events(batch: pa.RecordBatch) -> list[Event]:
    """Rows as the machine's plain values (Python's, for the JSON state and equality): timestamps as
    epoch milliseconds, floored; NaN as None. The one conversion both sides use."""
    columns = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_timestamp(column.type):
            micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()).to_pylist()
            columns[name] = [None if v is None else v // 1000 for v in micros]
        elif pa.types.is_floating(column.type):
            columns[name] = [None if v is None or v != v else v for v in column.to_pylist()]
        else:
            columns[name] = column.to_pylist()
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _timed(events: list[Event], machine: KeyedMachine) -> list[Event]:
    """Events a machine can place in time (silver never holds one without)."""
    return [e for e in events if e.get(machine.time_column) is not None]


def _arrow_batch(outputs: Sequence[Output], schema: pa.Schema) -> pa.RecordBatch:
    arrays = []
    for field in schema:
        values = [o.get(field.name) for o in outputs]
        if pa.types.is_timestamp(field.type):  # the machine's epoch milliseconds
            arrays.append(pa.array([None if v is None else v * 1000 for v in values], pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _Processor(StatefulProcessor):
    """The stream's side of :func:`keyed_state_machine`: buffer, wait for the watermark, fold in order.

    State per bucket of keys: ``states`` (each key's machine state, as JSON, by key; a ``None``
    state is no entry), ``pending`` (events not yet passed by the watermark, and deadline markers, by
    time slot), ``slots`` (which slots hold entries), ``folded`` (the watermark of the last fold: an
    event older than it arrived too late to be folded in order, and is left to the batch correction),
    ``timer`` (the bucket's one timer) and ``sweep`` (the watermark after which the bucket's states
    are read for deadlines that got no marker; none while no state has one). A state whose deadline
    is not past ``sweep`` has a marker. Rows in, rows out (``transformWithState``). Each state call
    is a round trip to the JVM; an absent value is asked about (``exists``, ``containsKey``), never
    read (see :func:`_value`)."""

    def __init__(self, machine: KeyedMachine, key: str) -> None:
        self.machine = machine
        self.key = key
        self.names = machine.output_schema.fieldNames()
        fields = machine.output_schema.fields
        self.stamps = tuple(i for i, f in enumerate(fields) if isinstance(f.dataType, TimestampType))  # positions
        self.output = Row(*self.names)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.states = handle.getMapState("states", _MACHINE_KEY, _STATE)
        self.pending = handle.getMapState("pending", _SLOT_KEY, _ENTRIES)
        self.slots = handle.getValueState("slots", _SLOTS)
        self.folded = handle.getValueState("folded", _FOLDED)
        self.timer = handle.getValueState("timer", _TIMER)
        # Added after the first checkpoints: a new state variable resumes an old checkpoint (a changed one does not).
        self.sweep = handle.getValueState("sweep", _SWEEP)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        before = _value(self.folded)
        arrived: list[list[Any]] = []
        for event in _row_events(rows, self.machine):
            event.pop(BUCKET_COLUMN, None)
            at = event[self.machine.time_column]
            if before is not None and at < before:
                continue  # the watermark passed it before it came: the correction folds it
            arrived.append([at, str(event[self.machine.order_column]), json.dumps(event[self.key]), event])
        if arrived:
            slots = self._slots()
            self._buffer(arrived, slots)
            self.slots.update((json.dumps(sorted(slots)),))
            self._wake_after(min(entry[0] for entry in arrived), _value(self.timer))
        return iter(())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        watermark = timerValues.getCurrentWatermarkInMs()
        slots = self._slots()
        due: dict[str, list[Event]] = {}  # by key: the events the watermark passed (none: a deadline marker)
        wake = [slot * SLOT_MS for slot in slots if slot * SLOT_MS >= watermark]
        for slot in sorted(s for s in slots if s * SLOT_MS < watermark):
            entries = self._entries(slot)
            kept = [entry for entry in entries if entry[0] >= watermark]
            for at, _, machine_key, event in entries:
                if at < watermark:
                    events = due.setdefault(machine_key, [])
                    if event is not None:
                        events.append(event)
            if kept:
                self.pending.updateValue((slot,), (json.dumps(kept),))
                wake.append(min(entry[0] for entry in kept))
            else:
                self.pending.removeKey((slot,))
                slots.discard(slot)
        outputs: list[Output] = []
        markers: list[list[Any]] = []
        sweep = _value(self.sweep)
        sweeping = sweep is not None and sweep < watermark
        # Deadlines up to here get a marker; a later one waits for the bucket's next pass.
        reach = sweep if sweep is not None and not sweeping else _next_pass(watermark, key[0])
        unmarked = False
        folded: set[str] = set()
        for machine_key, events in due.items():
            # containsKey first: Spark's state server logs a warning for every read of an absent entry.
            saved = self.states.getValue((machine_key,)) if self.states.containsKey((machine_key,)) else None
            state = None if saved is None else json.loads(saved[0])
            before = _deadline(self.machine, state)
            if not events and (before is None or before >= watermark):
                continue  # a marker of a deadline that has moved on since
            state, produced = fold(self.machine, state, events, until_ms=watermark)
            self._save(machine_key, state, saved is not None)
            outputs += produced
            folded.add(machine_key)
            deadline = _deadline(self.machine, state)
            if deadline is None:
                continue
            if deadline == before and before >= watermark and (sweep is None or before <= sweep):
                continue  # its marker is still buffered
            if deadline <= reach:
                markers.append([deadline, "", machine_key, None])
            else:
                unmarked = True
        if sweep is not None and sweeping:
            unmarked = self._pass(watermark, sweep, reach, folded, outputs, markers) or unmarked
        if due:
            self.folded.update((watermark,))
        if markers:
            self._buffer(markers, slots)
            wake.append(min(marker[0] for marker in markers))
        self.slots.update((json.dumps(sorted(slots)),))
        # The next pass: at reach while a state waits for one (a pending pass not yet due keeps its time).
        next_pass = reach if unmarked or (sweep is not None and not sweeping) else None
        if next_pass is None:
            if sweep is not None:
                self.sweep.clear()
        else:
            if next_pass != sweep:
                self.sweep.update((next_pass,))
            wake.append(next_pass)
        if wake:  # the timer that fired is gone (Spark deletes it after this call): none to delete
            self._wake_after(min(wake), None)
        else:
            self.timer.clear()
        return iter([self._row(o) for o in outputs])

    def _pass(
        self,
        watermark: int,
        swept_to: int,
        reach: int,
        folded: set[str],
        outputs: list[Output],
        markers: list[list[Any]],
    ) -> bool:
        """Read every state of the bucket once: fire the deadlines the watermark has passed, and mark
        those due by ``reach`` that have no marker yet (one up to ``swept_to`` has one). Keys just
        folded (``folded``) are skipped: their deadlines were weighed against ``reach`` already.
        Whether a state still waits for a later pass."""
        unmarked = False
        for (machine_key,), (saved,) in list(self.states.iterator()):
            if machine_key in folded:
                continue
            state = json.loads(saved)
            deadline = _deadline(self.machine, state)
            if deadline is None or watermark <= deadline <= swept_to:
                continue  # none, or its marker is buffered
            if deadline < watermark:  # it fell due between two passes, with no marker
                state, produced = fold(self.machine, state, [], until_ms=watermark)
                self._save(machine_key, state, True)
                outputs += produced
                deadline = _deadline(self.machine, state)
                if deadline is None:
                    continue
            if deadline <= reach:
                markers.append([deadline, "", machine_key, None])
            else:
                unmarked = True
        return unmarked

    def _save(self, machine_key: str, state: Any, existed: bool) -> None:
        """A key's state after a fold; a key whose state is None is forgotten."""
        if state is not None:
            self.states.updateValue((machine_key,), (json.dumps(state),))
        elif existed:
            self.states.removeKey((machine_key,))

    def _slots(self) -> set[int]:
        saved = _value(self.slots)
        return set() if saved is None else set(json.loads(saved))

    def _entries(self, slot: int) -> list[list[Any]]:
        saved = self.pending.getValue((slot,))
        return [] if saved is None else json.loads(saved[0])

    def _buffer(self, entries: list[list[Any]], slots: set[int]) -> None:
        """Add entries to their slots (``slots`` gains the new ones)."""
        by_slot: dict[int, list[list[Any]]] = {}
        for entry in entries:
            by_slot.setdefault(entry[0] // SLOT_MS, []).append(entry)
        for slot, added in by_slot.items():
            held = self._entries(slot) if slot in slots else []
            self.pending.updateValue((slot,), (json.dumps(held + added),))
            slots.add(slot)

    def _wake_after(self, at: int, current: int | None) -> None:
        """One timer per bucket, just after its earliest entry: it fires once the watermark has passed
        that entry. ``current``: the bucket's timer (None: it has none)."""
        if current is not None and current <= at + 1:
            return
        if current is not None:
            self.handle.deleteTimer(current)
        self.handle.registerTimer(at + 1)
        self.timer.update((at + 1,))

    def _row(self, output: Output) -> Row:
        """An output as a Row of ``output_schema``; its epoch-ms timestamps as UTC datetimes."""
        values = [output.get(name) for name in self.names]
        for i in self.stamps:
            if values[i] is not None:
                values[i] = _EPOCH + dt.timedelta(milliseconds=values[i])
        return self.output(*values)

    def close(self) -> None:
        pass


def _next_pass(watermark: int, bucket: int) -> int:
    """When a bucket's next pass over its states is due: at least :data:`SWEEP_MS` past the watermark
    (a deadline within that always gets its marker), at the bucket's own phase of the hour, so the
    buckets' passes come one after another instead of all in one micro-batch."""
    earliest = watermark + SWEEP_MS
    return earliest + (bucket * SWEEP_MS // BUCKETS - earliest) % SWEEP_MS


def _value(state: Any) -> Any:
    """A value state's one field, None when it holds none: ``exists()`` first, because Spark's state
    server logs a warning for every ``get()`` of an absent value (per bucket: a round trip is cheap)."""
    return state.get()[0] if state.exists() else None


def stream_states(spark: SparkSession, checkpoint: str) -> dict[Any, Any]:
    """Each key's machine state as a streaming query (its checkpoint) holds it, read back with Spark's
    state data source: {key: state}. For checks and benchmarks; the query keeps running meanwhile."""
    rows = (
        spark.read.format("statestore")
        .option("path", checkpoint)
        .option("stateVarName", "states")
        .load()
        .select("user_map_key.key", "user_map_value.json")
        .collect()
    )
    return {json.loads(key): json.loads(state) for key, state in rows}
