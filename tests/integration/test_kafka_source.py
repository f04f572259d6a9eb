"""The ``tidewater-kafka`` Spark source against the real embedded broker (tansu) and real Spark.

Records are produced with kafka-python (explicit partition, key, headers and timestamp_ms) and the
offsets each one got are taken from the broker's produce acknowledgements, so every expectation is
"what the broker stored", not "what the source's own code computes". One topic per test.
"""

from __future__ import annotations

import datetime as dt
import math
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater.broker import EmbeddedBroker, free_port
from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaPythonClient
from tidewater.errors import one_line
from tidewater.streaming.retention import RetentionWatch

T0 = 1_700_000_000_000  # record timestamps: T0 + index * 1000 + partition (ms), growing with offsets
FORMAT = "tidewater-kafka"
SPARK_COLUMNS = [
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
    ("headers", "array<struct<key:string,value:binary>>"),
]


@dataclass(frozen=True)
class Sent:
    """One produced record and the offset the broker acknowledged for it."""

    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


def produce(servers: str, topic: str, counts: dict[int, int], *, flushes: int = 3, first_index: int = 0) -> list[Sent]:
    """Send ``counts[p]`` records to each partition in ``flushes`` rounds (so the broker stores
    several batches per partition) and return them with their acknowledged offsets."""
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
    pending: list[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...], int, Any]] = []
    try:
        for round_ in range(flushes):
            for p, n in counts.items():
                for i in range(first_index + n * round_ // flushes, first_index + n * (round_ + 1) // flushes):
                    key = f"k{p}-{i}".encode()
                    value = f"v{p}-{i}".encode() + bytes([0, 255, i % 256])  # not UTF-8: binary round trip
                    headers = () if i % 5 == 0 else (("src", b"test"), ("i", str(i).encode()))
                    ts = T0 + i * 1000 + p
                    future = producer.send(
                        topic, key=key, value=value, headers=list(headers), timestamp_ms=ts, partition=p
                    )
                    pending.append((p, key, value, headers, ts, future))
            producer.flush()
    finally:
        producer.close()
    return [Sent(p, f.get(timeout=10).offset, k, v, h, ts) for p, k, v, h, ts, f in pending]


def source(spark: SparkSession, servers: str, topic: str, **options: str) -> DataFrame:
    reader = spark.read.format(FORMAT).option("kafka.bootstrap.servers", servers).option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def positions(df: DataFrame) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]


def expected_positions(sent: list[Sent], keep: Callable[[Sent], bool] = lambda s: True) -> set[tuple[int, int]]:
    return {(s.partition, s.offset) for s in sent if keep(s)}


def assert_exactly_once(got: list[tuple[int, int]], expected: set[tuple[int, int]]) -> None:
    dupes = [pos for pos, n in Counter(got).items() if n > 1]
    assert not dupes, f"read more than once: {dupes[:5]}"
    assert set(got) == expected, (
        f"missing {sorted(expected - set(got))[:5]}, unexpected {sorted(set(got) - expected)[:5]}"
    )


def stream(spark: SparkSession, servers: str, topic: str, **options: str) -> DataFrame:
    reader = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", servers).option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


# ---- client ------------------------------------------------------------------------------------------


def test_end_offsets_are_the_true_end_not_list_offsets(broker: EmbeddedBroker, make_topic: Callable[..., str]) -> None:
    """The fetch-probe end offsets equal the records per partition after several stored batches,
    where the broker's ListOffsets(latest) answers the last batch's base offset + 1."""
    topic = make_topic(3)
    counts = {0: 40, 1: 61, 2: 9}
    sent = produce(broker.bootstrap_servers, topic, counts, flushes=4)
    truth = {p: max(s.offset for s in sent if s.partition == p) + 1 for p in counts}
    assert truth == counts  # the acknowledged offsets are 0..n-1 in every partition

    client = KafkaPythonClient({"bootstrap_servers": [broker.bootstrap_servers], "request_timeout_ms": 5000})
    try:
        assert client.end_offsets(topic, [0, 1, 2]) == truth
        assert client.earliest_offsets(topic, [0, 1, 2]) == {0: 0, 1: 0, 2: 0}
        # A ListOffsets(earliest) answer above what the broker serves is corrected by a fetch from 0.
        assert client.first_readable(topic, 1, 7) == 0 and client.first_readable(topic, 1, 0) == 0
        assert client.partitions(topic) == [0, 1, 2]
    finally:
        client.close()

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        listed = {tp.partition: o for tp, o in consumer.end_offsets([TopicPartition(topic, p) for p in counts]).items()}
    finally:
        consumer.close()
    assert all(listed[p] <= truth[p] for p in counts), (listed, truth)
    if listed == truth:  # informative only: the probe is right either way
        warnings.warn(
            f"the broker's ListOffsets(latest) is now right ({listed}): the fetch probe may be unnecessary",
            stacklevel=1,
        )


def test_the_retention_watch_reports_what_the_broker_holds(
    kafka_settings: Settings, broker: EmbeddedBroker, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's look at the first retained offsets, from its own thread. The embedded broker cannot
    delete records (no DeleteRecords, no retention), so every partition holds from 0 here; the verdicts
    of a partition whose unread records retention is about to delete are tests/unit/test_retention_lag.py's."""
    topic = make_topic(2)
    produce(broker.bootstrap_servers, topic, {0: 5, 1: 3}, flushes=1)
    watch = RetentionWatch(kafka_settings, [topic], every_s=0.2).start()
    try:
        deadline = time.monotonic() + 30
        while watch.snapshot()[1] is None:
            assert time.monotonic() < deadline, "no look at the broker within 30 s"
            time.sleep(0.1)
        first, looked_at = watch.snapshot()
        assert first == {f"{topic}/0": 0, f"{topic}/1": 0} and looked_at is not None and looked_at <= time.time()
    finally:
        began = time.monotonic()
        watch.stop()
        assert time.monotonic() - began < 5

    # A broker that does not answer costs a warning per look, not the caller's thread.
    unreachable = kafka_settings.replace(
        kafka_bootstrap_servers=f"127.0.0.1:{free_port()}", kafka_request_timeout_ms=500
    )

    def warned() -> bool:
        return any("retention watch: could not ask the broker" in r.getMessage() for r in caplog.records)

    with caplog.at_level("WARNING", logger="tidewater.streaming.retention"):
        lonely = RetentionWatch(unreachable, [topic], every_s=0.2).start()
        deadline = time.monotonic() + 20
        while not warned():
            assert time.monotonic() < deadline, "no warning within 20 s"
            time.sleep(0.2)
        assert lonely.snapshot() == ({}, None)
        lonely.stop()
    assert any("retention watch: could not ask the broker" in r.getMessage() for r in caplog.records)


# ---- batch -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["kafka-python", "confluent"])
def test_batch_read_every_record_once_with_all_columns(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str], backend: str
) -> None:
    """A batch read returns each stored (partition, offset) exactly once, in Spark's Kafka columns,
    with key, value, timestamp, timestampType and headers as produced; ranges larger than
    maxRecordsPerPartition are split into several Spark tasks without gaps or overlaps."""
    topic = make_topic(4)
    sent = produce(broker.bootstrap_servers, topic, {0: 900, 1: 500, 2: 400, 3: 200})
    df = source(  # partition 0 -> 2 tasks
        spark, broker.bootstrap_servers, topic, maxRecordsPerPartition="500", **{"kafka.client": backend}
    )
    assert [(f.name, f.dataType.simpleString()) for f in df.schema] == SPARK_COLUMNS

    rows = df.select(
        "partition",
        "offset",
        "key",
        "value",
        "topic",
        F.unix_millis("timestamp").alias("ts"),
        "timestampType",
        "headers",
    ).collect()
    assert_exactly_once([(r.partition, r.offset) for r in rows], expected_positions(sent))
    by_position = {(s.partition, s.offset): s for s in sent}
    for r in rows:
        s = by_position[(r.partition, r.offset)]
        assert (bytes(r.key), bytes(r.value), r.topic, r.ts, r.timestampType) == (
            s.key,
            s.value,
            topic,
            s.timestamp_ms,
            0,  # CreateTime
        )
        assert tuple((h.key, bytes(h.value)) for h in r.headers) == s.headers


def test_batch_starting_and_ending_offsets_select_exactly_the_range(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str]
) -> None:
    """startingOffsets/endingOffsets JSON (explicit offsets, -2 earliest, -1 latest) select exactly
    [start, end) per partition; keywords earliest/latest work as whole-topic bounds."""
    topic = make_topic(3)
    sent = produce(broker.bootstrap_servers, topic, {0: 50, 1: 50, 2: 50}, flushes=2)
    servers = broker.bootstrap_servers

    got = positions(
        source(
            spark,
            servers,
            topic,
            startingOffsets=f'{{"{topic}": {{"0": 5, "1": -2, "2": 30}}}}',
            endingOffsets=f'{{"{topic}": {{"0": 20, "1": -1, "2": 30}}}}',
        )
    )
    assert_exactly_once(got, {(0, o) for o in range(5, 20)} | {(1, o) for o in range(50)})

    got = positions(
        source(spark, servers, topic, startingOffsets="earliest", endingOffsets=f'{{"{topic}": {{"1": 7, "2": -2}}}}')
    )
    # unlisted partition 0 ends at latest; partition 2 ends at earliest (nothing)
    assert_exactly_once(got, expected_positions(sent, lambda s: s.partition == 0) | {(1, o) for o in range(7)})

    assert positions(source(spark, servers, topic, startingOffsets="latest")) == []


def test_batch_starting_timestamp(spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str]) -> None:
    """startingTimestamp starts each partition at its first record with timestamp >= the value:
    exactly the records at/after it, and none for a partition whose records are all older."""
    topic = make_topic(3)
    sent = produce(broker.bootstrap_servers, topic, {0: 30, 1: 40, 2: 60}, flushes=3)
    middle = T0 + 35_000 + 1  # partition 0 (ts up to T0+29_000) has nothing at/after it
    got = positions(source(spark, broker.bootstrap_servers, topic, startingTimestamp=str(middle)))
    expected = expected_positions(sent, lambda s: s.timestamp_ms >= middle)
    assert {p for p, _ in expected} == {1, 2}
    assert_exactly_once(got, expected)


# ---- stream ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["kafka-python", "confluent"])
def test_available_now_caps_batches_fixes_its_target_and_resumes(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str], tmp_path: Path, backend: str
) -> None:
    """Trigger.AvailableNow with maxOffsetsPerTrigger: every record exactly once, batches of at most
    the cap (so at least ceil(N / cap) of them), records produced after the query started are left
    out; a second run on the same checkpoint reads exactly those, without duplicates."""
    topic = make_topic(4)
    servers = broker.bootstrap_servers
    cap, per_partition, late_per_partition = 1000, 1000, 100
    sent = produce(servers, topic, dict.fromkeys(range(4), per_partition))
    late: list[Sent] = []
    checkpoint = str(tmp_path / "checkpoint")

    def run(on_batch: Callable[[int], None] | None = None) -> list[list[tuple[int, int]]]:
        batches: list[list[tuple[int, int]]] = []

        def collect(df: DataFrame, batch_id: int) -> None:
            batches.append(positions(df))
            if on_batch is not None:
                on_batch(batch_id)

        query = (
            stream(spark, servers, topic, maxOffsetsPerTrigger=str(cap), **{"kafka.client": backend})
            .writeStream.foreachBatch(collect)
            .trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        assert query.awaitTermination(120), "availableNow query did not finish in 120 s"
        assert query.exception() is None
        return batches

    def produce_late(batch_id: int) -> None:
        if batch_id == 0:
            late.extend(produce(servers, topic, dict.fromkeys(range(4), late_per_partition), first_index=per_partition))

    first = run(produce_late)
    assert len(late) == 4 * late_per_partition
    assert all(len(b) <= cap for b in first), [len(b) for b in first]
    assert len(first) >= math.ceil(len(sent) / cap)
    assert_exactly_once([pos for b in first for pos in b], expected_positions(sent))

    second = run()
    assert_exactly_once([pos for b in second for pos in b], expected_positions(late))


def test_ingest_time_is_data_so_a_stream_compiles_its_bronze_code_once(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """With ``ingestTime`` each record carries when the reader took it, and bronze's projection takes
    it from there: micro-batches after the first compile no new code (Spark's codegen metrics). The
    same stream without it (``current_timestamp()``, a new literal each batch) compiles every batch,
    which shows the count can see it."""
    from tidewater import transforms

    topic = make_topic(2)
    sent = produce(broker.bootstrap_servers, topic, dict.fromkeys(range(2), 300))
    compilation = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def run(name: str, **options: str) -> tuple[list[int], list[Any]]:
        compiles: list[int] = []
        stamps: list[Any] = []

        def write(df: DataFrame, batch_id: int) -> None:
            before = compilation.getCount()
            bronze = transforms.to_bronze(df).persist()
            try:
                rows = bronze.toArrow()
                bronze.where("ingest_date IS NOT NULL").count()  # a second job over the cached rows
            finally:
                bronze.unpersist()
            compiles.append(compilation.getCount() - before)
            stamps.extend(rows.column("ingest_time").to_pylist())

        query = (
            stream(spark, broker.bootstrap_servers, topic, maxOffsetsPerTrigger="100", **options)
            .writeStream.foreachBatch(write)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
        assert query.awaitTermination(120), f"{name}: availableNow query did not finish in 120 s"
        assert query.exception() is None
        return compiles, stamps

    started = dt.datetime.now(dt.UTC)
    stamped, stamps = run("stamped", ingestTime="true")
    assert len(stamped) >= 5 and sum(stamped[1:]) == 0, stamped
    assert len(stamps) == len(sent)
    assert all(started <= stamp <= dt.datetime.now(dt.UTC) for stamp in stamps)

    literal, _ = run("literal")
    assert all(count > 0 for count in literal[1:]), literal


def test_stream_starting_latest_reads_only_new_records(
    spark: SparkSession, broker: EmbeddedBroker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """startingOffsets=latest: records already in the topic are skipped, records produced after the
    query started are read exactly once."""
    topic = make_topic(2)
    servers = broker.bootstrap_servers
    produce(servers, topic, {0: 100, 1: 100}, flushes=1)
    got: list[tuple[int, int]] = []
    query = (
        stream(spark, servers, topic, startingOffsets="latest")
        .writeStream.foreachBatch(lambda df, _batch_id: got.extend(positions(df)))
        .trigger(processingTime="500 milliseconds")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while query.lastProgress is None:  # the first (empty) batch fixes the starting offsets
            assert time.monotonic() < deadline, "the query made no progress in 60 s"
            assert query.exception() is None
            time.sleep(0.2)
        new = produce(servers, topic, {0: 30, 1: 20}, flushes=2, first_index=100)
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(got, expected_positions(new))


# ---- errors ------------------------------------------------------------------------------------------


def test_missing_topic_is_one_line_on_the_driver(spark: SparkSession, broker: EmbeddedBroker) -> None:
    """A topic that does not exist fails the read with TopicNotFoundError, reported in one line."""
    with pytest.raises(Exception) as info:
        source(spark, broker.bootstrap_servers, "no-such-topic-7f3a").collect()
    assert "TopicNotFoundError" in str(info.value)
    line = one_line(info.value)
    assert "\n" not in line
    assert line.startswith("TopicNotFoundError:"), line
    assert "no-such-topic-7f3a" in line


def test_unreachable_broker_is_one_line_on_the_driver(spark: SparkSession) -> None:
    """No broker at the address: BrokerUnreachableError in one line, within the request timeout."""
    servers = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        source(spark, servers, "anything", **{"kafka.request.timeout.ms": "3000"}).collect()
    line = one_line(info.value)
    assert "\n" not in line
    assert line.startswith("BrokerUnreachableError:"), line
    assert servers in line
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("backend", ["kafka-python", "confluent"])
def test_one_read_of_several_ranges_returns_exactly_them(
    broker: EmbeddedBroker, make_topic: Callable[..., str], backend: str
) -> None:
    """A small micro-batch's task reads all its ranges at once (librdkafka: one assignment); ranges of a
    partition that repeats, out of order, and a reader reused after a read all return exactly their records."""
    from tidewater.connectors.kafka_source import make_client

    topic = make_topic(3)
    sent = produce(broker.bootstrap_servers, topic, {0: 40, 1: 25, 2: 10})
    client = make_client(backend, {"bootstrap_servers": [broker.bootstrap_servers]})
    try:
        for ranges in (
            [(topic, 0, 0, 10), (topic, 1, 5, 25), (topic, 2, 0, 10)],
            [(topic, 0, 30, 40), (topic, 0, 0, 5), (topic, 1, 0, 3), (topic, 0, 5, 12)],  # repeats, rewinds
        ):
            rows = [row for batch in client.read_ranges(ranges) for row in batch.to_pylist()]
            want = sorted((p, o) for _, p, start, end in ranges for o in range(start, end))
            assert sorted((r["partition"], r["offset"]) for r in rows) == want
            values = {(s.partition, s.offset): s.value for s in sent}
            assert all(r["value"] == values[(r["partition"], r["offset"])] for r in rows)
            if backend == "confluent":
                # a reader kept for the next task holds no partition: librdkafka would go on fetching for it
                assert client._rd_consumer.assignment() == []
    finally:
        client.close()
