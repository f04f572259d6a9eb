"""The UI tests' lake (real Delta tables written with deltalake, an audit table, a static report with
CSS, JS and a relatively linked subpage like GX Data Docs) and a plain HTTP helper.

Shared by tests/ui/conftest.py (fixtures) and the test modules (constants, helpers).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.orchestration.airflow_env import ADMIN_USER
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality.audit_log import AuditRow, to_arrow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
AUDIT_DAG = "tidewater_ui_test_audit"
AUDIT_TASK = "audit"
# A one-task DAG whose task carries the audit operator's extra link: run once with `airflow dags test`,
# its run is the one the lake's audit rows name (the run id is only known after it ran).
AUDIT_DAG_FILE = f"""
import datetime as dt

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from tidewater.ui.links import AuditReportLink


class AuditLike(EmptyOperator):
    operator_extra_links = (AuditReportLink(),)


with DAG("{AUDIT_DAG}", start_date=dt.datetime(2026, 1, 1), schedule=None):
    AuditLike(task_id="{AUDIT_TASK}")
"""
REPORT_ID = "20261121T100000-rsvps"
REPORT_CSS_COLOR = "rgb(1, 2, 3)"
SECRET_TEXT = "tidewater-ui-test-secret-outside-the-lake"


@dataclass
class UiLake:
    settings: Settings
    silver_uri: str
    report_path: str  # relative to the lake root, as audit rows record it
    outside_file: Path  # a file beside the lake that nothing may serve
    audit_run: str  # the DAG run the audit rows belong to


@dataclass
class UiServer:
    url: str
    lake: UiLake
    password: str
    log: Path
    env: dict[str, str]  # the Airflow environment of the server (a scheduler started by a test shares it)

    def token(self) -> str:
        body = json.dumps({"username": ADMIN_USER, "password": self.password}).encode()
        answer = http(self.url + "/auth/token", method="POST", body=body, headers={"Content-Type": "application/json"})
        assert answer.status == 201, answer.text
        return str(json.loads(answer.text)["access_token"])


@dataclass
class Answer:
    status: int
    text: str
    headers: dict[str, str]


def http(url: str, *, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    """One request, no proxy, no redirects followed; errors come back as answers."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=60) as response:
            return Answer(response.status, response.read().decode(errors="replace"), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(errors="replace"), dict(exc.headers))


# ---- the lake --------------------------------------------------------------------------------------


def _silver_batch(ids: range, batch: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "venue": pa.array([f"venue-{i % 7}" for i in ids], pa.string()),
            "batch": pa.array([batch] * len(ids), pa.int64()),
        }
    )


def ui_settings(root: Path) -> Settings:
    return Settings(state_dir=str(root / "state"), lake_root=(root / "lake").as_uri(), airflow_port=free_port())


def build_lake(root: Path, settings: Settings, audit_run: str) -> UiLake:
    """Silver with three commits (3, +120, +3 rows), a gold table, an audit table (rows of DAG run
    ``audit_run``) and one report."""
    layout = PipelineLayout.of(settings, get_pipeline("rsvps"))
    silver = layout.table_uri("silver")
    for number, (ids, batch) in enumerate([(range(0, 3), 0), (range(3, 123), 1), (range(123, 126), 2)]):
        write_deltalake(
            silver,
            _silver_batch(ids, batch),
            mode="append",
            commit_properties=CommitProperties(custom_metadata={"tidewater.run_id": f"ui-test-run-{number}"}),
        )
    gold_name = layout.table_names[-1]  # some gold table of the pipeline
    write_deltalake(
        layout.table_uri(gold_name),
        pa.table({"venue": ["venue-1", "venue-2"], "responses": pa.array([5, 8], pa.int64())}),
    )

    report_rel = f"{settings.namespace}/rsvps/reports/{REPORT_ID}/index.html"
    report_dir = root / "lake" / settings.namespace / "rsvps" / "reports" / REPORT_ID
    (report_dir / "static").mkdir(parents=True)
    (report_dir / "validations").mkdir()
    (report_dir / "index.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Data Docs</title>"
        # the CDN links GX 1.x's page templates carry (served from the vendored copies)
        '<link href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css" rel="stylesheet">'
        '<link rel="stylesheet" href="https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css">'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>'
        "<link rel='stylesheet' href='static/style.css'><script src='static/app.js'></script></head>"
        "<body><h1 id='docs-title'>Validation results for rsvps</h1>"
        "<button id='styled-button' class='btn btn-primary'><i class='fas fa-check'></i> expectations</button>"
        "<a id='suite-link' href='validations/silver.html'>rsvps.silver suite</a></body></html>"
    )
    (report_dir / "static" / "style.css").write_text(f"body {{ background-color: {REPORT_CSS_COLOR}; }}\n")
    (report_dir / "static" / "app.js").write_text(
        "document.addEventListener('DOMContentLoaded', () => {\n"
        "  const p = document.createElement('p'); p.id = 'js-ran'; p.textContent = 'scripts run';\n"
        "  document.body.appendChild(p);\n});\n"
    )
    (report_dir / "validations" / "silver.html").write_text(
        "<!doctype html><html><head><link rel='stylesheet' href='../static/style.css'></head><body>"
        "<h2 id='suite-title'>Suite rsvps.silver: 4 of 4 expectations met</h2>"
        "<a id='back' href='../index.html'>back</a></body></html>"
    )

    start = dt.datetime(2026, 11, 21, 9, tzinfo=dt.UTC)
    common: dict[str, Any] = {
        "audit_id": "audit-1",
        "pipeline": "rsvps",
        "namespace": settings.namespace,
        "interval_start": start,
        "interval_end": start + dt.timedelta(hours=1),
        "trigger": "scheduled",
        "dag_id": AUDIT_DAG,
        "dag_run_id": audit_run,
        "task_id": AUDIT_TASK,
        "report_path": report_rel,
        "audited_at": start + dt.timedelta(hours=1, minutes=6),
    }
    rows = [
        AuditRow(
            suite="rsvps.silver",
            table_name="silver",
            success=True,
            rows=126,
            expectations=4,
            failed_expectations=0,
            **common,
        ),
        AuditRow(
            suite=f"rsvps.{gold_name.replace('/', '.')}",
            table_name=gold_name,
            success=False,
            rows=2,
            expectations=3,
            failed_expectations=1,
            blocking=True,
            failures=["expect_column_values_to_not_be_null(venue): 1 null"],
            **common,
        ),
    ]
    write_deltalake(layout.audit_uri(), to_arrow(rows))

    outside = root / "outside-secret.txt"
    outside.write_text(SECRET_TEXT)
    # A link planted inside the reports area that leads out of the lake must not be followed.
    os.symlink(outside, report_dir / "static" / "leak.txt")
    write_stream_state(settings)
    return UiLake(settings, silver, report_rel, outside, audit_run)


STREAM_ERROR = "tidewater: CheckpointError: checkpoint of bronze is held by another driver"


def write_stream_state(settings: Settings, *, minutes: int = 20) -> None:
    """What a stream of rsvps leaves behind, in the files' own formats: its progress history (records made
    by the listener's summarize() from Spark-shaped progress, one bronze and one gold batch per 30 s over
    the last ``minutes``), its supervisor events (a start, a death with its error, a restart) and a
    driver that has exited since (so the page shows it failed, with the error)."""
    from tidewater.orchestration.supervisor import StreamControl
    from tidewater.streaming.progress import summarize

    control = StreamControl(settings, "rsvps")
    progress_dir = control.layout.progress_dir()
    progress_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    topic = settings.topic("rsvps")
    records = []
    for step in range(minutes * 2):
        at = now - dt.timedelta(seconds=30 * (minutes * 2 - step))
        stamp = at.isoformat().replace("+00:00", "Z")
        behind = 400 if step < minutes else 20  # the stream caught up half-way
        records.append(
            summarize(
                {
                    "name": f"{settings.namespace}.rsvps.bronze",
                    "batchId": step,
                    "timestamp": stamp,
                    "numInputRows": 1500,
                    "inputRowsPerSecond": 50.0,
                    "processedRowsPerSecond": 40.0 if step < minutes else 90.0,
                    "durationMs": {"triggerExecution": 1800 + 10 * step},
                    "sources": [
                        {
                            "endOffset": {topic: {"0": 1000 * step, "1": 500 * step}},
                            "latestOffset": {topic: {"0": 1000 * step + behind, "1": 500 * step + 90}},
                        }
                    ],
                },
                0,
                # Partition 1's retention keeps 100 records, 90 of them unread: at risk.
                retained={f"{topic}/0": 0, f"{topic}/1": 500 * step - 10},
            )
        )
        records.append(
            summarize(
                {
                    "name": f"{settings.namespace}.rsvps.gold_venue_response_counts",
                    "batchId": step,
                    "timestamp": stamp,
                    "numInputRows": 1500,
                    "durationMs": {"triggerExecution": 900},
                    "stateOperators": [{"numRowsTotal": 100 + step, "numRowsDroppedByWatermark": step % 3}],
                    "eventTime": {"watermark": stamp},
                },
                step,
            )
        )
    (progress_dir / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for record in records[-2:]:
        query = record["name"].rsplit(".", 1)[-1]
        (progress_dir / f"{query}.json").write_text(json.dumps(record))
    control.dir.mkdir(parents=True, exist_ok=True)
    started = (now - dt.timedelta(minutes=minutes)).isoformat()
    events = [
        {"at": started, "event": "start", "reason": "not running", "pid": 999_999_998},
        {"at": started, "event": "died", "error": STREAM_ERROR},
        {"at": started, "event": "start", "reason": "died", "pid": 999_999_999},
    ]
    (control.dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (control.dir / "driver.log").write_text(f"starting\n{STREAM_ERROR}\n")
    (control.dir / "driver.json").write_text(
        json.dumps({"pid": 999_999_999, "launched_unix": now.timestamp() - 60 * minutes, "log_offset": 0})
    )
