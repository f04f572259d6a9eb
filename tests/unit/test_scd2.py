"""The SCD2 core: versions depend on the set of changes, never on their arrival order or batching."""

from __future__ import annotations

import datetime as dt
import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.scd2 import (
    ABSORBED,
    IS_CURRENT,
    VALID_FROM,
    VALID_TO,
    Scd2Spec,
    chain_errors,
    changed_rows,
    plan,
    version_at,
    versions,
)

SPEC = Scd2Spec("machine_id", "changed_at", ("location", "model", "operator"), "change_id")
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)


def at(hour: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hour)


def change(machine: str, hour: float, location: str, change_id: str, model: str = "V1", operator: str = "acme"):
    return {
        "machine_id": machine,
        "changed_at": at(hour),
        "location": location,
        "model": model,
        "operator": operator,
        "change_id": change_id,
    }


def oracle(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The intended table, written independently of the module: per key, the greatest (change_id,
    attributes) at each sequence; runs of equal attributes in sequence order make one version."""

    def attributes(c):
        return tuple(c[name] for name in SPEC.attributes)

    def rank(c):
        return (c["change_id"], tuple((v is not None, 0 if v is None else v) for v in attributes(c)))

    winners: dict[tuple[str, dt.datetime], dict[str, Any]] = {}
    for c in changes:
        slot = (c["machine_id"], c["changed_at"])
        if slot not in winners or rank(c) > rank(winners[slot]):
            winners[slot] = c
    rows = []
    for machine, group in itertools.groupby(sorted(winners.items()), key=lambda item: item[0][0]):
        runs = [list(run) for _, run in itertools.groupby((c for _, c in group), key=attributes)]
        for i, run in enumerate(runs):
            first = run[0]
            end = runs[i + 1][0]["changed_at"] if i + 1 < len(runs) else None
            rows.append(
                {
                    "machine_id": machine,
                    **{name: first[name] for name in SPEC.attributes},
                    VALID_FROM: first["changed_at"],
                    VALID_TO: end,
                    IS_CURRENT: end is None,
                    "change_id": first["change_id"],
                    ABSORBED: [{"changed_at": c["changed_at"], "change_id": c["change_id"]} for c in run[1:]],
                }
            )
    return rows


class Store:
    """A table as the I/O keeps it: rows by (key, valid_from), changed only through plan()'s upserts
    and deletes (what the MERGE does)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, dt.datetime], dict[str, Any]] = {}

    def apply(self, batch: list[dict[str, Any]]):
        planned = plan(SPEC, list(self.rows.values()), batch)
        for gone in planned.deletes:
            del self.rows[(gone["machine_id"], gone[VALID_FROM])]
        for row in planned.upserts:
            self.rows[(row["machine_id"], row[VALID_FROM])] = row
        touched = {c["machine_id"] for c in batch}
        assert self.table(touched) == planned.versions  # the diff rebuilds exactly the planned versions
        return planned

    def table(self, keys: set[str] | None = None) -> list[dict[str, Any]]:
        return [row for slot, row in sorted(self.rows.items()) if keys is None or slot[0] in keys]


def build(batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    store = Store()
    for batch in batches:
        store.apply(batch)
    return store.table()


# A relocation, a change that changes nothing (absorbed), a same-sequence conflict, an A-B-A history,
# an exact duplicate: every rule in six records.
SIX = [
    change("m1", 1, "north", "c01"),
    change("m1", 2, "north", "c02"),  # repeats the version from 1: absorbed
    change("m1", 3, "south", "c03"),
    change("m1", 3, "east", "c04"),  # same sequence as c03, greater change id: wins
    change("m1", 5, "north", "c05"),  # back to north: a new version (not consecutive)
    change("m1", 3, "east", "c04"),  # exact duplicate
]


def test_in_order_history_is_a_gapless_chain_with_one_current_version():
    rows = versions(SPEC, [], SIX)
    assert [(r["location"], r[VALID_FROM], r[VALID_TO], r[IS_CURRENT], r["change_id"]) for r in rows] == [
        ("north", at(1), at(3), False, "c01"),
        ("east", at(3), at(5), False, "c04"),
        ("north", at(5), None, True, "c05"),
    ]
    assert rows[0][ABSORBED] == [{"changed_at": at(2), "change_id": "c02"}]
    assert rows == oracle(SIX)
    assert chain_errors(SPEC, rows) == []


def test_every_arrival_order_one_change_per_batch_gives_the_in_order_table():
    expected = versions(SPEC, [], SIX)
    for order in itertools.permutations(SIX):
        assert build([[c] for c in order]) == expected, order


def test_random_orders_and_batchings_give_the_same_table():
    rng = random.Random(20260301)
    for _ in range(300):
        changes = []
        for n in range(rng.randint(1, 12)):
            machine = rng.choice(["m1", "m2", "m3"])
            changes.append(
                change(machine, rng.randint(0, 5), rng.choice("ab"), f"c{rng.randint(0, 30):02d}-{n}", rng.choice("xy"))
            )
        changes += rng.sample(changes, rng.randint(0, len(changes)))  # re-sent copies
        expected = oracle(changes)
        assert versions(SPEC, [], changes) == expected
        rng.shuffle(changes)
        cuts = sorted(rng.sample(range(1, len(changes)), rng.randint(0, len(changes) - 1)))
        batches = [changes[i:j] for i, j in itertools.pairwise([0, *cuts, len(changes)])]
        assert build(batches) == expected
        assert chain_errors(SPEC, expected) == []


_changes = st.lists(
    st.builds(
        change,
        machine=st.sampled_from(["m1", "m2"]),
        hour=st.integers(0, 4),
        location=st.sampled_from(["a", "b"]),
        change_id=st.sampled_from(["c1", "c2", "c3", "c4"]),
        model=st.sampled_from(["x", "y"]),
    ),
    max_size=10,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(changes=_changes, order=st.randoms(use_true_random=False), batches=st.integers(1, 4))
def test_property_any_order_any_batching_equals_one_in_order_batch(changes, order, batches):
    # change ids repeat here on purpose: one id re-sent with other attributes still resolves one way
    shuffled = list(changes)
    order.shuffle(shuffled)
    split = [shuffled[i::batches] for i in range(batches)]
    assert build([b for b in split if b]) == build([changes] if changes else [])
    assert build([changes] if changes else []) == oracle(changes)


def test_re_applying_changes_writes_nothing():
    store = Store()
    first = store.apply(SIX[:3])
    assert first.inserted == 2 and first.deleted == 0
    again = store.apply(SIX[:3])
    assert again.empty and again.inserted == again.updated == again.deleted == 0
    store.apply(SIX[3:])
    for batch in (SIX, SIX[:1], SIX[4:]):  # any subset of what the table holds is a no-op
        assert store.apply(batch).empty


def test_same_sequence_conflict_is_won_by_the_greater_change_id_in_either_order():
    south, east = change("m1", 3, "south", "c03"), change("m1", 3, "east", "c04")
    for batches in ([[south], [east]], [[east], [south]], [[south, east]], [[east, south]]):
        (row,) = build(batches)
        assert (row["location"], row["change_id"]) == ("east", "c04")


def test_same_sequence_same_attributes_keeps_the_greater_change_id():
    low, high = change("m1", 3, "east", "c03"), change("m1", 3, "east", "c04")
    store = Store()
    store.apply([high])
    assert store.apply([low]).empty  # the smaller id of an identical change is a no-op
    store = Store()
    store.apply([low])
    relabel = store.apply([high])  # a greater id relabels the version, nothing else
    assert (relabel.inserted, relabel.updated, relabel.deleted) == (0, 1, 0)
    assert store.table()[0]["change_id"] == "c04"


def test_one_change_id_resent_with_other_attributes_resolves_deterministically():
    a, b = change("m1", 3, "a", "c07"), change("m1", 3, "b", "c07")
    assert build([[a], [b]]) == build([[b], [a]]) == build([[a, b]])


def test_consecutive_identical_attributes_collapse_into_the_earliest():
    rows = versions(SPEC, [], [change("m1", 1, "a", "c1"), change("m1", 2, "a", "c2"), change("m1", 3, "b", "c3")])
    assert [(r["location"], r[VALID_FROM], r[VALID_TO]) for r in rows] == [("a", at(1), at(3)), ("b", at(3), None)]
    assert rows[0][ABSORBED] == [{"changed_at": at(2), "change_id": "c2"}]
    # an identical change arriving late, before the version, moves its start earlier
    store = Store()
    store.apply([change("m1", 0, "z", "c0"), change("m1", 3, "a", "c3")])
    moved = store.apply([change("m1", 1, "a", "c1")])
    assert (moved.inserted, moved.updated, moved.deleted) == (1, 1, 1)
    assert [(r["location"], r[VALID_FROM], r["change_id"]) for r in store.table()] == [
        ("z", at(0), "c0"),
        ("a", at(1), "c1"),
    ]
    assert store.table()[1][ABSORBED] == [{"changed_at": at(3), "change_id": "c3"}]


def test_a_late_change_between_identical_changes_brings_the_absorbed_one_back():
    store = Store()
    store.apply([change("m1", 1, "a", "c1"), change("m1", 3, "a", "c3")])
    assert len(store.table()) == 1
    planned = store.apply([change("m1", 2, "b", "c2")])
    assert (planned.inserted, planned.updated, planned.deleted) == (2, 1, 0)
    assert [(r["location"], r[VALID_FROM], r[VALID_TO]) for r in store.table()] == [
        ("a", at(1), at(2)),
        ("b", at(2), at(3)),
        ("a", at(3), None),
    ]


def test_a_late_change_can_remove_a_stored_version():
    store = Store()
    store.apply([change("m1", 1, "a", "c1"), change("m1", 3, "b", "c3")])
    planned = store.apply([change("m1", 2, "b", "c2")])
    assert planned.deletes == [{"machine_id": "m1", VALID_FROM: at(3)}]
    assert [(r["location"], r[VALID_FROM], r[VALID_TO]) for r in store.table()] == [
        ("a", at(1), at(2)),
        ("b", at(2), None),
    ]


def test_other_keys_are_left_alone():
    store = Store()
    store.apply([change("m1", 1, "a", "c1"), change("m2", 1, "a", "c2")])
    planned = store.apply([change("m1", 2, "b", "c3")])
    assert planned.keys == 1 and {r["machine_id"] for r in planned.versions} == {"m1"}
    upserts, deletes = changed_rows(SPEC, store.table(), versions(SPEC, store.table(), [change("m1", 0, "b", "c0")]))
    assert {r["machine_id"] for r in upserts} == {"m1"} and deletes == []


def test_sequences_compare_as_instants_whatever_their_zone():
    naive = change("m1", 1, "a", "c1") | {"changed_at": dt.datetime(2026, 3, 1, 1)}  # naive: UTC
    zoned = change("m1", 1, "a", "c1") | {
        "changed_at": dt.datetime(2026, 3, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    }
    assert (
        versions(SPEC, [], [naive]) == versions(SPEC, [], [zoned]) == versions(SPEC, [], [change("m1", 1, "a", "c1")])
    )


@pytest.mark.parametrize("column", ["machine_id", "changed_at", "change_id"])
def test_null_keys_sequences_and_change_ids_are_refused(column):
    with pytest.raises(ValueError, match=column):
        versions(SPEC, [], [change("m1", 1, "a", "c1") | {column: None}])


def test_null_attributes_are_values():
    rows = versions(SPEC, [], [change("m1", 1, None, "c1"), change("m1", 2, None, "c2"), change("m1", 3, "a", "c3")])
    assert [(r["location"], r[VALID_FROM]) for r in rows] == [(None, at(1)), ("a", at(3))]
    assert build([[change("m1", 1, None, "c1")], [change("m1", 1, "a", "c1")]]) == build(
        [[change("m1", 1, "a", "c1")], [change("m1", 1, None, "c1")]]
    )


def test_version_at_is_the_fact_join():
    rows = versions(SPEC, [], SIX)
    assert version_at(SPEC, rows, "m1", at(0.5)) is None
    assert version_at(SPEC, rows, "m1", at(1))["location"] == "north"
    assert version_at(SPEC, rows, "m1", at(2.99))["location"] == "north"
    assert version_at(SPEC, rows, "m1", at(3))["location"] == "east"  # valid_to is exclusive
    assert version_at(SPEC, rows, "m1", at(1000))["change_id"] == "c05"
    assert version_at(SPEC, rows, "m2", at(3)) is None


def test_chain_errors_finds_gaps_overlaps_and_two_current_versions():
    rows = versions(SPEC, [], SIX)
    gap = [dict(rows[0], **{VALID_TO: at(2)}), *rows[1:]]
    assert any("ends at" in e for e in chain_errors(SPEC, gap))
    two_current = [*rows[:-1], dict(rows[-1]), dict(rows[-1], **{VALID_FROM: at(9)})]
    assert any("2 current versions" in e for e in chain_errors(SPEC, two_current))
    repeated = [dict(rows[0], **{VALID_TO: at(2)}), dict(rows[0], **{VALID_FROM: at(2)}), *rows[1:]]
    assert any("repeats the attributes" in e for e in chain_errors(SPEC, repeated))


def test_spec_is_checked():
    with pytest.raises(ValueError, match="distinct"):
        Scd2Spec("machine_id", "changed_at", ("machine_id",), "change_id")
    with pytest.raises(ValueError, match="collide"):
        Scd2Spec("machine_id", "changed_at", ("valid_from",), "change_id")
    with pytest.raises(ValueError, match="at least one"):
        Scd2Spec("machine_id", "changed_at", (), "change_id")
