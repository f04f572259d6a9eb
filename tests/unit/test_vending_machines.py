"""The vending machines' pure state machines and the deadlines of :func:`tidewater.keyed_state.fold`."""

from __future__ import annotations

import json
import random

import pytest

from tidewater import scd2
from tidewater.keyed_state import KeyedMachine, fold
from tidewater.pipelines.vending import machines

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
MIN = 60_000


def reading(at: int, reading_id: str, sales: int = 1, amount: float = 2.0, machine: str = "vm-1") -> dict:
    return {
        "machine_id": machine,
        "at": at,
        "event_id": f"r:{reading_id}",
        "sales_count": sales,
        "sales_amount": amount,
        "change_id": None,
        **dict.fromkeys(machines.ATTRIBUTES),
    }


def change(at: int, change_id: str, location: str, machine: str = "vm-1", operator: str = "op") -> dict:
    return {
        "machine_id": machine,
        "at": at,
        "event_id": f"c:{change_id}",
        "sales_count": None,
        "sales_amount": None,
        "change_id": change_id,
        "location": location,
        "model": "m",
        "operator": operator,
    }


def test_a_reading_is_sold_where_its_machine_stood_then():
    events = [
        change(T0 - 1, "c1", "berlin"),
        reading(T0 + 5 * MIN, "r1", 2, 4.0),
        change(T0 + 20 * MIN, "c2", "hamburg"),
        reading(T0 + 20 * MIN, "r2", 1, 1.5),  # the change at the same instant governs it
        reading(T0 + 70 * MIN, "r3", 1, 2.5),
    ]
    _, rows = fold(machines.SALES, None, events, until_ms=T0 + 2 * 60 * MIN + 1)
    by = {(r["location"], r["window_start"]): (r["sales_count"], r["sales_amount"], r["readings"]) for r in rows}
    assert by == {
        ("berlin", T0): (2, 4.0, 1),
        ("hamburg", T0): (1, 1.5, 1),
        ("hamburg", T0 + 60 * MIN): (1, 2.5, 1),
    }


def test_an_hour_is_written_only_once_event_time_passes_its_end():
    events = [change(T0 - 1, "c1", "berlin"), reading(T0 + MIN, "r1")]
    assert fold(machines.SALES, None, events, until_ms=T0 + 60 * MIN)[1] == []
    assert len(fold(machines.SALES, None, events, until_ms=T0 + 60 * MIN + 1)[1]) == 1
    # or when the machine's next reading is in a later hour (the deadline fires before it)
    _, rows = fold(machines.SALES, None, [*events, reading(T0 + 61 * MIN, "r2")])
    assert [r["window_start"] for r in rows] == [T0]


def test_a_re_sent_reading_counts_once_and_before_its_first_change_the_location_is_unknown():
    events = [reading(T0 + MIN, "r1", 3, 6.0), reading(T0 + MIN, "r1", 3, 6.0)]
    _, rows = fold(machines.SALES, None, events, until_ms=T0 + 61 * MIN)
    assert [(r["location"], r["sales_count"], r["readings"]) for r in rows] == [(machines.UNKNOWN_LOCATION, 3, 1)]


def test_a_machine_is_silent_when_no_reading_comes_for_longer_than_declared():
    events = [change(T0, "c1", "berlin"), reading(T0 + MIN, "r1"), reading(T0 + 10 * MIN, "r2")]
    quiet_until = T0 + 10 * MIN + machines.SILENT_AFTER_MS
    assert fold(machines.SILENCE, None, events, until_ms=quiet_until)[1] == []
    _, rows = fold(machines.SILENCE, None, [*events, reading(T0 + 40 * MIN, "r3")], until_ms=T0 + 41 * MIN)
    assert rows == [
        {
            "machine_id": "vm-1",
            "location": "berlin",
            "silent_since": T0 + 10 * MIN,
            "detected_at": quiet_until,
            "last_reading_id": "r2",
        }
    ]


def test_the_dimension_closes_a_version_and_opens_the_next_and_absorbs_a_repeat():
    events = [
        change(T0, "c1", "berlin"),
        change(T0 + 5 * MIN, "c2", "berlin"),  # nothing changes: absorbed
        change(T0 + 10 * MIN, "c3", "hamburg"),
    ]
    state, rows = fold(machines.VERSIONS, None, events)
    versions = [(r["location"], r["valid_from"], r["valid_to"], r["is_current"]) for r in rows]
    assert versions == [("berlin", T0, T0 + 10 * MIN, False), ("hamburg", T0 + 10 * MIN, None, True)]
    assert state["location"] == "hamburg" and json.loads(json.dumps(state)) == state  # the stream stores JSON
    stored = [
        {**r, "valid_from": machines._instant(r["valid_from"]), "valid_to": machines._instant(r["valid_to"])}
        for r in rows
    ]
    assert scd2.chain_errors(machines.SPEC, [{**r, "absorbed": []} for r in stored]) == []


def test_the_dimension_keeps_the_greater_change_id_at_one_instant():
    events = [change(T0, "c1", "berlin"), change(T0, "c9", "hamburg")]
    for order in (events, events[::-1]):
        _, rows = fold(machines.VERSIONS, None, order)
        assert [(r["location"], r["change_id"]) for r in rows] == [("hamburg", "c9")]


@pytest.mark.parametrize("seed", range(5))
def test_folding_in_micro_batches_gives_the_fold_of_everything(seed):
    """What the stream does (fold what the watermark passed, keep the state, go on) equals one fold."""
    rng = random.Random(seed)
    events = [change(T0 - 1, "c0", "berlin")]
    at = T0
    for i in range(200):
        at += rng.randrange(1, 25) * MIN // 4
        events.append(reading(at, f"r{i}", rng.randrange(3), 2.0))
        if rng.random() < 0.05:
            events.append(change(at + 1, f"c{i + 1}", rng.choice(("berlin", "hamburg", "munich"))))
    end = at + 3 * 60 * MIN
    for machine in (machines.SALES, machines.SILENCE, machines.VERSIONS):
        _, whole = fold(machine, None, events, until_ms=end)
        state, outputs, before = None, [], T0 - MIN
        while before < end:
            watermark = min(end, before + rng.randrange(1, 90) * MIN)
            passed = [e for e in events if before <= e["at"] < watermark]
            state, produced = fold(machine, state, passed, until_ms=watermark)
            outputs += produced
            before = watermark
        if machine is machines.VERSIONS:  # upserts: the last row per version is what the table holds
            last: dict[tuple, dict] = {}
            for r in outputs:
                last[(r["machine_id"], r["valid_from"])] = r
            outputs = list(last.values())
        assert outputs == whole, machine.output_schema.fieldNames()


def test_each_machine_needs_only_the_event_columns_it_declares():
    """The stream and a batch hand a machine only its ``event_columns`` (a narrower sort before
    ``transformWithState``, less JSON buffered in state): the fold of events cut to them is the fold
    of whole events. A step reading an undeclared column would fail on every event (skipped: nothing
    sold, no silence, no version)."""
    rng = random.Random(7)
    events = [change(T0 - 1, "c0", "berlin")]
    for i in range(120):
        events.append(reading(T0 + i * 7 * MIN, f"r{i}", rng.randrange(3), 2.0))
        if i % 30 == 29:
            events.append(change(T0 + i * 7 * MIN + 1, f"c{i}", rng.choice(("hamburg", "munich"))))
    events.append(reading(T0 + 5 * 7 * MIN, "r5", 1, 2.0))  # a re-sent reading
    end = T0 + 20 * 60 * MIN
    for machine in (machines.SALES, machines.SILENCE, machines.VERSIONS):
        assert set(machine.event_columns) <= set(machines.EVENT_COLUMNS)
        _, whole = fold(machine, None, events, until_ms=end)
        cut = [{c: e[c] for c in machine.event_columns} for e in events]
        _, narrow = fold(machine, None, cut, until_ms=end)
        assert whole and narrow == whole, machine.output_schema.fieldNames()
    assert set(machines.SILENCE.event_columns) < set(machines.SALES.event_columns) < set(machines.EVENT_COLUMNS)


def test_a_deadline_that_does_not_move_on_is_fired_once():
    stuck = KeyedMachine(
        step=lambda state, event: ({"due": event["at"]}, []),
        event_columns=("k", "at", "id"),
        time_column="at",
        order_column="id",
        output_schema=machines.SILENCE_SCHEMA,
        deadline=lambda state: None if not state else state["due"],
        on_deadline=lambda state, at: (state, [{"fired": at}]),
    )
    _, outputs = fold(stuck, None, [{"k": 1, "at": 5, "id": "a"}], until_ms=100)
    assert outputs == [{"fired": 5}]


def test_deadline_and_on_deadline_come_together():
    with pytest.raises(ValueError, match="together"):
        KeyedMachine(
            step=lambda s, e: (s, []),
            event_columns=(),
            time_column="at",
            order_column="id",
            output_schema=machines.SILENCE_SCHEMA,
            deadline=lambda s: None,
        )
