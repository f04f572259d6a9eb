"""``tidewater sql``: read-only SQL over the lake's Delta tables, a page at a time.

    tidewater sql "SELECT venue_id, count(*) FROM rsvps.silver GROUP BY 1 ORDER BY 2 DESC"
    tidewater sql "SELECT * FROM rsvps.silver VERSION AS OF 3 ORDER BY event_id" --page 2 --page-size 50
    tidewater sql "SELECT * FROM rsvps.gold.venue_response_counts TIMESTAMP AS OF '2026-11-21T10:00:00Z'"
    tidewater sql - < query.sql                 (the query from standard input)
    tidewater sql --tables                      (the catalog: version, rows, size, last commit, latest audit)

``--format table`` (default: aligned text and a footer saying whether there is a next page),
``csv`` (the page only, header first) or ``json`` (one object: columns, rows, page, has_more,
tables read). A refused query prints one line (``tidewater: QueryRefused: ...``) and exits with 2.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.query.encode import json_text

CELL_WIDTH = 60  # table format: longer values are cut (csv and json carry them whole)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sql`` command to the ``tidewater`` parser."""
    parser = sub.add_parser(
        "sql",
        help="read-only SQL over the lake's tables (time travel: VERSION AS OF n, TIMESTAMP AS OF '...')",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("query", nargs="?", help="one SELECT/WITH/VALUES statement, in quotes; - reads standard input")
    parser.add_argument("--tables", action="store_true", help="list the lake's tables instead of running a query")
    parser.add_argument("--page", type=int, default=1, help="which page of the result (from 1)")
    parser.add_argument("--page-size", type=int, default=100, help="rows per page (1..1000)")
    parser.add_argument(
        "--namespace", default=None, help="namespace the table names refer to (default: TIDEWATER_NAMESPACE or live)"
    )
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.error = types.MethodType(_one_line_error, parser)  # type: ignore[method-assign]
    parser.set_defaults(func=run)


def _one_line_error(self: argparse.ArgumentParser, message: str) -> NoReturn:
    """Usage errors in the one-line form of every other tidewater error (exit status 2)."""
    self.exit(2, f"tidewater: ConfigError: {self.prog}: {message} (see --help)\n")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.tables:
        if args.query:
            raise ConfigError("tidewater sql: give a query or --tables, not both")
        print_tables(settings, namespace=args.namespace, fmt=args.format)
        return 0
    query = sys.stdin.read() if args.query == "-" else args.query
    if not query or not query.strip():
        raise ConfigError('tidewater sql needs a query, e.g. tidewater sql "SELECT * FROM rsvps.silver", or --tables')
    from tidewater.query.sql import run_sql

    result = run_sql(settings, query, page=args.page, page_size=args.page_size, namespace=args.namespace)
    if args.format == "json":
        print(result.to_json())
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([[_csv_value(v) for v in row] for row in result.rows])
        print(f"tidewater: {footer(result.page, len(result.rows), result.has_more)}", file=sys.stderr)
    else:
        if result.columns == ["plan_type", "plan"]:  # EXPLAIN: plans are multi-line text
            for plan_type, plan in result.rows:
                print(f"{plan_type}:\n{plan.rstrip()}\n")
        else:
            print(render_table(result.columns, result.rows))
        read = ", ".join(f"{key} ({'/'.join(info['as_of'])})" for key, info in result.tables.items())
        print(f"{footer(result.page, len(result.rows), result.has_more)}" + (f"; read {read}" if read else ""))
    return 0


def footer(page: int, rows: int, has_more: bool) -> str:
    more = f"yes — use --page {page + 1}" if has_more else "no"
    return f"page {page}, {rows} row{'s' if rows != 1 else ''}, more: {more}"


def print_tables(settings: Settings, *, namespace: str | None, fmt: str) -> None:
    from tidewater.query.catalog import catalog, latest_audits, table_info, table_listing

    if fmt == "json":
        print(json_text(table_listing(settings, namespace=namespace)))
        return
    infos = [table_info(ref) for ref in catalog(settings, namespace=namespace).values()]
    audits = latest_audits(settings, namespace=namespace)
    header = ["table", "version", "rows", "size", "files", "last commit", "operation", "latest audit"]
    rows = []
    for info in infos:
        audit = audits.get(info.name)
        rows.append(
            [
                info.name,
                info.version,
                info.rows,
                _size(info.size_bytes),
                info.files,
                info.last_commit_time.strftime("%Y-%m-%d %H:%M:%S") if info.last_commit_time else None,
                info.last_operation
                or (info.error and f"error: {info.error}")
                or ("no data yet" if not info.exists else None),
                _audit_status(audit),
            ]
        )
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([[_csv_value(v) for v in row] for row in rows])
    else:
        print(render_table(header, rows, null="-"))


def _audit_status(audit: dict[str, Any] | None) -> str | None:
    if audit is None:
        return None
    when = audit.get("audited_at")
    stamp = when.strftime("%Y-%m-%d %H:%M") if isinstance(when, dt.datetime) else ""
    if audit.get("success"):
        return f"passed {stamp}".strip()
    failed = audit.get("failed_expectations")
    return f"FAILED ({failed} failed) {stamp}".strip()


def _size(size: int | None) -> str | None:
    if size is None:
        return None
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return None


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, null: str = "NULL") -> str:
    """Aligned text; numbers right-aligned, long values cut to CELL_WIDTH."""
    cells = [[_cell(v, null) for v in row] for row in rows]
    numeric = [
        any(row[i] is not None for row in rows)
        and all(isinstance(row[i], int | float | decimal.Decimal) or row[i] is None for row in rows)
        for i in range(len(columns))
    ]
    widths = [max([len(str(c)), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line([str(c) for c in columns]), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _cell(value: Any, null: str) -> str:
    if value is None:
        return null
    text = _text(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def _csv_value(value: Any) -> str:
    return "" if value is None else _text(value)


def _text(value: Any) -> str:
    """A non-null value as text in a table or CSV cell: binary as hex (readable, and what SQL's
    ``encode(x, 'hex')`` shows), nested values as the JSON every query answer uses."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | dict | tuple):
        return json_text(value)
    return str(value)
