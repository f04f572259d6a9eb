"""A toy pipeline declared only here, in tests/: meter readings counted per meter per minute.

It proves that a pipeline is a declaration: the platform's stream, batch recompute, replay,
late-data correction, audits, SQL catalog and DAGs pick it up from ``TIDEWATER_PIPELINE_MODULES``
(this file's path) with no edit anywhere in the library. Its committed expectation suites live
beside it, in ``suites/toy/``; its sample events (:data:`SAMPLE_EVENTS`) feed ``tidewater generate
--pipeline toy`` and the platform.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

from tidewater.pipelines.base import Pipeline, Source, WindowAggregate
from tidewater.pipelines.contract import Between, NotAfterArrival, Quality, Required
from tidewater.pipelines.samples import EventContext, Payload, SampleEvents, set_field, truncated_json
from tidewater.transforms import windowed_counts

PAYLOAD = StructType(
    [
        StructField("reading_id", StringType()),
        StructField("read_at", TimestampType()),
        StructField("meter", StringType()),
        StructField("kwh", DoubleType()),
    ]
)


def per_meter_minute(silver: DataFrame) -> DataFrame:
    return windowed_counts(
        silver,
        time_column="read_at",
        watermark="1 minute",
        window="1 minute",
        group_by=("meter",),
        measures={"readings": F.count(F.lit(1)), "kwh_total": F.round(F.sum("kwh"), 6)},
    )


def sample_reading(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid reading of meter m-0..m-3, 0..5 kWh, keyed by its meter."""
    meter = f"m-{rng.randrange(4)}"
    kwh = round(rng.uniform(0, 5), 3)
    payload = {"reading_id": context.event_id, "read_at": context.event_time, "meter": meter, "kwh": kwh}
    return meter.encode(), payload


SAMPLE_EVENTS = SampleEvents(
    make=sample_reading,
    malformations={"negative_kwh": set_field("kwh", -1.0), "truncated_json": truncated_json},
)


PIPELINE = Pipeline(
    name="toy",
    description="Meter readings (a test-only pipeline)",
    entity_column="meter",
    suites_dir=str(Path(__file__).parent / "suites"),
    sample_events=SAMPLE_EVENTS,
    sources=(
        Source(
            name="readings",
            topic="toy-readings",
            payload_schema=PAYLOAD,
            columns={"reading_id": "p.reading_id", "read_at": "p.read_at", "meter": "p.meter", "kwh": "p.kwh"},
            constraints=(
                Required(("reading_id",), non_empty=True),
                Required(("read_at",), reason="read_at missing or not an ISO-8601 timestamp"),
                Required(("meter",)),
                Between("kwh", 0, 1000, label="kwh"),
                NotAfterArrival("read_at", tolerance="5 minutes"),
            ),
            key="reading_id",
            event_time="read_at",
            watermark="1 minute",
            partition_column="read_date",
            quality=Quality(rows_per_hour=(1, None), tolerated_invalid_fraction=0.2, tolerated_duplicate_fraction=0.2),
        ),
    ),
    gold=(
        WindowAggregate(
            name="per_meter_minute",
            description="Readings and kWh per meter, 1-minute tumbling windows",
            keys=("window_start", "meter"),
            window="1 minute",
            build=per_meter_minute,
        ),
    ),
)


@dataclass(frozen=True)
class Reading:
    """One Kafka record of the toy topic (the shape tests' ``send`` takes)."""

    key: bytes
    value: bytes
    timestamp_ms: int
    reading_id: str | None
    kind: str  # ok | duplicate | malformed | late


def readings(start: dt.datetime, count: int, *, seed: int, per_second: int = 5, late_every: int = 0) -> list[Reading]:
    """``count`` readings from ``start`` at ``per_second``; every 10th a re-send, every 17th malformed and,
    with ``late_every``, every n-th sent five minutes after it was read (behind the watermark)."""
    rng = random.Random(seed)
    out: list[Reading] = []
    for i in range(count):
        read_at = start + dt.timedelta(milliseconds=i * 1000 // per_second)
        sent = read_at + (dt.timedelta(minutes=5) if late_every and i % late_every == 0 else dt.timedelta(0))
        meter = f"m-{rng.randrange(4)}"
        reading_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        payload = {
            "reading_id": reading_id,
            "read_at": read_at.isoformat().replace("+00:00", "Z"),
            "meter": meter,
            "kwh": round(rng.uniform(0, 5), 3),
        }
        kind = "late" if sent != read_at else "ok"
        if i % 17 == 16:
            payload["kwh"], kind = -1.0, "malformed"
        record = Reading(meter.encode(), json.dumps(payload).encode(), int(sent.timestamp() * 1000), reading_id, kind)
        out.append(record)
        if i % 10 == 9 and kind != "malformed":
            out.append(Reading(record.key, record.value, record.timestamp_ms, reading_id, "duplicate"))
    return out
