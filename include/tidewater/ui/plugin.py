"""What ``plugins/tidewater_plugin.py`` registers with Airflow, cheap to import in every Airflow process.

Airflow loads plugins in the scheduler, DAG processor, triggerer and task processes too, where the
FastAPI app is never served. The app is therefore handed over as :class:`LazyApp`, a plain ASGI
callable that imports and builds :func:`tidewater.ui.app.create_app` on its first request (in the
api-server only), so those processes do not import Airflow's API-server modules or the lake readers.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tidewater.ui import URL_PREFIX

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

CATEGORY = "Tidewater"


class LazyApp:
    """An ASGI app built from ``module:factory`` when the first request arrives."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._app: ASGIApp | None = None
        self._lock = threading.Lock()

    def _build(self) -> ASGIApp:
        with self._lock:
            if self._app is None:
                module, _, name = self.target.partition(":")
                self._app = getattr(importlib.import_module(module), name)()
        return self._app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        app = self._app or self._build()
        await app(scope, receive, send)


FASTAPI_APPS = [{"app": LazyApp("tidewater.ui.app:create_app"), "url_prefix": URL_PREFIX, "name": "tidewater lake"}]

# hrefs without a leading slash resolve against Airflow's <base href>, so they survive a base_url path.
_PREFIX = URL_PREFIX.lstrip("/")
EXTERNAL_VIEWS = [
    {
        "name": "Streams",
        "href": f"{_PREFIX}/streams",
        "destination": "nav",
        "url_route": "tidewater-streams",
        "category": CATEGORY,
    },
    {
        "name": "Lake tables",
        "href": f"{_PREFIX}/tables",
        "destination": "nav",
        "url_route": "tidewater-tables",
        "category": CATEGORY,
    },
    {
        "name": "Lake SQL",
        "href": f"{_PREFIX}/sql",
        "destination": "nav",
        "url_route": "tidewater-sql",
        "category": CATEGORY,
    },
    {
        "name": "Data-quality audits",
        "href": f"{_PREFIX}/audits",
        "destination": "nav",
        "url_route": "tidewater-audits",
        "category": CATEGORY,
    },
    {
        # A tab on every DAG run page: that run's Data Docs (or "no audit for this run").
        "name": "Data quality",
        "href": f"{_PREFIX}/reports/by-run?dag_id={{DAG_ID}}&run_id={{RUN_ID}}",
        "destination": "dag_run",
        "url_route": "tidewater-run-report",
    },
]


def operator_extra_links() -> list[Any]:
    from tidewater.ui.links import AuditReportLink

    return [AuditReportLink()]
