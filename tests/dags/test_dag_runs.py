"""The batch, replay and late-data correction DAGs run with ``dag.test()`` in a real Airflow (SQLite
metadata DB), their Spark tasks as real spark-submit jobs, against real Delta tables that the
streaming job wrote from a real broker. The tests share one lake and run in file order:

1. batch DAG: a blocking audit failure holds back the interval's gold (its success path, stream/batch
   parity and audits, runs as a REST backfill on the cluster profile's Airflow on PostgreSQL);
2. replay DAG: bad params refused before Spark (a sandbox replay leaving live tables untouched is
   test_replay's, the job the DAG's replay task submits);
3. late events arrive, the stream drops them behind the watermark; the correction DAG folds them
   into gold, marks the windows final and writes the ledger.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline_helpers import gold_from_silver, produce_generated, run_stream, send
from tidewater.generator.events import GeneratorConfig, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.lake.reads import read_table
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
START = parse_ts("2026-11-21T10:00:00.000Z")  # on-time events: 10:00 .. 10:05


@pytest.fixture(scope="module")
def world(broker, tmp_path_factory: pytest.TempPathFactory, spark) -> dict[str, Any]:
    from tidewater.config import Settings

    settings = Settings(
        pipelines="rsvps",  # the DAGs of this deployment: rsvps only (pageviews' are the same code)
        state_dir=str(tmp_path_factory.mktemp("dagruns") / "state"),
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"dagruns-{id(tmp_path_factory):x}-",
        kafka_request_timeout_ms=5000,
    )
    ensure_topic(settings, settings.topic(RSVPS.source().topic), 2)
    produce_generated(
        settings, settings.topic(RSVPS.source().topic), GeneratorConfig(seed=31, start_time_ms=START, rate=10), 3000
    )
    run_stream(spark, settings)
    return {"settings": settings, "layout": PipelineLayout.of(settings, RSVPS)}


def gold_values(spark, settings, gold: str) -> list[tuple]:
    """Gold rows without status/revision, sorted: what the numbers are."""
    layout = PipelineLayout.of(settings, RSVPS)
    table = read_table(spark, layout.table_uri(f"gold/{gold}"))
    columns = [c for c in table.columns if c not in ("status", "revision")]
    return sorted(tuple(r) for r in table.select(*columns).collect())


def test_blocking_audit_failure_holds_back_the_intervals_gold(airflow_home, world, spark):
    """Records lost before Kafka (sequence gaps) in 12:00-13:00: the reconciliation fails, the gate
    fails and the interval's gold is not published; the failure is in the audit table."""
    settings, layout = world["settings"], world["layout"]
    noon = parse_ts("2026-11-21T12:00:00.000Z")
    produce_generated(
        settings,
        settings.topic(RSVPS.source().topic),
        GeneratorConfig(seed=33, start_time_ms=noon, rate=10, loss_rate=0.05),
        600,
    )
    run_stream(spark, settings)
    gold_versions = {g.name: layout.table(f"gold/{g.name}").version() for g in RSVPS.gold}
    result = airflow_home.dag_test("tidewater_batch_rsvps", settings=settings, logical_date="2026-11-21T13:00:00+00:00")
    states = result["task_states"]
    assert states["recompute_silver"] == "success", result
    assert states["audit_interval"] == "failed" and states["gold_gate"] == "failed", result
    assert states["publish_gold"] == "upstream_failed" and states["audit_gold"] == "upstream_failed", result
    assert {g.name: layout.table(f"gold/{g.name}").version() for g in RSVPS.gold} == gold_versions
    failed = [r for r in audit_rows(layout) if r["dag_run_id"] == result["run_id"] and not r["success"]]
    assert [r["suite"] for r in failed] == ["rsvps.reconciliation"] and failed[0]["blocking"]
    assert "lost upstream of Kafka" in failed[0]["failures"][-1]


def audit_rows(layout: PipelineLayout) -> list[dict[str, Any]]:
    return DeltaTable(layout.audit_uri()).to_pyarrow_table().to_pylist()


def test_replay_dag_refuses_bad_params_before_spark(airflow_home, world):
    result = airflow_home.dag_test(
        "tidewater_replay",
        {"pipeline": "rsvps", "start": "2026-11-21T11:00:00Z", "end": "2026-11-21T10:00:00Z"},
        settings=world["settings"],
    )
    assert result["task_states"]["validate"] == "failed"
    assert result["task_states"]["replay"] == "upstream_failed"  # no Spark job started


def test_correction_dag_folds_late_events_into_gold_with_a_ledger(airflow_home, world, spark):
    settings, layout = world["settings"], world["layout"]
    # Events of 10:00:00 .. 10:00:05 that reach Kafka six minutes later, when the watermark is past 10:03.
    happened = generate(GeneratorConfig(seed=32, start_time_ms=START, rate=10), 50)
    late = [dataclasses.replace(r, timestamp_ms=r.timestamp_ms + 360_000) for r in happened]
    send(settings, settings.topic(RSVPS.source().topic), late)
    run_stream(spark, settings)  # the stream keeps them in silver but its gold drops them (behind the watermark)
    name = "venue_response_counts"
    closed = dt.datetime(2026, 11, 21, 10, 2)  # windows ending by then are behind the watermark (~10:03)
    assert _closed(gold_values(spark, settings, name), closed) != _closed(
        gold_from_silver(spark, settings, name), closed
    )

    conf = {"start": "2026-11-21T09:55:00Z", "end": "2026-11-21T10:10:00Z"}
    result = airflow_home.dag_test("tidewater_correct_late_data", conf, settings=settings)
    assert result["task_states"] == {
        "plan_rsvps": "success",
        "correct_rsvps": "success",
        "audit_rsvps": "success",
    }, result
    corrected = [r for r in audit_rows(layout) if r["dag_run_id"] == result["run_id"]]
    assert {r["trigger"] for r in corrected} == {"correction"} and all(r["success"] for r in corrected)
    assert _closed(gold_values(spark, settings, name), closed) == _closed(
        gold_from_silver(spark, settings, name), closed
    )
    gold = read_table(spark, layout.table_uri(f"gold/{name}")).collect()
    assert {r["status"] for r in gold if r["window_end"] <= closed} == {"final"}
    # Airflow recorded the change of each gold table as an event of its Asset, saying what the job did.
    events = {e["asset"]: e for e in result["asset_events"]}
    event = events[f"rsvps.gold.{name}"]
    assert event["task_id"] == "correct_rsvps" and event["uri"] == layout.table_uri(f"gold/{name}")
    assert event["extra"]["mode"] == "correction" and event["extra"]["run_id"] == result["run_id"]
    assert event["extra"]["rows"] > 0 and event["extra"]["interval"]["start"].startswith("2026-11-21T09:55")
    ledger = DeltaTable(layout.ledger_uri()).to_pyarrow_table().to_pylist()
    assert ledger and {e["dag_run_id"] for e in ledger} == {result["run_id"]}
    assert all(e["old_value"] != e["new_value"] for e in ledger)
    assert sum(e["late_events"] for e in ledger if e["table"].endswith(name)) > 0
    # That a rerun finds nothing left to correct is test_late_correction's (same code, without Airflow).


def _closed(rows: list[tuple], before: dt.datetime) -> list[tuple]:
    return [r for r in rows if r[1] <= before]  # (window_start, window_end, ...)
