"""vending: telemetry joined as of event time to a versioned machines dimension, at-least-once.

Real broker, real Spark (the streaming job's code, Trigger.AvailableNow in micro-batches of 400
records, so the watermark advances as on a live stream), real Delta. The records are the pipeline's own
sample events over 80 minutes: 20 machines, installations and moves (some recorded late), outages
(silent machines), warm cabinets, re-sent and malformed records. The expected gold rows are computed
here by folding the pure machines (:mod:`tidewater.pipelines.vending.machines`) over the generated
records in plain Python, independently of Spark.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from typing import Any

import pytest

from pipeline_helpers import delta_rows, final_watermark_ms, run_stream, send
from tidewater.batch.correction import correct_late_data
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import replay
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.keyed_state import KeyedMachine, fold
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.samples import GeneratedRecord, GeneratorConfig, format_ts, generate, parse_ts
from tidewater.pipelines.vending import machines
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.query.sql import run_sql

pytestmark = pytest.mark.slow

VENDING = get_pipeline("vending")
TOTAL = 3000
START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
CONFIG = GeneratorConfig(
    seed=7,
    rate=0.6,  # 3,000 readings over about 83 minutes of event time
    members=20,
    start_time_ms=parse_ts("2026-11-21T10:00:00Z"),
    duplicate_rate=0.03,
    out_of_order_fraction=0.05,
    out_of_order_max_ms=5_000,  # inside the 1-minute watermark
    malformed_rate=0.01,
)


def machine_events(records: list[GeneratedRecord]) -> dict[str, list[dict[str, Any]]]:
    """Every valid copy of every record (at-least-once: repeats included), as the machines see them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.kind in ("malformed", "lost"):
            continue
        p = json.loads(r.value)
        if r.source == "machines":
            event = {
                "machine_id": p["machine_id"],
                "at": parse_ts(p["changed_at"]),
                "event_id": f"c:{p['change_id']}",
                "sales_count": None,
                "sales_amount": None,
                "change_id": p["change_id"],
                **{a: p[a] for a in machines.ATTRIBUTES},
            }
        else:
            event = {
                "machine_id": p["machine_id"],
                "at": parse_ts(p["read_at"]),
                "event_id": f"r:{p['reading_id']}",
                "sales_count": p["sales_count"],
                "sales_amount": p["sales_amount"],
                "change_id": None,
                **dict.fromkeys(machines.ATTRIBUTES),
            }
        out.setdefault(event["machine_id"], []).append(event)
    return out


def folded(machine: KeyedMachine, events: dict[str, list[dict[str, Any]]], until_ms: int) -> list[dict[str, Any]]:
    """The machine's outputs for events before ``until_ms`` (the stream's final watermark)."""
    rows: list[dict[str, Any]] = []
    for per_machine in events.values():
        passed = [e for e in per_machine if e["at"] < until_ms]
        rows += fold(machine, None, passed, until_ms=until_ms)[1]
    return rows


def ms(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    value = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value
    return int(value.timestamp() * 1000)


def by_key(rows: list[dict[str, Any]], keys: tuple[str, ...], measures: tuple[str, ...]) -> dict[tuple, tuple]:
    def plain(v: Any) -> Any:
        return ms(v) if isinstance(v, dt.datetime) else v

    return {tuple(plain(r[k]) for k in keys): tuple(plain(r[m]) for m in measures) for r in rows}


def send_all(settings: Settings, records: list[GeneratedRecord]) -> None:
    for source in VENDING.sources:
        mine = [r for r in records if (r.source or VENDING.sources[0].name) == source.name]
        send(settings, settings.topic(source.topic), mine)


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> dict[str, Any]:
    state = tmp_path_factory.mktemp("vending")
    settings = Settings(
        state_dir=str(state / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"vend-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=400,
    )
    for source in VENDING.sources:
        ensure_topic(settings, settings.topic(source.topic), 2)
    records = list(generate(CONFIG, TOTAL, VENDING.sample_events))
    send_all(settings, records)
    run_stream(spark, settings, "vending")
    return {"settings": settings, "records": records, "layout": PipelineLayout.of(settings, VENDING)}


def test_every_reading_and_every_copy_reaches_silver(lake):
    """At-least-once: nothing lost, a re-sent reading kept as a second row (the audit counts them)."""
    layout, records = lake["layout"], lake["records"]
    sent = Counter(json.loads(r.value)["reading_id"] for r in records if r.source is None and r.kind != "malformed")
    silver = Counter(r["reading_id"] for r in delta_rows(layout, "telemetry/silver"))
    assert silver == sent
    assert max(silver.values()) > 1  # the generator re-sent some
    bronze = delta_rows(layout, "telemetry/bronze")
    assert Counter((r["partition"], r["offset"]) for r in bronze).most_common(1)[0][1] == 1


def test_gold_is_the_fold_of_each_machines_events(lake):
    """Sales per location and hour, silences and the dimension: what the pure machines give, as of
    event time (each reading at the location its machine stood at then; a repeat counted once)."""
    layout, events = lake["layout"], machine_events(lake["records"])
    sales_watermark = final_watermark_ms(layout, layout.gold_query_of("sales_by_location_hour").name)
    expected = folded(machines.SALES, events, sales_watermark)
    measures = ("sales_count", "sales_amount", "readings")
    keys = ("location", "window_start", "machine_id")
    assert expected  # at least one hour closed
    assert by_key(delta_rows(layout, "gold/sales_by_location_hour"), keys, measures) == by_key(expected, keys, measures)
    assert len({r["location"] for r in expected}) > 3

    silence_watermark = final_watermark_ms(layout, layout.gold_query_of("silent_machines").name)
    silences = folded(machines.SILENCE, events, silence_watermark)
    assert silences  # the generator's outages
    keys, measures = ("machine_id", "silent_since"), ("detected_at", "location", "last_reading_id")
    assert by_key(delta_rows(layout, "gold/silent_machines"), keys, measures) == by_key(silences, keys, measures)

    versions_watermark = final_watermark_ms(layout, layout.gold_query_of("machines").name)
    dimension = folded(machines.VERSIONS, events, versions_watermark)
    last = {}
    for row in dimension:  # a fold's outputs upsert: the last per version wins
        last[(row["machine_id"], row["valid_from"])] = row
    keys, measures = ("machine_id", "valid_from"), ("valid_to", "is_current", "location", "operator")
    stored = delta_rows(layout, "gold/machines")
    assert by_key(stored, keys, measures) == by_key(list(last.values()), keys, measures)
    moved = Counter(r["machine_id"] for r in stored)
    assert moved.most_common(1)[0][1] > 1  # some machine has history
    assert sum(r["is_current"] for r in stored) == len(moved)


def test_the_audit_keeps_the_at_least_once_promise_and_batch_equals_stream(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    interval = Interval(START, START + dt.timedelta(hours=1))
    audit = run_audit(spark, settings, AuditRequest(pipeline=VENDING, interval=interval))
    suites = {r.suite: r for r in audit.rows}
    assert audit.success, audit.summary()
    reconciliation = suites["vending.telemetry.reconciliation"].counts
    assert reconciliation["delivery"] == "at_least_once"
    assert reconciliation["duplicate_copies_kept"] > 0
    parity = {name for name in suites if ".parity." in name}
    assert parity == {f"vending.parity.gold.{g.name}" for g in VENDING.gold}
    per_location = run_sql(  # the per-machine rows add up to sales per location and hour
        settings,
        "SELECT location, window_start, SUM(sales_amount) AS amount FROM vending.gold.sales_by_location_hour "
        "GROUP BY location, window_start",
    )
    totals: Counter[tuple] = Counter()
    for r in delta_rows(layout, "gold/sales_by_location_hour"):
        totals[(r["location"], ms(r["window_start"]))] += r["sales_amount"]
    assert {(r[0], ms(r[1])): round(r[2], 2) for r in per_location.rows} == {k: round(v, 2) for k, v in totals.items()}


def test_a_late_relocation_is_rejoined_by_the_correction(lake, spark):
    """A machine moved at 10:20, entered at 11:40: the stream has passed 10:20 and never sees it; the
    correction folds it in: the machine's 10:00 hour is split between the two locations, the dimension
    gains the version, each changed row is in the ledger."""
    settings, layout = lake["settings"], lake["layout"]
    hour = START
    sales = [r for r in delta_rows(layout, "gold/sales_by_location_hour") if ms(r["window_start"]) == ms(hour)]
    target = max(sales, key=lambda r: r["readings"])
    machine = target["machine_id"]
    moved_at = parse_ts("2026-11-21T10:20:00Z")
    payload = {
        "change_id": "late-move",
        "machine_id": machine,
        "changed_at": format_ts(moved_at),
        "location": "test-depot",
        "model": "snackmaster-3",
        "operator": "north-vend",
    }
    record = GeneratedRecord(
        key=machine.encode(),
        value=json.dumps(payload).encode(),
        timestamp_ms=moved_at + 80 * 60_000,
        kind="late",
        event_id="late-move",
        producer_id="test",
        seq_no=-1,
        event_time_ms=moved_at,
        source="machines",
    )
    send_all(settings, [record])
    run_stream(spark, settings, "vending")  # silver keeps it; the machines never see it (late)
    assert not [r for r in delta_rows(layout, "gold/sales_by_location_hour") if r["location"] == "test-depot"]

    correct_late_data(spark, settings, VENDING, START, START + dt.timedelta(hours=1), run_id="vending-late")
    after = [
        r
        for r in delta_rows(layout, "gold/sales_by_location_hour")
        if r["machine_id"] == machine and ms(r["window_start"]) == ms(hour)
    ]
    events = machine_events([*lake["records"], record])
    expected = [
        r
        for r in folded(machines.SALES, {machine: events[machine]}, ms(hour + dt.timedelta(hours=2)))
        if r["window_start"] == ms(hour)
    ]
    measures = ("sales_count", "sales_amount", "readings")
    keys = ("location", "window_start", "machine_id")
    assert by_key(after, keys, measures) == by_key(expected, keys, measures)
    assert "test-depot" in {r["location"] for r in after}
    versions = [r for r in delta_rows(layout, "gold/machines") if r["machine_id"] == machine]
    assert moved_at in {ms(r["valid_from"]) for r in versions}
    entries = [e for e in Ledger(layout.ledger_uri()).rows(spark) if e["dag_run_id"] == "vending-late"]
    assert {e["table"] for e in entries} >= {"gold/sales_by_location_hour", "gold/machines"}
    again = correct_late_data(spark, settings, VENDING, START, START + dt.timedelta(hours=1), run_id="vending-late-2")
    assert again.ledger_entries == 0


def test_a_sandbox_replay_of_one_machine_reproduces_its_gold(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    end = START + dt.timedelta(hours=1)
    machine = Counter(r["machine_id"] for r in delta_rows(layout, "gold/silent_machines")).most_common(1)[0][0]
    replay(
        spark, settings, VENDING, START, end, run_id="vending-replay", sandbox_namespace="vend_sb", entities=[machine]
    )
    sandbox = PipelineLayout.of(settings, VENDING, "vend_sb")

    def rows(where: PipelineLayout, table: str, time: str) -> list[tuple]:
        return sorted(
            (ms(r[time]), r["machine_id"], r.get("location"))
            for r in delta_rows(where, table)
            if r["machine_id"] == machine and ms(r[time]) < ms(end)
        )

    for table, time in (("gold/silent_machines", "silent_since"), ("gold/sales_by_location_hour", "window_start")):
        live = rows(layout, table, time)
        assert rows(sandbox, table, time) == live, table
    assert {r["machine_id"] for r in delta_rows(sandbox, "gold/sales_by_location_hour")} == {machine}
