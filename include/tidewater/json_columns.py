"""Payloads that hold the strict JSON contract, as the typed Arrow columns Spark's ``from_json`` makes of them.

Why: Spark's parse of a record in the JVM (``from_json``) builds a reader with an 8 KiB buffer per
record and looks the timestamp's zone up with a regular expression: a quarter of ads' streaming JVM's
CPU and 37% of what it allocated while draining (the twenty-sixth stop's profile). The Kafka reader
decodes every payload anyway for its strict check (:mod:`tidewater.strict_json`); this module turns what
that decode gave into the columns the parse needs, in the reader's Python worker, so the JVM does not
parse the record a second time.

Exact, or not at all: a record is typed here only where every value comes out as Spark's would, bit for
bit. A record holding any other value (a timestamp not in the canonical ISO 8601 form with an offset,
an integer outside a 32-bit field), or one that breaks the strict contract, gets a null struct, and
the parse hands it to ``from_json`` as before (:func:`tidewater.transforms.parse_payload`). A schema
with a type this module does not type (dates, decimals, floats, arrays, maps, ...) is not typed at all
(:func:`typable`). ``tests/integration/test_hostile_records.py`` holds both parses to each other on
hostile payloads; ``tests/unit/test_json_columns.py`` the rules here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from operator import attrgetter
from typing import Any

import pyarrow as pa

from tidewater import strict_json

# ``pyarrow.compute`` (and ``pa.array`` of a list) import pandas, ~50 MiB: the functions that compute import
# it themselves, so that a process that only reads the names and types here (a streaming-source runner,
# whose Kafka source parses its options) does not load it. A task worker has it preloaded.

# The column the reader adds: each payload typed (see module doc), null where ``from_json`` must parse it.
PARSED_COLUMN = "_parsed"
# Spark's corrupt-record field of the parse (see tidewater.transforms.parse_payload): a typed record has none.
CORRUPT_FIELD = "_corrupt_record"

# Spark type (its JSON name) -> (Arrow type, Spark DDL type) of the types typed exactly.
_SCALARS: dict[str, tuple[pa.DataType, str]] = {
    "string": (pa.string(), "STRING"),
    "long": (pa.int64(), "BIGINT"),
    "integer": (pa.int32(), "INT"),
    "double": (pa.float64(), "DOUBLE"),
    "boolean": (pa.bool_(), "BOOLEAN"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "TIMESTAMP"),
}
# The one timestamp spelling typed here, which Spark's parser (``stringToTimestamp``) and Arrow's read
# the same: a four-digit year from 1000, a time to the second with up to six fractional digits, and Z
# or an offset within Java's +-18:00. The day of the month is checked apart (:func:`_real_days`).
_TIMESTAMP = (
    r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9])$"
)
_INT32 = (-(2**31), 2**31 - 1)
_CHUNK = 5_000


def typable(schema_json: str) -> bool:
    """Whether every field of the Spark schema ``schema_json`` (``StructType.json()``) is typed here."""
    return _typable(json.loads(schema_json))


def _typable(spark_type: Any) -> bool:
    if isinstance(spark_type, dict):
        return spark_type.get("type") == "struct" and all(_typable(f["type"]) for f in spark_type["fields"])
    return spark_type in _SCALARS


def with_corrupt_field(schema_json: str) -> str:
    """The parse's schema (``StructType.json()``): the payload's fields, then :data:`CORRUPT_FIELD`, a string.
    What Spark's ``from_json`` gives and what the typed column holds; :func:`arrow_type` and
    :func:`spark_ddl` spell it for Arrow and for a data source's schema, ``tidewater.transforms`` as a
    ``StructType``."""
    struct = json.loads(schema_json)
    corrupt = {"name": CORRUPT_FIELD, "type": "string", "nullable": True, "metadata": {}}
    return json.dumps({**struct, "fields": [*struct["fields"], corrupt]})


@lru_cache(maxsize=16)
def arrow_type(schema_json: str) -> pa.StructType:
    """The parsed column's Arrow type (:func:`with_corrupt_field` of the payload's schema)."""
    return pa.struct(_arrow_fields(json.loads(with_corrupt_field(schema_json))))


def _arrow_fields(struct: dict[str, Any]) -> list[pa.Field]:
    return [pa.field(f["name"], _arrow(f["type"])) for f in struct["fields"]]


def _arrow(spark_type: Any) -> pa.DataType:
    return pa.struct(_arrow_fields(spark_type)) if isinstance(spark_type, dict) else _SCALARS[spark_type][0]


def spark_ddl(schema_json: str) -> str:
    """The parsed column's Spark DDL type (for a data source's schema): :func:`with_corrupt_field` too."""
    return _ddl(json.loads(with_corrupt_field(schema_json)))


def _ddl(spark_type: Any) -> str:
    if not isinstance(spark_type, dict):
        return _SCALARS[spark_type][1]
    fields = ", ".join(f"`{f['name'].replace('`', '``')}`: {_ddl(f['type'])}" for f in spark_type["fields"])
    return f"STRUCT<{fields}>"


def reasons_and_parsed(payloads: pa.Array | pa.ChunkedArray, schema_json: str) -> tuple[pa.Array, pa.StructArray]:
    """Each payload's strict-contract reason (:func:`tidewater.strict_json.violation`) and its typed
    fields (null where the reason is not, or where ``from_json`` must type it)."""
    if len(payloads) > _CHUNK:  # a chunk's decoded objects at a time: a worker's heap holds no more
        parts = [reasons_and_parsed(payloads.slice(at, _CHUNK), schema_json) for at in range(0, len(payloads), _CHUNK)]
        return pa.concat_arrays([r for r, _ in parts]), pa.concat_arrays([p for _, p in parts])
    reasons, decoded = strict_json.reasons_and_decoded(payloads, schema_json)
    return reasons, parsed(decoded, schema_json)


def parsed(decoded: Sequence[Any], schema_json: str) -> pa.StructArray:
    """The typed column of :func:`tidewater.strict_json.reasons_and_decoded`'s objects (None: not typed)."""
    import pyarrow.compute as pc

    schema, objects = json.loads(schema_json), list(decoded)
    try:
        children, exact = _struct_children(objects, schema)
    except Exception:  # typing must never fail a read: from_json parses this batch alone, as it always did
        # (a value Arrow would not take as it is, say a lone surrogate in a string)
        return pa.nulls(len(objects), arrow_type(schema_json))  # type: ignore[return-value]
    typed = pc.invert(_is_none(objects))
    if exact is not None:
        typed = pc.and_(typed, exact)
    children.append(pa.nulls(len(objects), pa.string()))  # no corrupt record
    return pa.StructArray.from_arrays(children, fields=list(arrow_type(schema_json)), mask=pc.invert(typed))


def _is_none(values: Sequence[Any]) -> pa.Array:
    return pa.array([value is None for value in values], pa.bool_())


def _struct_children(objects: list[Any], struct: dict[str, Any]) -> tuple[list[pa.Array], pa.Array | None]:
    """The typed child columns of ``objects`` (decoded structs, or None) and, per row, whether all of
    them are exact (a None row's children are null, and exact); None when every row is."""
    import pyarrow.compute as pc

    blank = strict_json.blank(json.dumps(struct, sort_keys=True))
    rows = [blank if value is None else value for value in objects]
    exact = None
    children = []
    for field in struct["fields"]:
        column, column_exact = _column(list(map(attrgetter(field["name"]), rows)), field["type"])
        children.append(column)
        if column_exact is not None:
            exact = column_exact if exact is None else pc.and_(exact, column_exact)
    return children, exact


def _column(values: list[Any], spark_type: Any) -> tuple[pa.Array, pa.Array | None]:
    """One field's values as its Arrow column, and per row whether the value is Spark's exactly (None:
    every value is; the types with no value Spark would read otherwise)."""
    import pyarrow.compute as pc

    if isinstance(spark_type, dict):
        children, exact = _struct_children(values, spark_type)
        null = _is_none(values)
        column = pa.StructArray.from_arrays(children, fields=_arrow_fields(spark_type), mask=null)
        return column, None if exact is None else pc.or_(null, exact)
    if spark_type == "timestamp":
        return _timestamps(pa.array(values, pa.string()))
    if spark_type == "integer":  # the contract holds integers to 64 bits; Spark's int field to 32
        wide = pa.array(values, pa.int64())
        fits = pc.and_(pc.greater_equal(wide, _INT32[0]), pc.less_equal(wide, _INT32[1]))
        return pc.cast(pc.if_else(fits, wide, None), pa.int32()), pc.fill_null(fits, True)
    return pa.array(values, _SCALARS[spark_type][0]), None


def _timestamps(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    import pyarrow.compute as pc

    pattern = pc.match_substring_regex(text, _TIMESTAMP)
    canonical = pc.if_else(pattern, text, "1970-01-01T00:00:00Z")  # null stays null
    canonical = pc.and_(pattern, _real_days(canonical))
    column = pc.cast(pc.if_else(canonical, text, None), pa.timestamp("us", tz="UTC"))
    return column, pc.fill_null(canonical, True)


_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _real_days(text: pa.Array) -> pa.Array:
    """Whether the ``YYYY-MM-DD`` each text (of :data:`_TIMESTAMP`'s form) starts with is a day of the
    calendar: the pattern lets 30 February through, which Spark's parser refuses and Arrow's cast
    fails on."""
    import pyarrow.compute as pc

    year, month, day = (
        pc.cast(pc.utf8_slice_codeunits(text, start, start + width), pa.int32())
        for start, width in ((0, 4), (5, 2), (8, 2))
    )
    leap = pc.and_(
        pc.equal(pc.remainder(year, 4), 0),
        pc.or_(pc.not_equal(pc.remainder(year, 100), 0), pc.equal(pc.remainder(year, 400), 0)),
    )
    last = pc.add(
        pc.take(pa.array(_DAYS_IN_MONTH, pa.int32()), month), pc.cast(pc.and_(leap, pc.equal(month, 2)), pa.int32())
    )
    return pc.less_equal(day, last)
