"""Executor side of a Delta write: Arrow batches -> Parquet data files + their add-action metadata.

Nothing here touches the Delta log. Files written by a task that later fails, or by a micro-batch
that is never committed, are invisible to every Delta reader and are removed by ``vacuum``.
Partition columns are not stored in the files (the Delta convention); their values go into the
add action and into Hive-style directory names.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidewater.lake.storage import filesystem, join
from tidewater.times import iso_text, micros_iso

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
MAX_STRING_STAT = 32
# Characters Hive/Spark escape as %XX in partition directory names (ExternalCatalogUtils.escapePathName).
_PATH_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(map(chr, range(1, 32)))


def escape_path_value(value: str) -> str:
    """A partition value as a directory name component, escaped the way Spark escapes it (and unescapes it
    in partition discovery); ``/`` in a value must not create a sub-directory."""
    return "".join(f"%{ord(c):02X}" if c in _PATH_ESCAPED else c for c in value)


def partition_value_text(value: Any) -> str | None:
    """Delta's string form of a partition value."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return iso_text(value, sep=" ", suffix="")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ts_text(micros: int) -> str | None:
    return micros_iso(micros, digits=3)


def file_stats(table: pa.Table) -> str:
    """Delta per-file statistics: numRecords, nullCount and safe min/max bounds.

    Bounds must never be narrower than the data (readers skip files with them), so timestamps
    are widened to whole milliseconds and long strings get no bounds at all.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_nested(kind):
            continue
        nulls[name] = column.null_count
        if column.null_count == len(column) or len(column) == 0:
            continue
        if pa.types.is_integer(kind):
            lo, hi = pc.min_max(column).values()
            mins[name], maxs[name] = lo.as_py(), hi.as_py()
        elif pa.types.is_date(kind):
            days = column.cast(pa.date32()).cast(pa.int32())
            lo, hi = pc.min_max(days).values()
            low, high = micros_iso(lo.as_py() * 86_400_000_000), micros_iso(hi.as_py() * 86_400_000_000)
            if low is not None and high is not None:
                mins[name], maxs[name] = low[:10], high[:10]
        elif pa.types.is_timestamp(kind):
            micros = column.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64())
            lo, hi = pc.min_max(micros).values()
            lo_ms, hi_ms = lo.as_py() // 1000 * 1000, -(-hi.as_py() // 1000) * 1000
            low, high = _ts_text(lo_ms), _ts_text(hi_ms)
            if low is not None and high is not None:  # no bounds beyond years 1-9999: readers then scan
                mins[name], maxs[name] = low, high
        elif pa.types.is_floating(kind):
            continue  # NaN and infinities have no JSON spelling; floats get no bounds
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            lo, hi = pc.min_max(column).values()
            if len(lo.as_py()) <= MAX_STRING_STAT and len(hi.as_py()) <= MAX_STRING_STAT:
                mins[name], maxs[name] = lo.as_py(), hi.as_py()
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        separators=(",", ":"),
    )


def write_data_files(
    table_uri: str,
    batches: Iterable[pa.RecordBatch],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    max_rows_per_file: int = 2_000_000,
) -> list[dict[str, Any]]:
    """Write ``batches`` (cast to ``schema``) as Parquet files under ``table_uri``.

    Returns one add-action dict per file (keys: path, size, partition_values, modification_time,
    stats); the driver commits them. Rows are buffered per partition value, so a task writes one
    file per partition value rather than one per incoming batch.
    """
    data_schema = pa.schema([f for f in schema if f.name not in partition_by])
    groups: dict[tuple[str | None, ...], list[pa.Table]] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        table = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
        if not partition_by:
            groups.setdefault((), []).append(table)
            continue
        keys = table.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
        for key_row in keys.to_pylist():
            mask = None
            for col in partition_by:
                value = key_row[col]
                cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], pa.scalar(value))
                mask = cond if mask is None else pc.and_(mask, cond)
            part = table.filter(mask)
            key = tuple(partition_value_text(key_row[c]) for c in partition_by)
            groups.setdefault(key, []).append(part)

    fs, root = filesystem(table_uri)
    actions: list[dict[str, Any]] = []
    for key, parts in groups.items():
        data = pa.concat_tables(parts).select(data_schema.names)
        subdir = "/".join(
            f"{col}={HIVE_NULL if v is None else escape_path_value(v)}"
            for col, v in zip(partition_by, key, strict=True)
        )
        for offset in range(0, data.num_rows, max_rows_per_file):
            chunk = data.slice(offset, max_rows_per_file)
            name = f"part-{uuid.uuid4()}.snappy.parquet"
            relative = f"{subdir}/{name}" if subdir else name
            target = join(root, relative)
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            with fs.open_output_stream(target) as sink:
                pq.write_table(chunk, sink, compression="snappy")
            actions.append(
                {
                    "path": relative,  # the file's real relative path: delta-rs URI-encodes it for the log
                    "size": fs.get_file_info(target).size,
                    "partition_values": dict(zip(partition_by, key, strict=True)),
                    "modification_time": int(time.time() * 1000),
                    "stats": file_stats(chunk),
                }
            )
    return actions


ADD_ACTION_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),  # JSON object
        ("modification_time", pa.int64()),
        ("stats", pa.string()),
    ]
)
ADD_ACTION_DDL = "path string, size long, partition_values string, modification_time long, stats string"


def actions_to_batch(actions: list[dict[str, Any]]) -> pa.RecordBatch:
    """Add actions as one Arrow batch (how executors hand them to the driver through Spark)."""
    rows = [dict(a, partition_values=json.dumps(a["partition_values"])) for a in actions]
    return pa.RecordBatch.from_pylist(rows, schema=ADD_ACTION_SCHEMA)


def actions_from_rows(rows: list[Any]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        action = row.asDict() if hasattr(row, "asDict") else dict(row)
        action["partition_values"] = json.loads(action["partition_values"] or "{}")
        out.append(action)
    return out
