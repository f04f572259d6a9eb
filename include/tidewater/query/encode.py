"""How lake values become JSON: one encoding for every answer the query layer gives.

``tidewater sql --format json``, ``tidewater sql --tables --format json``, the UI's JSON API
(``/tidewater/api/sql``, ``/api/tables``, ``/api/audits``...) and the nested values in text and CSV
cells all encode through :func:`json_value`, so the same query answers with the same JSON wherever
it is asked (README: the UI's SQL box is "the same engine as ``./tw sql``").

The choices, for values JSON has no type for: datetimes, dates and times as ISO-8601 text; durations
as seconds; Decimals as text (a float would round them); binary as base64 (JSON's usual spelling of
bytes); NaN and infinities as null (JSON has no such numbers, and a numeric column stays numbers or
null for a typed reader); tuples and sets as lists; mapping keys as text; anything else as its text.

Persisted JSON (the ledger's keys and values, the conflicts table's copies) has formats of its own
(:mod:`tidewater.batch.gold_diff`, :mod:`tidewater.dedup`): those are stored data, compared as text,
and do not change with how answers are shown.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Mapping
from typing import Any


def json_value(value: Any) -> Any:
    """``value`` (typed Python values from Arrow, nested) as values ``json.dumps`` and a browser accept."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_value(v) for v in value]
    return str(value)


def json_text(value: Any, *, ensure_ascii: bool = True) -> str:
    """``value`` as JSON text (strict: no NaN literals can slip through)."""
    return json.dumps(json_value(value), ensure_ascii=ensure_ascii, allow_nan=False)
