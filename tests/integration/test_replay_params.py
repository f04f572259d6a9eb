"""Replay / backfill parameter checks (tidewater.orchestration.params): every refusal, with its message.

* Parameters: pure checks, no broker, no Spark.
* source=bronze: real Delta tables on the local file system, committed the way the stream commits
  bronze (``write_data_files`` + ``commit_files``), so the file statistics are the stream's.
* source=kafka: the real embedded broker (topic missing, empty, holding another range, holding the
  range, and an unreachable broker).
* Retention: the embedded broker (tansu) cannot delete records - it has no DeleteRecords and no
  retention settings - so an earliest offset above 0 cannot be produced on it. That branch runs
  against :class:`RetainedClient`, a small in-memory implementation of the PartitionClient protocol
  (the same approach as tests/unit/test_kafka_offsets.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pytest
from kafka import KafkaProducer

from pipeline_helpers import BRONZE_SCHEMA
from tidewater import pipelines as registry
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.connectors.kafka_client import records_to_arrow
from tidewater.errors import BrokerUnreachableError, ConfigError, TidewaterError, TopicNotFoundError
from tidewater.generator.producer import ensure_topic
from tidewater.lake.files import write_data_files
from tidewater.orchestration.params import (
    ReplayRequest,
    check_range_held,
    parse_interval,
    parse_replay_params,
)
from tidewater.pipelines import all_pipelines, get_pipeline
from tidewater.pipelines.layout import PipelineLayout

RSVPS = get_pipeline("rsvps")
NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)  # records below: one per second from 10:00:00
VALID = {
    "pipeline": "rsvps",
    "start": "2026-11-21T10:00:00Z",
    "end": "2026-11-21T11:00:00",  # no offset: UTC
    "source": "bronze",
    "target": "sandbox",
    "sandbox_namespace": "replay_1",
    "entities": [],
}

DECLARED = ", ".join(sorted(all_pipelines(Settings(pipelines=""))))  # the packaged pipelines


def parse(settings: Settings, now: dt.datetime = NOW, **changes: object) -> ReplayRequest:
    return parse_replay_params({**VALID, **changes}, settings, now=now)


def refused(exc: pytest.ExceptionInfo[BaseException], *fragments: str) -> None:
    """The error is one line (what the task log and the Airflow UI show) holding every fragment."""
    text = str(exc.value)
    assert "\n" not in text, text
    assert isinstance(exc.value, TidewaterError)
    for fragment in fragments:
        assert fragment in text, (fragment, text)


# ---- parameters --------------------------------------------------------------------------------------


def test_valid_params_become_the_jobs_arguments(settings: Settings) -> None:
    """Times become aware UTC (naive = UTC, offsets converted); entities are deduplicated strings;
    the sandbox namespace is passed only to a sandbox replay."""
    request = parse(settings, start="2026-11-21T11:00:00+01:00", entities=[101, " 102 ", "101"])
    assert request == ReplayRequest(
        "rsvps", T0, T0 + dt.timedelta(hours=1), "bronze", "sandbox", "replay_1", ("101", "102")
    )
    assert request.to_args() == [
        "--pipeline", "rsvps",
        "--start", "2026-11-21T10:00:00.000000Z",
        "--end", "2026-11-21T11:00:00.000000Z",
        "--source", "bronze",
        "--target", "sandbox",
        "--sandbox-namespace", "replay_1",
        "--entity", "101",
        "--entity", "102",
    ]  # fmt: skip
    live = parse(settings, target="live", source="kafka", sandbox_namespace="", entities="7, 8")
    assert live.sandbox_namespace == "" and live.entities == ("7", "8")
    assert "--sandbox-namespace" not in live.to_args()
    assert live.to_args()[-8:] == ["--source", "kafka", "--target", "live", "--entity", "7", "--entity", "8"]
    assert parse(settings, start=T0, end=T0 + dt.timedelta(minutes=1)).end == T0 + dt.timedelta(minutes=1)
    assert parse(settings, source=None, target=None).source == "bronze"  # defaults: bronze into a sandbox


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pipeline": "orders"}, f"unknown pipeline 'orders': known pipelines are {DECLARED}"),
        ({"start": "yesterday"}, "start 'yesterday' is not an ISO-8601 time"),
        ({"end": "2026-13-01T00:00:00Z"}, "end '2026-13-01T00:00:00Z' is not an ISO-8601 time"),
        ({"start": ""}, "start is required: give an ISO-8601 time"),
        ({"end": None}, "end is required"),
        (
            {"end": "2026-11-21T10:00:00Z"},
            "end 2026-11-21T10:00:00.000000Z is not after start 2026-11-21T10:00:00.000000Z: the range is "
            "[start, end), give end > start",
        ),
        ({"end": "2026-11-21T09:00:00Z"}, "is not after start"),
        (
            {"start": "2026-11-21T12:05:01Z", "end": "2026-11-21T13:00:00Z"},
            "the range [2026-11-21T12:05:01.000000Z, 2026-11-21T13:00:00.000000Z) starts in the future (now is "
            "2026-11-21T12:00:00.000000Z, clock skew tolerance 5 minutes): nothing can hold it yet",
        ),
        ({"source": "s3"}, "source 's3' is not one of bronze, kafka"),
        ({"target": "prod"}, "target 'prod' is not one of sandbox, live"),
        ({"sandbox_namespace": ""}, "a sandbox replay needs sandbox_namespace"),
        ({"sandbox_namespace": "live"}, "sandbox_namespace 'live' is the live namespace: choose another"),
        (
            {"sandbox_namespace": "my sandbox!"},
            "sandbox_namespace 'my sandbox!' may hold only letters, digits, - and _",
        ),
        ({"entities": ["12", "12a"]}, "entities 12a are not valid venue_id values of pipeline rsvps (whole numbers)"),
        ({"sandbox_ns": "x"}, "unknown replay parameter(s) sandbox_ns: the parameters are pipeline, start, end"),
    ],
    ids=lambda value: str(value)[:40] if isinstance(value, dict) else "",
)
def test_refusals(settings: Settings, changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(settings, **changes)
    refused(caught, message)


def test_a_range_within_the_clock_skew_of_now_is_accepted(settings: Settings) -> None:
    """Events may be up to the pipeline's clock-skew tolerance ahead of the clock: a range starting
    that little in the future may already hold some."""
    request = parse(settings, start="2026-11-21T12:04:59Z", end="2026-11-21T13:00:00Z")
    assert request.start == NOW + dt.timedelta(minutes=4, seconds=59)


def test_entities_need_an_entity_column(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = dataclasses.replace(RSVPS, name="plain", entity_column=None)
    monkeypatch.setattr(registry, "all_pipelines", lambda: {"rsvps": RSVPS, "plain": plain})
    with pytest.raises(ConfigError) as caught:
        parse(settings, pipeline="plain", entities=["42"])
    refused(caught, "pipeline plain has no entity column", "leave entities empty to replay every entity")
    assert parse(settings, pipeline="plain").entities == ()


def test_parse_interval_for_the_batch_dag() -> None:
    """The batch DAG's helper: the same time rules, without replay parameters."""
    assert parse_interval("2026-11-21T10:00:00", "2026-11-21T11:00:00+00:00", now=NOW) == (
        T0,
        T0 + dt.timedelta(hours=1),
    )
    with pytest.raises(ConfigError) as caught:
        parse_interval("2026-11-21T10:00:00Z", "", now=NOW)
    refused(caught, "end is required")
    with pytest.raises(ConfigError) as caught:
        parse_interval("2026-11-22T10:00:00Z", "2026-11-22T11:00:00Z", now=NOW, clock_skew=dt.timedelta(0))
    refused(caught, "starts in the future", "clock skew tolerance 0 minutes")


# ---- source=bronze: Delta file statistics ------------------------------------------------------------


def make_bronze(settings: Settings, records: int = 300, per_commit: int = 100) -> PipelineLayout:
    """Bronze of the live namespace holding Kafka records at T0, T0+1s, ... (the stream's commit path)."""
    layout = PipelineLayout.of(settings, RSVPS)
    table = layout.table("bronze")
    table.ensure(BRONZE_SCHEMA, partition_by=("ingest_date",))
    for batch_id, first in enumerate(range(0, records, per_commit)):
        offsets = list(range(first, min(records, first + per_commit)))
        stamps = [T0 + dt.timedelta(seconds=o) for o in offsets]
        rows = pa.RecordBatch.from_pydict(
            {
                "key": [None] * len(offsets),
                "value": [b"{}"] * len(offsets),
                "topic": ["rsvps"] * len(offsets),
                "partition": [0] * len(offsets),
                "offset": offsets,
                "kafka_timestamp": stamps,
                "timestamp_type": [0] * len(offsets),
                "headers": [[] for _ in offsets],
                "ingest_time": stamps,
                "ingest_date": [s.date() for s in stamps],
            },
            schema=BRONZE_SCHEMA,
        )
        actions = write_data_files(table.uri, [rows], schema=BRONZE_SCHEMA, partition_by=["ingest_date"])
        table.commit_files(actions, app_id="test", batch_id=batch_id)
    return layout


def test_bronze_missing_or_empty_is_refused(settings: Settings) -> None:
    request = parse(settings)
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, request)
    refused(caught, "there is no bronze table for live/rsvps", "run the stream first, or replay from source=kafka")

    PipelineLayout.of(settings, RSVPS).table("bronze").ensure(BRONZE_SCHEMA, partition_by=("ingest_date",))
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, request)
    refused(
        caught,
        "bronze live/rsvps holds no records; nothing to replay in "
        "[2026-11-21T10:00:00.000000Z, 2026-11-21T11:00:00.000000Z)",
    )


def test_bronze_must_overlap_the_range_judged_from_file_statistics(settings: Settings) -> None:
    """Bronze holds Kafka times 10:00:00 .. 10:04:59. A range it overlaps (allowing for the clock
    skew: an event at 10:06 may have reached Kafka at 10:01) is described; a range after or before
    it is refused. The data files are deleted first: only the log's statistics are read, no scan."""
    layout = make_bronze(settings)
    data_files = list(Path(unquote(urlparse(layout.table_uri("bronze")).path)).glob("ingest_date=*/*.parquet"))
    assert len(data_files) == 3
    for path in data_files:
        path.unlink()

    held = check_range_held(settings, parse(settings, start="2026-11-21T10:02:00Z", end="2026-11-21T10:03:00Z"))
    assert held == (
        "bronze live/rsvps holds 300 records in 3 files, Kafka time 2026-11-21T10:00:00.000000Z to "
        "2026-11-21T10:04:59.000000Z"
    )
    assert check_range_held(settings, parse(settings, start="2026-11-21T10:06:00Z", end="2026-11-21T11:00:00Z"))

    for start, end in (("2026-11-21T11:00:00Z", "2026-11-21T12:00:00Z"), ("2026-11-21T08:00:00Z", "2026-11-21T09:00Z")):
        with pytest.raises(ConfigError) as caught:
            check_range_held(settings, parse(settings, start=start, end=end))
        refused(
            caught,
            "bronze holds events from 2026-11-21T10:00:00.000000Z to 2026-11-21T10:04:59.000000Z; nothing to replay in "
            f"[{start[:19]}.000000Z, ",
        )


# ---- source=kafka: the real broker -------------------------------------------------------------------


@pytest.fixture
def kafka_replay(kafka_settings: Settings, make_topic) -> Settings:
    """Settings whose rsvps topic name is unique to this test (a topic prefix), not yet created."""
    return kafka_settings.replace(kafka_topic_prefix=make_topic(partitions=1, prefix="unused") + "-")


def produce(settings: Settings, topic: str, count: int, partitions: int) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    try:
        for i in range(count):
            stamp = int((T0 + dt.timedelta(seconds=i)).timestamp() * 1000)
            producer.send(topic, value=b"{}", partition=i % partitions, timestamp_ms=stamp)
        producer.flush(timeout=60)
    finally:
        producer.close()


def test_kafka_topic_missing_empty_or_elsewhere_is_refused(kafka_replay: Settings) -> None:
    settings = kafka_replay
    topic = settings.topic("rsvps")
    request = parse(settings, source="kafka", start="2026-11-21T10:02:00Z", end="2026-11-21T10:03:00Z")

    with pytest.raises(TopicNotFoundError) as caught:
        check_range_held(settings, request)
    refused(caught, f"Kafka topic {topic!r} does not exist")

    ensure_topic(settings, topic, 2)
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, request)
    refused(
        caught,
        f"Kafka topic {topic} is empty; nothing to replay in "
        "[2026-11-21T10:02:00.000000Z, 2026-11-21T10:03:00.000000Z)",
    )

    produce(settings, topic, 300, partitions=2)
    assert check_range_held(settings, request) == (
        f"Kafka topic {topic} holds 300 records in 2 partitions from 2026-11-21T10:00:00.000000Z to "
        "2026-11-21T10:04:59.000000Z"
    )
    later = parse(settings, source="kafka", start="2026-11-21T11:00:00Z", end="2026-11-21T12:00:00Z")
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, later)
    refused(caught, f"Kafka holds {topic} from 2026-11-21T10:00:00.000000Z to 2026-11-21T10:04:59.000000Z; nothing")


def test_unreachable_broker_is_one_line(settings: Settings) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    unreachable = settings.replace(kafka_bootstrap_servers=address, kafka_request_timeout_ms=2000)
    with pytest.raises(BrokerUnreachableError) as caught:
        check_range_held(unreachable, parse(unreachable, source="kafka"))
    refused(caught, f"cannot reach a Kafka broker at {address}: check TIDEWATER_KAFKA_BOOTSTRAP_SERVERS")


# ---- retention: an in-memory client ------------------------------------------------------------------


class RetainedClient:
    """In-memory PartitionClient: per partition the retained offsets [earliest, end); the record at
    offset o has Kafka timestamp T0 + o seconds. Stands in for a broker whose retention deleted
    records, which the embedded broker cannot do."""

    def __init__(self, topic: str, partitions: dict[int, tuple[int, int]]) -> None:
        self.topic = topic
        self.retained = partitions
        self.closed = False

    def partitions(self, topic: str) -> list[int]:
        assert topic == self.topic
        return sorted(self.retained)

    def earliest_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: self.retained[p][0] for p in partitions}

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: self.retained[p][1] for p in partitions}

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        raise AssertionError("not needed to check a range")

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        earliest, last = self.retained[partition]
        offsets = list(range(max(start, earliest), min(end, last)))
        yield records_to_arrow(
            {
                "key": [None] * len(offsets),
                "value": [b"{}"] * len(offsets),
                "topic": [topic] * len(offsets),
                "partition": [partition] * len(offsets),
                "offset": offsets,
                "timestamp": [int((T0 + dt.timedelta(seconds=o)).timestamp() * 1_000_000) for o in offsets],
                "timestampType": [0] * len(offsets),
                "headers": [[] for _ in offsets],
            }
        )

    def close(self) -> None:
        self.closed = True


def test_kafka_retention_refuses_a_range_it_no_longer_holds(settings: Settings) -> None:
    """Partition 0 lost offsets 0..99 to retention (it now starts at 10:01:40); partition 1 is whole.
    A range needing records before 10:01:40 (start - 5 minutes of clock skew) is refused with the
    advice to replay from bronze; a later range is fine. A partition whose records were all deleted
    refuses every range (when its records ended is unknown)."""
    topic = settings.topic("rsvps")
    client = RetainedClient(topic, {0: (100, 300), 1: (0, 300)})
    from_kafka = {"source": "kafka"}

    too_early = parse(settings, start="2026-11-21T10:05:00Z", end="2026-11-21T10:10:00Z", **from_kafka)
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, too_early, client=client)
    refused(
        caught,
        f"Kafka retains {topic} only from 2026-11-21T10:01:40.000000Z (older records were deleted by retention): "
        "replay from source=bronze",
    )

    fine = parse(settings, start="2026-11-21T10:06:40Z", end="2026-11-21T10:10:00Z", **from_kafka)
    assert check_range_held(settings, fine, client=client).startswith(f"Kafka topic {topic} holds 500 records")
    assert not client.closed, "a client the caller passed in is the caller's to close"

    emptied = RetainedClient(topic, {0: (100, 300), 1: (0, 300), 2: (50, 50)})
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, fine, client=emptied)
    refused(caught, f"Kafka retains none of the older records of {topic}/2 (deleted by retention)")

    gone = RetainedClient(topic, {0: (300, 300), 1: (120, 120)})
    with pytest.raises(ConfigError) as caught:
        check_range_held(settings, fine, client=gone)
    refused(caught, f"Kafka retains none of {topic}'s records (older records were deleted by retention)")
