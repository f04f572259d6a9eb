"""Versioned dimension tables in the lake: apply a batch of changes as one idempotent Delta MERGE.

The rules live in :mod:`tidewater.scd2` (pure); this module reads and writes. For a batch of changes,
:func:`apply_changes` reads the stored versions of the batch's keys (as :meth:`LakeTable.lookup` would), asks
:func:`tidewater.scd2.plan` for every version of those keys, and commits only the difference in ONE
MERGE on (key, valid_from): new and changed versions are upserted, versions that a late change made
disappear are deleted (:meth:`LakeTable.merge` with ``delete=``). With ``(app_id, batch_id)`` the
commit carries a Delta app transaction, and a batch already committed is skipped without reading.

Re-applying changes the table already holds changes nothing (no commit), with or without an app
transaction: the table depends only on the set of changes applied, not on their order or batching.

One writer per dimension table at a time: the read of the stored versions and the MERGE are two
snapshots, so a concurrent writer of the same keys in between would be overwritten. Writers that may
overlap must hold the table's lock (:mod:`tidewater.lake.locks`) around this call.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidewater import scd2
from tidewater.errors import TidewaterError
from tidewater.lake.tables import LakeTable
from tidewater.scd2 import TIMESTAMP, VALID_FROM, VALID_TO, Scd2Spec


class DimensionInputError(TidewaterError):
    """A batch of changes cannot be applied to a dimension (missing columns, null keys or sequences)."""


@dataclass(frozen=True)
class DimensionResult:
    committed: bool  # False when nothing changed or the batch was already committed
    version: int  # the table's Delta version afterwards
    changes: int  # change rows in the batch
    keys: int  # distinct keys in the batch
    inserted: int = 0  # new versions
    updated: int = 0  # stored versions rewritten (valid_to, is_current, change_id or absorbed changes)
    deleted: int = 0  # stored versions that no longer exist (absorbed into an earlier one)


def dimension_schema(spec: Scd2Spec, changes: pa.Schema) -> pa.Schema:
    """The table's schema: key, attributes, valid_from, valid_to, is_current, change_id, absorbed."""
    try:
        return spec.schema(changes)
    except ValueError as exc:
        raise DimensionInputError(f"{exc}: a change needs {list(spec.change_columns)}") from None


def apply_changes(
    table: LakeTable,
    spec: Scd2Spec,
    changes: pa.Table,
    *,
    app_id: str | None = None,
    batch_id: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> DimensionResult:
    """Apply a batch of changes (columns ``spec.change_columns``; others are ignored) to the dimension
    at ``table``, creating it on first use. See the module's docstring for the guarantees."""
    schema = dimension_schema(spec, changes.schema)
    opened = table.ensure(schema, description=f"SCD2 versions of {spec.key} by {spec.sequence}")
    version = int(opened.version())
    if app_id is not None and batch_id is not None and table.already_committed(app_id, batch_id, opened):
        return DimensionResult(False, version, changes.num_rows, 0)
    changes = _normalized(spec, changes)
    if changes.num_rows == 0:
        return DimensionResult(False, version, 0, 0)
    stored_schema = LakeTable.arrow_schema(opened)
    keys = pc.unique(changes.column(spec.key)).cast(stored_schema.field(spec.key).type)
    existing = _stored_versions(opened, spec, keys)
    try:
        planned = scd2.plan(spec, existing.to_pylist(), changes.to_pylist())
    except ValueError as exc:
        raise DimensionInputError(f"cannot apply changes to {table.uri}: {exc}") from None
    counts = {"inserted": planned.inserted, "updated": planned.updated, "deleted": planned.deleted}
    if planned.empty:
        return DimensionResult(False, version, changes.num_rows, planned.keys)
    columns = pa.schema([stored_schema.field(name) for name in spec.columns])
    upserts = pa.Table.from_pylist(planned.upserts, schema=columns)
    keyed = pa.schema([columns.field(spec.key), columns.field(VALID_FROM)])
    deletes = pa.Table.from_pylist(planned.deletes, schema=keyed)
    result = table.merge(
        upserts,
        keys=[spec.key, VALID_FROM],
        app_id=app_id,
        batch_id=batch_id,
        metadata=metadata,
        delete=deletes if deletes.num_rows else None,
    )
    if not result.committed:
        counts = dict.fromkeys(counts, 0)
    return DimensionResult(result.committed, result.version, changes.num_rows, planned.keys, **counts)


def read_versions(table: LakeTable, spec: Scd2Spec, *, version: int | None = None) -> pa.Table:
    """Every stored version (of a Delta snapshot), sorted by (key, valid_from)."""
    rows = table.open(version=version).to_pyarrow_table(columns=list(spec.columns))
    return rows.sort_by([(spec.key, "ascending"), (VALID_FROM, "ascending")])


def as_of(versions: pa.Table, at: dt.datetime) -> pa.Table:
    """The versions current at ``at`` (one per key that existed then):
    ``valid_from <= at < coalesce(valid_to, +inf)``."""
    instant = pa.scalar(at if at.tzinfo else at.replace(tzinfo=dt.UTC), TIMESTAMP)
    started = pc.less_equal(versions.column(VALID_FROM), instant)
    not_ended = pc.or_kleene(pc.is_null(versions.column(VALID_TO)), pc.greater(versions.column(VALID_TO), instant))
    return versions.filter(pc.and_kleene(started, not_ended))


def attach(facts: pa.Table, versions: pa.Table, spec: Scd2Spec, *, time_column: str, prefix: str = "") -> pa.Table:
    """``facts`` with the attributes (and ``change_id``) of the version of their key current at their
    ``time_column``; nulls where no version was current (a left join, the facts' order kept)."""
    row = "__tidewater_fact_row"
    taken = [spec.change_id, *spec.attributes]
    indexed = facts.append_column(row, pa.array(range(facts.num_rows), pa.int64()))
    at = indexed.column(time_column).cast(TIMESTAMP)
    probe = pa.table({spec.key: indexed.column(spec.key), "__at": at, row: indexed.column(row)})
    candidates = versions.select([spec.key, VALID_FROM, VALID_TO, *taken])
    joined = probe.join(candidates, keys=spec.key, join_type="inner")
    started = pc.less_equal(joined.column(VALID_FROM), joined.column("__at"))
    not_ended = pc.or_kleene(
        pc.is_null(joined.column(VALID_TO)), pc.greater(joined.column(VALID_TO), joined.column("__at"))
    )
    matched = joined.filter(pc.and_kleene(started, not_ended)).select([row, *taken])
    matched = matched.rename_columns([row, *(prefix + name for name in taken)])
    result = indexed.join(matched, keys=row, join_type="left outer").sort_by(row)
    return result.drop_columns([row])


def _stored_versions(opened: DeltaTable, spec: Scd2Spec, keys: pa.Array) -> pa.Table:
    """The stored versions of ``keys`` in the snapshot ``opened``: the key column of every live file,
    the other columns only of the files that hold one of ``keys``.

    Not :meth:`LakeTable.lookup`: its filtered dataset scan fails on files written by a delta-rs MERGE
    (``Function 'greater_equal' has no kernel matching input types (string, string_view)``: the file
    statistics become string literals, the files' columns string_view), so files are read unfiltered
    in the table's schema and filtered here.
    """
    dataset = opened.to_pyarrow_dataset()
    columns = list(spec.columns)
    found = [dataset.schema.empty_table().select(columns)]
    for fragment in dataset.get_fragments():
        held = fragment.to_table(columns=[spec.key], schema=dataset.schema).column(0)
        if not pc.any(pc.is_in(held, value_set=keys)).as_py():
            continue
        rows = fragment.to_table(columns=columns, schema=dataset.schema)
        found.append(rows.filter(pc.is_in(rows.column(spec.key), value_set=keys)))
    return pa.concat_tables(found)


def _normalized(spec: Scd2Spec, changes: pa.Table) -> pa.Table:
    """The change columns only, the sequence as UTC microseconds; null keys, sequences and ids refused."""
    changes = changes.select(list(spec.change_columns))
    for name in (spec.key, spec.sequence, spec.change_id):
        nulls = changes.column(name).null_count
        if nulls:
            raise DimensionInputError(
                f"{nulls} change(s) without {name}: every change needs a key, a sequence and a change id"
            )
    try:
        sequence = changes.column(spec.sequence).cast(TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DimensionInputError(f"sequence column {spec.sequence!r} is not a timestamp: {exc}") from None
    return changes.set_column(changes.schema.get_field_index(spec.sequence), spec.sequence, sequence)
