"""Pure conversions of lake values for the pages (no I/O, unit-tested); JSON is encoded as every query
answer is (:func:`tidewater.query.encode.json_value`, which the JSON API uses too)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from tidewater.query.encode import json_value

MAX_CELL_CHARS = 300  # a cell longer than this is cut in the HTML table (the JSON API has it whole)


def human_size(size: int | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable


def as_datetime(value: Any) -> dt.datetime | None:
    """A timestamp from a datetime, epoch milliseconds (Delta history) or ISO text."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def fmt_time(value: Any) -> str:
    """UTC, to the second: the same clock Airflow's UI is configured with."""
    when = as_datetime(value)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if when else ""


def fmt_interval(start: Any, end: Any) -> str:
    a, b = as_datetime(start), as_datetime(end)
    if a is None and b is None:
        return ""
    left = a.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M") if a else "?"
    if b is None:
        return f"{left} to ?"
    same_day = a is not None and a.date() == b.date()
    right = b.astimezone(dt.UTC).strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M")
    return f"{left} to {right} UTC"


def commit_run(metadata: Mapping[str, Any] | None) -> str:
    """Which run wrote a commit, from the custom metadata tidewater's writers attach."""
    if not metadata:
        return ""
    for key in ("tidewater.run_id", "tidewater.maintenance_run", "run_id", "airflow.run_id"):
        if metadata.get(key):
            return str(metadata[key])
    query, batch = metadata.get("tidewater.query"), metadata.get("tidewater.batch_id")
    if query is not None:
        return f"stream {query}" + (f" batch {batch}" if batch is not None else "")
    return ""


def cell_text(value: Any) -> str:
    """How a value reads in an HTML result table (NULL shown as such, long values cut)."""
    if value is None:
        return "NULL"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, list | tuple | Mapping):
        text = json.dumps(json_value(value), ensure_ascii=False)
    else:
        text = str(json_value(value))
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"
