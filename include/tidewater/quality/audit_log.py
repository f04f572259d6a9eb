"""The audit table: one row per suite (or reconciliation) a run validated, appended, never rewritten.

It lives at ``PipelineLayout.audit_uri()``; the UI's table page shows each table's latest row and
links its Data Docs report (``report_path``, relative to the lake root).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")
AUDIT_SCHEMA = pa.schema(
    [
        pa.field("audit_id", pa.string()),  # one audit run (all its suites share it)
        pa.field("pipeline", pa.string()),
        pa.field("namespace", pa.string()),
        pa.field("suite", pa.string()),  # e.g. rsvps.silver, rsvps.reconciliation
        pa.field("table_name", pa.string()),  # bronze | records | silver | quarantine | gold/<name>
        pa.field("interval_start", _TS),
        pa.field("interval_end", _TS),
        pa.field("success", pa.bool_()),
        pa.field("rows", pa.int64()),  # rows the suite looked at
        pa.field("expectations", pa.int64()),
        pa.field("failed_expectations", pa.int64()),
        pa.field("failures", pa.list_(pa.string())),  # "expectation_type(column): what was seen"
        pa.field("counts", pa.string()),  # JSON: named counts (reconciliation figures, unexpected counts)
        pa.field("blocking", pa.bool_()),  # a failure here holds back the interval's gold
        pa.field("trigger", pa.string()),  # scheduled | backfill | replay | correction | manual
        pa.field("dag_id", pa.string()),
        pa.field("dag_run_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("report_path", pa.string()),  # Data Docs index.html, relative to the lake root
        pa.field("audited_at", _TS),
    ]
)


@dataclass(frozen=True, kw_only=True)
class AuditRow:
    audit_id: str
    pipeline: str
    namespace: str
    suite: str
    table_name: str
    interval_start: dt.datetime
    interval_end: dt.datetime
    success: bool
    rows: int
    expectations: int
    failed_expectations: int
    failures: Sequence[str] = ()
    counts: Mapping[str, Any] = field(default_factory=dict)
    blocking: bool = False
    trigger: str = "manual"
    dag_id: str = ""
    dag_run_id: str = ""
    task_id: str = ""
    report_path: str = ""
    audited_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def as_record(self) -> dict[str, Any]:
        record = {name: getattr(self, name) for name in AUDIT_SCHEMA.names}
        record["failures"] = list(self.failures)
        record["counts"] = json.dumps(dict(self.counts), sort_keys=True, default=str)
        return record


def to_arrow(rows: Sequence[AuditRow]) -> pa.Table:
    return pa.Table.from_pylist([row.as_record() for row in rows], schema=AUDIT_SCHEMA)
