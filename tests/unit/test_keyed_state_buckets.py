"""The stream's bucketed processor (:class:`tidewater.keyed_state._Processor`) emits what :func:`fold` gives.

The processor runs against an in-memory stand-in for PySpark's state handle, driven the way Spark's
``transformWithState`` drives it in event-time mode: each micro-batch drops rows older than the
previous batch's watermark, hands each bucket its rows, then fires every timer at or before the new
watermark (the latest event time seen minus the delay), one call per bucket and timer. The stream
itself (real Spark, RocksDB) is held to the same fold by the payments and vending integration tests;
this one covers many arrival orders, deadlines that move, and keys sharing a bucket, in milliseconds.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import Row

from tidewater.keyed_state import BUCKET_COLUMN, KeyedMachine, _Processor, fold
from tidewater.pipelines.vending import machines

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
MIN = 60_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class _Value:
    def __init__(self) -> None:
        self.value: tuple | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple | None:
        return self.value

    def update(self, value: tuple) -> None:
        self.value = tuple(value)

    def clear(self) -> None:
        self.value = None


class _Map:
    def __init__(self) -> None:
        self.entries: dict[tuple, tuple] = {}

    def containsKey(self, key: tuple) -> bool:
        return tuple(key) in self.entries

    def getValue(self, key: tuple) -> tuple | None:
        return self.entries.get(tuple(key))

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.entries[tuple(key)] = tuple(value)

    def removeKey(self, key: tuple) -> None:
        del self.entries[tuple(key)]


class _Bucket:
    """One grouping key's state variables and timers, as the processor's handle sees them."""

    def __init__(self) -> None:
        self.maps: dict[str, _Map] = {}
        self.values: dict[str, _Value] = {}
        self.timers: set[int] = set()

    def getMapState(self, name: str, *_: Any) -> _Map:
        return self.maps.setdefault(name, _Map())

    def getValueState(self, name: str, *_: Any) -> _Value:
        return self.values.setdefault(name, _Value())

    def registerTimer(self, at: int) -> None:
        self.timers.add(at)

    def deleteTimer(self, at: int) -> None:
        self.timers.discard(at)


class _Watermark:
    def __init__(self, watermark: int) -> None:
        self.watermark = watermark

    def getCurrentWatermarkInMs(self) -> int:
        return self.watermark


def run_stream(machine: KeyedMachine, key: str, batches: list[list[dict]], delay_ms: int) -> tuple[list[dict], int]:
    """The processor over ``batches`` of events: (every output, the final watermark)."""
    buckets: dict[int, tuple[_Processor, _Bucket]] = {}
    watermark, seen, outputs = 0, None, []
    for batch in batches:
        late = watermark  # Spark drops rows behind the previous batch's watermark
        rows: dict[int, list[Row]] = {}
        for event in batch:
            if event[machine.time_column] < late:
                continue
            bucket = hash(event[key]) % 7
            rows.setdefault(bucket, []).append(_row(event, machine, bucket))
            seen = max(seen or event[machine.time_column], event[machine.time_column])
        for bucket, bucket_rows in rows.items():
            processor, handle = _bucket(buckets, bucket, machine, key)
            assert list(processor.handleInputRows((bucket,), iter(bucket_rows), _Watermark(late))) == []
        watermark = max(watermark, (seen or 0) - delay_ms)
        for bucket, (processor, handle) in sorted(buckets.items()):
            for at in sorted(t for t in handle.timers if t <= watermark):
                fired = processor.handleExpiredTimer((bucket,), _Watermark(watermark), at)  # type: ignore[arg-type]
                outputs += [_plain(r, machine) for r in fired]
                handle.timers.discard(at)  # Spark deletes the timer that fired after the call
    return outputs, watermark


def _bucket(buckets: dict, bucket: int, machine: KeyedMachine, key: str) -> tuple[_Processor, _Bucket]:
    if bucket not in buckets:
        processor, handle = _Processor(machine, key), _Bucket()
        processor.init(handle)  # type: ignore[arg-type]
        buckets[bucket] = (processor, handle)
    return buckets[bucket]


def _row(event: dict, machine: KeyedMachine, bucket: int) -> Row:
    values = {c: event.get(c) for c in dict.fromkeys(machine.event_columns)}
    values[machine.time_column] = EPOCH + dt.timedelta(milliseconds=event[machine.time_column])
    return Row(**values, **{BUCKET_COLUMN: bucket})


def _plain(row: Row, machine: KeyedMachine) -> dict:
    out = row.asDict()
    for name in out:
        if isinstance(out[name], dt.datetime):
            out[name] = (out[name] - EPOCH) // dt.timedelta(milliseconds=1)
    return out


def expected(machine: KeyedMachine, key: str, events: list[dict], watermark: int) -> list[dict]:
    """What the fold gives each key's events behind the final watermark (outputs in schema order)."""
    by_key: dict[Any, list[dict]] = {}
    for event in events:
        if event[machine.time_column] < watermark:
            by_key.setdefault(event[key], []).append(event)
    names = machine.output_schema.fieldNames()
    return [
        {n: o.get(n) for n in names}
        for events_of_key in by_key.values()
        for o in fold(machine, None, events_of_key, until_ms=watermark)[1]
    ]


def arrivals(events: list[dict], rng: random.Random, batches: int) -> Iterator[list[dict]]:
    """``events`` in time order, cut into batches, each shuffled (out of order within a batch)."""
    cuts = sorted(rng.sample(range(1, len(events)), batches - 1))
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        chunk = events[start:end]
        rng.shuffle(chunk)
        yield chunk


def readings(rng: random.Random, count: int, machines_count: int) -> list[dict]:
    at, events = T0, []
    for i in range(count):
        at += rng.randint(0, 40_000)
        events.append(
            {
                "machine_id": f"vm-{rng.randrange(machines_count)}",
                "at": at,
                "event_id": f"r:{i}",
                "reading_id": str(i),
                "sales_count": 1,
                "sales_amount": 2.0,
                "change_id": None,
                **dict.fromkeys(machines.ATTRIBUTES),
            }
        )
    return events


def _key(row: dict) -> str:
    return repr(sorted(row.items()))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("machine", [machines.SILENCE, machines.SALES], ids=["silence", "sales"])
def test_the_bucketed_stream_emits_what_the_fold_gives(seed, machine):
    rng = random.Random(seed)
    events = readings(rng, 400, machines_count=12)
    streamed, watermark = run_stream(machine, "machine_id", list(arrivals(events, rng, 25)), delay_ms=MIN)
    want = expected(machine, "machine_id", events, watermark)
    assert sorted(map(_key, streamed)) == sorted(map(_key, want))
    assert want, "the case should exercise the machine's outputs"


def test_a_deadline_fires_without_any_later_event_of_its_key():
    # vm-1 falls silent; only vm-2's readings move the watermark past vm-1's deadline.
    quiet = readings(random.Random(1), 1, machines_count=1)
    quiet[0]["machine_id"] = "vm-1"
    later = [
        {**quiet[0], "machine_id": "vm-2", "at": quiet[0]["at"] + m * MIN, "event_id": f"r:x{m}", "reading_id": f"x{m}"}
        for m in range(1, 40, 3)
    ]
    streamed, watermark = run_stream(machines.SILENCE, "machine_id", [quiet, *[[e] for e in later]], delay_ms=MIN)
    silent = [r for r in streamed if r["machine_id"] == "vm-1"]
    assert len(silent) == 1 and silent[0]["silent_since"] == quiet[0]["at"]
    assert sorted(map(_key, streamed)) == sorted(
        map(_key, expected(machines.SILENCE, "machine_id", [*quiet, *later], watermark))
    )
