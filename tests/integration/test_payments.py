"""payments: the per-card fraud state machine, streamed and recomputed; alerts published to Kafka once.

Real broker, real Spark (the spark-submit streaming job for the kills), real Delta. The payments are the
pipeline's own sample events (compromised cards in bursts from changing countries, amount spikes),
with re-sends, out-of-order and malformed records. The expected alerts are computed here by folding
the pure rules (:func:`tidewater.pipelines.payments.fraud.step`) over the generated payments in plain
Python, independently of Spark.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline_helpers import run_stream, send
from tidewater.config import Settings
from tidewater.connectors.kafka_client import kafka_python_config
from tidewater.connectors.kafka_publish import read_committed
from tidewater.generator.producer import ensure_topic
from tidewater.keyed_state import fold
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.payments import FRAUD_RULES
from tidewater.pipelines.samples import GeneratedRecord, GeneratorConfig, generate, parse_ts

pytestmark = pytest.mark.slow

PAYMENTS = get_pipeline("payments")
WATERMARK_MS = 10_000
CONFIG = GeneratorConfig(
    seed=21,
    rate=20,
    venues=50,
    start_time_ms=parse_ts("2026-11-21T10:00:00Z"),
    duplicate_rate=0.02,
    out_of_order_fraction=0.05,
    out_of_order_max_ms=5_000,
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
    return DeltaTable(layout.table_uri("gold/fraud_alerts")).to_pyarrow_table().to_pylist()


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> dict[str, Any]:
    state = tmp_path_factory.mktemp("payments")
    settings = Settings(
        state_dir=str(state / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"pay-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=1000,
    )
    topic = settings.topic(PAYMENTS.source().topic)
    ensure_topic(settings, topic, 2)
    records = send(settings, topic, generate(CONFIG, 4000, PAYMENTS.sample_events))
    run_stream(spark, settings, "payments")
    return {"settings": settings, "records": records, "layout": PipelineLayout.of(settings, PAYMENTS)}


def test_the_stream_raises_the_alerts_the_pure_rules_give(lake):
    payments = valid_payments(lake["records"])
    high = max(p["paid_at"] for p in payments.values())
    # The stream folds a payment once the watermark (latest - 10 s) has passed it.
    expected = expected_alerts(payments, before_ms=high - WATERMARK_MS)
    rows = gold_alerts(lake["layout"])
    assert Counter(r["alert_id"] for r in rows) == Counter(expected.keys())
    assert {a["rule"] for a in expected.values()} == {"velocity", "amount_spike", "impossible_travel"}


def test_each_alert_is_published_once(lake):
    settings = lake["settings"]
    topic = settings.topic("payment-alerts")
    published = read_committed(kafka_python_config(settings), topic)
    ids = Counter(json.loads(value)["alert_id"] for _, value, _, _ in published)
    assert ids == Counter(r["alert_id"] for r in gold_alerts(lake["layout"]))
    assert all(key == json.loads(value)["card_id"].encode() for key, value, _, _ in published)
