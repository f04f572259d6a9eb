"""Data-quality audits on real streamed lakes: real broker, real Spark, real Delta, Great Expectations.

Three lakes, each written by the streaming job's own code from generated events:

* ``clean``: the platform's everyday mix (1% re-sends, 0.2% malformed, out-of-order events): every
  suite and the reconciliation pass; then a duplicate forced into silver and into gold is caught.
* ``upstream``: producers sending 30% malformed records (nulls, bad enums, out-of-range lat/lon,
  wrong types) and 10% re-sends: the records suite fails naming each broken expectation, while
  silver passes (quarantine and de-duplication did their job) and the counts reconcile.
* ``clocks``: one producer's clock 20 minutes ahead and 5% of records lost before Kafka: silver's
  event-time expectation and the sequence-gap reconciliation fail, and both block gold.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipeline_helpers import streamed_lake, table_rows
from tidewater.batch.interval import Interval
from tidewater.config import Settings
from tidewater.lake.storage import join
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality.audit import AuditRequest, AuditResult, run_audit
from tidewater.quality.audit_log import AUDIT_SCHEMA

RSVPS = get_pipeline("rsvps")
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
HOUR = Interval(T0, T0 + dt.timedelta(hours=1))


def audit(spark, settings: Settings, interval: Interval = HOUR, **kwargs) -> AuditResult:
    request = AuditRequest(
        pipeline=RSVPS, interval=interval, dag_id="test_audits", dag_run_id=f"run-{time.time_ns()}", **kwargs
    )
    return run_audit(spark, settings, request)


def by_suite(result: AuditResult) -> dict[str, object]:
    return {row.suite: row for row in result.rows}


def audit_table_rows(settings: Settings) -> list[dict]:
    uri = PipelineLayout.of(settings, RSVPS).audit_uri()
    return DeltaTable(uri).to_pyarrow_table().to_pylist()


@pytest.fixture(scope="module")
def clean(spark, broker, tmp_path_factory) -> Settings:
    state = str(tmp_path_factory.mktemp("audit-clean") / "state")
    return streamed_lake(
        spark,
        broker.bootstrap_servers,
        state,
        prefix="audit-clean",
        seed=5,
        count=1500,
        duplicate_rate=0.01,
        malformed_rate=0.005,
    )


@pytest.fixture(scope="module")
def upstream(spark, broker, tmp_path_factory) -> Settings:
    state = str(tmp_path_factory.mktemp("audit-upstream") / "state")
    return streamed_lake(
        spark,
        broker.bootstrap_servers,
        state,
        prefix="audit-up",
        seed=6,
        count=1500,
        duplicate_rate=0.10,
        malformed_rate=0.30,
    )


def test_clean_data_passes_every_suite_and_reconciles(spark, clean: Settings) -> None:
    result = audit(spark, clean)
    suites = by_suite(result)
    assert set(suites) == {
        "rsvps.bronze",
        "rsvps.records",
        "rsvps.silver",
        "rsvps.reconciliation",
        "rsvps.gold.venue_response_counts",
        "rsvps.gold.trending_venues",
        "rsvps.parity.gold.venue_response_counts",
        "rsvps.parity.gold.trending_venues",
    }
    assert result.success, result.summary()
    # Where its seconds went: a phase per suite and per step of the reconciliation, in the result line.
    assert {"bronze", "records", "silver", "reconciliation/silver", "gold/trending_venues", "parity"} <= set(
        result.phases_ms
    ), result.phases_ms
    assert result.to_dict()["phases_ms"]["total"] / 1000 <= result.seconds + 0.001  # both rounded
    counts = suites["rsvps.reconciliation"].counts
    assert counts["bronze_rows"] == 1500
    assert counts["offset_span"] == counts["bronze_distinct_offsets_in_span"] == 1500
    assert counts["silver_rows"] + counts["duplicates_removed"] + counts["quarantined"] == 1500
    assert counts["duplicates_removed"] > 0 and counts["quarantined"] > 0, json.dumps(counts)
    assert counts["lost_before_silver"] == 0
    # Gaps only where a record was unreadable (its producer and seq_no did not parse): nothing lost.
    assert sum(counts["seq_gaps"].values()) <= counts["records_without_producer_seq"]
    # The silver suite audits the hour by event time, the reconciliation by arrival: they differ only by
    # out-of-order events of the first seconds, which happened before 10:00 (at most 20 s before).
    in_hour = [r for r in table_rows(spark, clean, "silver") if HOUR.start <= r["event_time"].replace(tzinfo=dt.UTC)]
    assert suites["rsvps.silver"].rows == len(in_hour)
    early = counts["silver_rows"] - len(in_hour)
    assert 0 <= early <= 20, early
    # Recorded: one row per suite, all with the run's id and the report, which exists in the lake.
    assert DeltaTable(PipelineLayout.of(clean, RSVPS).audit_uri()).schema().to_arrow().names == AUDIT_SCHEMA.names
    rows = [r for r in audit_table_rows(clean) if r["audit_id"] == result.audit_id]
    assert len(rows) == 8 and all(r["success"] for r in rows)
    assert {r["dag_run_id"] for r in rows} == {result.rows[0].dag_run_id}
    index = join(clean.lake_uri, result.report_path).removeprefix("file://")
    html = Path(index).read_text(encoding="utf-8")
    assert "rsvps.silver" in html and "rsvps.records" in html and "FAILED" not in html
    # The index works offline (no CDN scripts) and links each suite's validation page, which exists.
    pages = re.findall(r'href="(validations/rsvps/silver/[^"]+)"', html)
    assert pages and (Path(index).parent / pages[0]).exists()


def test_duplicates_forced_into_silver_and_gold_are_caught(spark, clean: Settings) -> None:
    layout = PipelineLayout.of(clean, RSVPS)
    for name, time_column in (("silver", "event_time"), ("gold/venue_response_counts", "window_start")):
        table = LakeTable(layout.table_uri(name))
        rows = table.open().to_pyarrow_table()
        # a row of the audited hour (out-of-order events also made rows of 09:59)
        first = rows.filter(pc.field(time_column) >= pa.scalar(HOUR.start, rows.schema.field(time_column).type))
        table.append_arrow(first.slice(0, 1))  # what a second, unsynchronised writer would do
    result = audit(spark, clean)
    failures = {row.suite: row.failures for row in result.rows if not row.success}
    # The copy has the original's lineage, so every record is still accounted for once; the
    # duplicate audits catch it, and so does the reconciliation's check of the exactly-once promise.
    assert set(failures) == {"rsvps.silver", "rsvps.gold.venue_response_counts", "rsvps.reconciliation"}
    assert failures["rsvps.reconciliation"] == [
        "silver holds 1 extra row(s) for keys it holds already: exactly_once keeps one per key"
    ]
    assert any(f.startswith("expect_column_values_to_be_unique(event_id): 2 of") for f in failures["rsvps.silver"])
    assert any(
        f.startswith("expect_compound_columns_to_be_unique(window_start,venue_id,response)")
        for f in failures["rsvps.gold.venue_response_counts"]
    )
    assert result.blocking_failures  # silver is declared blocking for rsvps
    recorded = [r for r in audit_table_rows(clean) if r["audit_id"] == result.audit_id and not r["success"]]
    assert {r["suite"] for r in recorded} == set(failures)


def test_upstream_faults_fail_the_records_suite_naming_each_expectation(spark, upstream: Settings) -> None:
    result = audit(spark, upstream)
    suites = by_suite(result)
    records = suites["rsvps.records"]
    assert not records.success
    failed = " | ".join(records.failures)
    for expectation in (
        "expect_column_values_to_not_be_null(event_id)",  # injected nulls
        "expect_column_values_to_be_in_set(response)",  # bad enums
        "expect_column_values_to_be_between(venue_lat)",  # out of range
        "expect_column_values_to_not_be_null(member_id)",  # missing / wrongly typed member
        "expect_column_values_to_be_unique(event_id)",  # re-sends
    ):
        assert expectation in failed, failed
    # Nothing of it reached silver, and every record is accounted for.
    assert suites["rsvps.silver"].success, suites["rsvps.silver"].failures
    assert suites["rsvps.reconciliation"].success, suites["rsvps.reconciliation"].failures
    counts = suites["rsvps.reconciliation"].counts
    assert counts["quarantined"] == counts["rejected_records"] > 300
    # The records suite is not declared blocking: gold is not held back for upstream noise.
    assert not result.blocking_failures
    assert records.counts["unexpected"]["expect_column_values_to_be_in_set(response)"] > 0
    # A suite that saw unexpected values is validated again with samples of them (the first run fetches
    # none): its failure lines quote them, and its Data Docs page is that second run's, the only one.
    in_set = next(f for f in records.failures if f.startswith("expect_column_values_to_be_in_set(response)"))
    sample = in_set.split(", e.g. ")[1].split(", ")[0].strip("'")
    report = Path(join(upstream.lake_uri, result.report_path).removeprefix("file://")).parent
    pages = list((report / "validations" / "rsvps" / "records").rglob("*.html"))
    assert len(pages) == 1 and sample in pages[0].read_text(encoding="utf-8"), (pages, sample)


def test_future_event_times_and_upstream_loss_fail_and_block_gold(spark, broker, tmp_path_factory) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    state = str(tmp_path_factory.mktemp("audit-clocks") / "state")
    settings = streamed_lake(
        spark,
        broker.bootstrap_servers,
        state,
        prefix="audit-clocks",
        seed=7,
        count=900,
        start_time_ms=int(now.timestamp() * 1000),
        clock_skew_ms=(0, 0, 20 * 60 * 1000),
        loss_rate=0.05,
        duplicate_rate=0.0,
        malformed_rate=0.0,
    )
    result = audit(spark, settings, Interval(now - dt.timedelta(hours=1), now + dt.timedelta(hours=1)))
    suites = by_suite(result)
    # A producer whose clock runs 20 minutes ahead stamps its event times (and its Kafka CreateTime, up to
    # the wall clock) ahead of arrival: those records are quarantined, judged against the ingest time the
    # producer does not control, so silver holds its contract; the records suite names what arrived.
    silver = suites["rsvps.silver"]
    assert silver.success, silver.failures
    records = suites["rsvps.records"]
    assert any(
        f.startswith("expect_column_values_to_be_between(event_time_ahead_of_ingest_seconds)") for f in records.failures
    )
    quarantined = [
        r for r in table_rows(spark, settings, "quarantine") if "ahead of the record's arrival" in r["reason"]
    ]
    assert len(quarantined) > 200  # the skewed producer's third of 900 events, less the records lost upstream
    reconciliation = suites["rsvps.reconciliation"]
    assert not reconciliation.success
    assert any("seq_no gaps" in f and "lost upstream of Kafka" in f for f in reconciliation.failures)
    gaps = reconciliation.counts["seq_gaps"]
    assert set(gaps) == {"producer-0", "producer-1", "producer-2"} and sum(gaps.values()) > 20
    assert {r.suite for r in result.blocking_failures} == {"rsvps.reconciliation"}
    recorded = json.loads([r for r in audit_table_rows(settings) if r["suite"] == "rsvps.reconciliation"][-1]["counts"])
    assert recorded["seq_gaps"] == gaps
