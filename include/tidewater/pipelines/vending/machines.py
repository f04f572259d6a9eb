"""The vending machines' state machines, pure Python (no Spark, no I/O): one fold per machine.

Each machine's events are its telemetry readings and the changes of its metadata (where it stands,
its model, who operates it), folded together in event-time order by :mod:`tidewater.keyed_state`
(a change before a reading at the same instant: ``event_id`` is ``c:<change_id>`` or
``r:<reading_id>``, which also tells a machine which kind of event it has). Folding in event-time
order *is* the as-of join: a reading meets the version of its machine that was current when it was
taken, on the stream and in any recompute or replay, however much later it runs. The changelog is
read whole by a bounded recompute (the gold tables' ``history``), so the version in force before the
interval is known.

* :data:`VERSIONS` -- the machines dimension, SCD type 2 (:mod:`tidewater.scd2` owns the rules: keyed
  by machine, sequenced by ``changed_at``, ties to the greater change id, repeats absorbed).
* :data:`SALES` -- sales per location per hour, per machine: a reading adds to its hour's total at the
  location the machine stood at; the hour is written when event time passes its end (a deadline), so
  a machine that goes quiet still gets its hour. A reading sent twice (at-least-once) counts once.
* :data:`SILENCE` -- a machine silent for longer than :data:`SILENT_AFTER`: a deadline ``last
  reading + SILENT_AFTER`` that any reading pushes back; when it fires, the silence is a row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidewater import scd2
from tidewater.keyed_state import KeyedMachine
from tidewater.times import parse_duration

HOUR_MS = 3_600_000
SILENT_AFTER = "15 minutes"  # the declared silence: no reading for longer than this
SILENT_AFTER_MS = int(parse_duration(SILENT_AFTER).total_seconds() * 1000)
UNKNOWN_LOCATION = "(unknown)"  # a reading before the machine's first change (a key column: never null)

ATTRIBUTES = ("location", "model", "operator")
SPEC = scd2.Scd2Spec(key="machine_id", sequence="changed_at", attributes=ATTRIBUTES, change_id="change_id")

# An event's id is its kind and its own id; "c" < "r" puts a change before a reading of the same instant.
CHANGE_ID_PREFIX, READING_ID_PREFIX = "c:", "r:"

# The columns of a machine event: the union of readings and changes (a reading's change columns are
# null, a change's reading columns). Each machine reads only those it needs (its ``event_columns``):
# the stream sorts a micro-batch's events by key before ``transformWithState`` and buffers them as JSON
# until the watermark passes them. With every column (and the reading id beside ``event_id``) that
# sort held up to 192 MiB of the streaming JVM's heap; draining 1M events, the JVM's PSS peak is a
# median 862 MiB with these against 1,017 (8 interleaved pairs, 2026-12-02; see the README).
EVENT_COLUMNS = (
    "machine_id",
    "at",
    "event_id",
    "sales_count",
    "sales_amount",
    "change_id",
    *ATTRIBUTES,
)

VERSION_SCHEMA = StructType(
    [
        StructField("machine_id", StringType()),
        *[StructField(name, StringType()) for name in ATTRIBUTES],
        StructField(scd2.VALID_FROM, TimestampType()),
        StructField(scd2.VALID_TO, TimestampType()),
        StructField(scd2.IS_CURRENT, BooleanType()),
        StructField("change_id", StringType()),
    ]
)

SALES_SCHEMA = StructType(
    [
        StructField("location", StringType()),
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("machine_id", StringType()),
        StructField("sales_count", LongType()),
        StructField("sales_amount", DoubleType()),
        StructField("readings", LongType()),
    ]
)

SILENCE_SCHEMA = StructType(
    [
        StructField("machine_id", StringType()),
        StructField("location", StringType()),
        StructField("silent_since", TimestampType()),
        StructField("detected_at", TimestampType()),
        StructField("last_reading_id", StringType()),
    ]
)

State = dict[str, Any]
Event = dict[str, Any]


def _is_change(event: Event) -> bool:
    return str(event.get("event_id") or "").startswith(CHANGE_ID_PREFIX)


def _reading_id(event: Event) -> str:
    return str(event["event_id"]).removeprefix(READING_ID_PREFIX)


# ---- the dimension --------------------------------------------------------------------------------


def _instant(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _ms(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _stored(version: State) -> State:
    """A version as :mod:`tidewater.scd2` holds it (times as datetimes) from its JSON state form."""
    absorbed = [{"changed_at": _instant(a["changed_at"]), "change_id": a["change_id"]} for a in version["absorbed"]]
    return {
        **version,
        scd2.VALID_FROM: _instant(version[scd2.VALID_FROM]),
        scd2.VALID_TO: _instant(version[scd2.VALID_TO]),
        scd2.ABSORBED: absorbed,
    }


def _state(version: State) -> State:
    """A version in its JSON state form (times as epoch ms)."""
    absorbed = [{"changed_at": _ms(a["changed_at"]), "change_id": a["change_id"]} for a in version[scd2.ABSORBED]]
    return {
        **version,
        scd2.VALID_FROM: _ms(version[scd2.VALID_FROM]),
        scd2.VALID_TO: _ms(version[scd2.VALID_TO]),
        scd2.ABSORBED: absorbed,
    }


def version_step(state: State | None, event: Event) -> tuple[State | None, list[dict[str, Any]]]:
    """A machine's current version and a change -> the new current version and the versions to upsert
    (the one it closes and the one it opens; or the current one, if the change repeats it)."""
    if not _is_change(event):
        return state, []
    change = {
        "machine_id": event["machine_id"],
        "changed_at": _instant(event["at"]),
        "change_id": event["change_id"],
        **{name: event[name] for name in ATTRIBUTES},
    }
    planned = scd2.plan(SPEC, [_stored(state)] if state else [], [change])
    current = _state(planned.versions[-1])
    upserts = [{c: _state(v).get(c) for c in VERSION_SCHEMA.fieldNames()} for v in planned.upserts]
    return current, upserts


VERSIONS = KeyedMachine(
    step=version_step,
    event_columns=("machine_id", "at", "event_id", "change_id", *ATTRIBUTES),
    time_column="at",
    order_column="event_id",
    output_schema=VERSION_SCHEMA,
    output_key=("machine_id", scd2.VALID_FROM),
)


# ---- sales per location per hour ----------------------------------------------------------------------


def sales_step(state: State | None, event: Event) -> tuple[State, list[dict[str, Any]]]:
    """A change moves the machine; a reading adds to its hour at the machine's location (once per id)."""
    state = state or {"machine_id": event["machine_id"], "location": None, "hour": None, "totals": {}, "seen": []}
    if _is_change(event):
        return {**state, "location": event["location"]}, []
    reading_id = _reading_id(event)
    if reading_id in state["seen"]:
        return state, []  # a re-sent reading (at-least-once delivery): counted once
    hour = event["at"] - event["at"] % HOUR_MS
    location = state["location"] or UNKNOWN_LOCATION
    totals = dict(state["totals"])
    count, amount, readings = totals.get(location, [0, 0.0, 0])
    totals[location] = [  # a list, as JSON gives it back: the stream's state equals a fold's
        count + int(event["sales_count"] or 0),
        round(amount + float(event["sales_amount"] or 0.0), 2),
        readings + 1,
    ]
    return {**state, "hour": hour, "totals": totals, "seen": [*state["seen"], reading_id]}, []


def sales_deadline(state: State | None) -> int | None:
    """An hour with readings is written when event time passes its end."""
    return None if not state or state["hour"] is None else state["hour"] + HOUR_MS


def close_hour(state: State, at: int) -> tuple[State, list[dict[str, Any]]]:
    rows = [
        {
            "location": location,
            "window_start": state["hour"],
            "window_end": state["hour"] + HOUR_MS,
            "machine_id": state["machine_id"],
            "sales_count": count,
            "sales_amount": amount,
            "readings": readings,
        }
        for location, (count, amount, readings) in sorted(state["totals"].items())
    ]
    return {**state, "hour": None, "totals": {}, "seen": []}, rows


SALES = KeyedMachine(
    step=sales_step,
    event_columns=("machine_id", "at", "event_id", "sales_count", "sales_amount", "location"),
    time_column="at",
    order_column="event_id",
    output_schema=SALES_SCHEMA,
    deadline=sales_deadline,
    on_deadline=close_hour,
)


# ---- silent machines --------------------------------------------------------------------------------


def silence_step(state: State | None, event: Event) -> tuple[State, list[dict[str, Any]]]:
    """A reading pushes the machine's silence deadline back; a change moves it."""
    state = state or {"machine_id": event["machine_id"], "location": None, "last_at": None, "last_id": None}
    if _is_change(event):
        return {**state, "location": event["location"]}, []
    return {**state, "last_at": event["at"], "last_id": _reading_id(event)}, []


def silence_deadline(state: State | None) -> int | None:
    return None if not state or state["last_at"] is None else state["last_at"] + SILENT_AFTER_MS


def report_silence(state: State, at: int) -> tuple[State, list[dict[str, Any]]]:
    row = {
        "machine_id": state["machine_id"],
        "location": state["location"] or UNKNOWN_LOCATION,
        "silent_since": state["last_at"],
        "detected_at": at,
        "last_reading_id": state["last_id"],
    }
    return {**state, "last_at": None, "last_id": None}, [row]


SILENCE = KeyedMachine(
    step=silence_step,
    event_columns=("machine_id", "at", "event_id", "location"),
    time_column="at",
    order_column="event_id",
    output_schema=SILENCE_SCHEMA,
    deadline=silence_deadline,
    on_deadline=report_silence,
)
