"""Offset arithmetic of the ``tidewater-kafka`` source, without a broker or Spark.

``cap_offsets``, option parsing and the planner's data-loss checks are pure functions of offsets.
The planner is driven through :class:`FakePartitionClient`, a small in-memory implementation of
the :class:`~tidewater.connectors.kafka_client.PartitionClient` protocol. That fake is the only
way to test retention loss here: the embedded broker (tansu) cannot delete records at all —
DeleteRecords panics its broker thread and topic retention configs are unsupported — so an
earliest offset that moves forward can only be simulated. The real-broker behaviour of the same
code (true end offsets, reads, timestamps) is covered by tests/integration/test_kafka_source.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pytest
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from tidewater.connectors import kafka_source
from tidewater.connectors.kafka_client import RECORD_SCHEMA, records_to_arrow
from tidewater.connectors.kafka_source import (
    KafkaBatchReader,
    KafkaRange,
    KafkaRanges,
    KafkaSourceOptions,
    KafkaStreamReader,
    Offsets,
    _KafkaPlanner,
    _parse_offset_spec,
    cap_offsets,
)
from tidewater.errors import ConfigError, DataLossError, TopicNotFoundError

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "orders"}


class FakePartitionClient:
    """In-memory PartitionClient: per topic, per partition, the retained range [earliest, end)."""

    def __init__(self, topics: dict[str, dict[int, tuple[int, int]]]) -> None:
        self.topics = topics
        self.closed = False
        # (topic, partition) -> the first offset really served, where ListOffsets(earliest) says more
        # (the embedded broker has done so: see KafkaPythonClient.first_readable).
        self.served_from: dict[tuple[str, int], int] = {}
        self.verified = 0

    def partitions(self, topic: str) -> list[int]:
        if topic not in self.topics:
            raise TopicNotFoundError(f"Kafka topic {topic!r} does not exist")
        return sorted(self.topics[topic])

    def earliest_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: self.topics[topic][p][0] for p in partitions}

    def first_readable(self, topic: str, partition: int, reported: int) -> int:
        self.verified += 1
        return min(reported, self.served_from.get((topic, partition), reported))

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: self.topics[topic][p][1] for p in partitions}

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        # Records carry timestamp == offset * 1000 in this fake.
        first, end = self.topics[topic][partition]
        return min(end, max(first, -(-timestamp_ms // 1000)))

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        offsets = list(range(start, end))
        yield records_to_arrow(
            {
                "key": [None] * len(offsets),
                "value": [str(o).encode() for o in offsets],
                "topic": [topic] * len(offsets),
                "partition": [partition] * len(offsets),
                "offset": offsets,
                "timestamp": [o * 1000 * 1000 for o in offsets],
                "timestampType": [0] * len(offsets),
                "headers": [[] for _ in offsets],
            }
        )

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int, int]], *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        for topic, partition, start, end in ranges:
            yield from self.read_arrow(topic, partition, start, end)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakePartitionClient:
    """A fake client every planner/reader in this test gets from ``make_client``."""
    client = FakePartitionClient({"orders": {0: (0, 100), 1: (10, 50), 2: (0, 0)}})
    monkeypatch.setattr(kafka_source, "make_client", lambda backend, config: client)
    monkeypatch.setattr(kafka_source, "_IDLE_READERS", {})
    return client


def planner(**options: str) -> _KafkaPlanner:
    return _KafkaPlanner(KafkaSourceOptions.parse({**BASE, **options}))


def assert_one_line(exc: BaseException, *fragments: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


# ---- cap_offsets ---------------------------------------------------------------------------------


def test_cap_offsets_returns_end_when_the_lag_fits() -> None:
    """A batch smaller than the cap is not cut."""
    start: Offsets = {"t": {"0": 5, "1": 0}}
    end: Offsets = {"t": {"0": 10, "1": 3}}
    assert cap_offsets(start, end, 8) == end
    assert cap_offsets(start, end, 100) == end


def test_cap_offsets_splits_in_proportion_to_lag() -> None:
    """The cap is shared by lag: 3:1 lag gives a 3:1 split, totalling exactly the cap."""
    start: Offsets = {"t": {"0": 0, "1": 100}}
    end: Offsets = {"t": {"0": 3000, "1": 1100}}
    capped = cap_offsets(start, end, 400)
    assert capped == {"t": {"0": 300, "1": 200}}


@pytest.mark.parametrize(
    ("lags", "max_rows"),
    [
        ([1000, 1, 1, 1], 3),  # the big partition's share is 2, the small ones are forced to 1
        ([7, 13, 0, 29, 1], 10),
        ([5000, 5000, 5000, 5000], 1000),
        ([1, 1, 1, 1, 1, 1], 2),  # more lagging partitions than the cap: each still moves by 1
        ([999_999, 3, 0], 1),
    ],
)
def test_cap_offsets_invariants(lags: list[int], max_rows: int) -> None:
    """Every lagging partition moves, nothing leaves [start, end], the total respects the cap
    except for the at-least-one rule (a partition whose proportional share rounds to 0)."""
    start: Offsets = {"a": {str(i): 10 * i for i in range(len(lags))}}
    end: Offsets = {"a": {str(i): 10 * i + lag for i, lag in enumerate(lags)}}
    capped = cap_offsets(start, end, max_rows)
    total = sum(lags)
    forced = sum(1 for lag in lags if lag and (lag * max_rows) // total == 0) if total > max_rows else 0
    moved = 0
    for p, stop in end["a"].items():
        begin, got = start["a"][p], capped["a"][p]
        assert begin <= got <= stop, (p, begin, got, stop)
        if stop > begin:
            assert got > begin, f"partition {p} starved"
        moved += got - begin
    assert moved <= max_rows + forced
    if not forced:
        assert moved <= max_rows


def test_cap_offsets_partition_missing_from_start_does_not_move() -> None:
    """A partition absent from start counts as having no lag (the stream reader fills it first)."""
    start: Offsets = {"t": {"0": 0}}
    end: Offsets = {"t": {"0": 100, "1": 100}}
    assert cap_offsets(start, end, 10) == {"t": {"0": 10, "1": 100}}


# ---- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"subscribe": "orders"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, "subscribe"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": " , "}, "subscribe"),
        ({**BASE, "maxOffsetsPerTrigger": "lots"}, "maxOffsetsPerTrigger='lots' must be a whole number"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger='0' must be a whole number of at least 1"),
        ({**BASE, "startingTimestamp": "yesterday"}, "startingTimestamp='yesterday' must be a whole number"),
        ({**BASE, "maxRecordsPerPartition": "1e3"}, "maxRecordsPerPartition='1e3' must be a whole number"),
        ({**BASE, "maxRecordsPerPartition": "0"}, "maxRecordsPerPartition='0' must be a whole number of at least 1"),
        ({**BASE, "kafka.request.timeout.ms": "soon"}, "kafka.request.timeout.ms='soon' must be a whole number"),
    ],
)
def test_parse_rejects_bad_options_with_one_line(options: dict[str, str], needle: str) -> None:
    """Missing servers/topics and numbers that are not whole numbers in range are ConfigErrors with a
    one-line message."""
    with pytest.raises(ConfigError) as info:
        KafkaSourceOptions.parse(options)
    assert_one_line(info.value, needle)


def test_parse_defaults() -> None:
    """Only servers and subscribe are required; the rest has Spark-like defaults."""
    opts = KafkaSourceOptions.parse(BASE)
    assert opts.topics == ("orders",)
    assert opts.client_config["bootstrap_servers"] == ["127.0.0.1:9092"]
    assert opts.client_config["request_timeout_ms"] == 15000
    assert opts.starting == "earliest"
    assert opts.ending == "latest"
    assert opts.starting_timestamp_ms is None
    assert opts.max_offsets_per_trigger is None
    assert opts.fail_on_data_loss is True
    assert opts.max_records_per_partition == 500_000
    assert opts.backend == "kafka-python"
    assert opts.ingest_time is False


def test_parse_numbers_topics_and_case_insensitive_keys() -> None:
    """Spark lower-cases option keys on some paths: either spelling works; numbers become ints."""
    opts = KafkaSourceOptions.parse(
        {
            "kafka.bootstrap.servers": "a:1,b:2",
            "subscribe": "orders, rsvps ,",
            "kafka.request.timeout.ms": "3000",
            "maxOffsetsPerTrigger": "1000",
            "startingtimestamp": "1700000000000",
            "maxRecordsPerPartition": "250",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "u",
            "kafka.sasl.password": "p",
        }
    )
    assert opts.topics == ("orders", "rsvps")
    assert opts.client_config["bootstrap_servers"] == ["a:1", "b:2"]
    assert opts.client_config["request_timeout_ms"] == 3000
    assert opts.client_config["sasl_mechanism"] == "PLAIN"
    assert opts.client_config["sasl_plain_username"] == "u"
    assert opts.max_offsets_per_trigger == 1000
    assert opts.starting_timestamp_ms == 1_700_000_000_000
    assert opts.max_records_per_partition == 250


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("TRUE", True), ("false", False), ("False", False)])
def test_parse_fail_on_data_loss(value: str, expected: bool) -> None:
    assert KafkaSourceOptions.parse({**BASE, "failOnDataLoss": value}).fail_on_data_loss is expected


# ---- offset specs ------------------------------------------------------------------------------------


def test_parse_offset_spec_keywords_and_json() -> None:
    """Keywords mean "resolve later"; JSON becomes {topic: {partition as str: int}}."""
    assert _parse_offset_spec("earliest", "startingOffsets") is None
    assert _parse_offset_spec("latest", "startingOffsets") is None
    assert _parse_offset_spec('{"t": {"0": 42, "1": -2}}', "startingOffsets") == {"t": {"0": 42, "1": -2}}


@pytest.mark.parametrize(
    "spec", ["", "newest", "{not json", '["t", 0]', '{"t": [1, 2]}', '{"t": {"0": "x"}}', '{"t": 5}', "42"]
)
def test_parse_offset_spec_errors(spec: str) -> None:
    """Anything but earliest/latest/{topic: {partition: offset}} is a one-line ConfigError naming the option."""
    with pytest.raises(ConfigError) as info:
        _parse_offset_spec(spec, "endingOffsets")
    assert_one_line(info.value, "endingOffsets=", "earliest, latest or JSON")


# ---- planner: data loss ---------------------------------------------------------------------------------


def test_check_retained_accepts_a_retained_range(fake: FakePartitionClient) -> None:
    """Starting at or after the earliest retained offset, ending at or after the start: no error."""
    planner().check_retained({"orders": {"0": 0, "1": 10, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})


def test_check_retained_reports_retention_loss(fake: FakePartitionClient) -> None:
    """The query needs offset 4 of orders/1, but retention already moved the start to 10."""
    with pytest.raises(DataLossError) as info:
        planner().check_retained({"orders": {"0": 0, "1": 4, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})
    assert_one_line(info.value, "orders/1", "4..9", "retention", "failOnDataLoss=false")


def test_check_retained_reports_a_recreated_topic(fake: FakePartitionClient) -> None:
    """The committed start (70) is beyond the partition's end (50): the topic was recreated."""
    with pytest.raises(DataLossError) as info:
        planner().check_retained({"orders": {"1": 70}}, {"orders": {"1": 50}})
    assert_one_line(info.value, "orders/1", "ends at 50", "up to 70", "recreated")


def test_check_retained_reports_a_vanished_partition(fake: FakePartitionClient) -> None:
    """A partition in the checkpoint that the broker no longer has is loss, not a silent skip."""
    with pytest.raises(DataLossError) as info:
        planner().check_retained({"orders": {"0": 0, "7": 3}}, {"orders": {"0": 100}})
    assert_one_line(info.value, "orders/7", "gone")


def test_an_earliest_offset_the_broker_misreports_loses_and_refuses_nothing(fake: FakePartitionClient) -> None:
    """orders/1: ListOffsets(earliest) says 10, but the broker still serves from 0 (tansu did, with two
    producers). A new stream starts at 0, not 10; a stream at 4 is not told offsets 4..9 were deleted.
    A true loss (served from 10) is still refused; a check that finds nothing missing asks no fetch."""
    fake.served_from[("orders", 1)] = 0
    assert planner().resolve("earliest", what="startingOffsets", default=-2)["orders"]["1"] == 0
    planner().check_retained({"orders": {"0": 0, "1": 4, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})
    fake.served_from[("orders", 1)] = 10
    with pytest.raises(DataLossError):
        planner().check_retained({"orders": {"0": 0, "1": 4, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})
    before = fake.verified
    planner().check_retained({"orders": {"0": 0, "1": 10, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})
    assert fake.verified == before


def test_fail_on_data_loss_false_suppresses_the_check(fake: FakePartitionClient) -> None:
    """failOnDataLoss=false: the same lost range is accepted, and planning starts at what is retained."""
    lenient = planner(failOnDataLoss="false")
    start: Offsets = {"orders": {"0": 0, "1": 4, "2": 0}}
    end: Offsets = {"orders": {"0": 100, "1": 50, "2": 0}}
    lenient.check_retained(start, end)
    ranges = {r.partition: r for r in lenient.split(start, end)}
    assert ranges[1] == KafkaRange("orders", 1, 10, 50)  # not 4: offsets 4..9 no longer exist
    with pytest.raises(DataLossError):
        planner().check_retained(start, end)


# ---- planner: split and resolve -----------------------------------------------------------------------


def test_split_covers_each_range_once_in_bounded_chunks(fake: FakePartitionClient) -> None:
    """Ranges tile [start, end) per partition with at most maxRecordsPerPartition offsets each;
    empty partitions produce no task; a partition missing from start begins at its earliest offset."""
    p = planner(maxRecordsPerPartition="30")
    ranges = p.split({"orders": {"0": 5, "2": 0}}, {"orders": {"0": 100, "1": 50, "2": 0}})
    by_partition: dict[int, list[KafkaRange]] = {}
    for r in ranges:
        assert 0 < r.end - r.start <= 30
        by_partition.setdefault(r.partition, []).append(r)
    assert sorted(by_partition) == [0, 1]
    for partition, (lo, hi) in {0: (5, 100), 1: (10, 50)}.items():
        covered = [o for r in by_partition[partition] for o in range(r.start, r.end)]
        assert covered == list(range(lo, hi))


def test_resolve_keywords_and_json_with_sentinels(fake: FakePartitionClient) -> None:
    """-2/-1 in JSON mean earliest/latest; unlisted partitions take the default."""
    p = planner()
    assert p.resolve("earliest", what="startingOffsets", default=-2) == {"orders": {"0": 0, "1": 10, "2": 0}}
    assert p.resolve("latest", what="startingOffsets", default=-2) == {"orders": {"0": 100, "1": 50, "2": 0}}
    assert p.resolve('{"orders": {"0": 42, "1": -1}}', what="endingOffsets", default=-2) == {
        "orders": {"0": 42, "1": 50, "2": 0}
    }
    assert p.resolve('{"orders": {"1": -2}}', what="endingOffsets", default=-1) == {
        "orders": {"0": 100, "1": 10, "2": 0}
    }


def test_planner_never_pickles_its_client(fake: FakePartitionClient) -> None:
    """The planner is shipped to executors with the reader: its socket-holding client must stay behind."""
    import pickle

    p = planner()
    p.partitions_of()
    assert p._client is fake
    assert pickle.loads(pickle.dumps(p))._client is None


# ---- stream reader offsets ---------------------------------------------------------------------------


def test_stream_latest_offset_caps_and_stops_at_the_available_now_target(fake: FakePartitionClient) -> None:
    """availableNow fixes the target when the query starts; later records are left for the next run.
    maxOffsetsPerTrigger caps each batch on the way to it."""
    reader = KafkaStreamReader(KafkaSourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "40"}))
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    start = reader.initialOffset()
    assert start == {"orders": {"0": 0, "1": 10, "2": 0}}
    reader.prepareForTriggerAvailableNow()
    fake.topics["orders"][0] = (0, 160)  # produced after the query started
    offsets = start
    batches = 0
    while True:
        nxt = reader.latestOffset(offsets, reader.getDefaultReadLimit())
        if nxt == offsets:
            break
        assert sum(nxt["orders"][p] - offsets["orders"][p] for p in nxt["orders"]) <= 40
        offsets, batches = nxt, batches + 1
    assert offsets == {"orders": {"0": 100, "1": 50, "2": 0}}  # the target, not 160
    assert batches >= 4  # 140 records, at most 40 per batch
    reader.stop()
    assert fake.closed


def test_the_reported_latest_offsets_are_those_the_batch_was_planned_from(
    fake: FakePartitionClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark asks for the broker's end right after planning a batch (for the progress's lag): the reader
    answers with the end it just read, uncapped, instead of asking the broker again."""
    reader = KafkaStreamReader(KafkaSourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "40"}))
    start = reader.initialOffset()
    asked = []
    real = fake.end_offsets
    monkeypatch.setattr(fake, "end_offsets", lambda topic, parts: asked.append(topic) or real(topic, parts))
    planned = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert 0 < sum(planned["orders"].values()) - sum(start["orders"].values()) <= 40  # capped
    assert reader.reportLatestOffset() == {"orders": {"0": 100, "1": 50, "2": 0}}  # what is there
    assert len(asked) == 1
    fake.topics["orders"][0] = (0, 120)
    assert reader.reportLatestOffset() == {"orders": {"0": 120, "1": 50, "2": 0}}  # asked afresh: once only
    assert len(asked) == 2


def test_stream_latest_offset_fails_on_loss_and_adds_new_partitions(fake: FakePartitionClient) -> None:
    """The stream reader checks retention every batch; a partition that appeared starts at its earliest."""
    reader = KafkaStreamReader(KafkaSourceOptions.parse(BASE))
    assert isinstance(reader.getDefaultReadLimit(), ReadAllAvailable)
    assert reader.latestOffset({"orders": {"0": 0, "1": 10}}, ReadAllAvailable()) == {
        "orders": {"0": 100, "1": 50, "2": 0}
    }
    with pytest.raises(DataLossError) as info:
        reader.latestOffset({"orders": {"0": 120, "1": 10, "2": 0}}, ReadAllAvailable())
    assert_one_line(info.value, "orders/0", "ends at 100", "up to 120")


def test_read_range_yields_the_record_schema(fake: FakePartitionClient) -> None:
    """Executors stream exactly [start, end) in Spark's Kafka column layout."""
    batches = list(kafka_source.read_range(KafkaSourceOptions.parse(BASE), KafkaRange("orders", 1, 12, 15)))
    table = pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
    assert table.column("offset").to_pylist() == [12, 13, 14]
    assert not fake.closed  # kept for the worker's next read


def test_ingest_time_stamps_each_record_with_the_read_and_comes_last(
    fake: FakePartitionClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ingestTime`` adds when the reader took the records, after the strict check's column, in the
    order the source's schema declares."""
    monkeypatch.setattr(kafka_source.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    contract = '{"type":"struct","fields":[]}'
    options = KafkaSourceOptions.parse({**BASE, "ingestTime": "true", "payloadContract": contract})
    assert options.schema.endswith("_strict_error STRING, ingest_time TIMESTAMP")
    (batch,) = kafka_source.read_range(options, KafkaRange("orders", 1, 12, 15))
    assert batch.schema.names[-2:] == ["_strict_error", "ingest_time"]
    assert batch.column("ingest_time").type == pa.timestamp("us", tz="UTC")
    assert batch.column("ingest_time").cast(pa.int64()).to_pylist() == [1_700_000_000_123_456] * 3
    assert KafkaSourceOptions.parse(BASE).schema == kafka_source.SPARK_RECORD_DDL


def test_a_worker_reuses_its_reader_and_closes_one_whose_read_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakePartitionClient] = []

    def make(backend: str, config: dict) -> FakePartitionClient:
        made.append(FakePartitionClient({"orders": {0: (0, 100), 1: (10, 50)}}))
        return made[-1]

    monkeypatch.setattr(kafka_source, "make_client", make)
    monkeypatch.setattr(kafka_source, "_IDLE_READERS", {})
    options = KafkaSourceOptions.parse(BASE)
    for part in (KafkaRange("orders", 0, 0, 10), KafkaRange("orders", 1, 10, 20), KafkaRange("orders", 0, 10, 30)):
        assert sum(b.num_rows for b in kafka_source.read_range(options, part)) == part.end - part.start
    assert len(made) == 1 and not made[0].closed  # one client for every read of the worker
    reading = kafka_source.read_range(options, KafkaRange("orders", 0, 30, 90))
    next(reading)
    reading.close()  # Spark stopped the task (or the read raised) midway: its client goes
    assert made[0].closed
    other = KafkaSourceOptions.parse({**BASE, "kafka.bootstrap.servers": "127.0.0.1:1"})
    list(kafka_source.read_range(options, KafkaRange("orders", 1, 10, 11)))
    list(kafka_source.read_range(other, KafkaRange("orders", 1, 10, 11)))
    assert len(made) == 3  # a new one after the failure, and one per connection


def test_batch_reader_with_nothing_to_read(fake: FakePartitionClient) -> None:
    """An empty range plans no tasks; Spark then sends one InputPartition(None), which reads nothing."""
    reader = KafkaBatchReader(KafkaSourceOptions.parse({**BASE, "startingOffsets": "latest"}))
    assert reader.partitions() == []
    assert list(reader.read(InputPartition(None))) == []
    assert fake.closed  # the driver-side client is closed once planning is done


class FlakyClient(FakePartitionClient):
    """Times out ``failures`` times (a broker restarting), then answers; counts the clients made."""

    made = 0

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__({"orders": {0: (0, 100)}})
        self.failures = failures
        self.error = error

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().end_offsets(topic, partitions)


def flaky(monkeypatch: pytest.MonkeyPatch, failures: int, error: Exception) -> FlakyClient:
    client = FlakyClient(failures, error)

    def make(backend: str, config: dict) -> FlakyClient:
        FlakyClient.made += 1
        return client

    FlakyClient.made = 0
    monkeypatch.setattr(kafka_source, "make_client", make)
    monkeypatch.setattr(kafka_source.time, "sleep", lambda seconds: None)
    return client


def test_a_stream_rides_through_a_broker_restart_with_new_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka.errors import KafkaTimeoutError

    flaky(monkeypatch, 3, KafkaTimeoutError("Failed to get offsets by timestamps in 5000 ms"))
    stream = KafkaStreamReader(KafkaSourceOptions.parse(BASE))
    assert stream.planner.end_offsets() == {"orders": {"0": 100}}
    assert FlakyClient.made == 4  # a fresh connection after each failure


def test_a_bounded_read_and_a_wrong_request_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka.errors import KafkaTimeoutError

    flaky(monkeypatch, 1, KafkaTimeoutError("timed out"))
    with pytest.raises(KafkaTimeoutError):
        planner().end_offsets()  # retry_seconds=0: the batch reader's planner
    flaky(monkeypatch, 1, TopicNotFoundError("Kafka topic 'orders' does not exist"))
    stream = KafkaStreamReader(KafkaSourceOptions.parse(BASE))
    with pytest.raises(TopicNotFoundError):
        stream.planner.end_offsets()
    assert FlakyClient.made == 1


def test_transient_errors_are_told_apart() -> None:
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, UnknownTopicOrPartitionError

    from tidewater.connectors.kafka_source import transient_broker_error
    from tidewater.errors import BrokerUnreachableError

    assert transient_broker_error(KafkaTimeoutError()) and transient_broker_error(KafkaConnectionError())
    assert transient_broker_error(BrokerUnreachableError("no fetch response"))
    assert transient_broker_error(UnknownTopicOrPartitionError())  # retriable in kafka-python (metadata lag)
    assert not transient_broker_error(DataLossError("gone")) and not transient_broker_error(ValueError("x"))


def test_resume_from_latest_also_skips_batch_zero_when_spark_re_runs_it(fake: FakePartitionClient) -> None:
    """A job killed inside batch 0 and resumed (at-most-once): Spark asks initialOffset for batch 0's start
    and re-runs batch 0; neither it nor anything sent while the job was down is read."""
    reader = KafkaStreamReader(KafkaSourceOptions.parse({**BASE, "resumeFrom": "latest"}))
    start = reader.initialOffset()
    batch_zero: Offsets = {"orders": {"0": 40, "1": 20, "2": 0}}  # as the checkpoint's offsets log holds it
    fake.topics["orders"][0] = (0, 160)  # sent while the job was down
    assert reader.partitions(start, batch_zero) == []
    following = reader.latestOffset(batch_zero, ReadAllAvailable())
    assert reader.partitions(batch_zero, following) == []  # 40..159 arrived while down: skipped
    fake.topics["orders"][0] = (0, 170)  # sent after the resume: read
    after = reader.latestOffset(following, ReadAllAvailable())
    assert [(r.partition, r.start, r.end) for r in reader.partitions(following, after)] == [(0, 160, 170)]


def test_a_small_micro_batch_is_one_task_reading_every_range(fake: FakePartitionClient) -> None:
    """At a low rate a task per partition costs more than the records: up to ``minRecordsPerTask``
    records are one Spark task that reads every range in turn; a larger batch keeps a task per range."""
    reader = KafkaStreamReader(KafkaSourceOptions.parse({**BASE, "minRecordsPerTask": "100"}))
    start, end = {"orders": {"0": 0, "1": 10}}, {"orders": {"0": 60, "1": 50}}
    (packed,) = reader.partitions(start, end)
    assert isinstance(packed, KafkaRanges)
    assert [(r.partition, r.start, r.end) for r in packed.ranges] == [(0, 0, 60), (1, 10, 50)]
    table = pa.Table.from_batches(list(reader.read(packed)), schema=RECORD_SCHEMA)
    assert list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True)) == [
        *((0, o) for o in range(0, 60)),
        *((1, o) for o in range(10, 50)),
    ]
    bigger = KafkaStreamReader(KafkaSourceOptions.parse({**BASE, "minRecordsPerTask": "99"}))
    assert all(isinstance(p, KafkaRange) for p in bigger.partitions(start, end))
    assert len(bigger.partitions(start, end)) == 2


def test_a_payload_contract_adds_the_reason_column_to_the_schema_and_every_batch(fake: FakePartitionClient) -> None:
    """``payloadContract``: the source's schema and every batch it reads carry each value's strict-contract reason."""
    from tidewater import strict_json
    from tidewater.connectors.kafka_source import KafkaDataSource

    contract = '{"type":"struct","fields":[{"name":"n","type":"long","nullable":true,"metadata":{}}]}'
    assert strict_json.REASON_COLUMN not in KafkaDataSource(dict(BASE)).schema()
    assert (
        KafkaDataSource({**BASE, "payloadContract": contract}).schema().endswith(f"{strict_json.REASON_COLUMN} STRING")
    )
    options = KafkaSourceOptions.parse({**BASE, "payloadContract": contract})
    (batch,) = kafka_source.read_range(options, KafkaRange("orders", 1, 12, 14))
    reasons = batch.column(strict_json.REASON_COLUMN).to_pylist()
    assert reasons == [strict_json.violation(b"12", contract), strict_json.violation(b"13", contract)]
    assert all(reasons)  # a bare number is not one JSON object


def test_a_contract_that_is_no_spark_schema_is_one_line_before_any_read() -> None:
    """A ``payloadContract`` the check cannot hold payloads to is one line when the source is created (it used
    to quarantine every record as one that "could not be checked")."""
    for contract in ("not json", '{"type":"struct"}', "[1, 2]", '{"type":"struct","fields":[{"type":"long"}]}'):
        with pytest.raises(ConfigError, match=r"^tidewater-kafka option payloadContract is not a Spark schema as JSON"):
            KafkaSourceOptions.parse({**BASE, "payloadContract": contract})
