"""The pure rules of the bounded jobs: how a recompute or a correction changes published gold rows,
what the ledger records, and how intervals, durations and predicates are spelled. No Spark."""

from __future__ import annotations

import datetime as dt
import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tidewater.batch.gold_diff import (
    _reconcile_recompute_columns,
    _reconcile_recompute_rows,
    _RowByRow,
    _unique_sorted_keys,
    measure_columns,
    plan_correction,
    reconcile_recompute,
    to_json,
)
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import LEDGER_SCHEMA, change_key, entries_for
from tidewater.batch.predicates import Selection, coerce_entities
from tidewater.errors import ConfigError
from tidewater.times import parse_duration, parse_time

KEYS = ("window_start", "venue_id", "response")
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
SCHEMA = pa.schema(
    [
        ("window_start", pa.timestamp("us", tz="UTC")),
        ("window_end", pa.timestamp("us", tz="UTC")),
        ("venue_id", pa.int64()),
        ("response", pa.string()),
        ("venue_name", pa.string()),
        ("rsvp_count", pa.int64()),
        ("status", pa.string()),
        ("revision", pa.int32()),
    ]
)


def row(minute: int, venue: int, count: int, status: str = "provisional", revision: int = 0, response: str = "yes"):
    start = T0 + dt.timedelta(minutes=minute)
    return {
        "window_start": start,
        "window_end": start + dt.timedelta(minutes=1),
        "venue_id": venue,
        "response": response,
        "venue_name": f"venue {venue}",
        "rsvp_count": count,
        "status": status,
        "revision": revision,
    }


def table(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


def by_key(t: pa.Table) -> dict[tuple, dict]:
    return {(r["window_start"], r["venue_id"], r["response"]): r for r in t.to_pylist()}


# ---- measures ---------------------------------------------------------------------------------------


def test_measures_are_the_columns_that_are_not_keys_windows_or_status():
    assert measure_columns(SCHEMA.names, KEYS) == ("venue_name", "rsvp_count")
    trending = ("window_start", "window_end", "venue_id", "venue_name", "rsvp_count", "yes_count", "status", "revision")
    assert measure_columns(trending, ("window_start", "window_end", "venue_id")) == (
        "venue_name",
        "rsvp_count",
        "yes_count",
    )


def test_json_is_deterministic():
    assert to_json({"b": 2, "a": "é"}) == '{"a":"é","b":2}'
    assert to_json(None) is None
    assert json.loads(to_json({"t": T0})) == {"t": T0.isoformat()}


# ---- recompute --------------------------------------------------------------------------------------


def test_recompute_replaces_provisional_rows_silently():
    old = table(row(0, 1, 5), row(1, 1, 7))
    new = table(row(0, 1, 6, "final"), row(1, 1, 7))
    out = reconcile_recompute(old, new, KEYS)
    assert out.changes == ()
    rows = by_key(out.rows)
    assert rows[(T0, 1, "yes")]["rsvp_count"] == 6
    assert rows[(T0, 1, "yes")]["status"] == "final"
    assert {r["revision"] for r in rows.values()} == {0}


def test_recompute_records_a_changed_final_row_and_bumps_its_revision():
    old = table(row(0, 1, 5, "final", revision=2), row(1, 1, 7, "final"))
    new = table(row(0, 1, 6, "final"), row(1, 1, 7, "final"))
    out = reconcile_recompute(old, new, KEYS)
    (change,) = out.changes
    assert change.kind == "changed"
    assert change.old == {"venue_name": "venue 1", "rsvp_count": 5}
    assert change.new == {"venue_name": "venue 1", "rsvp_count": 6}
    assert change.group == {"venue_id": 1, "response": "yes"}
    assert change.revision == 3
    rows = by_key(out.rows)
    assert rows[(T0, 1, "yes")]["revision"] == 3
    assert rows[(T0 + dt.timedelta(minutes=1), 1, "yes")]["revision"] == 0  # unchanged: kept


def test_recompute_keeps_a_final_row_final_and_records_a_removed_one():
    old = table(row(0, 1, 5, "final", revision=1), row(0, 2, 3, "final"), row(0, 3, 1))
    new = table(row(0, 1, 5, "provisional"))  # venue 2 and 3 no longer in silver
    out = reconcile_recompute(old, new, KEYS)
    assert by_key(out.rows)[(T0, 1, "yes")]["status"] == "final"
    assert by_key(out.rows)[(T0, 1, "yes")]["revision"] == 1
    (removed,) = out.changes  # the provisional venue 3 goes silently
    assert removed.kind == "removed" and removed.new is None and removed.group["venue_id"] == 2


def test_recompute_is_idempotent():
    old = table(row(0, 1, 5, "final"), row(0, 2, 1), row(2, 1, 4, "final", revision=1))
    new = table(row(0, 1, 6, "final"), row(0, 2, 2, "final"), row(1, 9, 1), row(2, 1, 4, "final"))
    first = reconcile_recompute(old, new, KEYS)
    second = reconcile_recompute(first.rows, new, KEYS)
    assert second.changes == ()
    assert second.rows.equals(first.rows)
    keys = [(r["window_start"], r["venue_id"]) for r in first.rows.to_pylist()]
    assert keys == sorted(keys)  # deterministic order


# ---- correction -------------------------------------------------------------------------------------


def test_correction_upserts_missing_and_differing_rows_and_flips_agreeing_ones():
    old = table(
        row(0, 1, 5),  # differs: late events
        row(0, 2, 3),  # agrees, provisional: flip to final
        row(1, 1, 4, "final", revision=1),  # agrees, final: nothing
        row(2, 5, 9),  # silver has nothing for it: left alone
    )
    new = table(
        row(0, 1, 8, "final"),
        row(0, 2, 3, "final"),
        row(1, 1, 4, "final"),
        row(-1, 1, 2, "final"),  # a window only late events fed: missing from gold
    )
    plan = plan_correction(old, new, KEYS)
    assert plan.finalized == 1
    upserts = by_key(plan.rows)
    assert set(upserts) == {(T0, 1, "yes"), (T0, 2, "yes"), (T0 - dt.timedelta(minutes=1), 1, "yes")}
    assert upserts[(T0, 1, "yes")] == row(0, 1, 8, "final", revision=1)
    assert upserts[(T0, 2, "yes")] == row(0, 2, 3, "final", revision=0)
    assert upserts[(T0 - dt.timedelta(minutes=1), 1, "yes")]["revision"] == 1
    kinds = {(c.window_start, c.kind): c for c in plan.changes}
    assert kinds[(T0, "changed")].old["rsvp_count"] == 5 and kinds[(T0, "changed")].new["rsvp_count"] == 8
    missing = kinds[(T0 - dt.timedelta(minutes=1), "missing")]
    assert missing.old is None and missing.new == {"venue_name": "venue 1", "rsvp_count": 2}


def test_correction_rerun_finds_nothing():
    old = table(row(0, 1, 5), row(0, 2, 3))
    new = table(row(0, 1, 8, "final"), row(0, 2, 3, "final"))
    first = plan_correction(old, new, KEYS)
    merged = {**by_key(old), **by_key(first.rows)}
    second = plan_correction(table(*merged.values()), new, KEYS)
    assert second.rows.num_rows == 0 and second.changes == () and second.finalized == 0


# ---- ledger entries ---------------------------------------------------------------------------------


def test_ledger_entries_name_the_row_its_values_and_the_late_events():
    plan = plan_correction(table(row(0, 1, 5)), table(row(0, 1, 8, "final"), row(3, 2, 1, "final")), KEYS)
    late = {change_key(c): 3 for c in plan.changes if c.kind == "changed"}
    at = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
    entries = entries_for("gold/x", plan.changes, late, run_id="run-1", mode="correction", at=at)
    assert len(entries) == 2
    changed = next(e for e in entries if e.old_value is not None)
    assert changed.table == "gold/x" and changed.window_start == T0 and changed.dag_run_id == "run-1"
    assert json.loads(changed.keys) == {"venue_id": 1, "response": "yes"}
    assert json.loads(changed.old_value)["rsvp_count"] == 5 and json.loads(changed.new_value)["rsvp_count"] == 8
    assert changed.late_events == 3
    assert changed.reason == "3 events arrived after the window closed (behind the watermark)"
    missing = next(e for e in entries if e.old_value is None)
    assert missing.late_events == 0 and missing.reason.startswith("window missing from gold")
    recompute = entries_for("gold/x", plan.changes, late, run_id="r", mode="recompute", at=at)
    assert all(e.reason.startswith("recompute: ") for e in recompute)
    assert pa.Table.from_pylist([vars(e) for e in entries], schema=LEDGER_SCHEMA).num_rows == 2


# ---- intervals, durations, predicates ---------------------------------------------------------------


def test_times_accept_offsets_and_z_and_take_naive_as_utc():
    assert parse_time("2026-11-21T10:00:00Z") == T0
    assert parse_time("2026-11-21T11:00:00+01:00") == T0
    assert parse_time("2026-11-21T10:00") == T0
    assert parse_time("2026-11-21T10:00:00.000Z").tzinfo == dt.UTC
    with pytest.raises(ConfigError, match="not an ISO-8601 time"):
        parse_time("yesterday", "start")


def test_interval_must_be_forward_and_knows_its_dates():
    with pytest.raises(ConfigError, match="must be after start"):
        Interval.parse("2026-11-21T10:00Z", "2026-11-21T10:00Z")
    interval = Interval.parse("2026-11-21T23:00Z", "2026-11-23T00:00Z")
    assert interval.dates() == [dt.date(2026, 11, 21), dt.date(2026, 11, 22)]  # end exclusive
    assert str(interval) == "[2026-11-21T23:00:00.000000Z, 2026-11-23T00:00:00.000000Z)"


def test_durations():
    assert parse_duration("2 minutes") == dt.timedelta(minutes=2)
    assert parse_duration("1 minute") == dt.timedelta(minutes=1)
    assert parse_duration("1 hour") == dt.timedelta(hours=1)
    with pytest.raises(ConfigError):
        parse_duration("soon")


def test_selection_predicate_and_entities():
    interval = Interval.parse("2026-11-21T10:00Z", "2026-11-21T11:00Z")
    assert Selection("event_time", interval).sql() == (
        "`event_time` >= '2026-11-21T10:00:00.000000Z' AND `event_time` < '2026-11-21T11:00:00.000000Z'"
    )
    venues = coerce_entities(["10001", "10002", "10001"], "venue_id", pa.int64())
    assert venues == (10001, 10002)
    assert (
        Selection("window_start", interval, "venue_id", venues).sql("t").endswith("AND t.`venue_id` IN (10001, 10002)")
    )
    assert Selection("t", interval, "name", ("O'Brien",)).sql().endswith("`name` IN ('O''Brien')")
    with pytest.raises(ConfigError, match="not a valid"):
        coerce_entities(["abc"], "venue_id", pa.int64())


def test_selection_arrow_filter_picks_the_interval_start_inclusive_end_exclusive():
    interval = Interval.parse("2026-11-21T10:00Z", "2026-11-21T11:00Z")
    at = [
        dt.datetime(2026, 11, 21, 9, 59, 59, 999999, tzinfo=dt.UTC),
        interval.start,
        interval.end - dt.timedelta(microseconds=1),
        interval.end,
    ]
    rows = pa.table(
        {"window_start": pa.array(at, pa.timestamp("us", "UTC")), "venue_id": pa.array([1, 2, 3, 2], pa.int64())}
    )
    picked = ds.dataset(rows).to_table(filter=Selection("window_start", interval).arrow())
    assert picked.column("window_start").to_pylist() == at[1:3]
    only_2 = Selection("window_start", interval, "venue_id", (2,)).arrow()
    assert ds.dataset(rows).to_table(filter=only_2).column("venue_id").to_pylist() == [2]


# ---- rows that merge (sessions) ---------------------------------------------------------------------


def test_correction_removes_rows_the_recompute_no_longer_has_when_rows_merge():
    """Two sessions bridged by a late event: the first grows, the second no longer exists."""
    old = table(row(0, 1, 2, status="final", revision=0), row(45, 1, 2, status="final", revision=2), row(5, 2, 1))
    merged = row(0, 1, 5, status="final")
    supported = table(merged, row(5, 2, 1)).select(list(KEYS))
    plan = plan_correction(old, table(merged, row(5, 2, 1, status="final")), KEYS, supported=supported)
    gone = (T0 + dt.timedelta(minutes=45), 1, "yes")
    assert plan.removed == (gone,)
    kinds = {(c.window_start.minute, c.kind, c.revision) for c in plan.changes}
    assert kinds == {(0, "changed", 1), (45, "removed", 3)}
    assert gone not in by_key(plan.rows) and plan.finalized == 1


def test_correction_never_removes_without_the_supported_keys():
    """Windows do not merge: a row the recompute lacks stays (a correction only adds what was missed)."""
    old = table(row(0, 1, 2, status="final"), row(45, 1, 2, status="final"))
    plan = plan_correction(old, table(row(0, 1, 2, status="final")), KEYS)
    assert plan.removed == () and plan.changes == () and plan.rows.num_rows == 0


def test_an_open_session_is_supported_though_not_final():
    """A row the recompute has, but not closed yet, is not removed (it is only not final)."""
    old = table(row(0, 1, 2))
    plan = plan_correction(old, table(), KEYS, supported=table(row(0, 1, 3)).select(list(KEYS)))
    assert plan.removed == () and plan.changes == ()


def test_a_per_event_row_spans_its_instant():
    """A projection's span is its event time: that is the ledger's window, and not a measure."""
    schema = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("id", pa.string()), ("page", pa.string()),
                        ("status", pa.string()), ("revision", pa.int32())])  # fmt: skip
    old = pa.Table.from_pylist([{"at": T0, "id": "v1", "page": "/a", "status": "provisional", "revision": 0}], schema)
    new = pa.Table.from_pylist([{"at": T0, "id": "v1", "page": "/b", "status": "final", "revision": 0}], schema)
    plan = plan_correction(old, new, ("id",), span=("at", "at"))
    (change,) = plan.changes
    assert (change.window_start, change.window_end, change.group) == (T0, T0, {"id": "v1"})
    assert (change.old, change.new) == ({"page": "/a"}, {"page": "/b"})
    assert measure_columns(new.column_names, ("id",), ("at", "at")) == ("page",)


def test_recompute_decided_in_columns_equals_the_row_by_row_definition():
    """Random published and recomputed windows (finals, provisionals, revisions, missing and removed
    rows, null and NaN measures): the column-wise reconcile gives the definition's rows, in its order,
    and its ledger changes, in its order."""
    schema = SCHEMA.append(pa.field("share", pa.float64()))
    rng = random.Random(7)

    def rows(keys: list[tuple[int, int, str]]) -> pa.Table:
        out = []
        for minute, venue, response in keys:
            r = row(minute, venue, rng.choice([1, 2, 3, None]), rng.choice(["final", "provisional"]), rng.randint(0, 3))
            r["response"] = response
            r["venue_name"] = rng.choice([f"venue {venue}", None])
            r["share"] = rng.choice([0.5, 0.25, float("nan"), None, -0.0, 0.0])
            out.append(r)
        rng.shuffle(out)
        return pa.Table.from_pylist(out, schema=schema)

    universe = [(m, v, r) for m in range(6) for v in range(4) for r in ("yes", "no")]
    kinds: set[str] = set()
    for _ in range(60):
        old = rows(rng.sample(universe, rng.randint(0, 30)))
        new = rows(rng.sample(universe, rng.randint(0, 30)))
        # The column-wise path itself (reconcile_recompute would fall back to the definition on an error).
        got = _reconcile_recompute_columns(old, new, KEYS, ("window_start", "window_end"))
        want = _reconcile_recompute_rows(old, new, KEYS)
        assert _nan_equal(got.rows, want.rows)
        assert got.rows.schema == want.rows.schema
        assert _changes(got) == _changes(want)
        kinds |= {c.kind for c in got.changes}
    assert kinds == {"changed", "removed"}  # the draws reached both kinds of ledger entry


def _nan_equal(a: pa.Table, b: pa.Table) -> bool:
    """Row lists equal, a NaN equal to a NaN."""

    def norm(t: pa.Table) -> list[dict]:
        return [{k: ("nan" if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in t.to_pylist()]

    return norm(a) == norm(b)


def _changes(result) -> list[tuple]:
    nan = lambda v: "nan" if isinstance(v, float) and v != v else v  # noqa: E731
    return [
        (
            c.window_start,
            tuple(c.group.items()),
            c.kind,
            c.revision,
            None if c.old is None else {k: nan(v) for k, v in c.old.items()},
            None if c.new is None else {k: nan(v) for k, v in c.new.items()},
        )
        for c in result.changes
    ]


def test_repeated_or_null_keys_take_the_row_by_row_definition():
    """Keys that repeat in the recomputed rows, in published rows silver still has or no longer has, or
    that are null: the column-wise path declines them, and the result is the definition's."""
    a, b, c = row(0, 1, 2, status="final"), row(5, 1, 3, status="final"), row(10, 2, 1, status="final")
    a_again = row(0, 1, 9, status="final", revision=1)
    null_key = {**row(15, 3, 1), "venue_id": None}
    cases = {
        "repeat in new": (table(a, b), table(a, a_again, c)),
        "repeat in old, still in new": (table(a, a_again, b), table(a, c)),
        "repeat in old, gone from new": (table(a, a_again, b), table(b, c)),
        "null key in new": (table(a), table(a, null_key)),
        "null key in old": (table(a, null_key), table(a)),
    }
    for name, (old, new) in cases.items():
        with pytest.raises(_RowByRow):
            _reconcile_recompute_columns(old, new, KEYS, ("window_start", "window_end"))
        got, want = reconcile_recompute(old, new, KEYS), _reconcile_recompute_rows(old, new, KEYS)
        assert _nan_equal(got.rows, want.rows), name
        assert _changes(got) == _changes(want), name


def test_unique_keys_are_told_from_sorted_neighbours():
    t = table(row(0, 1, 2), row(0, 2, 2), row(5, 1, 2))
    order = pc.sort_indices(t.select(list(KEYS)), sort_keys=[(k, "ascending") for k in KEYS])
    assert _unique_sorted_keys(t, KEYS, order)
    twice = table(row(0, 1, 2), row(5, 1, 2), row(0, 1, 7))
    order = pc.sort_indices(twice.select(list(KEYS)), sort_keys=[(k, "ascending") for k in KEYS])
    assert not _unique_sorted_keys(twice, KEYS, order)
