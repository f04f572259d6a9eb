"""The lake's queryable tables under SQL names, and what the UI shows about each one.

A table's SQL name is ``<pipeline>.<table>`` with the layout's ``/`` written as ``.``:
``rsvps.silver``, ``rsvps.gold.venue_response_counts``, ``rsvps.corrections``, ``rsvps.audits``.
Tables of another namespace (a sandbox replay) are written ``<namespace>.<pipeline>.<table>``.
Everything is derived from :meth:`PipelineLayout.queryable_tables`, so a table cannot be named
here that does not live under the lake root, and a new pipeline or gold table appears by itself.

Nothing in this module scans data: sizes and row counts come from the Delta log's add actions.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError

from tidewater.config import Settings, check_namespace, is_namespace
from tidewater.lake.storage import storage_options
from tidewater.lake.tables import add_actions
from tidewater.pipelines import all_pipelines
from tidewater.pipelines.layout import PipelineLayout
from tidewater.query.encode import json_value

log = logging.getLogger(__name__)

# commitInfo keys every writer sets; the rest are commit properties (tidewater.run_id, ...).
STANDARD_COMMIT_KEYS = frozenset(
    {
        "timestamp",
        "operation",
        "operationParameters",
        "operationMetrics",
        "engineInfo",
        "clientVersion",
        "version",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "userId",
        "userName",
        "txnId",
        "inCommitTimestamp",
    }
)


@dataclass(frozen=True)
class TableRef:
    """One queryable Delta table: its SQL name and where it lives."""

    name: str  # SQL name: rsvps.silver, or sandbox.rsvps.silver outside the default namespace
    namespace: str
    pipeline: str
    table: str  # layout name: silver, gold/venue_response_counts, corrections, audits
    uri: str


def catalog(settings: Settings, *, namespace: str | None = None) -> dict[str, TableRef]:
    """Every queryable table of every pipeline in ``namespace`` (default: the settings' one), by SQL name
    (``<pipeline>.<table>``: names are relative to the namespace being browsed)."""
    ns = check_namespace(namespace or settings.namespace)
    found: dict[str, TableRef] = {}
    for pipeline in all_pipelines(settings).values():
        layout = PipelineLayout.of(settings, pipeline, ns)
        for table, uri in layout.queryable_tables().items():
            name = f"{pipeline.name}.{table.replace('/', '.')}"
            found[name] = TableRef(name=name, namespace=ns, pipeline=pipeline.name, table=table, uri=uri)
    return found


def resolve(settings: Settings, parts: Sequence[str], *, namespace: str | None = None) -> TableRef | None:
    """The table a dotted SQL name means, or None.

    ``rsvps.silver`` / ``rsvps.gold.x`` are in ``namespace`` (default: the settings' one);
    ``sandbox.rsvps.silver`` is in namespace ``sandbox``. A first part that names a pipeline is
    always pipeline-first (pipelines are never named like a namespace).
    """
    if not parts or any(not p for p in parts):
        return None
    if parts[0] in all_pipelines(settings):
        return catalog(settings, namespace=namespace).get(".".join(parts))
    if len(parts) < 3 or not is_namespace(parts[0]):
        return None
    ref = catalog(settings, namespace=parts[0]).get(".".join(parts[1:]))
    if ref is None:
        return None
    # Written with an explicit namespace: keep that spelling, it is how the user refers to it.
    return TableRef(name=".".join(parts), namespace=ref.namespace, pipeline=ref.pipeline, table=ref.table, uri=ref.uri)


# ---- what the UI lists ---------------------------------------------------------------------------


@dataclass
class TableInfo:
    """A table's current snapshot, from the Delta log only (cheap enough for every page view)."""

    name: str
    uri: str
    exists: bool
    version: int | None = None
    rows: int | None = None  # None when some file has no statistics (then nobody knows without a scan)
    size_bytes: int | None = None
    files: int | None = None
    last_commit_time: dt.datetime | None = None
    last_operation: str | None = None
    last_commit_metadata: dict[str, Any] = field(default_factory=dict)  # commit properties: tidewater.* etc.
    last_commit: dict[str, Any] = field(default_factory=dict)  # the whole commitInfo of the latest version
    namespace: str = ""
    pipeline: str = ""
    table: str = ""
    description: str | None = None
    partition_columns: list[str] = field(default_factory=list)
    columns: list[tuple[str, str]] = field(default_factory=list)  # (name, Arrow type) for the SQL box
    created_time: dt.datetime | None = None
    error: str | None = None  # the table could not be read (the listing still shows it)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO-8601 strings."""
        return json_value(asdict(self))


def table_info(ref: TableRef) -> TableInfo:
    """Version, rows, size, files and the last commit of ``ref``; ``exists=False`` before its first commit."""
    info = TableInfo(
        name=ref.name, uri=ref.uri, exists=False, namespace=ref.namespace, pipeline=ref.pipeline, table=ref.table
    )
    try:
        table = DeltaTable(ref.uri, storage_options=storage_options(ref.uri))
    except TableNotFoundError:
        return info
    except (DeltaError, OSError) as exc:
        info.error = brief(exc)
        return info
    info.exists = True
    try:
        info.version = int(table.version())
        actions = add_actions(table)
        info.files = actions.num_rows
        info.size_bytes = int(sum(actions.column("size_bytes").to_pylist())) if info.files else 0
        if "num_records" in actions.column_names:
            counts = actions.column("num_records").to_pylist()
            info.rows = None if any(c is None for c in counts) else int(sum(counts))
        elif not info.files:
            info.rows = 0
        metadata = table.metadata()
        info.description = metadata.description
        info.partition_columns = list(metadata.partition_columns)
        info.created_time = from_millis(metadata.created_time)
        info.columns = [(f.name, str(f.type)) for f in pa.schema(table.schema().to_arrow())]
        last = table.history(1)
        if last:
            commit = last[0]
            info.last_commit = commit
            info.last_commit_time = from_millis(commit.get("timestamp"))
            info.last_operation = commit.get("operation")
            info.last_commit_metadata = commit_properties(commit)
    except (DeltaError, OSError) as exc:
        info.error = brief(exc)
    return info


def table_history(ref: TableRef, *, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` commits of ``ref``, newest first; empty before the first commit.

    Each: version, timestamp (UTC datetime), operation, operationParameters, operationMetrics,
    metadata (the commit properties, e.g. tidewater.run_id) and userMetadata when set.
    """
    try:
        table = DeltaTable(ref.uri, storage_options=storage_options(ref.uri))
    except TableNotFoundError:
        return []
    out = []
    for commit in table.history(limit):
        entry = {
            "version": commit.get("version"),
            "timestamp": from_millis(commit.get("timestamp")),
            "operation": commit.get("operation"),
            "operationParameters": commit.get("operationParameters") or {},
            "operationMetrics": commit.get("operationMetrics") or {},
            "metadata": commit_properties(commit),
        }
        if commit.get("userMetadata") is not None:
            entry["userMetadata"] = commit["userMetadata"]
        out.append(entry)
    return out


def latest_audits(settings: Settings, *, namespace: str | None = None) -> dict[str, dict[str, Any]]:
    """For each catalog table, the newest row (by ``audited_at``) of its pipeline's audit table about it.

    Keys are catalog names; tables never audited (and pipelines without an audit table) are absent.
    """
    tables = catalog(settings, namespace=namespace)
    by_layout = {(ref.pipeline, ref.table): name for name, ref in tables.items()}
    audit_tables = {ref.pipeline: ref for ref in tables.values() if ref.table == "audits"}
    found: dict[str, dict[str, Any]] = {}
    for pipeline, ref in sorted(audit_tables.items()):
        try:
            audits = DeltaTable(ref.uri, storage_options=storage_options(ref.uri))
        except TableNotFoundError:
            continue
        # DataFusion picks each table's newest row; only those rows reach Python.
        query = (
            "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY table_name ORDER BY audited_at DESC) "
            "AS _tw_rank FROM audits) WHERE _tw_rank = 1"
        )
        try:
            reader = QueryBuilder().register("audits", audits).execute(query)
            rows = pa.RecordBatchReader.from_stream(reader).read_all().drop_columns(["_tw_rank"]).to_pylist()
        except (DeltaError, OSError, ValueError) as exc:  # an audit table of another shape: list the tables anyway
            log.warning("cannot read the audit table %s: %s", ref.uri, brief(exc))
            continue
        for row in rows:
            name = by_layout.get((pipeline, row.get("table_name")))
            if name is not None:
                found[name] = row
    return found


def table_listing(settings: Settings, *, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every catalog table as one JSON-ready dict: :class:`TableInfo` fields plus ``latest_audit``
    (the row of :func:`latest_audits`, or None). What a table listing page or ``--format json`` shows."""
    audits = latest_audits(settings, namespace=namespace)
    return [
        {**table_info(ref).as_dict(), "latest_audit": json_value(audits.get(name))}
        for name, ref in catalog(settings, namespace=namespace).items()
    ]


# ---- small helpers shared with the engine ----------------------------------------------------------


def commit_properties(commit: dict[str, Any]) -> dict[str, Any]:
    """The custom part of a commitInfo: what the writer labelled the commit with."""
    return {k: v for k, v in commit.items() if k not in STANDARD_COMMIT_KEYS}


def from_millis(value: int | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromtimestamp(int(value) / 1000, tz=dt.UTC)


def brief(exc: BaseException) -> str:
    """delta-rs and DataFusion errors span lines (cause chains): fold them into one short line."""
    return " ".join(str(exc).split())[:400]
