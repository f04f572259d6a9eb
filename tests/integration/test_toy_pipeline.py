"""A pipeline declared only in tests/ (tests/toy_pipeline/toy.py) runs through the whole platform.

Real broker, real Spark, real Delta. Registered through ``TIDEWATER_PIPELINE_MODULES`` alone, the
toy pipeline is streamed (bronze, silver, quarantine, gold), recomputed as a batch (equal to the
stream), replayed into a sandbox, audited with its own committed suites (no sequence check: it
declares no producer sequence), corrected after late readings (ledger entries), queried with SQL,
and gets its own batch DAG. The tests share one lake and run in file order.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from pipeline_helpers import gold_as_streamed, gold_from_silver, run_stream, send
from tidewater.batch.correction import correct_late_data
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import SANDBOX, recompute_interval, replay
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.lake.reads import read_table
from tidewater.pipelines import all_pipelines, get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality import suites
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.query.sql import run_sql

TOY_MODULE = Path(__file__).resolve().parents[1] / "toy_pipeline" / "toy.py"
START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
RANGE = Interval.parse("2026-11-21T09:50:00Z", "2026-11-21T10:10:00Z")
CLOSED = dt.datetime(2026, 11, 21, 10, 3)  # windows ending by then are behind the stream's watermark (Spark: naive UTC)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toy(spark) -> Iterator[Any]:
    """The toy pipeline registered for this process (and, through Settings, for its children).

    After the Spark session exists: building one exports its settings (this variable included) to
    the environment its workers inherit."""
    before = os.environ.get("TIDEWATER_PIPELINE_MODULES")
    os.environ["TIDEWATER_PIPELINE_MODULES"] = str(TOY_MODULE)
    try:
        yield get_pipeline("toy")
    finally:
        if before is None:
            os.environ.pop("TIDEWATER_PIPELINE_MODULES", None)
        else:
            os.environ["TIDEWATER_PIPELINE_MODULES"] = before


@pytest.fixture(scope="module")
def lake(toy, spark, broker, tmp_path_factory) -> dict[str, Any]:
    from tidewater_pipeline_toy import readings  # loaded by the registry from TOY_MODULE

    settings = Settings(
        state_dir=str(tmp_path_factory.mktemp("toy") / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"toy-{uuid.uuid4().hex[:8]}-",
        pipeline_modules=str(TOY_MODULE),
    )
    topic = settings.topic(toy.source().topic)
    ensure_topic(settings, topic, 2)
    sent = send(settings, topic, readings(START, 1200, seed=1))  # 10:00-10:04 at 5 per second
    run_stream(spark, settings, "toy")
    return {"settings": settings, "sent": sent, "layout": PipelineLayout.of(settings, toy), "readings": readings}


def test_the_registry_finds_it_and_its_suites_are_committed(toy):
    assert set(all_pipelines()) >= {"rsvps", "toy"}
    assert list(suites.stale_suites(toy)) == []
    assert suites.suite_path(toy, "silver").is_relative_to(TOY_MODULE.parent)


def test_stream_writes_every_tier(toy, lake, spark):
    settings, sent, layout = lake["settings"], lake["sent"], lake["layout"]
    bronze = read_table(spark, layout.table_uri("bronze"))
    assert bronze.count() == len(sent)
    silver = read_table(spark, layout.table_uri("silver")).toArrow()
    valid = {r.reading_id for r in sent if r.kind != "malformed"}
    assert sorted(silver["reading_id"].to_pylist()) == sorted(valid)  # re-sends removed
    quarantine = read_table(spark, layout.table_uri("quarantine"))
    assert quarantine.count() == sum(r.kind == "malformed" for r in sent)
    assert {r.reason for r in quarantine.select("reason").collect()} == {"kwh outside [0, 1000]"}
    # The stream's gold equals the same transform run as a batch over silver, for the closed windows.
    batch = closed_windows(gold_from_silver(spark, settings, "per_meter_minute", "toy"))
    assert batch and closed_windows(gold_as_streamed(spark, settings, "per_meter_minute", "toy")) == batch


def closed_windows(rows: list[tuple]) -> list[tuple]:
    return [r for r in rows if r[1] <= CLOSED]  # (window_start, window_end, ...)


def test_batch_recompute_reproduces_the_stream(toy, lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    silver_before = sorted(tuple(r) for r in read_table(spark, layout.table_uri("silver")).collect())
    gold_before = gold_as_streamed(spark, settings, "per_meter_minute", "toy")
    result = recompute_interval(spark, settings, toy, RANGE.start, RANGE.end, run_id="toy-recompute")
    assert result.ledger_entries == 0
    assert sorted(tuple(r) for r in read_table(spark, layout.table_uri("silver")).collect()) == silver_before
    assert closed_windows(gold_as_streamed(spark, settings, "per_meter_minute", "toy")) == closed_windows(gold_before)


def test_sandbox_replay_leaves_live_untouched(toy, lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    live = {name: layout.table(name).version() for name in layout.table_names if layout.table(name).exists()}
    replay(
        spark,
        settings,
        toy,
        "2026-11-21T10:00:00Z",
        "2026-11-21T10:02:00Z",
        run_id="toy-replay",
        target=SANDBOX,
        sandbox_namespace="toysbx",
    )
    assert {name: layout.table(name).version() for name in live} == live
    sandbox = read_table(spark, PipelineLayout.of(settings, toy, "toysbx").table_uri("silver"))
    in_range = read_table(spark, layout.table_uri("silver")).where(F.col("read_at") < F.lit(START.replace(minute=2)))
    assert sorted(r.reading_id for r in sandbox.collect()) == sorted(r.reading_id for r in in_range.collect())


def test_audit_passes_with_its_own_suites(toy, lake, spark):
    result = run_audit(spark, lake["settings"], AuditRequest(pipeline=toy, interval=RANGE))
    outcomes = {row.suite: row for row in result.rows}
    assert set(outcomes) == {
        "toy.bronze",
        "toy.records",
        "toy.silver",
        "toy.reconciliation",
        "toy.gold.per_meter_minute",
        "toy.parity.gold.per_meter_minute",
    }, outcomes
    assert all(o.success for o in outcomes.values()), [list(o.failures) for o in outcomes.values()]
    reconciliation = outcomes["toy.reconciliation"]
    assert reconciliation.expectations == 4 and "seq_gaps" not in reconciliation.counts  # no sequence: 4 checks


def test_late_readings_are_corrected_with_a_ledger(toy, lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    late = lake["readings"](START, 40, seed=2, late_every=1)  # read 10:00:00-10:00:08, sent 10:05
    send(settings, settings.topic(toy.source().topic), late)
    run_stream(spark, settings, "toy")  # silver keeps them; gold's 10:00 windows are closed
    streamed = closed_windows(gold_as_streamed(spark, settings, "per_meter_minute", "toy"))
    batch = closed_windows(gold_from_silver(spark, settings, "per_meter_minute", "toy"))
    assert streamed != batch

    result = correct_late_data(spark, settings, toy, RANGE.start, RANGE.end, run_id="toy-late")
    assert result.ledger_entries > 0
    entries = [e for e in Ledger(layout.ledger_uri()).rows(spark) if e["dag_run_id"] == "toy-late"]
    assert sum(e["late_events"] for e in entries) == sum(r.kind == "late" for r in late)
    assert closed_windows(gold_as_streamed(spark, settings, "per_meter_minute", "toy")) == batch


def test_sql_sees_its_tables(toy, lake):
    result = run_sql(lake["settings"], "SELECT count(*) AS n FROM toy.silver")
    assert result.rows[0][0] > 0
    gold = run_sql(lake["settings"], "SELECT sum(readings) FROM toy.gold.per_meter_minute")
    assert gold.rows[0][0] > 0


def test_it_gets_a_batch_dag(toy, airflow_home, tmp_path):
    settings = Settings(state_dir=str(tmp_path / "state"), pipeline_modules=str(TOY_MODULE))
    integrity = airflow_home.run("integrity", settings=settings)
    assert integrity["import_errors"] == {}
    assert "tidewater_batch_toy" in integrity["dags"] and "tidewater_batch_rsvps" in integrity["dags"]
    assert "supervise_toy" in integrity["dags"]["tidewater_supervise_streams"]
