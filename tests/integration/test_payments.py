"""payments: the per-card fraud state machine, streamed and recomputed; alerts published to Kafka once.

Real broker, real Spark (the spark-submit streaming job for the kills), real Delta. The payments are the
pipeline's own sample events (compromised cards in bursts from changing countries, amount spikes),
with re-sends, out-of-order and malformed records. The expected alerts are computed here by folding
the pure rules (:func:`tidewater.pipelines.payments.fraud.step`) over the generated payments in plain
Python, independently of Spark.

The job is killed with SIGKILL three times, by fault injection at the fault points of publishing:
between the alerts' Delta commit and their Kafka transaction, while the alerts are produced (records
on the broker, transaction not committed), and after the Kafka commit but before Spark's checkpoint
commit; the second half of the payments arrives after them (kills at random moments are the exactly-once
test's). A final Trigger.AvailableNow run drains the rest. Then no payment is lost or
doubled, every alert is in the table once and in the topic once for a committed reader, and the
stream's per-card state equals a from-scratch fold of the payments it passed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from pipeline_helpers import delta_rows, final_watermark_ms, kill_job, run_stream, send, wait_for
from tidewater.batch.correction import correct_late_data
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import recompute_interval, replay
from tidewater.config import Settings
from tidewater.connectors.kafka_client import kafka_python_config
from tidewater.connectors.kafka_publish import read_committed
from tidewater.faults import CRASH_AFTER_COMMIT, CRASH_AFTER_PUBLISH, CRASH_BEFORE_PUBLISH_COMMIT
from tidewater.generator.producer import ensure_topic
from tidewater.keyed_state import fold, stream_states
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.payments import FRAUD_RULES
from tidewater.pipelines.samples import GeneratedRecord, GeneratorConfig, generate, parse_ts
from tidewater.processes import stop_process_group
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.query.sql import run_sql
from tidewater.streaming.jobs import launch_stream_job

pytestmark = pytest.mark.slow

PAYMENTS = get_pipeline("payments")
TOTAL = 4000
RANDOM_KILLS = 0  # random kills are the exactly-once test's; here the publishing fault points
GOLD_QUERY = "gold_fraud_alerts"
WATERMARK_MS = 10_000
CONFIG = GeneratorConfig(
    seed=21,
    rate=20,
    venues=50,
    start_time_ms=parse_ts("2026-11-21T10:00:00Z"),
    duplicate_rate=0.02,
    out_of_order_fraction=0.05,
    out_of_order_max_ms=2_000,  # well inside the 10 s watermark: no payment arrives late
    malformed_rate=0.005,
)


def valid_payments(records: list[GeneratedRecord]) -> dict[str, dict[str, Any]]:
    """The first valid copy of each payment, as the machine sees it (paid_at in epoch ms)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.kind not in ("malformed", "lost") and r.event_id is not None and r.event_id not in out:
            payment = json.loads(r.value)
            out[r.event_id] = {**payment, "paid_at": parse_ts(payment["paid_at"])}
    return out


def expected_alerts(payments: dict[str, dict[str, Any]], before_ms: int | None = None) -> dict[str, dict]:
    """alert id -> alert, folding the pure rules per card over the payments earlier than ``before_ms``."""
    cards: dict[str, list[dict]] = {}
    for p in payments.values():
        if before_ms is None or p["paid_at"] < before_ms:
            cards.setdefault(p["card_id"], []).append(p)
    alerts: dict[str, dict] = {}
    for events in cards.values():
        _, outputs = fold(FRAUD_RULES, None, events)
        alerts.update({a["alert_id"]: a for a in outputs})
    return alerts


def gold_alerts(layout: PipelineLayout) -> list[dict[str, Any]]:
    return delta_rows(layout, "gold/fraud_alerts")


@pytest.fixture(scope="module")
def lake(broker, tmp_path_factory) -> dict[str, Any]:
    state = tmp_path_factory.mktemp("payments")
    settings = Settings(
        state_dir=str(state / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"pay-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=400,
        trigger_seconds=1.0,
    )
    topic = settings.topic(PAYMENTS.source().topic)
    ensure_topic(settings, topic, 2)
    layout = PipelineLayout.of(settings, PAYMENTS)
    records = list(generate(CONFIG, TOTAL, PAYMENTS.sample_events))
    send(settings, topic, records[: TOTAL // 2])
    logs = state / "logs"
    logs.mkdir()
    running: list[subprocess.Popen[bytes]] = []
    gold = f"{layout.namespace}.payments.{GOLD_QUERY}"

    def launch(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        job = launch_stream_job(settings, "payments", logs / f"{name}.log", extra_args=args, extra_env=env)
        running.append(job)
        return job

    def trickle() -> None:  # the rest arrives while the job is killed at random
        for start in range(TOTAL // 2, TOTAL, 200):
            send(settings, topic, records[start : start + 200])
            time.sleep(1.0)

    seed = int(os.environ.get("TIDEWATER_CHAOS_SEED", time.time()))
    chaos = random.Random(seed)
    print(f"chaos seed {seed} (set TIDEWATER_CHAOS_SEED to replay)")
    producer = threading.Thread(target=trickle, daemon=True)
    try:
        faults = ((CRASH_AFTER_COMMIT, 1), (CRASH_BEFORE_PUBLISH_COMMIT, 2), (CRASH_AFTER_PUBLISH, 3))
        for point, batch in faults:
            job = launch(point.lower(), env={point: f"{gold}:{batch}"})
            log = logs / f"{point.lower()}.log"
            assert job.wait(timeout=300) == -signal.SIGKILL, log.read_text()[-3000:]
            assert not (layout.checkpoint(GOLD_QUERY) / "commits" / str(batch)).exists()
        producer.start()
        for round_no in range(RANDOM_KILLS):
            launched = time.time()
            job = launch(f"random-{round_no}")
            wait_for(
                lambda t=launched: any(p.stat().st_mtime > t for p in layout.progress_dir().glob("*.json")),
                timeout_s=300,
                what="a batch of the restarted job",
                log=logs / f"random-{round_no}.log",
            )
            time.sleep(chaos.uniform(0.0, 4.0))
            kill_job(job)
        producer.join(timeout=120)
        final = launch("final", "--available-now")
        assert final.wait(timeout=600) == 0, (logs / "final.log").read_text()[-3000:]
    finally:
        for job in running:
            stop_process_group(job, timeout_s=10)
    return {"settings": settings, "records": records, "layout": layout}


def test_no_payment_is_lost_or_doubled(lake):
    layout, records = lake["layout"], lake["records"]
    bronze = delta_rows(layout, "bronze")
    assert Counter((r["partition"], r["offset"]) for r in bronze).most_common(1)[0][1] == 1
    assert len(bronze) == len(records)
    silver = Counter(r["payment_id"] for r in delta_rows(layout, "silver"))
    assert silver == Counter(valid_payments(records).keys())


def test_the_stream_raises_the_alerts_the_pure_rules_give(lake):
    payments = valid_payments(lake["records"])
    expected = expected_alerts(payments, before_ms=final_watermark_ms(lake["layout"], GOLD_QUERY))
    rows = gold_alerts(lake["layout"])
    assert Counter(r["alert_id"] for r in rows) == Counter(expected.keys())
    assert {a["rule"] for a in expected.values()} == {"velocity", "amount_spike", "impossible_travel"}
    by_id = {r["alert_id"]: r for r in rows}
    for alert_id, alert in expected.items():
        assert (by_id[alert_id]["card_id"], by_id[alert_id]["detail"]) == (alert["card_id"], alert["detail"])


def test_each_alert_is_published_once_for_a_committed_reader(lake):
    settings = lake["settings"]
    published = read_committed(kafka_python_config(settings), settings.topic("payment-alerts"))
    ids = Counter(json.loads(value)["alert_id"] for _, value, _, _ in published)
    assert ids and max(ids.values()) == 1
    assert set(ids) == {r["alert_id"] for r in gold_alerts(lake["layout"])}
    assert all(key == json.loads(value)["card_id"].encode() for key, value, _, _ in published)


def test_the_streams_state_equals_a_fold_from_scratch(lake, spark):
    layout = lake["layout"]
    _ = spark.streams  # the state reader needs the session's state store coordinator
    streamed = stream_states(spark, str(layout.checkpoint(GOLD_QUERY)))
    watermark = final_watermark_ms(layout, GOLD_QUERY)
    cards: dict[str, list[dict]] = {}
    for p in valid_payments(lake["records"]).values():
        if p["paid_at"] < watermark:
            cards.setdefault(p["card_id"], []).append(p)
    expected = {card: fold(FRAUD_RULES, None, events)[0] for card, events in cards.items()}
    assert streamed.keys() == expected.keys()
    assert streamed == expected


START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)


def _utc(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    return value


def measures(row: dict[str, Any]) -> dict[str, Any]:
    return {c: _utc(v) for c, v in row.items() if c not in ("status", "revision")}


def test_batch_equals_stream_and_the_audit_passes(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    end = START + dt.timedelta(minutes=3)
    before = {r["alert_id"]: measures(r) for r in gold_alerts(layout)}
    result = recompute_interval(spark, settings, PAYMENTS, START, end, run_id="payments-parity")
    assert result.ledger_entries == 0, result
    after = {r["alert_id"]: measures(r) for r in gold_alerts(layout)}
    streamed = {k: v for k, v in before.items() if v["paid_at"] < end}
    assert streamed and all(after[k] == v for k, v in streamed.items())

    audit = run_audit(spark, settings, AuditRequest(pipeline=PAYMENTS, interval=Interval(START, end)))
    suites = {r.suite: r for r in audit.rows}
    assert audit.success, audit.summary()
    assert {"payments.reconciliation", "payments.parity.gold.fraud_alerts", "payments.gold.fraud_alerts"} <= set(suites)
    assert suites["payments.reconciliation"].counts["delivery"] == "exactly_once"

    counted = run_sql(
        settings, "SELECT rule, count(*) AS n FROM payments.gold.fraud_alerts GROUP BY rule ORDER BY rule"
    )
    assert dict(counted.rows) == dict(Counter(r["rule"] for r in gold_alerts(layout)))


def test_a_late_payment_is_folded_in_by_the_correction(lake, spark):
    """A compromised card's payment from yet another country, sent ten minutes late: the stream drops it
    (behind the watermark); the correction folds it where it belongs and the alerts become what the
    rules give with it, every changed alert in the ledger."""
    settings, layout, records = lake["settings"], lake["layout"], lake["records"]
    payments = valid_payments(records)
    travel = [r for r in gold_alerts(layout) if r["rule"] == "impossible_travel" and r["status"] == "final"]
    target = payments[sorted(travel, key=lambda r: r["paid_at"])[0]["payment_id"]]
    paid_at = target["paid_at"] + 1_000
    late = {**target, "payment_id": "late-payment", "country": "XX", "paid_at": paid_at, "amount": 12.5}
    value = {**late, "paid_at": dt.datetime.fromtimestamp(paid_at / 1000, dt.UTC).isoformat().replace("+00:00", "Z")}
    record = GeneratedRecord(
        key=target["card_id"].encode(),
        value=json.dumps(value).encode(),
        timestamp_ms=paid_at + 600_000,
        kind="late",
        event_id="late-payment",
        producer_id="test",
        seq_no=-1,
        event_time_ms=paid_at,
    )
    send(settings, settings.topic(PAYMENTS.source().topic), [record])
    run_stream(spark, settings, "payments")  # silver keeps it; the state machine never sees it (late)
    assert not [r for r in gold_alerts(layout) if r["payment_id"] == "late-payment"]

    end = START + dt.timedelta(hours=1)
    correct_late_data(spark, settings, PAYMENTS, START, end, run_id="payments-late")
    watermark = final_watermark_ms(layout, GOLD_QUERY)
    expected = expected_alerts({**payments, "late-payment": late}, before_ms=watermark)
    rows = {r["alert_id"]: r for r in gold_alerts(layout) if r["paid_at"].timestamp() * 1000 < watermark}
    assert set(rows) == set(expected)
    assert "late-payment:impossible_travel" in rows
    entries = [e for e in Ledger(layout.ledger_uri()).rows(spark) if e["dag_run_id"] == "payments-late"]
    changed = {json.loads(e["keys"])["alert_id"] for e in entries}
    assert "late-payment:impossible_travel" in changed
    again = correct_late_data(spark, settings, PAYMENTS, START, end, run_id="payments-late-2")
    assert again.ledger_entries == 0


def test_a_sandbox_replay_of_one_card_reproduces_its_alerts(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    end = START + dt.timedelta(minutes=3)
    card = Counter(r["card_id"] for r in gold_alerts(layout)).most_common(1)[0][0]
    live_version = layout.table("gold/fraud_alerts").version()
    result = replay(
        spark,
        settings,
        PAYMENTS,
        START,
        end,
        run_id="payments-replay",
        sandbox_namespace="pay_sandbox",
        entities=[card],
    )
    assert result.entities == (card,)
    sandbox = PipelineLayout.of(settings, PAYMENTS, "pay_sandbox")

    def alerts(where: PipelineLayout) -> dict[str, dict]:
        return {
            r["alert_id"]: measures(r) for r in gold_alerts(where) if r["card_id"] == card and _utc(r["paid_at"]) < end
        }

    assert alerts(sandbox) == alerts(layout) and alerts(layout)
    assert {r["card_id"] for r in gold_alerts(sandbox)} == {card}
    assert layout.table("gold/fraud_alerts").version() == live_version


def test_the_state_and_its_size_are_in_the_streams_health(lake):
    """What the supervisor shows per query (the progress file): the cards in state and the bytes they take."""
    progress = json.loads((lake["layout"].progress_dir() / f"{GOLD_QUERY}.json").read_text())
    assert progress["state_rows"] > 0
    assert max(progress["state_memory_bytes"], progress["state_files_bytes"]) > 0


def _payment_record(payment_id: str, card: str, paid_at: int) -> GeneratedRecord:
    value = {
        "payment_id": payment_id,
        "paid_at": dt.datetime.fromtimestamp(paid_at / 1000, dt.UTC).isoformat().replace("+00:00", "Z"),
        "card_id": card,
        "merchant_id": "m-1",
        "amount": 20.0,
        "currency": "EUR",
        "country": "DE",
    }
    return GeneratedRecord(
        key=card.encode(),
        value=json.dumps(value).encode(),
        timestamp_ms=paid_at,
        kind="valid",
        event_id=payment_id,
        producer_id="test",
        seq_no=-1,
        event_time_ms=paid_at,
    )


def test_a_card_quiet_for_a_day_is_forgotten_by_the_stream(lake, spark):
    """The stream keeps the state of the cards of the last day only (``fraud.forget_at``): once event
    time is a day past every card's last payment, their entries are gone. Each bucket finds them in a
    pass over its states (their deadlines lay too far ahead for a marker): real Spark's map state
    iterator and removal. Last in the module: it moves event time on by a day."""
    settings, layout = lake["settings"], lake["layout"]
    checkpoint = str(layout.checkpoint(GOLD_QUERY))
    _ = spark.streams  # the state reader needs the session's state store coordinator
    assert len(stream_states(spark, checkpoint)) > 10
    later = final_watermark_ms(layout, GOLD_QUERY) + 26 * 3_600_000
    new = [
        _payment_record("day-after-1", "c-day-after", later),
        _payment_record("day-after-2", "c-day-after", later + 60_000),
    ]
    send(settings, settings.topic(PAYMENTS.source().topic), new)
    run_stream(spark, settings, "payments")
    assert final_watermark_ms(layout, GOLD_QUERY) == later + 60_000 - WATERMARK_MS
    first = {**valid_payments(new)["day-after-1"]}
    assert stream_states(spark, checkpoint) == {"c-day-after": fold(FRAUD_RULES, None, [first])[0]}
