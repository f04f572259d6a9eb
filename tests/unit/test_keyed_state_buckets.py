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
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from tidewater.keyed_state import BUCKET_COLUMN, BUCKETS, SWEEP_MS, KeyedMachine, _next_pass, _Processor, fold
from tidewater.pipelines.payments import FRAUD_RULES
from tidewater.pipelines.payments.fraud import HORIZON_MS
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
        self.passes = 0  # iterator() calls: the processor's passes over its states

    def containsKey(self, key: tuple) -> bool:
        return tuple(key) in self.entries

    def getValue(self, key: tuple) -> tuple | None:
        return self.entries.get(tuple(key))

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.entries[tuple(key)] = tuple(value)

    def removeKey(self, key: tuple) -> None:
        del self.entries[tuple(key)]

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        self.passes += 1
        return iter(list(self.entries.items()))


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


def run_stream(
    machine: KeyedMachine,
    key: str,
    batches: list[list[dict]],
    delay_ms: int,
    *,
    buckets: dict[int, tuple[_Processor, _Bucket]] | None = None,
    watermarks: list[int] | None = None,
    batch_watermarks: list[int] | None = None,
) -> tuple[list[dict], int]:
    """The processor over ``batches`` of events: (every output, the final watermark). ``buckets``
    receives each bucket's processor and state; ``watermarks``, the watermark each output came out at;
    ``batch_watermarks``, each batch's."""
    buckets = {} if buckets is None else buckets
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
        if batch_watermarks is not None:
            batch_watermarks.append(watermark)
        for bucket, (processor, handle) in sorted(buckets.items()):
            for at in sorted(t for t in handle.timers if t <= watermark):
                fired = processor.handleExpiredTimer((bucket,), _Watermark(watermark), at)  # type: ignore[arg-type]
                outputs += [_plain(r, machine) for r in fired]
                if watermarks is not None:
                    watermarks += [watermark] * (len(outputs) - len(watermarks))
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
        {**quiet[0], "machine_id": "vm-2", "at": quiet[0]["at"] + m * MIN, "event_id": f"r:x{m}"}
        for m in range(1, 40, 3)
    ]
    streamed, watermark = run_stream(machines.SILENCE, "machine_id", [quiet, *[[e] for e in later]], delay_ms=MIN)
    silent = [r for r in streamed if r["machine_id"] == "vm-1"]
    assert len(silent) == 1 and silent[0]["silent_since"] == quiet[0]["at"]
    assert sorted(map(_key, streamed)) == sorted(
        map(_key, expected(machines.SILENCE, "machine_id", [*quiet, *later], watermark))
    )


HOUR = 60 * MIN


def _closes_after(quiet_ms: int) -> KeyedMachine:
    """A session per key that closes (one row) ``quiet_ms`` after its last event: a deadline far past
    the watermark when ``quiet_ms`` exceeds :data:`SWEEP_MS`, which only the bucket's pass can mark."""

    def step(state: dict | None, event: dict) -> tuple[dict, list[dict]]:
        return {"id": event["machine_id"], "last": event["at"], "n": (state or {}).get("n", 0) + 1}, []

    def close(state: dict, at: int) -> tuple[None, list[dict]]:
        return None, [{"machine_id": state["id"], "closed_at": at, "events": state["n"]}]

    return KeyedMachine(
        step=step,
        event_columns=("machine_id", "at", "event_id"),
        time_column="at",
        order_column="event_id",
        output_schema=StructType(
            [
                StructField("machine_id", StringType()),
                StructField("closed_at", TimestampType()),
                StructField("events", LongType()),
            ]
        ),
        deadline=lambda state: None if state is None else state["last"] + quiet_ms,
        on_deadline=close,
    )


def _spread(rng: random.Random, hours: int, keys: int) -> list[dict]:
    """Readings over ``hours``: one to three every 1-10 minutes, each of one of ``keys`` machines at
    random, so one machine's readings are sometimes hours apart."""
    at, events = T0, []
    for _ in range(hours * 12):
        at += rng.randint(1, 10) * MIN
        for _ in range(rng.randint(1, 3)):
            events.append({"machine_id": f"vm-{rng.randrange(keys)}", "at": at, "event_id": f"e:{len(events)}"})
    return events


@pytest.mark.parametrize("seed", range(6))
def test_a_deadline_beyond_the_sweep_fires_as_soon_as_the_watermark_passes_it(seed):
    machine = _closes_after(3 * HOUR)
    rng = random.Random(seed)
    events = _spread(rng, hours=14, keys=20)
    buckets: dict = {}
    at: list[int] = []
    moved: list[int] = []
    streamed, watermark = run_stream(
        machine,
        "machine_id",
        list(arrivals(events, rng, 60)),
        delay_ms=MIN,
        buckets=buckets,
        watermarks=at,
        batch_watermarks=moved,
    )
    want = expected(machine, "machine_id", events, watermark)
    assert sorted(map(_key, streamed)) == sorted(map(_key, want)) and want
    # On time: in the first batch whose watermark passed it, as a marker would have fired it.
    for row, fired_at in zip(streamed, at, strict=True):
        earlier = [w for w in moved if w < fired_at]
        assert row["closed_at"] < fired_at and (not earlier or row["closed_at"] >= max(earlier))
    # The deadlines three hours ahead got no marker when folded: the buffer reaches two passes ahead at most.
    assert sum(handle.maps["states"].passes for _, handle in buckets.values() if "states" in handle.maps) > 0
    for _, handle in buckets.values():
        held = [slot for slot in handle.maps["pending"].entries]
        assert all(slot[0] * 1000 < watermark + 2 * SWEEP_MS for slot in held)


def test_a_forgotten_key_leaves_no_state_and_the_fold_gives_the_same_rows():
    machine = _closes_after(3 * HOUR)
    rng = random.Random(7)
    events = _spread(rng, hours=20, keys=30)
    buckets: dict = {}
    streamed, watermark = run_stream(machine, "machine_id", list(arrivals(events, rng, 80)), 0, buckets=buckets)
    held = {key for _, handle in buckets.values() for (key,) in handle.maps["states"].entries}
    last: dict[str, int] = {}
    for event in events:
        if event["at"] < watermark:
            last[json.dumps(event["machine_id"])] = event["at"]
    assert held == {key for key, at in last.items() if at + 3 * HOUR >= watermark}
    assert len(held) < len(last)
    assert sorted(map(_key, streamed)) == sorted(map(_key, expected(machine, "machine_id", events, watermark)))


def test_payments_forget_a_card_a_horizon_after_its_last_payment_and_raise_the_same_alerts():
    rng = random.Random(11)
    at, events = T0, []
    for i in range(900):  # ~9 days; each half day's payments come from 3 cards, most not seen again
        at += rng.choice([1, 2, 30, 90, 600]) * MIN // 10
        events.append(
            {
                "payment_id": f"p-{i:05d}",
                "card_id": f"c-{rng.choice([i // 50, i // 50, i // 150])}-{rng.randrange(3)}",
                "paid_at": at,
                "amount": rng.uniform(5, 50) * (30 if rng.random() < 0.05 else 1),
                "currency": "EUR",
                "country": rng.choice("AB"),
                "merchant_id": "m-1",
            }
        )
    buckets: dict = {}
    streamed, watermark = run_stream(FRAUD_RULES, "card_id", list(arrivals(events, rng, 120)), 10_000, buckets=buckets)
    want = expected(FRAUD_RULES, "card_id", events, watermark)
    assert sorted(map(_key, streamed)) == sorted(map(_key, want)) and want
    held = {key for _, handle in buckets.values() for (key,) in handle.maps["states"].entries}
    last = {json.dumps(e["card_id"]): e["paid_at"] for e in events if e["paid_at"] < watermark}
    assert held == {card for card, paid in last.items() if paid + HORIZON_MS >= watermark} and len(held) < len(last)


def test_each_bucket_passes_over_its_states_at_its_own_phase_at_least_a_sweep_ahead():
    for watermark in (T0, T0 + 17, T0 + 5 * HOUR + 59 * MIN):
        passes = [_next_pass(watermark, bucket) for bucket in range(BUCKETS)]
        assert all(watermark + SWEEP_MS <= at < watermark + 2 * SWEEP_MS for at in passes)
        assert len({at % SWEEP_MS for at in passes}) == BUCKETS  # spread over the hour, one bucket at a time
