"""A versioned dimension in a real Delta table (delta-rs, no Spark): late changes, replays, deletes."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from tidewater.lake.dimensions import (
    DimensionInputError,
    apply_changes,
    as_of,
    attach,
    read_versions,
)
from tidewater.lake.tables import LakeTable
from tidewater.scd2 import ABSORBED, IS_CURRENT, VALID_FROM, VALID_TO, Scd2Spec, chain_errors, versions

SPEC = Scd2Spec("machine_id", "changed_at", ("location", "model", "operator"), "change_id")
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
CHANGES = pa.schema(
    [
        ("machine_id", pa.string()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
        ("location", pa.string()),
        ("model", pa.string()),
        ("operator", pa.string()),
        ("change_id", pa.string()),
        ("received_at", pa.timestamp("us", tz="UTC")),  # not a dimension column: ignored
    ]
)


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
        "received_at": at(100),
    }


def batch(*changes: dict) -> pa.Table:
    return pa.Table.from_pylist(list(changes), schema=CHANGES)


# The changelog of three machines, in sequence order.
HISTORY = [
    change("m1", 1, "station", "c01"),
    change("m1", 5, "airport", "c05"),  # the relocation that arrives last
    change("m1", 9, "airport", "c09", operator="brightvend"),
    change("m1", 12, "mall", "c12", operator="brightvend"),
    change("m2", 2, "campus", "c02", model="V2"),
    change("m2", 6, "campus", "c06", model="V2"),  # no real change: absorbed
    change("m2", 7, "library", "c07", model="V2"),
    change("m3", 3, "hospital", "c03"),
]
# Arrival: later changes first; the m1 relocation at 5 and an early m2 change come last.
OUT_OF_ORDER = [
    [HISTORY[2], HISTORY[3], HISTORY[6]],
    [HISTORY[0], HISTORY[7], HISTORY[5]],
    [HISTORY[1], HISTORY[4]],
]


@pytest.fixture
def dim(tmp_path) -> LakeTable:
    return LakeTable(f"file://{tmp_path}/machines_dim")


def rows(table: LakeTable) -> list[dict]:
    return read_versions(table, SPEC).to_pylist()


def test_out_of_order_batches_build_the_in_order_table(tmp_path, dim):
    in_order = LakeTable(f"file://{tmp_path}/in_order")
    for i, change_ in enumerate(sorted(HISTORY, key=lambda c: c["changed_at"])):
        apply_changes(in_order, SPEC, batch(change_), app_id="dim", batch_id=i)
    for i, arriving in enumerate(OUT_OF_ORDER):
        apply_changes(dim, SPEC, batch(*arriving), app_id="dim", batch_id=i)

    expected = versions(SPEC, [], HISTORY)
    assert rows(dim) == rows(in_order) == expected
    assert chain_errors(SPEC, rows(dim)) == []
    m1 = [(r["location"], r["operator"], r[VALID_FROM], r[VALID_TO], r[IS_CURRENT]) for r in expected[:4]]
    assert m1 == [
        ("station", "acme", at(1), at(5), False),
        ("airport", "acme", at(5), at(9), False),
        ("airport", "brightvend", at(9), at(12), False),
        ("mall", "brightvend", at(12), None, True),
    ]
    assert expected[4][ABSORBED] == [{"changed_at": at(6), "change_id": "c06"}]
    schema = LakeTable.arrow_schema(dim.open())
    assert schema.field(VALID_FROM).type == pa.timestamp("us", tz="UTC")
    assert "received_at" not in schema.names and "changed_at" not in schema.names


def test_a_late_relocation_is_one_merge_that_rewrites_only_the_key(dim):
    first = apply_changes(dim, SPEC, batch(*OUT_OF_ORDER[0], *OUT_OF_ORDER[1]), app_id="dim", batch_id=0)
    assert first.committed and (first.inserted, first.updated, first.deleted) == (6, 0, 0)
    late = apply_changes(dim, SPEC, batch(HISTORY[1]), app_id="dim", batch_id=1)
    # m1 station@1 airport@9 mall@12 + airport@5: the new version ends the one from 1 and absorbs nothing
    assert (late.committed, late.version, late.keys) == (True, first.version + 1, 1)
    assert (late.inserted, late.updated, late.deleted) == (1, 1, 0)
    assert dim.history(1)[0]["operation"] == "MERGE"


def test_a_replayed_batch_changes_nothing(dim):
    applied = apply_changes(dim, SPEC, batch(*HISTORY), app_id="dim", batch_id=7, metadata={"run": "first"})
    assert applied.committed and dim.committed_version("dim") == 7
    before, table = dim.version(), rows(dim)

    replay = apply_changes(dim, SPEC, batch(*HISTORY), app_id="dim", batch_id=7)
    assert (replay.committed, replay.version, replay.inserted) == (False, before, 0)
    older = apply_changes(dim, SPEC, batch(change("m1", 20, "elsewhere", "c20")), app_id="dim", batch_id=3)
    assert not older.committed  # an older batch id of this app is already in the table: skipped unread
    again = apply_changes(dim, SPEC, batch(*reversed(HISTORY)), app_id="dim", batch_id=8)
    assert not again.committed  # changes the table already holds: nothing to write
    without_txn = apply_changes(dim, SPEC, batch(*HISTORY[:3]))
    assert not without_txn.committed
    assert dim.version() == before and rows(dim) == table
    assert dim.history(1)[0]["run"] == "first"  # the last commit is still the first run's


def test_a_late_change_that_absorbs_a_stored_version_deletes_it(dim):
    apply_changes(dim, SPEC, batch(change("m1", 1, "station", "c01"), change("m1", 3, "mall", "c03")))
    apply_changes(dim, SPEC, batch(change("m2", 1, "campus", "c11")))
    before = dim.version()

    result = apply_changes(dim, SPEC, batch(change("m1", 2, "mall", "c02")), app_id="dim", batch_id=1)

    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert result.version == dim.version() == before + 1  # the upserts and the delete: one commit
    assert [(r["machine_id"], r["location"], r[VALID_FROM], r[VALID_TO]) for r in rows(dim)] == [
        ("m1", "station", at(1), at(2)),
        ("m1", "mall", at(2), None),
        ("m2", "campus", at(1), None),
    ]
    assert rows(dim)[1][ABSORBED] == [{"changed_at": at(3), "change_id": "c03"}]
    metrics = dim.history(1)[0]["operationMetrics"]
    assert metrics["num_target_rows_deleted"] == 1 and metrics["num_target_rows_inserted"] == 1
    # and the absorbed change comes back as a version when a change between them arrives
    back = apply_changes(dim, SPEC, batch(change("m1", 2.5, "depot", "c025")))
    assert (back.inserted, back.updated, back.deleted) == (2, 1, 0)
    assert [r["location"] for r in rows(dim) if r["machine_id"] == "m1"] == ["station", "mall", "depot", "mall"]


def test_facts_join_the_version_current_at_their_time(dim):
    apply_changes(dim, SPEC, batch(*HISTORY))
    stored = read_versions(dim, SPEC)
    snapshot = as_of(stored, at(6))
    assert sorted((r["machine_id"], r["location"]) for r in snapshot.to_pylist()) == [
        ("m1", "airport"),
        ("m2", "campus"),
        ("m3", "hospital"),
    ]
    sales = pa.table(
        {
            "machine_id": ["m1", "m1", "m1", "m2", "m9", "m3"],
            "sold_at": [at(0.5), at(4.99), at(5), at(7), at(8), at(3)],
            "amount": [1, 2, 3, 4, 5, 6],
        }
    )
    joined = attach(sales, stored, SPEC, time_column="sold_at", prefix="machine_")
    assert joined.column("amount").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert joined.column("machine_location").to_pylist() == [None, "station", "airport", "library", None, "hospital"]
    assert joined.column("machine_change_id").to_pylist() == [None, "c01", "c05", "c07", None, "c03"]


def test_bad_batches_are_refused_with_a_clear_error(dim):
    with pytest.raises(DimensionInputError, match="without machine_id"):
        apply_changes(dim, SPEC, batch(change("m1", 1, "a", "c1") | {"machine_id": None}))
    with pytest.raises(DimensionInputError, match="lack the columns"):
        apply_changes(dim, SPEC, batch(change("m1", 1, "a", "c1")).drop_columns(["operator"]))
    assert apply_changes(dim, SPEC, batch()).committed is False
