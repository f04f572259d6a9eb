"""Literals and predicates in delta-rs's SQL (DataFusion), spelled once for every layer that writes one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.times import iso, micros_iso


def sql_timestamp(value: dt.datetime) -> str:
    """A delta-rs (DataFusion) timestamp literal: an ISO string it casts to the column's UTC type."""
    return f"'{iso(value)}'"


def sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dt.datetime):
        return sql_timestamp(value)
    return "'" + str(value).replace("'", "''") + "'"


def range_filter(source: pa.Table, columns: Sequence[str], *, alias: str) -> str | None:
    """``alias.c >= <least> AND alias.c <= <greatest>`` for each of ``columns`` over the values ``source``
    holds: the rows of another table a key of ``source`` can match, spelled so delta-rs skips the files
    whose statistics lie outside. Integer columns and timestamps with a zone (to the microsecond) are
    bounded; other columns, and bounds outside years 1-9999, are left out (a missing bound reads more,
    never less). None: nothing to bound."""
    bounds: list[str] = []
    for column in columns:
        values = source.column(column)
        kind = values.type
        if pa.types.is_timestamp(kind) and kind.tz is not None and kind.unit != "ns":
            values, literal = values.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64()), _micros_literal
        elif pa.types.is_integer(kind):
            literal = repr
        else:
            continue
        least_greatest = pc.min_max(values)
        for op, end in ((">=", "min"), ("<=", "max")):
            value = least_greatest[end].as_py()
            text = None if value is None else literal(value)
            if text is not None:
                bounds.append(f"{alias}.`{column}` {op} {text}")
    return " AND ".join(bounds) or None


def _micros_literal(micros: int) -> str | None:
    text = micros_iso(micros)
    return None if text is None else f"'{text}'"
