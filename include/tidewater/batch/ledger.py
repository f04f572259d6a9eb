"""The corrections ledger: one row for every change a batch job made to a published (final) gold row.

Gold values never change silently: whoever changes a final row appends its old and new values,
how many events arrived after the window closed, why, and which run did it, to a Delta table at
``PipelineLayout.ledger_uri()``. Entries are written *before* the gold commit they describe: if the
gold commit then fails, the retried run (same run id) finds its entries already there and does not
add them twice, whereas the opposite order could lose an entry for a change that did happen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tidewater.batch.gold_diff import RowChange, to_json
from tidewater.lake.locks import WriterLock
from tidewater.lake.reads import read_table
from tidewater.lake.tables import CommitResult, LakeTable

_TS = pa.timestamp("us", tz="UTC")
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string()),
        pa.field("window_start", _TS),
        pa.field("window_end", _TS),
        pa.field("keys", pa.string()),  # JSON of the non-window key columns
        pa.field("old_value", pa.string()),  # JSON of the measures before (null: the row was missing)
        pa.field("new_value", pa.string()),  # JSON of the measures after (null: the row was removed)
        pa.field("late_events", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("dag_run_id", pa.string()),
        pa.field("corrected_at", _TS),
    ]
)
# What makes an entry the same entry when a run is retried.
_IDENTITY = ("dag_run_id", "table", "window_start", "window_end", "keys")


@dataclass(frozen=True)
class LedgerEntry:
    table: str
    window_start: dt.datetime
    window_end: dt.datetime
    keys: str
    old_value: str | None
    new_value: str | None
    late_events: int
    reason: str
    dag_run_id: str
    corrected_at: dt.datetime

    def identity(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _IDENTITY)


def reason(change: RowChange, late_events: int, *, mode: str) -> str:
    """Why a row changed, in words a reader of the ledger can act on."""
    late = (
        f"{late_events} event{'s' if late_events != 1 else ''} arrived after the window closed (behind the watermark)"
        if late_events
        else "no event arrived after the window closed (gold differed from silver, e.g. a stream update raced "
        "a recompute)"
    )
    if change.kind == "missing":
        text = f"window missing from gold: {late}"
    elif change.kind == "removed":
        text = "silver no longer holds any event for this row"
    else:
        text = late
    return text if mode == "correction" else f"{mode}: {text}"


def entries_for(
    table: str,
    changes: Sequence[RowChange],
    late_events: Mapping[tuple[Any, ...], int],
    *,
    run_id: str,
    mode: str,
    at: dt.datetime,
) -> list[LedgerEntry]:
    """Ledger entries for ``changes``; ``late_events`` is keyed by :func:`change_key`."""
    out = []
    for change in changes:
        late = int(late_events.get(change_key(change), 0))
        out.append(
            LedgerEntry(
                table=table,
                window_start=change.window_start,
                window_end=change.window_end,
                keys=to_json(change.group) or "{}",
                old_value=to_json(change.old),
                new_value=to_json(change.new),
                late_events=late,
                reason=reason(change, late, mode=mode),
                dag_run_id=run_id,
                corrected_at=at,
            )
        )
    return out


def change_key(change: RowChange) -> tuple[Any, ...]:
    return (change.window_start, change.window_end, *change.group.values())


class Ledger:
    """The ledger table of one namespace and pipeline."""

    def __init__(self, uri: str, *, lock: WriterLock | None = None) -> None:
        self.table = LakeTable(uri)
        self.lock = lock  # maintenance compacts the ledger holding the same lock

    def record(
        self, spark: SparkSession, entries: Sequence[LedgerEntry], *, metadata: dict[str, Any] | None = None
    ) -> CommitResult | None:
        """Append the entries this run has not recorded yet (one commit); None when there is nothing to add."""
        if not entries:
            return None
        if self.lock is None:
            return self._record(spark, entries, metadata)
        with self.lock.hold(f"ledger entries of {sorted({e.dag_run_id for e in entries})}"):
            return self._record(spark, entries, metadata)

    def _record(
        self, spark: SparkSession, entries: Sequence[LedgerEntry], metadata: dict[str, Any] | None
    ) -> CommitResult | None:
        self.table.ensure(LEDGER_SCHEMA, description="late-data corrections of gold rows")
        run_ids = sorted({e.dag_run_id for e in entries})
        recorded = (
            read_table(spark, self.table.uri)
            .where(F.col("dag_run_id").isin(run_ids))
            .select(*_IDENTITY)
            .toArrow()  # Arrow keeps timestamps in UTC; collect() would use this process's time zone
        )
        seen = {_identity_of(row) for row in recorded.to_pylist()}
        fresh = [e for e in entries if _identity_of(asdict(e)) not in seen]
        if not fresh:
            return None
        rows = pa.Table.from_pylist([asdict(e) for e in fresh], schema=LEDGER_SCHEMA)
        return self.table.append_arrow(rows, metadata=metadata)

    def rows(self, spark: SparkSession) -> list[dict[str, Any]]:
        if not self.table.exists():
            return []
        return read_table(spark, self.table.uri).toArrow().to_pylist()


def _identity_of(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """Entry identity with timestamps as aware UTC datetimes, however they were read."""
    out = []
    for name in _IDENTITY:
        value = row[name]
        if isinstance(value, dt.datetime):
            value = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        out.append(value)
    return tuple(out)
