"""The plugin's FastAPI app: lake tables, read-only SQL, audits and Data Docs, behind Airflow's login.

Mounted by Airflow's api-server under :data:`tidewater.ui.URL_PREFIX` (see tidewater.ui.plugin).

HTML pages                                  JSON API
  GET  /tables                                GET  /api/tables
  GET  /tables/{name}/history                 GET  /api/tables/{name}/history
  GET  /sql?sql=&page=&page_size=             POST /api/sql   {"sql", "page", "page_size"}
  GET  /streams?hours=                         GET  /api/streams?hours=
  POST /streams/{pipeline}/control  (action=start|stop|restart|resume: a run of the control DAG)
  GET  /audits                                GET  /api/audits?dag_id=&run_id=
  GET  /reports/by-run?dag_id=&run_id=[&task_id=]
  GET  /reports/files/<ns>/<pipeline>/reports/<path>   (a page's CDN links point at /vendor)
  GET  /vendor/<package>@<version>/<path>      the Data Docs' CSS, JS and fonts (tidewater.ui.vendor)

Every route depends on :func:`tidewater.ui.auth.require_reader` (app-level dependency), and the app
has no OpenAPI/docs routes, so nothing here answers an unauthenticated caller with data. No route
writes the lake: the streams page's buttons create a run of the control DAG (for users the auth
manager lets trigger it), which does the work and leaves its trace in Airflow like any run. SQL goes
through :func:`tidewater.query.sql.run_sql`, which refuses anything but reads of the lake's tables.
Handlers are plain ``def``: FastAPI runs them in its thread pool, so lake reads do not block the
api-server's event loop. Settings are read from the ``TIDEWATER_*`` environment the platform gives the
api-server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fastapi import Body, Depends, FastAPI, Form, HTTPException, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tidewater.config import Settings, check_namespace
from tidewater.errors import ConfigError, TidewaterError
from tidewater.orchestration.params import ACTIONS, CONTROL_DAG_ID
from tidewater.query.encode import json_value
from tidewater.ui import data, vendor
from tidewater.ui.auth import ReaderDep, login_url, may_trigger, require_reader
from tidewater.ui.render import Pages
from tidewater.ui.reports import (
    ReportNotFound,
    ReportPathRefused,
    content_type,
    read_report,
    report_href,
    report_location,
    stat_report,
)

if TYPE_CHECKING:
    from tidewater.query.sql import QueryResult

log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50


def settings() -> Settings:
    """Read per request: cheap, and the api-server's environment is the single source."""
    return Settings.from_env()


def root_of(request: Request) -> str:
    """Where this app is mounted (``/tidewater``, behind any ``[api] base_url`` path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def pages(request: Request, config: Settings, namespace: str | None) -> Pages:
    return Pages(root_of(request), namespace or config.namespace, namespace)


def checked_namespace(namespace: str | None) -> str | None:
    """The request's namespace (None: the configured one); a malformed one is a 400 in the same words
    as everywhere else (:func:`tidewater.config.check_namespace`), before it reaches a path."""
    if namespace in (None, ""):
        return None
    try:
        return check_namespace(namespace)
    except ConfigError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


class PathRefused(HTTPException):
    """A report path outside every reports area (403, not an authentication problem)."""


class QueryProblem(HTTPException):
    """A query that did not run: 400 with the one-line reason; ``refused`` when run_sql refused it."""

    def __init__(self, detail: str, *, refused: bool) -> None:
        super().__init__(status.HTTP_400_BAD_REQUEST, detail)
        self.refused = refused


def run_query(config: Settings, sql: str, *, page: int, page_size: int, namespace: str | None) -> QueryResult:
    """run_sql, its refusals and errors turned into :class:`QueryProblem` (HTML and JSON say the same)."""
    from tidewater.query.sql import QueryRefused, run_sql

    try:
        return run_sql(config, sql, page=page, page_size=page_size, namespace=namespace)
    except QueryRefused as exc:
        raise QueryProblem(one_line(exc), refused=True) from None
    except TidewaterError as exc:
        raise QueryProblem(one_line(exc), refused=False) from None
    except Exception as exc:  # a query the engine rejects: say why, keep the server up
        log.warning("query failed: %s", exc, exc_info=True)
        raise QueryProblem(f"{type(exc).__name__}: {one_line(exc)}", refused=False) from None


def trigger_control(pipeline: str, action: str, user_name: str) -> str:
    """Create a run of the control DAG for ``pipeline``/``action``; its run id."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(
        CONTROL_DAG_ID,
        triggered_by=DagRunTriggeredByType.UI,
        triggering_user_name=user_name,
        conf={"pipeline": pipeline, "action": action},
    )
    if run is None:
        raise TidewaterError("Airflow created no run")
    return str(run.run_id)


def _default_namespace() -> str:
    try:
        return settings().namespace
    except TidewaterError:
        return ""


def create_app() -> FastAPI:
    """The app Airflow mounts. No docs/OpenAPI routes: they would be reachable without a token."""
    app = FastAPI(
        title="tidewater lake",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(require_reader)],
    )

    @app.exception_handler(StarletteHTTPException)
    async def refusals(request: Request, exc: StarletteHTTPException) -> Response:
        """401/403 for a browser page: the same status, with a sign-in link instead of bare JSON."""
        wants_html = "text/html" in request.headers.get("accept", "")
        api = request.url.path.startswith(f"{root_of(request)}/api/")
        if isinstance(exc, PathRefused) and wants_html:
            page = Pages(root_of(request), _default_namespace()).message("Refused", str(exc.detail), kind="error")
            return HTMLResponse(page, status_code=exc.status_code)
        if exc.status_code in (401, 403) and wants_html and not api:
            page = Pages(root_of(request), _default_namespace()).message(
                "Sign in required" if exc.status_code == 401 else "Not allowed",
                f"{exc.detail}. The lake pages need an Airflow session.",
                kind="error",
                link=login_url(request),
                link_text="Sign in to Airflow",
            )
            return HTMLResponse(page, status_code=exc.status_code, headers=getattr(exc, "headers", None))
        return await http_exception_handler(request, exc)

    @app.get("/", include_in_schema=False)
    def index(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{root_of(request)}/tables", status_code=status.HTTP_303_SEE_OTHER)

    # ---- tables -------------------------------------------------------------------------------

    @app.get("/tables", response_class=HTMLResponse)
    def tables_page(request: Request, namespace: str | None = None) -> HTMLResponse:
        namespace = checked_namespace(namespace)
        config = settings()
        rows = data.tables_overview(config, namespace)
        return HTMLResponse(pages(request, config, namespace).tables(rows))

    @app.get("/tables/{name}/history", response_class=HTMLResponse)
    def history_page(request: Request, name: str, namespace: str | None = None, limit: int = 50) -> HTMLResponse:
        namespace = checked_namespace(namespace)
        config = settings()
        view = pages(request, config, namespace)
        try:
            commits = data.table_history(config, name, namespace=namespace, limit=max(1, min(limit, 500)))
        except KeyError:
            page = view.message("Unknown table", f"no table {name!r} in the catalog", kind="error")
            return HTMLResponse(page, status_code=status.HTTP_404_NOT_FOUND)
        return HTMLResponse(view.history(name, commits))

    @app.get("/api/tables")
    def tables_api(namespace: str | None = None) -> JSONResponse:
        namespace = checked_namespace(namespace)
        rows = data.tables_overview(settings(), namespace)
        body = [
            {"name": r.name, "pipeline": r.pipeline, "table": r.table, **r.info, "audit": r.audit, "error": r.error}
            for r in rows
        ]
        return JSONResponse({"tables": json_value(body)})

    @app.get("/api/tables/{name}/history")
    def history_api(name: str, namespace: str | None = None, limit: int = 50) -> JSONResponse:
        namespace = checked_namespace(namespace)
        try:
            commits = data.table_history(settings(), name, namespace=namespace, limit=max(1, min(limit, 500)))
        except KeyError:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no table {name!r} in the catalog") from None
        return JSONResponse({"name": name, "history": json_value(commits)})

    # ---- SQL ----------------------------------------------------------------------------------

    @app.get("/sql", response_class=HTMLResponse)
    def sql_page(
        request: Request,
        sql: str = "",
        page: int = 1,
        page_size: int = DEFAULT_PAGE_SIZE,
        namespace: str | None = None,
    ) -> HTMLResponse:
        # A GET form: a query is a read, and its pages are plain links (bookmarkable, back button works).
        namespace = checked_namespace(namespace)
        config = settings()
        view = pages(request, config, namespace)
        page, page_size = max(1, page), max(1, min(page_size, MAX_PAGE_SIZE))
        if not sql.strip():
            from tidewater.query import catalog

            names = sorted(catalog.catalog(config, namespace=namespace))
            return HTMLResponse(view.sql(sql="", page_size=page_size, table_names=names))
        try:
            result = run_query(config, sql, page=page, page_size=page_size, namespace=namespace)
        except QueryProblem as exc:
            detail = str(exc.detail)
            refusal, error = (detail, "") if exc.refused else ("", detail)
            page_html = view.sql(sql=sql, page_size=page_size, refusal=refusal, error=error)
            return HTMLResponse(page_html, status_code=exc.status_code)
        return HTMLResponse(view.sql(sql=sql, page_size=page_size, result=result))

    @app.post("/api/sql")
    def sql_api(
        sql: str = Body(..., embed=True),
        page: int = Body(1, embed=True),
        page_size: int = Body(DEFAULT_PAGE_SIZE, embed=True),
        namespace: str | None = Body(None, embed=True),
    ) -> JSONResponse:
        namespace = checked_namespace(namespace)
        page, page_size = max(1, page), max(1, min(page_size, MAX_PAGE_SIZE))
        result = run_query(settings(), sql, page=page, page_size=page_size, namespace=namespace)
        return JSONResponse(result.as_dict())  # the same JSON as `tidewater sql --format json`

    # ---- streams --------------------------------------------------------------------------------

    def stream_views(config: Settings, namespace: str | None, hours: float) -> list[Any]:
        from tidewater.ui.streams import stream_views as views

        audits = data.audit_rows(config, namespace=namespace, limit=5000)
        return views(config, namespace, hours=hours, audits=audits)

    @app.get("/streams", response_class=HTMLResponse)
    def streams_page(
        request: Request,
        user: ReaderDep,
        namespace: str | None = None,
        hours: float = 1.0,
        requested: str = "",
        run_id: str = "",
        problem: str = "",
    ) -> HTMLResponse:
        namespace = checked_namespace(namespace)
        config = settings()
        hours = max(0.1, min(hours, 168.0))
        notice, kind = "", "info"
        if problem:
            notice, kind = problem, "error"
        elif requested:
            notice = f"{requested} requested: run {run_id} of {CONTROL_DAG_ID} (the page shows its effect once it ran)"
        page = pages(request, config, namespace).streams(
            stream_views(config, namespace, hours),
            hours=hours,
            can_control=may_trigger(user, CONTROL_DAG_ID),
            actions=ACTIONS,
            control_dag=CONTROL_DAG_ID,
            notice=notice,
            notice_kind=kind,
        )
        return HTMLResponse(page)

    @app.get("/api/streams")
    def streams_api(namespace: str | None = None, hours: float = 1.0) -> JSONResponse:
        namespace = checked_namespace(namespace)
        views = stream_views(settings(), namespace, max(0.1, min(hours, 168.0)))
        return JSONResponse({"streams": json_value([view.to_dict() for view in views])})

    @app.post("/streams/{pipeline}/control")
    def control_stream(request: Request, pipeline: str, user: ReaderDep, action: str = Form(...)) -> Response:
        """Start, stop, restart or resume a stream the way the Airflow UI would: a run of the control DAG
        (its params checked there too), created for a user allowed to trigger that DAG."""
        from tidewater.pipelines import all_pipelines

        if action not in ACTIONS:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, f"action {action!r} is not one of {', '.join(ACTIONS)}")
        if pipeline not in all_pipelines(settings()):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no pipeline {pipeline!r}")
        if not may_trigger(user, CONTROL_DAG_ID):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"user may not trigger {CONTROL_DAG_ID}")
        back = f"{root_of(request)}/streams"
        try:
            run = trigger_control(pipeline, action, user.get_name())
        except Exception as exc:  # not deployed here, the database: say so on the page
            problem = f"{action} of {pipeline} not requested: {CONTROL_DAG_ID}: {one_line(exc)}"
            return RedirectResponse(f"{back}?{urlencode({'problem': problem})}", status_code=status.HTTP_303_SEE_OTHER)
        query = urlencode({"requested": f"{action} of {pipeline}", "run_id": run})
        return RedirectResponse(f"{back}?{query}", status_code=status.HTTP_303_SEE_OTHER)

    # ---- audits and reports ---------------------------------------------------------------------

    @app.get("/audits", response_class=HTMLResponse)
    def audits_page(
        request: Request, namespace: str | None = None, limit: int = 200, pipeline: str = ""
    ) -> HTMLResponse:
        """Every audit, newest first, with each pipeline's pass rate per hour (the report index);
        ``pipeline`` keeps one pipeline's."""
        from tidewater.ui.charts import line_chart

        namespace = checked_namespace(namespace)
        config = settings()
        rows = data.audit_rows(config, namespace=namespace, limit=5000)
        pipelines = sorted({str(r.get("pipeline")) for r in rows if r.get("pipeline")})
        shown = [r for r in rows if r.get("pipeline") == pipeline] if pipeline else rows
        rates = [
            line_chart(
                f"{name}: suites passed per hour",
                data.audit_pass_rate([r for r in rows if r.get("pipeline") == name]),
                unit="%",
                chart_id=f"pass-rate-{name}",
            )
            for name in ([pipeline] if pipeline else pipelines)
        ]
        page = pages(request, config, namespace).audits(
            shown[: max(1, min(limit, 5000))], pipeline=pipeline, pipelines=pipelines, pass_rates=rates
        )
        return HTMLResponse(page)

    @app.get("/api/audits")
    def audits_api(
        namespace: str | None = None, dag_id: str | None = None, run_id: str | None = None, limit: int = 200
    ) -> JSONResponse:
        namespace = checked_namespace(namespace)
        rows = data.audit_rows(
            settings(), namespace=namespace, dag_id=dag_id, run_id=run_id, limit=max(1, min(limit, 5000))
        )
        return JSONResponse({"audits": json_value(rows)})

    @app.get("/reports/by-run", response_class=HTMLResponse)
    def by_run(
        request: Request,
        dag_id: str,
        run_id: str,
        task_id: str | None = None,
        namespace: str | None = None,
        list_all: bool = False,
    ) -> Response:
        """The report of one DAG run (or of one of its tasks: a run can audit twice, e.g. silver then
        gold): redirect when there is exactly one, else list the run's audits."""
        namespace = checked_namespace(namespace)
        config = settings()
        rows = data.run_audit_rows(config, dag_id=dag_id, run_id=run_id, namespace=namespace)
        of_task = [row for row in rows if task_id and row.get("task_id") == task_id]
        paths = data.report_paths(of_task or rows)
        if len(paths) == 1 and not list_all:
            return RedirectResponse(report_href(root_of(request), paths[0]), status_code=status.HTTP_303_SEE_OTHER)
        shown_ns = rows[0]["namespace"] if rows and rows[0].get("namespace") else namespace
        page = pages(request, config, shown_ns).audits(rows, dag_id=dag_id, run_id=run_id)
        return HTMLResponse(page, status_code=status.HTTP_200_OK if rows else status.HTTP_404_NOT_FOUND)

    @app.get("/reports/files/{path:path}")
    def report_file(request: Request, path: str) -> Response:
        config = settings()
        try:
            location = report_location(config.lake_uri, path)
            found = stat_report(location)
        except ReportPathRefused as exc:
            raise PathRefused(status.HTTP_403_FORBIDDEN, one_line(exc)) from None
        except ReportNotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, one_line(exc)) from None
        if found.is_dir:  # relative links in index.html need the folder URL to end in /
            return RedirectResponse(report_href(root_of(request), location.relative) + "/", status_code=307)
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        if found.content_type.startswith("text/html"):  # a Data Docs page: its CDN links go to /vendor
            page = b"".join(read_report(location)).decode("utf-8", errors="replace")
            return HTMLResponse(vendor.rewrite_html(page, f"{root_of(request)}/vendor"), headers=headers)
        headers["Content-Length"] = str(found.size)
        return StreamingResponse(read_report(location), media_type=found.content_type, headers=headers)

    @app.get("/vendor/{path:path}")
    def vendored(path: str) -> Response:
        found = vendor.local_path(path)
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no vendored file {path!r}")
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "public, max-age=86400"}
        return FileResponse(found, media_type=content_type(path), headers=headers)

    return app
