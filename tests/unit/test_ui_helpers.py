"""The plugin's pure parts: report path gate, content types, formatting, links, HTML escaping."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets
from tidewater.ui import format as fmt
from tidewater.ui.links import AuditReportLink, by_run_url
from tidewater.ui.plugin import EXTERNAL_VIEWS, LazyApp
from tidewater.ui.render import Pages
from tidewater.ui.reports import ReportPathRefused, content_type, report_href, report_location

LAKE = "file:///data/lake"


def test_report_location_accepts_files_of_a_reports_area():
    loc = report_location(LAKE, "live/rsvps/reports/r1/static/styles/x.css")
    assert loc.uri == f"{LAKE}/live/rsvps/reports/r1/static/styles/x.css"
    assert loc.reports_uri == f"{LAKE}/live/rsvps/reports"
    assert report_location(LAKE, "sandbox_1/rsvps/reports/r1/").relative.endswith("r1/index.html")
    odd = "live/rsvps/reports/r1/validations/manual__2026-11-21T16:38:40+00:00/a b.html"
    assert report_location(LAKE, odd).uri.endswith("a b.html")


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../etc/passwd",
        "live/rsvps/reports/../silver/_delta_log/0.json",
        "live/rsvps/reports/r1/../../silver/x",
        "live/rsvps/reports/./r1/index.html",
        "live/rsvps/reports//r1/index.html",
        "live/rsvps/reports",
        "live/rsvps/silver/_delta_log/00000000000000000000.json",
        "live/rsvps/audits/part-0.parquet",
        "../live/rsvps/reports/r1/index.html",
        "live/../rsvps/reports/r1/index.html",
        "live/rsvps/reports/r1\\..\\..\\silver",
        "live/rsvps/reports/r1/\x00.html",
        "live.x/rsvps/reports/r1/index.html",
    ],
)
def test_report_location_refuses_everything_else(path: str):
    with pytest.raises(ReportPathRefused, match="refused"):
        report_location(LAKE, path)


def test_content_types_that_data_docs_need():
    assert content_type("a/index.html") == "text/html; charset=utf-8"
    assert content_type("static/styles/x.CSS") == "text/css; charset=utf-8"
    assert content_type("static/app.js").startswith("text/javascript")
    assert content_type("static/images/logo.svg") == "image/svg+xml"
    assert content_type("static/fonts/a.woff2") == "font/woff2"
    assert content_type("data.bin") == "application/octet-stream"


def test_report_href_quotes_segments_but_keeps_slashes():
    href = report_href("/tidewater", "live/rsvps/reports/manual__2026-11-21T10:00:00+00:00/index.html")
    assert href == "/tidewater/reports/files/live/rsvps/reports/manual__2026-11-21T10%3A00%3A00%2B00%3A00/index.html"


def test_formatting():
    assert fmt.human_size(None) == "" and fmt.human_size(512) == "512 B" and fmt.human_size(1536) == "1.5 KiB"
    when = dt.datetime(2026, 11, 21, 10, 0, 5, tzinfo=dt.UTC)
    assert fmt.fmt_time(when) == "2026-11-21 10:00:05 UTC"
    assert fmt.fmt_time(int(when.timestamp() * 1000)) == "2026-11-21 10:00:05 UTC"  # Delta history millis
    assert fmt.fmt_time(None) == ""
    assert fmt.fmt_interval(when, when + dt.timedelta(hours=1)) == "2026-11-21 10:00 to 11:00 UTC"
    assert fmt.commit_run({"tidewater.run_id": "manual__1"}) == "manual__1"
    assert fmt.commit_run({"tidewater.query": "live.rsvps.bronze", "tidewater.batch_id": 3}) == (
        "stream live.rsvps.bronze batch 3"
    )
    assert fmt.commit_run({"tidewater.maintenance_run": "m1", "tidewater.step": "compact"}) == "m1"
    assert fmt.commit_run(None) == ""


def test_json_and_cell_values():
    value = {"t": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "d": decimal.Decimal("1.50"), "b": b"\x00\x01"}
    assert fmt.json_value([value, math.nan, (1, 2)]) == [
        {"t": "2026-01-02T00:00:00+00:00", "d": "1.50", "b": "AAE="},
        None,
        [1, 2],
    ]
    assert fmt.cell_text(None) == "NULL"
    assert fmt.cell_text(["a", 1]) == '["a", 1]'
    assert fmt.cell_text("x" * 1000).endswith("…") and len(fmt.cell_text("x" * 1000)) == fmt.MAX_CELL_CHARS


def test_audit_report_link_points_at_the_by_run_page():
    key = SimpleNamespace(dag_id="tidewater_batch_rsvps", run_id="scheduled__2026-11-21T10:00:00+00:00", task_id="a")
    link = AuditReportLink().get_link(None, ti_key=key)
    assert link.endswith(
        "/tidewater/reports/by-run?dag_id=tidewater_batch_rsvps&run_id=scheduled__2026-11-21T10%3A00%3A00%2B00%3A00"
        "&task_id=a"
    )
    assert AuditReportLink().name == "Data quality report"
    assert by_run_url("d", "r", base_url="http://h:1/") == "http://h:1/tidewater/reports/by-run?dag_id=d&run_id=r"


def test_pages_escape_lake_values_and_build_paging_links():
    pages = Pages("/tidewater", "live")
    evil = "<script>alert(1)</script>"
    result = SimpleNamespace(
        columns=["name", evil], rows=[[evil, None]], page=2, page_size=25, has_more=True, tables={}, elapsed_s=0.01
    )
    html = pages.sql(sql=f"SELECT '{evil}' FROM rsvps.silver", page_size=25, result=result)
    assert evil not in html and "&lt;script&gt;" in html
    assert 'id="prev"' in html and 'id="next"' in html
    assert "/tidewater/sql?sql=SELECT+%27%3Cscript%3E" in html and "page=3&amp;page_size=25" in html
    refused = pages.sql(sql="DELETE FROM x", page_size=25, refusal=f"refused: {evil}")
    assert 'id="refusal"' in refused and evil not in refused
    row = SimpleNamespace(name=evil, pipeline="p", table="t", info={"exists": True, "version": 3}, audit=None, error="")
    assert evil not in pages.tables([row])
    audits = pages.audits([{"suite": evil, "dag_id": "d", "dag_run_id": "r+1", "report_path": "live/p/reports/x/"}])
    assert (
        evil not in audits and "/dags/d/runs/r%2B1" in audits and "/tidewater/reports/files/live/p/reports/x/" in audits
    )


def test_lazy_app_builds_once_on_first_request():
    built: list[Any] = []
    app = LazyApp(f"{__name__}:_factory")
    _FACTORY_CALLS.clear()

    async def send(message: Any) -> None:
        built.append(message)

    async def receive() -> Any:
        return {}

    for _ in range(2):
        asyncio.run(app({"type": "http"}, receive, send))
    assert _FACTORY_CALLS == [1] and built == ["hello", "hello"]


_FACTORY_CALLS: list[int] = []


def _factory() -> Any:
    _FACTORY_CALLS.append(1)

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await send("hello")

    return asgi


def test_airflow_loads_the_plugin_folder(tmp_path: Path):
    settings = Settings(state_dir=str(tmp_path))
    env = airflow_environment(settings, ensure_secrets(settings))
    folder = env["AIRFLOW__CORE__PLUGINS_FOLDER"]
    assert (Path(folder) / "tidewater_plugin.py").is_file()
    routes = {view["url_route"] for view in EXTERNAL_VIEWS}
    assert len(routes) == len(EXTERNAL_VIEWS)  # Airflow drops views whose routes collide
    assert all(not view["href"].startswith("/") for view in EXTERNAL_VIEWS)  # relative to Airflow's <base href>
