"""A versioned dimension (slowly changing dimension, type 2) from a keyed, sequenced changelog.

Pure: plain rows in, plain rows out (no Spark, no I/O), so the same rules run on any batch and are
tested without a table. :mod:`tidewater.lake.dimensions` reads the stored versions of a batch's keys,
calls :func:`plan` and commits the answer as one Delta MERGE.

The model follows Databricks' AUTO CDC (``create_auto_cdc_flow(keys=..., sequence_by=...,
stored_as_scd_type=2)``): changes are keyed (``spec.key``) and ordered by a sequence
(``spec.sequence``, a timestamp), never by arrival; each version records the sequence at which it
became current (``valid_from``, AUTO CDC's ``__START_AT``) and the one at which it stopped
(``valid_to``, ``__END_AT``; null for the current version). AUTO CDC leaves two cases open ("there
should be one distinct update per key at each sequencing value"); here they are decided, so that the
table is a function of the *set* of changes seen, whatever their arrival order and batching:

* **Same (key, sequence)**: the change with the greater ``change_id`` wins (then, only for a
  change id re-sent with other attributes, the greater attribute tuple). A re-sent identical change is
  a no-op; an identical one with a greater id only relabels the version's ``change_id``.
* **No real change**: a change whose attributes equal the version current at its sequence opens no
  version; it is *absorbed* into that version (the earlier ``valid_from`` wins). All attributes are
  tracked (AUTO CDC's ``track_history_column_list`` = every attribute).
* **Absorbed changes are remembered** in the version's ``absorbed`` column (their sequence and change
  id; their attributes are the version's). Without it the table would depend on arrival order: after
  ``a@1, a@3`` the table holds one version ``a`` from 1; when ``b@2`` arrives late, the truth is
  ``a@1, b@2, a@3``, and only the remembered ``a@3`` can reappear as a version.
  Conversely a late change can make a stored version disappear (``a@1, b@3`` then ``b@2``: the
  version from 3 is absorbed into the new one from 2), so the writer must be able to delete versions.

Null keys, sequences and change ids are refused (as AUTO CDC refuses null keys and sequences).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

VALID_FROM = "valid_from"
VALID_TO = "valid_to"
IS_CURRENT = "is_current"
ABSORBED = "absorbed"
TIMESTAMP = pa.timestamp("us", tz="UTC")

Row = dict[str, Any]


@dataclass(frozen=True)
class Scd2Spec:
    """How changes are keyed, ordered, identified, and which of their columns a version holds."""

    key: str  # e.g. "machine_id"
    sequence: str  # e.g. "changed_at" (a timestamp: a version's valid_from)
    attributes: tuple[str, ...]  # e.g. ("location", "model", "operator")
    change_id: str  # e.g. "change_id" (the record id of a change: breaks ties at one sequence)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", tuple(self.attributes))
        names = [self.key, self.sequence, self.change_id, *self.attributes]
        if not self.attributes:
            raise ValueError("an SCD2 spec needs at least one attribute")
        if len(set(names)) != len(names):
            raise ValueError(f"SCD2 spec columns must be distinct: {names}")
        clash = sorted(set(names) & {VALID_FROM, VALID_TO, IS_CURRENT, ABSORBED})
        if clash:
            raise ValueError(f"SCD2 spec columns {clash} collide with the version columns")

    @property
    def change_columns(self) -> tuple[str, ...]:
        """The columns a change must carry."""
        return (self.key, self.sequence, *self.attributes, self.change_id)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of a stored version, in table order."""
        return (self.key, *self.attributes, VALID_FROM, VALID_TO, IS_CURRENT, self.change_id, ABSORBED)

    def schema(self, changes: pa.Schema) -> pa.Schema:
        """The dimension table's schema for changes of schema ``changes`` (all columns nullable)."""
        missing = [name for name in self.change_columns if name not in changes.names]
        if missing:
            raise ValueError(f"changes lack the columns {missing}")
        change_id = changes.field(self.change_id).type
        absorbed = pa.list_(pa.struct([(self.sequence, TIMESTAMP), (self.change_id, change_id)]))
        return pa.schema(
            [
                (self.key, changes.field(self.key).type),
                *[(name, changes.field(name).type) for name in self.attributes],
                (VALID_FROM, TIMESTAMP),
                (VALID_TO, TIMESTAMP),
                (IS_CURRENT, pa.bool_()),
                (self.change_id, change_id),
                (ABSORBED, absorbed),
            ]
        )


@dataclass(frozen=True)
class Scd2Plan:
    """What a batch does to the versions of its keys."""

    versions: list[Row]  # every version of the batch's keys afterwards, by (key, valid_from)
    upserts: list[Row]  # versions that are new or whose stored row changed (MERGE on key + valid_from)
    deletes: list[Row]  # {key, valid_from} of stored versions that no longer exist
    inserted: int  # upserts that are new versions
    updated: int  # upserts that replace a stored row
    keys: int  # keys in the batch

    @property
    def deleted(self) -> int:
        return len(self.deletes)

    @property
    def empty(self) -> bool:
        return not self.upserts and not self.deletes


@dataclass(frozen=True)
class _Change:
    sequence: dt.datetime
    change_id: Any
    attributes: tuple[Any, ...]

    def beats(self, other: _Change) -> bool:
        """Which of two changes at one (key, sequence) wins: a total order, so any arrival order agrees."""
        return (self.change_id, _order(self.attributes)) > (other.change_id, _order(other.attributes))


def versions(spec: Scd2Spec, existing: Iterable[Mapping[str, Any]], changes: Iterable[Mapping[str, Any]]) -> list[Row]:
    """All versions of the keys in ``changes``, given those keys' ``existing`` versions (rows as stored,
    as returned by a previous call; rows of other keys are ignored), sorted by (key, valid_from).

    The result depends only on the set of changes behind ``existing`` plus ``changes``: applying a
    changelog in any order, in any batches, each call fed the previous result, gives the same rows.
    """
    resolved = _resolve(spec, existing, list(changes))
    return [row for key in sorted(resolved) for row in _build(spec, key, resolved[key])]


def plan(spec: Scd2Spec, existing: Iterable[Mapping[str, Any]], changes: Iterable[Mapping[str, Any]]) -> Scd2Plan:
    """:func:`versions` plus what must be written: the rows to upsert and the versions to delete."""
    changes = list(changes)
    keys = {_key(spec, change) for change in changes}
    old = [row for row in existing if row.get(spec.key) in keys]
    new = versions(spec, old, changes)
    upserts, deletes = changed_rows(spec, old, new)
    stored = {(row[spec.key], _instant(row[VALID_FROM])) for row in old}
    inserted = sum((row[spec.key], row[VALID_FROM]) not in stored for row in upserts)
    return Scd2Plan(new, upserts, deletes, inserted, len(upserts) - inserted, len(keys))


def changed_rows(
    spec: Scd2Spec, old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]
) -> tuple[list[Row], list[Row]]:
    """``(upserts, deletes)`` that turn the stored ``old`` versions into ``new`` for the keys of ``new``:
    the rows of ``new`` that are not stored as they are, and the (key, valid_from) of the stored rows of
    those keys that ``new`` no longer has. Stored rows of other keys are left alone."""
    new = [dict(row) for row in new]
    keys = {row[spec.key] for row in new}
    stored = {(row[spec.key], _instant(row[VALID_FROM])): row for row in old if row[spec.key] in keys}
    upserts = [row for row in new if not _same(spec, stored.get((row[spec.key], row[VALID_FROM])), row)]
    kept = {(row[spec.key], row[VALID_FROM]) for row in new}
    deletes = [{spec.key: key, VALID_FROM: start} for key, start in sorted(stored) if (key, start) not in kept]
    return upserts, deletes


def chain_errors(spec: Scd2Spec, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """What is wrong with a set of versions (empty when nothing is): per key, valid_from strictly
    increasing, each valid_to the next valid_from (no gap, no overlap), exactly one current version
    (the last, valid_to null), consecutive versions differing in their attributes, and absorbed
    changes inside their version's interval."""
    errors: list[str] = []
    by_key: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(row[spec.key], []).append(row)
    for key, chain in by_key.items():
        chain = sorted(chain, key=lambda row: _instant(row[VALID_FROM]))
        current = sum(bool(row[IS_CURRENT]) for row in chain)
        if current != 1:
            errors.append(f"{key}: {current} current versions")
        for i, row in enumerate(chain):
            start, end = _instant(row[VALID_FROM]), _instant_or_none(row[VALID_TO])
            following = _instant(chain[i + 1][VALID_FROM]) if i + 1 < len(chain) else None
            if end != following:
                errors.append(f"{key}: version from {start} ends at {end}, the next starts at {following}")
            if bool(row[IS_CURRENT]) != (end is None):
                errors.append(f"{key}: version from {start} has is_current={row[IS_CURRENT]} and valid_to={end}")
            if i and _attributes(spec, row) == _attributes(spec, chain[i - 1]):
                errors.append(f"{key}: version from {start} repeats the attributes of the previous one")
            for entry in row[ABSORBED] or ():
                at = _instant(entry[spec.sequence])
                if not (start < at and (end is None or at < end)):
                    errors.append(f"{key}: version from {start} absorbed a change at {at}, outside it")
    return errors


def version_at(
    spec: Scd2Spec, rows: Iterable[Mapping[str, Any]], key: Any, at: dt.datetime
) -> Mapping[str, Any] | None:
    """The version of ``key`` current at ``at``: ``valid_from <= at < coalesce(valid_to, +inf)``."""
    at = _instant(at)
    for row in rows:
        end = _instant_or_none(row[VALID_TO])
        if row[spec.key] == key and _instant(row[VALID_FROM]) <= at and (end is None or at < end):
            return row
    return None


# ---- internals -----------------------------------------------------------------------------------


def _resolve(
    spec: Scd2Spec, existing: Iterable[Mapping[str, Any]], changes: Sequence[Mapping[str, Any]]
) -> dict[Any, dict[dt.datetime, _Change]]:
    """Per key of ``changes``: the winning change at each sequence, from the stored versions (each
    version's own change and its absorbed ones) and the new changes."""
    resolved: dict[Any, dict[dt.datetime, _Change]] = {_key(spec, change): {} for change in changes}

    def offer(key: Any, change: _Change) -> None:
        held = resolved[key].get(change.sequence)
        if held is None or change.beats(held):
            resolved[key][change.sequence] = change

    for row in existing:
        key = row[spec.key]
        if key not in resolved:
            continue
        attributes = _attributes(spec, row)
        offer(key, _Change(_instant(row[VALID_FROM]), _required(spec.change_id, row), attributes))
        for entry in row[ABSORBED] or ():
            offer(key, _Change(_instant(entry[spec.sequence]), _required(spec.change_id, entry), attributes))
    for change in changes:
        sequence = _instant(_required(spec.sequence, change))
        offer(_key(spec, change), _Change(sequence, _required(spec.change_id, change), _attributes(spec, change)))
    return resolved


def _build(spec: Scd2Spec, key: Any, changes: Mapping[dt.datetime, _Change]) -> list[Row]:
    """The versions of one key from its winning changes: consecutive equal attributes collapse into
    the earliest; each version ends where the next begins."""
    built: list[Row] = []
    previous: tuple[Any, ...] | None = None
    for sequence in sorted(changes):
        change = changes[sequence]
        if built and change.attributes == previous:
            built[-1][ABSORBED].append({spec.sequence: sequence, spec.change_id: change.change_id})
            continue
        built.append(
            {
                spec.key: key,
                **dict(zip(spec.attributes, change.attributes, strict=True)),
                VALID_FROM: sequence,
                VALID_TO: None,
                IS_CURRENT: True,
                spec.change_id: change.change_id,
                ABSORBED: [],
            }
        )
        previous = change.attributes
    for row, following in itertools.pairwise(built):
        row[VALID_TO] = following[VALID_FROM]
        row[IS_CURRENT] = False
    return built


def _same(spec: Scd2Spec, stored: Mapping[str, Any] | None, row: Mapping[str, Any]) -> bool:
    """Whether a stored row already holds ``row`` (timestamps compared as instants)."""
    if stored is None:
        return False
    return _comparable(spec, stored) == _comparable(spec, row)


def _comparable(spec: Scd2Spec, row: Mapping[str, Any]) -> tuple[Any, ...]:
    absorbed = tuple((_instant(e[spec.sequence]), e[spec.change_id]) for e in row[ABSORBED] or ())
    return (
        row[spec.key],
        _attributes(spec, row),
        _instant(row[VALID_FROM]),
        _instant_or_none(row[VALID_TO]),
        bool(row[IS_CURRENT]),
        row[spec.change_id],
        absorbed,
    )


def _attributes(spec: Scd2Spec, row: Mapping[str, Any]) -> tuple[Any, ...]:
    try:
        return tuple(row[name] for name in spec.attributes)
    except KeyError as exc:
        raise ValueError(f"a row lacks the attribute {exc.args[0]!r}: {dict(row)}") from None


def _key(spec: Scd2Spec, row: Mapping[str, Any]) -> Any:
    return _required(spec.key, row)


def _required(name: str, row: Mapping[str, Any]) -> Any:
    value = row.get(name)
    if value is None:
        raise ValueError(f"a change without {name}: {dict(row)} (keys, sequences and change ids must not be null)")
    return value


def _instant(value: Any) -> dt.datetime:
    """A sequence value as an aware UTC datetime (a naive one is taken as UTC)."""
    if not isinstance(value, dt.datetime):
        raise ValueError(f"a sequence must be a timestamp, not {value!r}")
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _instant_or_none(value: Any) -> dt.datetime | None:
    return None if value is None else _instant(value)


def _order(attributes: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    """A sort key for attribute tuples that holds nulls (null first)."""
    return tuple((value is not None, 0 if value is None else value) for value in attributes)
