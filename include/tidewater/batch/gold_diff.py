"""What a recompute or correction does to published gold rows: pure functions over two Arrow tables.

``old`` is what the gold table holds for the selected windows, ``new`` what silver says now (both
with the ``status`` and ``revision`` columns of :meth:`GoldTable.rows`). The functions decide the
rows to write and the changes the ledger must record, so that no published value changes silently.
They do no I/O and need no Spark, which is what lets the rules below be unit-tested exhaustively:

* a row's *measures* are its columns minus the merge keys, the window bounds, status and revision;
* ``revision`` counts the ledger entries of a row: it grows by one with every recorded change;
* once a row is ``final`` it stays final (a window behind the watermark does not reopen).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.pipelines.base import FINAL, STATUS_COLUMNS, WINDOW_SPAN

WINDOW_COLUMNS = WINDOW_SPAN  # the default span: window aggregates
Key = tuple[Any, ...]


def measure_columns(
    columns: Sequence[str], keys: Sequence[str], span: Sequence[str] = WINDOW_COLUMNS
) -> tuple[str, ...]:
    skip = {*keys, *span, *STATUS_COLUMNS}
    return tuple(c for c in columns if c not in skip)


def group_columns(keys: Sequence[str], span: Sequence[str] = WINDOW_COLUMNS) -> tuple[str, ...]:
    """The merge keys that are not window bounds (``venue_id``, ``response``): what the ledger calls keys."""
    return tuple(k for k in keys if k not in span)


def to_json(values: Mapping[str, Any] | None) -> str | None:
    """Deterministic JSON (sorted keys, no spaces) so equal values always give the same ledger text."""
    if values is None:
        return None
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"), default=_json_default, ensure_ascii=False)


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


@dataclass(frozen=True)
class RowChange:
    """One published gold row whose measures change: exactly one ledger entry."""

    window_start: dt.datetime
    window_end: dt.datetime
    group: dict[str, Any]  # non-window key columns -> values
    old: dict[str, Any] | None  # measures before; None: the row was missing
    new: dict[str, Any] | None  # measures after; None: the row is removed
    revision: int  # the row's revision after the change

    @property
    def kind(self) -> str:
        return "missing" if self.old is None else ("removed" if self.new is None else "changed")


@dataclass(frozen=True)
class Reconciled:
    rows: pa.Table  # what to write (schema of ``new``)
    changes: tuple[RowChange, ...]  # what the ledger must record
    finalized: int = 0  # rows whose status alone became final (no ledger entry: values unchanged)
    removed: tuple[Key, ...] = ()  # keys of published rows to delete (their changes are in ``changes``)


def index_rows(table: pa.Table, keys: Sequence[str]) -> dict[Key, dict[str, Any]]:
    return {tuple(row[k] for k in keys): row for row in table.to_pylist()}


def _sort_key(key: Key) -> tuple[tuple[bool, Any], ...]:
    return tuple((v is None, v) for v in key)


def _sorted(rows: Mapping[Key, dict[str, Any]]) -> Iterable[tuple[Key, dict[str, Any]]]:
    return sorted(rows.items(), key=lambda item: _sort_key(item[0]))


def _change(
    row: Mapping[str, Any], keys: Sequence[str], span: Sequence[str], old: Any, new: Any, revision: int
) -> RowChange:
    return RowChange(
        window_start=row[span[0]],
        window_end=row[span[1]],
        group={k: row[k] for k in group_columns(keys, span)},
        old=old,
        new=new,
        revision=revision,
    )


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def reconcile_recompute(
    old: pa.Table, new: pa.Table, keys: Sequence[str], *, span: Sequence[str] = WINDOW_COLUMNS
) -> Reconciled:
    """Rows that replace the selected windows, and the ledger entries that replacement needs.

    Provisional rows are simply replaced (they were published as "may still change"). A final row
    whose measures change, or which silver no longer supports (removed), gets a ledger entry and
    its revision grows; an unchanged row keeps its revision, so rerunning a recompute writes the
    very same rows.

    Decided column-wise in Arrow (an hour of ads has ~400k rows, one per impression: 5 s row by row,
    most of its recompute's gold step); only a final row whose measures Arrow cannot call equal goes
    through the row-by-row comparison, which stays the definition (:func:`_reconcile_recompute_rows`,
    also taken whole when keys are null or repeat, or Arrow cannot join or compare the columns).
    """
    try:
        return _reconcile_recompute_columns(old, new, keys, span)
    except (_RowByRow, KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return _reconcile_recompute_rows(old, new, keys, span=span)


class _RowByRow(Exception):
    """The tables need the row-by-row definition (see :func:`reconcile_recompute`); so does any Arrow
    error of the column-wise path (a key type Arrow cannot group, join or sort) or a missing column."""


def _positions(n: int) -> pa.Array:
    return pa.array(np.arange(n, dtype=np.int64))  # from a range: 0.2 s per 3.6M


def _unique_non_null_keys(table: pa.Table, keys: Sequence[str]) -> bool:
    if any(table.column(k).null_count for k in keys):
        return False
    return table.select(list(keys)).group_by(list(keys)).aggregate([]).num_rows == table.num_rows


def _unique_sorted_keys(table: pa.Table, keys: Sequence[str], order: pa.Array) -> bool:
    """No null key and no key twice, given ``order`` (the rows sorted by ``keys``): equal keys are neighbours.
    A quarter of the cost of grouping on 3.6M rows. Float keys are grouped instead (NaN is not equal to itself)."""
    if any(pa.types.is_floating(table.schema.field(k).type) for k in keys):
        return _unique_non_null_keys(table, keys)
    if any(table.column(k).null_count for k in keys):
        return False
    if table.num_rows < 2:
        return True
    repeated = None
    for k in keys:
        column = table.column(k).take(order).combine_chunks()
        same = pc.equal(column.slice(1), column.slice(0, table.num_rows - 1))
        repeated = same if repeated is None else pc.and_(repeated, same)
    return not pc.any(repeated).as_py()


def _matches(left: pa.Table, right: pa.Table, keys: Sequence[str], how: str) -> pa.Table:
    """``__l`` (and ``__r``) positions of ``left``'s rows joined to ``right``'s on ``keys``."""
    lhs = left.select(list(keys)).append_column("__l", _positions(left.num_rows))
    rhs = right.select(list(keys)).append_column("__r", _positions(right.num_rows))
    return lhs.join(rhs, keys=list(keys), join_type=how)


def _all_equal(new: pa.Table, prior: pa.Table, measures: Sequence[str]) -> pa.Array:
    """Per row: every measure equal on both sides, or null on both (as Python's ``None == None``); NaN,
    a null on one side, or columns Arrow cannot compare: False (the row-by-row comparison decides)."""
    equal = pa.array([True] * new.num_rows, pa.bool_())
    for m in measures:
        a, b = new.column(m), prior.column(m)
        try:
            same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            same = pa.array([False] * new.num_rows, pa.bool_())
        equal = pc.and_(equal, same)
    return equal


def _reconcile_recompute_columns(old: pa.Table, new: pa.Table, keys: Sequence[str], span: Sequence[str]) -> Reconciled:
    order = pc.sort_indices(new.select(list(keys)), sort_keys=[(k, "ascending") for k in keys])
    if not _unique_sorted_keys(new, keys, order) or any(old.column(k).null_count for k in keys):
        raise _RowByRow
    measures = measure_columns(new.column_names, keys, span)
    # For each new row, the position of the published row of its key (null: none). A published key
    # that repeats gives a new row two matches; one silver no longer has is checked with the removals.
    pairs = _matches(new, old, keys, "left outer").sort_by("__l")
    if pairs.num_rows != new.num_rows:
        raise _RowByRow
    prior_at = pairs.column("__r").combine_chunks()
    prior = old.take(prior_at)  # null rows where there is none
    prior_final = pc.fill_null(pc.equal(prior.column("status"), FINAL), False)
    candidates = pc.and_(prior_final, pc.invert(_all_equal(new, prior, measures))).combine_chunks()
    changes: list[RowChange] = []
    to_check = pc.filter(order, candidates.take(order)).to_pylist()  # in key order
    bumped: list[int] = []
    if to_check:
        new_rows = new.take(to_check).to_pylist()
        prior_rows = prior.take(to_check).to_pylist()
        for i, row, was in zip(to_check, new_rows, prior_rows, strict=True):
            old_values = {m: was.get(m) for m in measures}
            new_values = {m: row[m] for m in measures}
            if old_values != new_values:
                bumped.append(i)
                revision = int(was.get("revision") or 0) + 1
                changes.append(_change(row, keys, span, old_values, new_values, revision))
    bump = pc.is_in(_positions(new.num_rows), value_set=pa.array(bumped, pa.int64())).cast(pa.int64())
    revisions = pc.add(pc.fill_null(prior.column("revision").cast(pa.int64()), 0), bump)
    revisions = revisions.cast(new.schema.field("revision").type)
    statuses = pc.if_else(prior_final, pa.scalar(FINAL, new.schema.field("status").type), new.column("status"))
    out = new.set_column(new.schema.get_field_index("status"), new.schema.field("status"), statuses)
    out = out.set_column(out.schema.get_field_index("revision"), new.schema.field("revision"), revisions)
    out = out.take(order)
    # Published rows silver no longer has (no new row matched them: the join above named every matched
    # one, so no second join); a final one is a removal, with an entry.
    positions = _positions(old.num_rows)
    gone = old.take(pc.filter(positions, pc.invert(pc.is_in(positions, value_set=pc.drop_null(prior_at)))))
    if gone.num_rows:
        if not _unique_non_null_keys(gone, keys):
            raise _RowByRow
        finals = [r for r in gone.to_pylist() if r.get("status") == FINAL]
        for prior_row in sorted(finals, key=lambda r: _sort_key(tuple(r[k] for k in keys))):
            old_values = {m: prior_row.get(m) for m in measures}
            changes.append(_change(prior_row, keys, span, old_values, None, int(prior_row.get("revision") or 0) + 1))
    return Reconciled(out, tuple(changes))


def _reconcile_recompute_rows(
    old: pa.Table, new: pa.Table, keys: Sequence[str], *, span: Sequence[str] = WINDOW_COLUMNS
) -> Reconciled:
    """:func:`reconcile_recompute` row by row: the definition."""
    measures = measure_columns(new.column_names, keys, span)
    before = index_rows(old, keys)
    out: list[dict[str, Any]] = []
    changes: list[RowChange] = []
    for key, row in _sorted(index_rows(new, keys)):
        prior = before.pop(key, None)
        revision, status = 0, row["status"]
        if prior is not None:
            revision = int(prior.get("revision") or 0)
            if prior.get("status") == FINAL:
                status = FINAL
                old_values = {m: prior.get(m) for m in measures}
                new_values = {m: row[m] for m in measures}
                if old_values != new_values:
                    revision += 1
                    changes.append(_change(row, keys, span, old_values, new_values, revision))
        out.append({**row, "status": status, "revision": revision})
    for _key, prior in _sorted(before):
        if prior.get("status") == FINAL:
            old_values = {m: prior.get(m) for m in measures}
            changes.append(_change(prior, keys, span, old_values, None, int(prior.get("revision") or 0) + 1))
    return Reconciled(_table(out, new.schema), tuple(changes))


def plan_correction(
    old: pa.Table,
    new: pa.Table,
    keys: Sequence[str],
    *,
    supported: pa.Table | None = None,
    span: Sequence[str] = WINDOW_COLUMNS,
) -> Reconciled:
    """Upserts for closed windows (``new`` holds only those, recomputed from silver).

    Affected rows (measures differ, or the window is missing from gold because only late events
    fed it) become final with revision + 1 and one ledger entry each; unchanged rows that are not
    final yet have their status alone flipped to final. Gold rows silver does not support are left
    alone (a correction adds what the stream missed), unless ``supported`` is given: the keys of every
    row the recompute has, closed or not, for a kind whose rows merge (sessions bridged by a late
    event). A published row whose key is not among them no longer exists: it is removed, with one
    ledger entry. Nothing to do gives no rows and no removals, so a rerun commits nothing.
    """
    measures = measure_columns(new.column_names, keys, span)
    before = index_rows(old, keys)
    out: list[dict[str, Any]] = []
    changes: list[RowChange] = []
    finalized = 0
    for key, row in _sorted(index_rows(new, keys)):
        prior = before.get(key)
        new_values = {m: row[m] for m in measures}
        if prior is None:
            out.append({**row, "status": FINAL, "revision": 1})
            changes.append(_change(row, keys, span, None, new_values, 1))
            continue
        old_values = {m: prior.get(m) for m in measures}
        revision = int(prior.get("revision") or 0)
        if old_values != new_values:
            out.append({**row, "status": FINAL, "revision": revision + 1})
            changes.append(_change(row, keys, span, old_values, new_values, revision + 1))
        elif prior.get("status") != FINAL:
            out.append({**prior, "status": FINAL, "revision": revision})
            finalized += 1
    removed: list[Key] = []
    if supported is not None:
        exists = {tuple(row[k] for k in keys) for row in supported.select(list(keys)).to_pylist()}
        for key, prior in _sorted(before):
            if key not in exists:
                old_values = {m: prior.get(m) for m in measures}
                changes.append(_change(prior, keys, span, old_values, None, int(prior.get("revision") or 0) + 1))
                removed.append(key)
    return Reconciled(_table(out, new.schema), tuple(changes), finalized, tuple(removed))
