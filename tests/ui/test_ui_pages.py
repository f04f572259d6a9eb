"""The tidewater plugin in a real Airflow api-server, driven by headless Chromium and plain HTTP.

- Authentication: every route refuses a request without a token (401), with a forged token (403)
  and with an expired one (401), as JSON for API clients and as a sign-in page for a browser.
- A person signs in on Airflow's real login page, then: the tables page shows versions, rows and
  audit status; the page also loads inside Airflow's UI (the plugin's nav entry, an iframe); the
  SQL box time-travels to an old version, pages through a result, and shows the refusal of a write
  (the table's version does not move); the audits page opens a Data Docs report whose CSS, JS and
  relative subpage links work; in Airflow's UI, the audit DAG run's "Data quality" tab and its task's
  "Data quality report" extra link land on the same report.
- Streams: the page shows each stream's state (a driver that died, with its error and restart), its
  queries' last batch with the lag per partition, and plots of its progress history drawn on the
  server; its "stop" button creates a run of the real control DAG with the pipeline and action as
  params; each partition's lag is also shown against what the broker retains. A screenshot of the page
  is kept in ``.test-artifacts/ui/``.
- Assets: with a real scheduler beside the api-server, an event on ``rsvps.gold.venue_response_counts``
  runs ``examples/rsvps_gold_consumer.py`` (scheduled on ``rsvps.gold.*``), which reads the event's
  extra; the run's page shows "Asset Triggered" and, on its Asset Events tab, the asset (screenshot).
- Report files: only a pipeline's reports area is served (``..``, encoded ``..``, absolute paths,
  other lake folders and a symlink out of the lake are refused).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse

import jwt
import pytest
from deltalake import DeltaTable
from ui_support import AUDIT_DAG, AUDIT_TASK, REPORT_CSS_COLOR, SECRET_TEXT, STREAM_ERROR, UiServer, http

from tidewater.paths import project_root

pytestmark = [pytest.mark.slow, pytest.mark.airflow]

WAIT_S = 30
ARTIFACTS = project_root() / ".test-artifacts" / "ui"  # screenshots, kept after the run


def wait_for(driver: Any, css: str, timeout_s: float = WAIT_S) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def css_all(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def navigate(driver: Any, element: Any, timeout_s: float = WAIT_S) -> None:
    """Click a link or submit button and wait until the browser has left the current page (else a
    wait for an element could find the old page's copy of it)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    # A marker on the old page's window, not a reference to its <html>: Chrome may answer a query
    # on an element of a page being unloaded with a generic error instead of "stale" (seen in CI).
    driver.execute_script("window.__tidewaterOldPage = true")
    element.click()
    WebDriverWait(driver, timeout_s, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script("return !window.__tidewaterOldPage && document.readyState !== 'loading'")
    )


def sign_in(driver: Any, server: UiServer, next_path: str) -> None:
    """Airflow's own login page (SimpleAuthManager), as a person would use it."""
    driver.get(f"{server.url}/auth/login?{urlencode({'next': server.url + next_path})}")
    wait_for(driver, "input[name=username]").send_keys("admin")
    css(driver, "input[name=password]").send_keys(server.password)
    css(driver, "button[type=submit]").click()


def status_in_browser(driver: Any, path: str) -> int:
    """The HTTP status a same-origin fetch from the page gets (with the browser's cookies)."""
    return int(
        driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {credentials: 'same-origin', redirect: 'manual'})"
            ".then(r => done(r.status)).catch(() => done(-1));",
            path,
        )
    )


def silver_version(server: UiServer) -> int:
    return int(DeltaTable(server.lake.silver_uri).version())


def forged_token(server: UiServer) -> str:
    """A well-formed JWT with an admin's claims, signed with a key that is not the deployment's."""
    claims = jwt.decode(server.token(), options={"verify_signature": False})
    return jwt.encode(claims, "not-the-deployment-secret-" + "x" * 40, algorithm="HS512")


def expired_token(server: UiServer) -> str:
    """A token signed with the real key whose expiry has passed (Airflow answers 401 "Token Expired")."""
    from tidewater.orchestration.airflow_env import ensure_secrets

    claims = jwt.decode(server.token(), options={"verify_signature": False})
    past = int(time.time()) - 3600
    claims.update(iat=past - 60, nbf=past - 60, exp=past)
    return jwt.encode(claims, ensure_secrets(server.lake.settings).jwt_secret, algorithm="HS512")


def raw_get(server: UiServer, path: str, token: str) -> tuple[int, str]:
    """GET a path byte for byte (no client-side normalisation of ``..`` or percent escapes)."""
    parsed = urlparse(server.url)
    conn = HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


# ---- plain HTTP ----------------------------------------------------------------------------------------


def test_every_route_refuses_requests_without_a_valid_token(ui_server: UiServer):
    report = f"/tidewater/reports/files/{ui_server.lake.report_path}"
    by_run = urlencode({"dag_id": AUDIT_DAG, "run_id": ui_server.lake.audit_run})
    routes: list[tuple[str, str, bytes | None]] = [
        ("GET", "/tidewater/api/tables", None),
        ("GET", "/tidewater/api/tables/rsvps.silver/history", None),
        ("GET", "/tidewater/api/audits", None),
        ("POST", "/tidewater/api/sql", json.dumps({"sql": "SELECT * FROM rsvps.silver"}).encode()),
        ("GET", "/tidewater/tables", None),
        ("GET", "/tidewater/sql?sql=SELECT+1", None),
        ("GET", "/tidewater/audits", None),
        ("GET", f"/tidewater/reports/by-run?{by_run}", None),
        ("GET", report, None),
        ("GET", "/tidewater/", None),
    ]
    forged, expired = forged_token(ui_server), expired_token(ui_server)
    for method, path, body in routes:
        base = {"Content-Type": "application/json"}
        none = http(ui_server.url + path, method=method, body=body, headers=base)
        assert none.status == 401, (path, none.status, none.text[:200])
        for token, status in ((forged, 403), (expired, 401)):
            answer = http(
                ui_server.url + path, method=method, body=body, headers={**base, "Authorization": f"Bearer {token}"}
            )
            assert answer.status == status, (path, answer.status, answer.text[:200])
            assert "Validation results" not in answer.text and "venue-" not in answer.text
        cookie = http(ui_server.url + path, method=method, body=body, headers={**base, "Cookie": f"_token={forged}"})
        assert cookie.status == 403, (path, cookie.status)
    # No documentation routes that would describe (or serve) anything without a token.
    for path in ("/tidewater/docs", "/tidewater/openapi.json", "/tidewater/redoc"):
        assert http(ui_server.url + path).status in (401, 404)

    # The same calls with a real token (header or cookie, as the Airflow UI sends it) are answered.
    token = ui_server.token()
    listed = http(ui_server.url + "/tidewater/api/tables", headers={"Authorization": f"Bearer {token}"})
    assert listed.status == 200
    tables = {t["name"]: t for t in json.loads(listed.text)["tables"]}
    assert tables["rsvps.silver"]["version"] == 2 and tables["rsvps.silver"]["rows"] == 126
    assert tables["rsvps.silver"]["audit"]["success"] is True
    page = http(ui_server.url + "/tidewater/tables", headers={"Cookie": f"_token={token}"})
    assert page.status == 200 and "rsvps.silver" in page.text


def test_json_sql_api_reads_time_travels_and_refuses_writes(ui_server: UiServer):
    token = ui_server.token()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(sql: str, **extra: Any) -> Any:
        return http(
            ui_server.url + "/tidewater/api/sql",
            method="POST",
            body=json.dumps({"sql": sql, **extra}).encode(),
            headers=headers,
        )

    old = post("SELECT id, batch FROM rsvps.silver VERSION AS OF 0 ORDER BY id")
    assert old.status == 200, old.text
    assert json.loads(old.text)["rows"] == [[0, 0], [1, 0], [2, 0]]
    paged = json.loads(post("SELECT id FROM rsvps.silver ORDER BY id", page=2, page_size=50).text)
    assert [r[0] for r in paged["rows"]] == list(range(50, 100)) and paged["has_more"] is True

    before = silver_version(ui_server)
    for statement in (
        "INSERT INTO rsvps.silver VALUES (999, 'x', 9)",
        "DELETE FROM rsvps.silver WHERE id < 5",
        "SELECT * FROM read_parquet('/etc/passwd')",
        f"SELECT * FROM '{ui_server.lake.outside_file}'",
    ):
        refused = post(statement)
        assert refused.status == 400, (statement, refused.status, refused.text)
        detail = json.loads(refused.text)["detail"]
        assert detail.startswith("refused") and "\n" not in detail, detail
    assert silver_version(ui_server) == before


def test_report_files_outside_the_reports_area_are_refused(ui_server: UiServer):
    token = ui_server.token()
    reports = f"/tidewater/reports/files/{ui_server.lake.report_path.rsplit('/', 1)[0]}"
    ok_status, ok_body = raw_get(ui_server, f"{reports}/index.html", token)
    assert ok_status == 200 and "Validation results" in ok_body
    namespace = ui_server.lake.settings.namespace
    for path in (
        f"{reports}/../../silver/_delta_log/00000000000000000000.json",
        f"{reports}/%2e%2e/%2e%2e/silver/_delta_log/00000000000000000000.json",
        f"{reports}/..%2f..%2f..%2f..%2f..%2f{quote(str(ui_server.lake.outside_file.name))}",
        f"/tidewater/reports/files/{namespace}/rsvps/silver/_delta_log/00000000000000000000.json",
        "/tidewater/reports/files/%2Fetc%2Fpasswd",
        "/tidewater/reports/files/..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
        f"{reports}/static/leak.txt",  # a symlink planted in the reports area, pointing out of the lake
    ):
        status, body = raw_get(ui_server, path, token)
        assert status in (403, 404), (path, status, body[:200])
        assert SECRET_TEXT not in body and '"commitInfo"' not in body and "root:" not in body
        if status == 403:
            assert "refused" in json.loads(body)["detail"]


# ---- the browser --------------------------------------------------------------------------------------


def test_unauthenticated_browser_sees_no_lake_data(ui_server: UiServer, browser_factory: Callable[[], Any]):
    driver = browser_factory()  # fresh profile: no Airflow session
    driver.get(ui_server.url + "/tidewater/tables")
    message = wait_for(driver, "#message")
    assert "Not authenticated" in message.text
    assert not css_all(driver, "#tables") and "rsvps.silver" not in driver.page_source
    assert "/auth/login" in css(driver, "#message-link").get_attribute("href")
    assert status_in_browser(driver, "/tidewater/api/tables") == 401
    assert status_in_browser(driver, f"/tidewater/reports/files/{ui_server.lake.report_path}") == 401
    driver.get(f"{ui_server.url}/tidewater/sql?{urlencode({'sql': 'SELECT * FROM rsvps.silver'})}")
    wait_for(driver, "#message")
    assert "venue-" not in driver.page_source


def test_signed_in_user_browses_tables_queries_and_reports(ui_server: UiServer, browser_factory: Callable[[], Any]):
    driver = browser_factory()
    sign_in(driver, ui_server, "/tidewater/tables")

    # Tables page: version, rows and the latest audit of each table.
    wait_for(driver, "#tables")
    silver = css(driver, "tr[data-table='rsvps.silver']")
    assert silver.find_element("css selector", ".version").text == "2"
    assert silver.find_element("css selector", ".rows").text == "126"
    assert "ui-test-run-2" in silver.find_element("css selector", ".commit").text  # the last commit's run
    assert silver.find_element("css selector", ".audit-status").text == "passed"
    failed = [row for row in css_all(driver, "tr[data-table^='rsvps.gold']") if "failed" in row.text]
    assert failed, "the failed gold audit is shown"

    # History of one table: every commit, newest first.
    navigate(driver, silver.find_element("css selector", "a.history"))
    wait_for(driver, "#history")
    versions = [row.find_element("css selector", "td").text for row in css_all(driver, "#history tbody tr")]
    assert versions == ["2", "1", "0"]

    # The same page inside Airflow's own UI (the plugin's nav entry renders it in an iframe).
    driver.get(ui_server.url + "/plugin/tidewater-tables")
    frame = wait_for(driver, "iframe")
    driver.switch_to.frame(frame)
    wait_for(driver, "#tables")
    driver.switch_to.default_content()

    # SQL: time travel to version 0 shows the rows of the first commit only.
    driver.get(ui_server.url + "/tidewater/sql")
    box = wait_for(driver, "#sql")
    box.send_keys("SELECT id, batch FROM rsvps.silver VERSION AS OF 0 ORDER BY id")
    navigate(driver, css(driver, "#run"))
    wait_for(driver, "#result")
    cells = [[td.text for td in tr.find_elements("css selector", "td")] for tr in css_all(driver, "#result tbody tr")]
    assert cells == [["0", "0"], ["1", "0"], ["2", "0"]]

    # Paging: 25 rows a page, next goes to page 2 (rows 25..49), previous comes back.
    box = css(driver, "#sql")
    box.clear()
    box.send_keys("SELECT id FROM rsvps.silver ORDER BY id")
    driver.execute_script("document.getElementById('page_size').value = '25'")
    navigate(driver, css(driver, "#run"))
    navigate(driver, wait_for(driver, "#next"))
    wait_for(driver, "#prev")
    assert css(driver, "#page-number").text == "2"
    ids = [tr.find_element("css selector", "td").text for tr in css_all(driver, "#result tbody tr")]
    assert ids == [str(i) for i in range(25, 50)]
    navigate(driver, css(driver, "#prev"))
    wait_for(driver, "#next")
    assert css(driver, "#page-number").text == "1"

    # A write is refused with a clear message, and the table does not change.
    before = silver_version(ui_server)
    for statement in ("INSERT INTO rsvps.silver VALUES (999, 'x', 9)", "DELETE FROM rsvps.silver WHERE id < 5"):
        box = css(driver, "#sql")
        box.clear()
        box.send_keys(statement)
        navigate(driver, css(driver, "#run"))
        refusal = wait_for(driver, "#refusal")
        assert "refused" in refusal.text and "read" in refusal.text, refusal.text
        assert not css_all(driver, "#result")
    assert silver_version(ui_server) == before

    # Audits page -> the report: Data Docs render with their CSS and JS, relative links work.
    navigate(driver, css(driver, "#nav-audits"))
    wait_for(driver, "#audits")
    assert len(css_all(driver, "#audits tbody tr")) == 2
    # The report index: each pipeline's pass rate per hour (one hour here: 1 of 2 suites passed).
    dots = css_all(driver, "#pass-rate-rsvps g.series circle title")
    assert [d.get_attribute("textContent") for d in dots] == ["suites passed: 50 % at 2026-11-21 10:00:00 UTC"]
    assert css(driver, "#report-index a[href*='pipeline=rsvps']").text == "rsvps"
    navigate(driver, css(driver, "#audits a.report"))
    wait_for(driver, "#js-ran")  # the report's script was served as JavaScript and ran
    assert css(driver, "#docs-title").text == "Validation results for rsvps"
    assert driver.execute_script("return getComputedStyle(document.body).backgroundColor") == REPORT_CSS_COLOR
    navigate(driver, css(driver, "#suite-link"))
    assert "4 of 4" in wait_for(driver, "#suite-title").text
    navigate(driver, css(driver, "#back"))
    wait_for(driver, "#docs-title")

    # The DAG run that audited, in Airflow's UI: its "Data quality" tab (the plugin's dag_run view) shows
    # the run's report, and the audit task's extra link "Data quality report" leads to it too.
    run_page = f"{ui_server.url}/dags/{AUDIT_DAG}/runs/{quote(ui_server.lake.audit_run, safe='')}"
    driver.get(run_page)
    wait_for(driver, "a[href$='/plugin/tidewater-run-report']").click()
    driver.switch_to.frame(wait_for(driver, "iframe[title='Data quality']"))
    assert wait_for(driver, "#docs-title").text == "Validation results for rsvps"  # by-run redirected
    driver.switch_to.default_content()
    driver.get(f"{run_page}/tasks/{AUDIT_TASK}/details")
    link = wait_for(driver, "a[href*='/tidewater/reports/by-run']")
    assert link.text == "Data quality report" and f"task_id={AUDIT_TASK}" in link.get_attribute("href")
    navigate(driver, link)
    wait_for(driver, "#docs-title")
    assert driver.current_url.endswith(ui_server.lake.report_path)

    # Signed in or not, nothing outside a reports area is served: the page says it was refused.
    namespace = ui_server.lake.settings.namespace
    driver.get(f"{ui_server.url}/tidewater/reports/files/{namespace}/rsvps/silver/_delta_log/00000000000000000000.json")
    assert "refused" in wait_for(driver, "#message").text
    assert "commitInfo" not in driver.page_source


def test_plugin_is_registered_with_nav_entries_and_operator_link(ui_server: UiServer):
    token = ui_server.token()
    answer = http(ui_server.url + "/api/v2/plugins", headers={"Authorization": f"Bearer {token}"})
    plugin = next(p for p in json.loads(answer.text)["plugins"] if p["name"] == "tidewater")
    views = {v["url_route"]: v for v in plugin["external_views"]}
    assert {
        "tidewater-streams",
        "tidewater-tables",
        "tidewater-sql",
        "tidewater-audits",
        "tidewater-run-report",
    } <= set(views)
    assert views["tidewater-run-report"]["destination"] == "dag_run"
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/tidewater"
    assert any("AuditReportLink" in link for link in plugin["operator_extra_links"])
    errors = http(ui_server.url + "/api/v2/plugins/importErrors", headers={"Authorization": f"Bearer {token}"})
    assert json.loads(errors.text)["total_entries"] == 0, errors.text


def test_streams_page_shows_health_and_plots_and_stops_through_the_control_dag(
    ui_server: UiServer, browser_factory: Callable[[], Any]
):
    driver = browser_factory()
    sign_in(driver, ui_server, "/tidewater/streams")
    stream = wait_for(driver, "#stream-rsvps")
    assert stream.get_attribute("data-state") == "dead"  # its driver exited: the supervisor relaunches it
    assert STREAM_ERROR.removeprefix("tidewater: ") in stream.text and "1 restart(s)" in stream.text
    assert css(driver, "#stream-pageviews").get_attribute("data-state") == "stopped"  # never started
    bronze = css(driver, "#stream-rsvps tr[data-query='bronze']")
    topic = ui_server.lake.settings.topic("rsvps")
    assert f"{topic}/0 20" in bronze.text  # lag of each partition against the broker's end
    # ... and against what the broker retains: partition 1 has 90 of its 100 retained records unread.
    safe = css(driver, f"#stream-rsvps [data-partition='{topic}/0']")
    assert "of 39020 retained (0% unread)" in safe.text and safe.get_attribute("class") == "partition ok"
    risky = css(driver, f"#stream-rsvps [data-partition='{topic}/1']")
    assert f"{topic}/1 90 of 100 retained (90% unread) retention deletes unread records soon" == risky.text
    assert "at-risk" in risky.get_attribute("class").split()

    # The plots: inline SVG drawn on the server from progress.jsonl, a line per series.
    def series(chart: str) -> dict[str, int]:
        groups = css_all(driver, f"#chart-rsvps-{chart} g.series")
        return {g.get_attribute("data-series"): int(g.get_attribute("data-points")) for g in groups}

    assert series("rates") == {"bronze input": 40, "bronze processed": 40}
    assert series("lag") == {"bronze": 40}
    assert series("duration") == {"bronze": 40, "gold_venue_response_counts": 40}
    assert set(series("rows")) == {"bronze", "gold_venue_response_counts"}
    assert series("late") == {"gold_venue_response_counts": 40}
    assert series("state") == {"gold_venue_response_counts": 40}
    assert series("audits") == {"suites passed": 1}
    chart = css(driver, "#chart-rsvps-rates")
    assert chart.is_displayed() and chart.size["width"] >= 500 and chart.size["height"] >= 150
    assert "no progress in the last 1 h" in css(driver, "#stream-pageviews .no-history").text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "streams.png"))
    assert stream.screenshot(str(ARTIFACTS / "streams-rsvps.png"))
    assert len(chart.screenshot_as_png) > 5000  # a drawn plot, not an empty box

    # Stop: a run of the control DAG with the pipeline and action, made for the signed-in user.
    navigate(driver, css(driver, "#stop-rsvps"))
    notice = wait_for(driver, "#notice").text
    assert "stop of rsvps requested" in notice, notice
    token = ui_server.token()
    answer = http(
        ui_server.url + "/api/v2/dags/tidewater_stream_control/dagRuns", headers={"Authorization": f"Bearer {token}"}
    )
    runs = json.loads(answer.text)["dag_runs"]
    assert [(r["conf"], r["state"]) for r in runs] == [({"pipeline": "rsvps", "action": "stop"}, "queued")]
    assert runs[0]["dag_run_id"] in notice


def test_a_report_renders_styled_on_a_closed_network(ui_server: UiServer, browser_factory: Callable[..., Any]):
    """Data Docs load Bootstrap, Font Awesome and jQuery from CDNs; the plugin serves the vendored copies
    (tidewater.ui.vendor) in their place, so a browser that can reach nothing but Airflow renders it styled."""
    driver = browser_factory(offline=True)
    sign_in(driver, ui_server, f"/tidewater/reports/files/{ui_server.lake.report_path}")
    wait_for(driver, "#docs-title")
    source = driver.page_source
    assert "/tidewater/vendor/bootstrap@4.3.1/dist/css/bootstrap.min.css" in source
    assert "bootstrapcdn" not in source and "cdnjs" not in source and "code.jquery.com" not in source
    button = css(driver, "#styled-button")
    assert button.value_of_css_property("background-color") == "rgba(0, 123, 255, 1)"  # Bootstrap 4's primary
    assert driver.execute_script("return typeof window.jQuery") == "function"
    icon_fonts = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "document.fonts.load('900 16px \"Font Awesome 6 Free\"').then(f => done(f.length), () => done(-1));"
    )
    assert icon_fonts > 0  # the icon font came from the vendored webfonts
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "report-offline.png"))
    assert status_in_browser(driver, "/tidewater/vendor/bootstrap@4.3.1/package.json") == 404


def test_an_asset_event_on_gold_runs_a_users_dag_and_the_ui_shows_what_triggered_it(
    ui_server: UiServer, airflow_scheduler: Path, browser_factory: Callable[[], Any]
):
    """examples/rsvps_gold_consumer.py (the README's DAG scheduled on rsvps.gold.*) under a real
    scheduler: an event on one gold table, as publish_gold or a correction emits it (their events are
    tests/dags/test_dag_runs.py's), starts a run that reads the event's extra; the run's page in
    Airflow's UI names the asset that triggered it."""
    token = ui_server.token()

    def api(path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
        answer = http(
            ui_server.url + "/api/v2" + path,
            method=method,
            body=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert answer.status in (200, 201), f"{method} {path}: {answer.status} {answer.text[:500]}"
        return json.loads(answer.text)

    # The fixture paused the supervisor: it would launch real streams from this module's state folder.
    assert api("/dags/tidewater_supervise_streams")["is_paused"]
    api("/dags/rsvps_gold_consumer", "PATCH", {"is_paused": False})  # a new DAG starts paused, as on a deployment
    table = "rsvps.gold.venue_response_counts"
    (asset,) = [a for a in api(f"/assets?name_pattern={table}")["assets"] if a["name"] == table]
    assert asset["uri"].endswith("/rsvps/gold/venue_response_counts")
    assert {r["dag_id"] for r in asset["scheduled_dags"]} == {"rsvps_gold_consumer"}
    extra = {"mode": "correction", "interval": "2026-11-21T10:00:00+00:00/2026-11-21T11:00:00+00:00", "version": 7}
    api("/assets/events", "POST", {"asset_id": asset["id"], "extra": extra})

    def finished_run() -> dict[str, Any] | None:
        runs = api("/dags/rsvps_gold_consumer/dagRuns")["dag_runs"]
        return runs[0] if runs and runs[0]["state"] in ("success", "failed") else None

    deadline = time.monotonic() + 180
    while (run := finished_run()) is None:
        assert time.monotonic() < deadline, "no finished run:\n" + airflow_scheduler.read_text()[-3000:]
        time.sleep(2)
    assert run["run_type"] == "asset_triggered" and run["state"] == "success", run
    run_path = f"/dags/rsvps_gold_consumer/dagRuns/{run['dag_run_id']}"
    (event,) = api(run_path + "/upstreamAssetEvents")["asset_events"]
    assert event["name"] == table and event["extra"]["version"] == 7
    changes = api(run_path + "/taskInstances/what_changed/xcomEntries/return_value")["value"]
    assert [(c["table"], c["mode"], c["version"]) for c in changes] == [(table, "correction", 7)]

    driver = browser_factory()
    sign_in(driver, ui_server, f"/dags/rsvps_gold_consumer/runs/{run['dag_run_id']}")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def body() -> str:
        # The page's text in one script call: Airflow's UI re-renders as it loads, and a <body> element
        # found first went stale before its text was read (seen in CI).
        return str(driver.execute_script("return document.body ? document.body.innerText : ''"))

    # Also ignored while the page changes under a query: Chrome's generic errors for a page being replaced.
    rendered = WebDriverWait(driver, WAIT_S, ignored_exceptions=(WebDriverException,))
    rendered.until(lambda d: "Run Type" in body())
    assert "Asset Triggered" in body() and "what_changed" in body()
    driver.find_element("link text", "Asset Events").click()  # the run's tab of its triggering events
    rendered.until(lambda d: table in body())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "asset-triggered-run.png"))
