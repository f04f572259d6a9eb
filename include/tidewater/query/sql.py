"""Run one read-only SQL query over lake tables, one page at a time.

The engine is Apache DataFusion as shipped inside delta-rs (``deltalake.QueryBuilder``): no JVM, no
Spark, so it can answer from Airflow's api-server in milliseconds. Each query gets a fresh session
in which exactly the lake snapshots it names are registered, under internal names; the SQL it runs
is the guard's re-emission of the user's statement (see :mod:`tidewater.query.guard`), so only
what the guard accepted reaches DataFusion, and DataFusion has no other table to read (delta-rs'
session does not enable URL tables: ``FROM '/etc/passwd'`` is "table not found" even unguarded).

Paging: ``LIMIT page_size+1 OFFSET (page-1)*page_size`` is added to the query (or the query is
wrapped in ``SELECT * FROM (...)`` when it has a LIMIT of its own), so only one page is computed and
materialised; the extra row says whether there is a next page. Pages are stable only for a query
with an ORDER BY that orders rows completely, as in any SQL database.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError

from tidewater.config import Settings
from tidewater.lake.storage import filesystem, storage_options
from tidewater.query.catalog import TableRef, brief, catalog, resolve
from tidewater.query.encode import json_text, json_value
from tidewater.query.guard import GuardedQuery, QueryRefused, TableUse, guard

__all__ = ["QueryRefused", "QueryResult", "new_session", "run_sql"]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@dataclass
class QueryResult:
    """One page of a query's result, and which table snapshots the query read."""

    columns: list[str]
    rows: list[list[Any]]  # typed Python values (datetime, date, Decimal, bytes, list, dict, ...)
    page: int
    page_size: int
    has_more: bool
    # "<name>@v<version>" -> name, uri, version, latest_version, as_of (how the query asked for it),
    # commit_time (ISO-8601, when that version was committed)
    tables: dict[str, dict[str, Any]]
    elapsed_s: float
    types: list[str] = field(default_factory=list)  # Arrow type of each column

    @property
    def first_row(self) -> int:
        """1-based number of this page's first row in the whole result."""
        return (self.page - 1) * self.page_size + 1

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, encoded as every query answer is (:func:`tidewater.query.encode.json_value`)."""
        return json_value(asdict(self))

    def to_json(self) -> str:
        return json_text(asdict(self))


def new_session() -> QueryBuilder:
    """A DataFusion session with no tables (delta-rs' QueryBuilder: URL tables off, no file functions)."""
    return QueryBuilder()


def run_sql(
    settings: Settings,
    sql: str,
    *,
    page: int = 1,
    page_size: int = DEFAULT_PAGE_SIZE,
    namespace: str | None = None,
    max_page_size: int = MAX_PAGE_SIZE,
) -> QueryResult:
    """Run ``sql`` (one read-only query over lake tables) and return page ``page`` of its result.

    Raises :class:`QueryRefused` (one line) for anything that writes, reads outside the lake, names
    an unknown or empty table, asks for a version that does not exist, or fails in DataFusion.
    """
    started = time.monotonic()
    _check_paging(page, page_size, max_page_size)
    known = sorted(catalog(settings, namespace=namespace))
    query = guard(sql, resolve=lambda parts: resolve(settings, parts, namespace=namespace), known=known)
    snapshots = _Snapshots()
    names = [snapshots.add(use) for use in query.uses]
    statement = _statement(query, names, page=page, page_size=page_size)
    session = new_session()
    for name, table in snapshots.tables.items():
        session.register(name, table)
    try:
        result = pa.RecordBatchReader.from_stream(session.execute(statement)).read_all()
    except (DeltaError, OSError, ValueError, RuntimeError, pa.ArrowException) as exc:
        raise QueryRefused(_sql_error(exc, snapshots.labels)) from None
    columns = list(result.column_names)
    values = [[_plain(v) for v in column.to_pylist()] for column in result.columns]
    rows = [list(row) for row in zip(*values, strict=True)] if values else [[] for _ in range(result.num_rows)]
    if query.explain:  # EXPLAIN's few rows are paged here, and name tables as the user does
        rows = rows[(page - 1) * page_size : page * page_size + 1]
        rows = [[_relabel(v, snapshots.labels) if isinstance(v, str) else v for v in row] for row in rows]
    return QueryResult(
        columns=columns,
        rows=rows[:page_size],
        page=page,
        page_size=page_size,
        has_more=len(rows) > page_size,
        tables=snapshots.describe(),
        elapsed_s=round(time.monotonic() - started, 6),
        types=[str(f.type) for f in result.schema],
    )


def _check_paging(page: int, page_size: int, max_page_size: int) -> None:
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise QueryRefused(f"refused: page must be a whole number from 1 (got {page!r})")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= max_page_size:
        raise QueryRefused(f"refused: page size must be between 1 and {max_page_size} (got {page_size!r})")


def _statement(query: GuardedQuery, names: Sequence[str], *, page: int, page_size: int) -> str:
    """The SQL DataFusion runs: the guarded query, limited to one page (plus one row)."""
    body = query.render(names)
    if query.explain:
        return " ".join(query.explain) + "\n" + body
    limit = f"LIMIT {page_size + 1} OFFSET {(page - 1) * page_size}"
    if query.top_level_limit:
        # Wrapped, the query's own ORDER BY survives because a LIMIT comes with it (DataFusion drops
        # an ORDER BY in a derived table that has none: that is why other queries are not wrapped).
        return f"SELECT * FROM (\n{body}\n) AS _tw_page\n{limit}"
    return f"{body}\n{limit}"


class _Snapshots:
    """The (table, version) pairs one query reads, each opened once and registered under its own name."""

    def __init__(self) -> None:
        self.tables: dict[str, DeltaTable] = {}  # internal name -> snapshot
        self.info: dict[str, dict[str, Any]] = {}  # internal name -> what the result reports
        self._names: dict[tuple[str, int], str] = {}
        self._latest: dict[str, DeltaTable] = {}

    @property
    def labels(self) -> dict[str, str]:
        return {name: f"{info['name']}@v{info['version']}" for name, info in self.info.items()}

    def add(self, use: TableUse) -> str:
        ref = use.ref
        latest = self._open_latest(ref)
        latest_version = int(latest.version())
        snapshot: DeltaTable | None = None
        if use.as_of is None:
            version, snapshot = latest_version, latest
        elif use.as_of.version is not None:
            version = use.as_of.version
            if version > latest_version:
                first = _first_version(ref)
                raise QueryRefused(
                    f"refused: {ref.name} has versions {first}..{latest_version}; {use.as_of.text} is not one"
                )
        else:
            assert use.as_of.timestamp is not None
            snapshot, version = self._at_time(ref, use, latest_version)
        key = (ref.uri, version)
        name = self._names.get(key)
        if name is None:
            if snapshot is None or int(snapshot.version()) != version:
                snapshot = self._open_version(ref, version, latest_version)
            name = f"__tw_{len(self._names)}"
            self._names[key] = name
            self.tables[name] = snapshot
            committed = _commit_time(ref.uri, version)
            self.info[name] = {
                "name": ref.name,
                "uri": ref.uri,
                "version": version,
                "latest_version": latest_version,
                "as_of": [],
                "commit_time": committed.isoformat() if committed else None,
            }
        as_of = "latest" if use.as_of is None else use.as_of.text
        if as_of not in self.info[name]["as_of"]:
            self.info[name]["as_of"].append(as_of)
        return name

    def describe(self) -> dict[str, dict[str, Any]]:
        return {f"{info['name']}@v{info['version']}": info for info in self.info.values()}

    def _open_latest(self, ref: TableRef) -> DeltaTable:
        if ref.uri not in self._latest:
            try:
                self._latest[ref.uri] = DeltaTable(ref.uri, storage_options=storage_options(ref.uri))
            except TableNotFoundError:
                raise QueryRefused(f"table {ref.name} has no data yet (no Delta log at {ref.uri})") from None
            except (DeltaError, OSError) as exc:
                raise QueryRefused(f"cannot read table {ref.name} at {ref.uri}: {brief(exc)}") from None
        return self._latest[ref.uri]

    def _open_version(self, ref: TableRef, version: int, latest_version: int) -> DeltaTable:
        try:
            return DeltaTable(ref.uri, version=version, storage_options=storage_options(ref.uri))
        except (DeltaError, OSError):
            first = _first_version(ref)
            raise QueryRefused(
                f"refused: {ref.name} version {version} is no longer available (its log was cleaned up); "
                f"versions {first}..{latest_version} can be read"
            ) from None

    def _at_time(self, ref: TableRef, use: TableUse, latest_version: int) -> tuple[DeltaTable, int]:
        """The snapshot at a time: the newest version committed at or before it (as delta-rs resolves it,
        by the commit file's modification time); a time before the first commit is refused."""
        when = use.as_of.timestamp if use.as_of else None
        assert when is not None
        table = DeltaTable(ref.uri, storage_options=storage_options(ref.uri))
        try:
            table.load_as_version(when)
        except (DeltaError, OSError, ValueError) as exc:
            raise QueryRefused(f"refused: cannot read {ref.name} {use.as_of.text}: {brief(exc)}") from None
        version = int(table.version())
        committed = _commit_time(ref.uri, version)
        if committed is not None and committed > when:
            latest = _commit_time(ref.uri, latest_version)
            raise QueryRefused(
                f"refused: {ref.name} has no version at {when.isoformat()}: its versions {version}..{latest_version} "
                f"were committed from {committed.isoformat()} to {latest.isoformat() if latest else '?'}"
            )
        return table, version


def _log_path(uri: str, version: int) -> tuple[pafs.FileSystem, str]:
    fs, root = filesystem(uri)
    return fs, f"{root}/_delta_log/{version:020d}.json"


def _commit_time(uri: str, version: int) -> dt.datetime | None:
    """When ``version`` was committed: its log file's modification time (what delta-rs time travel uses)."""
    fs, path = _log_path(uri, version)
    try:
        info = fs.get_file_info(path)
    except OSError:
        return None
    if info.type != pafs.FileType.File or info.mtime is None:
        return None
    mtime = info.mtime
    return mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.UTC)


def _first_version(ref: TableRef) -> int:
    """The oldest version whose commit is still in the log (older ones are gone after log cleanup)."""
    fs, root = filesystem(ref.uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True))
    except OSError:
        return 0
    versions = [int(i.base_name[:20]) for i in infos if re.fullmatch(r"\d{20}\.json", i.base_name)]
    return min(versions, default=0)


_POSITION = re.compile(r"\s*at Line: \d+, Column: \d+")
_WRAPPED = re.compile(r"^(?:SQL error: )?(?:ParserError|TokenizerError)\(\"(.*)\"\)$")


def _sql_error(exc: BaseException, labels: dict[str, str]) -> str:
    """DataFusion's message in one line, with our internal table names replaced by the user's.

    Positions are dropped: they count in the re-emitted SQL, not in what the user typed.
    """
    text = _relabel(" ".join(str(exc).split()), labels)
    text = _POSITION.sub("", text)
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = wrapped.group(1)
    text = text.removeprefix("SQL error: ")
    return f"SQL error: {text[:400]}"


def _relabel(text: str, labels: dict[str, str]) -> str:
    for name, label in sorted(labels.items(), key=lambda item: -len(item[0])):  # __tw_10 before __tw_1
        text = text.replace(name, label)
    return text


def _plain(value: Any) -> Any:
    """Plain Python values: pandas Timestamps (what pyarrow gives for nanosecond columns) become datetimes."""
    if isinstance(value, dt.datetime) and type(value) is not dt.datetime and hasattr(value, "to_pydatetime"):
        return value.to_pydatetime()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
