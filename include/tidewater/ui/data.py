"""What the pages show, read from the lake (the only module of the UI that does lake I/O besides reports).

Table facts, history and SQL come from :mod:`tidewater.query`; audit rows are read straight from each
pipeline's audit table, because the audits page and the by-run lookup need every row of a run, not
only the newest per table. Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import pyarrow.compute as pc
import pyarrow.fs as pafs

from tidewater.config import Settings, is_namespace
from tidewater.errors import ConfigError
from tidewater.lake.storage import filesystem
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import all_pipelines
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import parse_time

log = logging.getLogger(__name__)

AUDIT_COLUMNS = [
    "audit_id",
    "pipeline",
    "namespace",
    "suite",
    "table_name",
    "interval_start",
    "interval_end",
    "success",
    "rows",
    "expectations",
    "failed_expectations",
    "failures",
    "blocking",
    "trigger",
    "dag_id",
    "dag_run_id",
    "task_id",
    "report_path",
    "audited_at",
]


@dataclass(frozen=True)
class TableRow:
    """One line of the tables page: the table's facts and its newest audit (if any)."""

    name: str
    pipeline: str
    table: str
    info: dict[str, Any]
    audit: dict[str, Any] | None
    error: str = ""


def _as_dict(value: Any) -> dict[str, Any]:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return dict(value)
    return dict(vars(value))


def audit_for(ref: Any, audits: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest audit of a table, whichever key form ``latest_audits`` used for it."""
    for key in (ref.name, f"{ref.pipeline}.{ref.table}", ref.table):
        if key in audits:
            return audits[key]
    return None


def tables_overview(settings: Settings, namespace: str | None = None) -> list[TableRow]:
    """Every catalog table with version, rows, size, last commit and latest audit."""
    from tidewater.query import catalog

    refs = catalog.catalog(settings, namespace=namespace)
    try:
        audits = catalog.latest_audits(settings, namespace=namespace)
    except Exception as exc:  # the tables still show without their audit status
        log.warning("latest audits unavailable: %s", exc)
        audits = {}
    rows = []
    for name, ref in sorted(refs.items()):
        try:
            info = _as_dict(catalog.table_info(ref))
            error = ""
        except Exception as exc:  # one unreadable table must not hide the others
            log.warning("table %s unreadable: %s", name, exc)
            info, error = {"name": name, "uri": ref.uri, "exists": False}, str(exc).splitlines()[0][:300]
        rows.append(TableRow(name, ref.pipeline, ref.table, info, audit_for(ref, audits), error))
    return rows


def table_history(settings: Settings, name: str, *, namespace: str | None = None, limit: int = 50) -> list[dict]:
    """The commits of one catalog table, newest first; KeyError for an unknown name."""
    from tidewater.query import catalog

    refs = catalog.catalog(settings, namespace=namespace)
    if name not in refs:
        raise KeyError(name)
    return catalog.table_history(refs[name], limit=limit)


def audit_rows(
    settings: Settings,
    *,
    namespace: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Audit rows of every pipeline (optionally of one DAG run), newest first."""
    namespace = namespace or settings.namespace
    found: list[dict[str, Any]] = []
    for pipeline in all_pipelines(settings).values():
        table = LakeTable(PipelineLayout.of(settings, pipeline, namespace).audit_uri())
        if not table.exists():
            continue
        delta = table.open()
        present = set(LakeTable.arrow_schema(delta).names)
        data = delta.to_pyarrow_table(columns=[c for c in AUDIT_COLUMNS if c in present])
        for column, wanted in (("dag_id", dag_id), ("dag_run_id", run_id)):
            if wanted is not None:
                data = data.filter(pc.equal(data[column], wanted)) if column in present else data.slice(0, 0)
        found.extend(data.to_pylist())
    found.sort(key=lambda row: (row.get("audited_at") is not None, row.get("audited_at")), reverse=True)
    return found[:limit]


def report_paths(rows: list[dict[str, Any]]) -> list[str]:
    """The distinct reports of some audit rows, in the rows' order (suites of one audit share one)."""
    seen: dict[str, None] = {}
    for row in rows:
        if row.get("report_path"):
            seen.setdefault(row["report_path"], None)
    return list(seen)


def namespaces(settings: Settings) -> list[str]:
    """The namespaces present in the lake (its top-level folders), the configured one first."""
    fs, root = filesystem(settings.lake_uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        infos = []
    found = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and is_namespace(i.base_name))
    return [settings.namespace, *(ns for ns in found if ns != settings.namespace)]


def run_audit_rows(
    settings: Settings, *, dag_id: str, run_id: str, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The audit rows one DAG run wrote. Without a namespace, the configured one is searched first,
    then the others (a sandbox replay audits in its own namespace, and its link does not say which)."""
    candidates = [namespace] if namespace else namespaces(settings)
    for ns in candidates:
        rows = audit_rows(settings, namespace=ns, dag_id=dag_id, run_id=run_id, limit=10_000)
        if rows:
            return rows
    return []


def audit_pass_rate(audits: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per hour of audit time: the share of suites that passed (%)."""
    hours: dict[float, list[bool]] = {}
    for audit in audits:
        if not isinstance(audit.get("audited_at"), str | dt.datetime):
            continue
        try:
            when = parse_time(audit["audited_at"], "audited_at")
        except ConfigError:
            continue
        hour = when.timestamp() - when.timestamp() % 3600
        hours.setdefault(hour, []).append(bool(audit.get("success")))
    points = [(hour, 100.0 * sum(results) / len(results)) for hour, results in sorted(hours.items())]
    return {"suites passed": points} if points else {}
