"""What a bounded job did, as one JSON line: the last line of its output, which Airflow and people read."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tidewater.batch.interval import Interval
from tidewater.lake.tables import CommitResult
from tidewater.times import iso

# What starts the last line of a job's output: the result as JSON follows (Airflow's operator reads it).
RESULT_PREFIX = "tidewater: result "


@dataclass(frozen=True)
class TableOutcome:
    rows: int  # rows written (replaced or upserted) in this table
    version: int  # the table's version after the job
    committed: bool  # False: nothing needed writing, no commit was made
    ledger_entries: int = 0  # changes of final rows recorded in the ledger for this table
    finalized: int = 0  # rows whose status alone became final

    @classmethod
    def of(cls, result: CommitResult, *, ledger_entries: int = 0, finalized: int = 0) -> TableOutcome:
        return cls(result.rows, result.version, result.committed, ledger_entries, finalized)


@dataclass(frozen=True)
class BatchResult:
    mode: str  # recompute | replay | correction
    pipeline: str
    run_id: str
    namespace: str  # where the job wrote
    interval: Interval
    source: str  # e.g. "bronze:live", "kafka:rsvps", "silver:live"
    entities: tuple[Any, ...] = ()
    closed_before: str | None = None  # windows ending at or before this are final (the batch's watermark)
    tables: dict[str, TableOutcome] = field(default_factory=dict)
    ledger_entries: int = 0
    ledger_version: int | None = None
    seconds: float = 0.0
    # Where those seconds went, per phase (tidewater.phase_clock): ``silver rsvps/rows to driver``, ...
    phases_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = {"start": iso(self.interval.start), "end": iso(self.interval.end)}
        out["entities"] = list(self.entities)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), default=str)

    def __str__(self) -> str:
        return self.to_json()
