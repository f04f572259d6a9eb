"""The UI's lake reads on S3 (moto): report files, the by-run lookup across namespaces, the path gate.

The browser tests run on a local lake; these check that the same functions work when the lake is a
bucket, where files are read through pyarrow's S3 file system and audit tables through delta-rs.
"""

from __future__ import annotations

import datetime as dt

import pyarrow.fs as pafs
import pytest
from deltalake import write_deltalake

from tidewater.config import Settings
from tidewater.lake.storage import filesystem, storage_options
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality.audit_log import AuditRow, to_arrow
from tidewater.ui import data
from tidewater.ui.reports import ReportNotFound, ReportPathRefused, read_report, report_location, stat_report


def _audit(namespace: str, run_id: str, report: str) -> AuditRow:
    start = dt.datetime(2026, 11, 21, 9, tzinfo=dt.UTC)
    return AuditRow(
        audit_id=f"a-{namespace}",
        pipeline="rsvps",
        namespace=namespace,
        suite="rsvps.silver",
        table_name="silver",
        interval_start=start,
        interval_end=start + dt.timedelta(hours=1),
        success=True,
        rows=10,
        expectations=3,
        failed_expectations=0,
        dag_id="tidewater_replay_rsvps",
        dag_run_id=run_id,
        task_id="audit",
        report_path=report,
    )


def test_reports_and_audits_on_s3(s3_lake_uri: str, s3_env: dict[str, str]):
    settings = Settings.from_env(lake_root=s3_lake_uri)
    rsvps = get_pipeline("rsvps")
    fs, root = filesystem(s3_lake_uri)
    folder = f"{root}/sandbox/rsvps/reports/r1"
    fs.create_dir(f"{folder}/static", recursive=True)
    with fs.open_output_stream(f"{folder}/index.html") as out:
        out.write(b"<html><body><h1>docs</h1></body></html>")
    with fs.open_output_stream(f"{folder}/static/style.css") as out:
        out.write(b"body { color: red; }")

    # A replay's audit lives in its own namespace; the by-run lookup finds it without being told where.
    report = "sandbox/rsvps/reports/r1/index.html"
    audits = PipelineLayout.of(settings, rsvps, "sandbox").audit_uri()
    write_deltalake(audits, to_arrow([_audit("sandbox", "manual__1", report)]), storage_options=storage_options(audits))
    rows = data.run_audit_rows(settings, dag_id="tidewater_replay_rsvps", run_id="manual__1")
    assert [r["report_path"] for r in rows] == [report]
    assert data.run_audit_rows(settings, dag_id="tidewater_replay_rsvps", run_id="other") == []
    assert "sandbox" in data.namespaces(settings)

    page = report_location(settings.lake_uri, report)
    found = stat_report(page)
    assert not found.is_dir and found.content_type.startswith("text/html") and found.size > 0
    assert b"".join(read_report(page)).startswith(b"<html>")
    css = report_location(settings.lake_uri, "sandbox/rsvps/reports/r1/static/style.css")
    assert stat_report(css).content_type.startswith("text/css")
    assert stat_report(report_location(settings.lake_uri, "sandbox/rsvps/reports/r1")).is_dir
    with pytest.raises(ReportNotFound):
        stat_report(report_location(settings.lake_uri, "sandbox/rsvps/reports/r1/missing.html"))
    with pytest.raises(ReportPathRefused):
        report_location(settings.lake_uri, "sandbox/rsvps/audits/_delta_log/00000000000000000000.json")
    assert fs.get_file_info(f"{root}/sandbox/rsvps/audits/_delta_log").type == pafs.FileType.Directory
