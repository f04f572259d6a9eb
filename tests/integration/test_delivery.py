"""Delivery semantics kept under kill -9, and the reconciliation audit reporting each promise.

Two test-only pipelines over the toy meter readings (tests/delivery_pipelines), real broker, real
Spark (the spark-submit job for the kills), real Delta, read back with delta-rs alone:

* ``meters_at_least_once``: killed between bronze's Delta commit and Spark's checkpoint commit, then
  resumed: every record reached the tables (nothing lost) and every re-send is a second silver row;
  the audit passes and reports the copies kept.
* ``meters_at_most_once``: killed right after a micro-batch reached bronze (before silver and
  quarantine), readings sent while it is down, then resumed: it starts at the latest offsets, so
  neither that batch nor what was sent while it was down is processed, and nothing is processed
  twice; the audit passes and reports the losses, the interrupted batch's malformed records included.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline_helpers import delta_rows, run_stream, send, wait_for
from tidewater.batch.interval import Interval
from tidewater.config import Settings
from tidewater.faults import CRASH_AFTER_COMMIT
from tidewater.generator.producer import ensure_topic
from tidewater.pipelines import Delivery, get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import stop_process_group
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.streaming.jobs import launch_stream_job
from toy_pipeline import toy

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1]
MODULES = ",".join(str(HERE / "delivery_pipelines" / f"{name}.py") for name in ("at_least_once", "at_most_once"))
START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
RANGE = Interval.parse("2026-11-21T09:00:00Z", "2026-11-21T11:00:00Z")


@pytest.fixture(scope="module")
def feeds(spark) -> Iterator[None]:
    """Both pipelines registered for this process and the jobs it starts (after Spark exists: see the toy test)."""
    before = os.environ.get("TIDEWATER_PIPELINE_MODULES")
    os.environ["TIDEWATER_PIPELINE_MODULES"] = MODULES
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TIDEWATER_PIPELINE_MODULES", None)
        else:
            os.environ["TIDEWATER_PIPELINE_MODULES"] = before


def lake_settings(broker: Any, tmp_path: Path) -> Settings:
    return Settings(
        state_dir=str(tmp_path / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"dlv-{uuid.uuid4().hex[:8]}-",
        pipeline_modules=MODULES,
        max_offsets_per_trigger=200,
        trigger_seconds=1.0,
    )


def reconciliation(spark: Any, settings: Settings, pipeline: Any) -> Any:
    result = run_audit(spark, settings, AuditRequest(pipeline=pipeline, interval=RANGE, checks=("reconciliation",)))
    (row,) = result.rows
    return row


def test_at_least_once_loses_nothing_and_keeps_every_copy(feeds, spark, broker, tmp_path):
    pipeline = get_pipeline("meters_at_least_once")
    assert pipeline.delivery is Delivery.AT_LEAST_ONCE
    settings = lake_settings(broker, tmp_path)
    layout = PipelineLayout.of(settings, pipeline)
    topic = settings.topic(pipeline.source().topic)
    ensure_topic(settings, topic, 2)
    sent = send(settings, topic, toy.readings(START, 900, seed=5))
    log = tmp_path / "job.log"
    crash = {CRASH_AFTER_COMMIT: f"{layout.namespace}.{pipeline.name}.bronze:1"}
    job = launch_stream_job(settings, pipeline.name, log, extra_env=crash)
    try:
        assert job.wait(timeout=300) == -signal.SIGKILL, log.read_text()[-3000:]
    finally:
        stop_process_group(job, timeout_s=10)
    run_stream(spark, settings, pipeline.name)  # resumes the killed job's checkpoint

    valid = [r for r in sent if r.kind != "malformed"]
    silver = Counter(r["reading_id"] for r in delta_rows(layout, "silver"))
    assert silver == Counter(r.reading_id for r in valid)  # every copy, none lost
    copies = sum(1 for r in sent if r.kind == "duplicate")
    assert copies > 50 and sum(n - 1 for n in silver.values()) == copies
    row = reconciliation(spark, settings, pipeline)
    assert row.success, row.failures
    assert row.counts["delivery"] == "at_least_once"
    assert row.counts["duplicate_copies_kept"] == copies and row.counts["bronze_rows"] == len(sent)


def test_at_most_once_never_repeats_and_reports_what_it_lost(feeds, spark, broker, tmp_path):
    pipeline = get_pipeline("meters_at_most_once")
    settings = lake_settings(broker, tmp_path)
    layout = PipelineLayout.of(settings, pipeline)
    topic = settings.topic(pipeline.source().topic)
    ensure_topic(settings, topic, 2)
    all_readings = toy.readings(START, 1500, seed=6)
    first, down, after = all_readings[:600], all_readings[600:1000], all_readings[1000:]
    send(settings, topic, first)
    log = tmp_path / "job.log"
    # The driver kills itself (SIGKILL) right after its first micro-batch reached bronze: that batch is
    # in neither silver nor quarantine, and at-most-once never runs it again.
    crash = {CRASH_AFTER_COMMIT: f"{layout.namespace}.{pipeline.name}.bronze:0"}
    job = launch_stream_job(settings, pipeline.name, log, extra_env=crash)
    try:
        assert job.wait(timeout=300) == -signal.SIGKILL, log.read_text()[-3000:]
        send(settings, topic, down)  # while no job runs: an at-most-once consumer never sees these
        resumed = time.time()
        job = launch_stream_job(settings, pipeline.name, log)
        # The Kafka query's own progress: once it reports a batch, it has fixed where it resumed (the
        # latest offsets then). Another query's progress says nothing about that.
        kafka_progress = layout.progress_dir() / f"{pipeline.query_of(pipeline.source(), 'bronze')}.json"
        wait_for(
            lambda: kafka_progress.exists() and kafka_progress.stat().st_mtime > resumed,
            timeout_s=300,
            what="the resumed Kafka query's progress",
            log=log,
        )
        send(settings, topic, after)  # while it runs again: read
        ids_after = {r.reading_id for r in after if r.kind != "malformed"}
        wait_for(
            lambda: ids_after <= {r["reading_id"] for r in delta_rows(layout, "silver")},
            timeout_s=300,
            what="the readings sent after the restart in silver",
            log=log,
        )
    finally:
        stop_process_group(job, timeout_s=10)

    bronze = delta_rows(layout, "bronze")
    assert Counter((r["partition"], r["offset"]) for r in bronze).most_common(1)[0][1] == 1  # nothing twice
    silver_ids = Counter(r["reading_id"] for r in delta_rows(layout, "silver"))
    assert max(silver_ids.values()) == 1
    assert not silver_ids.keys() & {r.reading_id for r in down}  # sent while down: never processed
    never_read = len(all_readings) - len(bronze)
    assert never_read >= len(down)
    # a batch the kill interrupted may have reached bronze but neither silver nor quarantine: lost too,
    # never re-run (its valid records miss silver, its malformed ones quarantine)
    valid = {r.value: r.reading_id for r in all_readings if r.kind != "malformed"}
    malformed = {r.value for r in all_readings if r.kind == "malformed"}
    quarantined = {(q["kafka_partition"], q["kafka_offset"]) for q in delta_rows(layout, "quarantine")}
    stranded_valid = sum(1 for r in bronze if r["value"] in valid and valid[r["value"]] not in silver_ids)
    stranded_rejected = sum(
        1 for r in bronze if r["value"] in malformed and (r["partition"], r["offset"]) not in quarantined
    )
    assert stranded_valid and stranded_rejected  # the crash left both kinds behind
    stranded = stranded_valid + stranded_rejected
    row = reconciliation(spark, settings, pipeline)
    assert row.success, row.failures
    assert row.counts["delivery"] == "at_most_once"
    assert row.counts["lost_records"] == never_read + stranded
