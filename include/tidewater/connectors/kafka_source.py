"""Spark Python data source ``tidewater-kafka``: Kafka topics as a streaming or batch DataFrame.

Columns match Spark's own Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers). Offsets live in Spark's checkpoint as ``{topic: {partition: offset}}``
(the next offset to read), so a restarted query re-reads exactly the uncommitted range.

Options (all strings, as Spark passes them):
  kafka.bootstrap.servers   required
  kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.username, kafka.sasl.password,
  kafka.ssl.cafile          optional security settings
  subscribe                 comma-separated topics
  startingOffsets           earliest (default) | latest | {"topic": {"0": 42, "1": -2}}  (-2 earliest, -1 latest)
  startingTimestamp         epoch ms: start each partition at the first record at/after it
  endingOffsets             batch only: latest (default) | JSON as above
  maxOffsetsPerTrigger      row cap per micro-batch (ignored by Trigger.AvailableNow's final target)
  failOnDataLoss            true (default): fail when offsets the query needs are gone
  maxRecordsPerPartition    split large offset ranges into Spark partitions of at most this size
  minRecordsPerTask         a micro-batch of at most this many records (default 20000) is read by one
                            Spark task, all its partitions in one assignment (PartitionClient.read_ranges):
                            at a low rate the fixed cost of a task per partition, not the records, was
                            most of the read
  resumeFrom                checkpoint (default) | latest: this run resumes a checkpoint and starts at
                            the topics' latest offsets, skipping (and logging) what it did not read;
                            at-most-once delivery (see tidewater.pipelines.base.Delivery). Set it only
                            when resuming: the caller knows whether the checkpoint has offsets.
  payloadContract           a Spark schema as JSON (``StructType.json()``): each record also gets
                            ``_strict_error``, why its value breaks that strict JSON contract (or null;
                            :mod:`tidewater.strict_json`). The check runs here, in the worker that
                            decodes the records anyway, so the stream's parse needs no Python worker.
  payloadParsed             true (with payloadContract, whose types :func:`tidewater.json_columns.typable`
                            accepts): each record also gets ``_parsed``, its payload typed from the
                            check's own decode, null where Spark's ``from_json`` must parse it
                            (:mod:`tidewater.json_columns`), so the JVM does not parse it again.
  ingestTime                true: each record also gets ``ingest_time`` (TIMESTAMP), when this reader
                            took it from the broker (one value per Arrow batch read). Bronze takes its
                            ingest time from here (:func:`tidewater.transforms.to_bronze`): a
                            ``current_timestamp()`` there is a new literal in every micro-batch, which
                            Spark writes into the code it generates, so every micro-batch compiled its
                            projections again (two Janino compiles of ~20-60 ms each, on the driver, and
                            their classes in the JVM's metaspace until a full collection).
"""

from __future__ import annotations

import json
import logging
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tidewater import json_columns, strict_json
from tidewater.config import Settings
from tidewater.connectors.kafka_client import SPARK_RECORD_DDL, KafkaConnection, KafkaPythonClient, PartitionClient
from tidewater.connectors.kafka_confluent import ConfluentClient
from tidewater.connectors.options import flag, whole_number
from tidewater.errors import BrokerUnreachableError, ConfigError, DataLossError

EARLIEST, LATEST = -2, -1
Offsets = dict[str, dict[str, int]]  # {topic: {partition (str): next offset}}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One Spark task: ``start <= offset < end`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """One Spark task reading several small ranges together (see ``minRecordsPerTask``)."""

    ranges: tuple[KafkaRange, ...]


def pack_small(ranges: Sequence[KafkaRange], min_records: int) -> list[InputPartition]:
    """``ranges`` as Spark tasks: one task for all of them when they hold at most ``min_records``."""
    if len(ranges) > 1 and sum(r.end - r.start for r in ranges) <= min_records:
        return [KafkaRanges(tuple(ranges))]
    return list(ranges)


@dataclass(frozen=True)
class KafkaSourceOptions:
    client_config: dict[str, Any]
    backend: str
    topics: tuple[str, ...]
    starting: str
    starting_timestamp_ms: int | None
    ending: str
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    max_records_per_partition: int
    min_records_per_task: int = 20_000
    resume_from_latest: bool = False
    payload_contract: str | None = None  # StructType.json() of the payload, see payloadContract
    payload_parsed: bool = False  # add _parsed, see payloadParsed
    ingest_time: bool = False  # add ingest_time, see ingestTime

    @classmethod
    def parse(cls, options: Any) -> KafkaSourceOptions:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        connection = KafkaConnection.from_options(opts)
        if not topics:
            raise ConfigError("tidewater-kafka needs option subscribe (comma-separated topic names)")
        timestamp = whole_number(opts, "startingTimestamp", source=SOURCE_NAME, minimum=0)
        max_offsets = whole_number(opts, "maxOffsetsPerTrigger", source=SOURCE_NAME)
        per_partition = whole_number(opts, "maxRecordsPerPartition", source=SOURCE_NAME, default=500_000)
        per_task = whole_number(opts, "minRecordsPerTask", source=SOURCE_NAME, minimum=0, default=20_000)
        contract = opts.get("payloadcontract") or None
        if contract is not None and (problem := strict_json.contract_problem(contract)):
            raise ConfigError(f"tidewater-kafka option payloadContract is {problem}")
        parsed = flag(opts, "payloadParsed")
        if parsed and not (contract and json_columns.typable(contract)):
            raise ConfigError(
                "tidewater-kafka option payloadParsed=true needs a payloadContract whose every type "
                "tidewater.json_columns types (string, long, integer, double, boolean, timestamp, struct)"
            )
        resume = opts.get("resumefrom", "checkpoint").lower()
        if resume not in ("checkpoint", "latest"):
            raise ConfigError(f"tidewater-kafka: resumeFrom={resume!r} must be checkpoint or latest")
        return cls(
            client_config=connection.kafka_python(),
            backend=opts.get("kafka.client", "kafka-python"),
            topics=topics,
            starting=opts.get("startingoffsets", "earliest"),
            starting_timestamp_ms=timestamp,
            ending=opts.get("endingoffsets", "latest"),
            max_offsets_per_trigger=max_offsets,
            fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
            max_records_per_partition=per_partition,
            min_records_per_task=per_task,
            resume_from_latest=resume == "latest",
            payload_contract=contract,
            payload_parsed=parsed,
            ingest_time=opts.get("ingesttime", "false").lower() == "true",
        )

    @property
    def schema(self) -> str:
        """The DataFrame's columns, in the order :func:`read_range` appends them."""
        extra = [f"{strict_json.REASON_COLUMN} STRING"] if self.payload_contract is not None else []
        if self.payload_contract is not None and self.payload_parsed:
            extra.append(f"{json_columns.PARSED_COLUMN} {json_columns.spark_ddl(self.payload_contract)}")
        if self.ingest_time:
            extra.append(f"{INGEST_TIME} TIMESTAMP")
        return ", ".join([SPARK_RECORD_DDL, *extra])


def _parse_offset_spec(spec: str, what: str) -> Offsets | None:
    """None for earliest/latest keywords, else the JSON mapping."""
    if spec in ("earliest", "latest"):
        return None
    try:
        parsed = json.loads(spec)
        return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(f'{what}={spec!r} must be earliest, latest or JSON like {{"topic": {{"0": 42}}}}') from None


log = logging.getLogger(__name__)
SOURCE_NAME = "tidewater-kafka"
T = TypeVar("T")

# A broker that restarts (kill -9, a rolling upgrade) is unreachable for a few seconds. A stream's
# offset and metadata requests retry with a fresh client for this long before the query fails (a
# bounded read fails at once: a person is waiting for it).
BROKER_RETRY_SECONDS = 60.0


def transient_broker_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the broker was unreachable or slow, not that the request was wrong."""
    from kafka.errors import KafkaError

    # kafka-python marks timeouts, lost connections and stale metadata as retriable.
    return isinstance(exc, BrokerUnreachableError) or (isinstance(exc, KafkaError) and bool(exc.retriable))


class _KafkaPlanner:
    """Driver-side offset arithmetic shared by the batch and the stream reader."""

    def __init__(self, options: KafkaSourceOptions, *, retry_seconds: float = 0.0) -> None:
        self.options = options
        self.retry_seconds = retry_seconds
        self._client: PartitionClient | None = None

    # The client holds sockets: never pickle it to executors.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def client(self) -> PartitionClient:
        if self._client is None:
            self._client = make_client(self.options.backend, self.options.client_config)
        return self._client

    def partitions_of(self) -> dict[str, list[int]]:
        return {topic: self.client.partitions(topic) for topic in self.options.topics}

    def end_offsets(self) -> Offsets:
        return self._retrying(
            "end offsets",
            lambda: {
                topic: {str(p): o for p, o in self.client.end_offsets(topic, parts).items()}
                for topic, parts in self.partitions_of().items()
            },
        )

    def earliest_offsets(self, *, verified: bool = False) -> Offsets:
        """The broker's first retained offset per partition; ``verified``: confirmed by a fetch
        (:meth:`KafkaPythonClient.first_readable`), where a wrong answer would skip or refuse records."""

        def ask() -> Offsets:
            out: Offsets = {}
            for topic, parts in self.partitions_of().items():
                first = self.client.earliest_offsets(topic, parts)
                if verified:
                    first = {p: self.client.first_readable(topic, p, o) for p, o in first.items()}
                out[topic] = {str(p): o for p, o in first.items()}
            return out

        return self._retrying("earliest offsets", ask)

    def _retrying(self, what: str, request: Callable[[], T]) -> T:
        """``request()``, retried with a fresh client while the broker is unreachable (up to
        ``retry_seconds``); other errors (a missing topic, lost offsets) fail at once."""
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.5
        while True:
            try:
                return request()
            except Exception as exc:
                if not transient_broker_error(exc) or time.monotonic() + delay > deadline:
                    raise
                log.warning("Kafka %s: %s; retrying in %.1f s with a new connection", what, exc, delay)
                self.close()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception as exc:  # a client whose broker died may fail to close; it is dropped anyway
                log.debug("closing the Kafka client: %s", exc)
            self._client = None

    def resolve(self, spec: str, *, what: str, default: int) -> Offsets:
        """Turn earliest/latest/JSON (with -2/-1 per partition) into concrete offsets."""
        explicit = _parse_offset_spec(spec, what)
        earliest = self.earliest_offsets(verified=True)
        latest = self.end_offsets()
        if explicit is None:
            return latest if spec == "latest" else earliest
        out: Offsets = {}
        for topic, parts in latest.items():
            chosen = explicit.get(topic, {})
            out[topic] = {}
            for p in parts:
                value = chosen.get(p, default)
                if value == EARLIEST:
                    value = earliest[topic][p]
                elif value == LATEST:
                    value = latest[topic][p]
                out[topic][p] = value
        return out

    def starting_offsets(self) -> Offsets:
        if self.options.starting_timestamp_ms is not None:
            ts = self.options.starting_timestamp_ms
            return {
                topic: {str(p): self.client.offset_for_timestamp(topic, p, ts) for p in parts}
                for topic, parts in self.partitions_of().items()
            }
        return self.resolve(self.options.starting, what="startingOffsets", default=EARLIEST)

    def check_retained(self, start: Offsets, end: Offsets) -> None:
        """Fail loudly when the range the query needs is no longer (or not yet) on the broker."""
        if not self.options.fail_on_data_loss:
            return
        earliest = self.earliest_offsets()
        if any(o < earliest.get(t, {}).get(p, o) for t, parts in start.items() for p, o in parts.items()):
            earliest = self.earliest_offsets(verified=True)  # before calling records lost: a fetch decides
        for topic, parts in start.items():
            for p, offset in parts.items():
                first = earliest.get(topic, {}).get(p)
                if first is None:
                    raise DataLossError(
                        f"partition {topic}/{p} the query read before is gone (topic deleted or shrunk); "
                        "restart from a new checkpoint deliberately if you accept the loss"
                    )
                if offset < first:
                    raise DataLossError(
                        f"offsets {offset}..{first - 1} of {topic}/{p} were deleted by retention before the "
                        "query read them; set failOnDataLoss=false only if you accept losing them"
                    )
                last = end.get(topic, {}).get(p, offset)
                if last < offset:
                    raise DataLossError(
                        f"{topic}/{p} ends at {last} but the query already read up to {offset}: the topic "
                        "was recreated or truncated; start a new checkpoint deliberately"
                    )

    def split(self, start: Offsets, end: Offsets) -> list[KafkaRange]:
        ranges: list[KafkaRange] = []
        step = self.options.max_records_per_partition
        # failOnDataLoss=false: skip offsets retention already deleted (reading them fails on the broker).
        retained = None if self.options.fail_on_data_loss else self.earliest_offsets()
        for topic, parts in end.items():
            for p, stop in parts.items():
                begin = start.get(topic, {}).get(p)
                if begin is None:  # a partition that appeared since the last batch
                    begin = self.earliest_offsets()[topic][p]
                if retained is not None:
                    begin = max(begin, retained.get(topic, {}).get(p, begin))
                for lo in range(begin, stop, step):
                    ranges.append(KafkaRange(topic, int(p), lo, min(stop, lo + step)))
        return ranges


def make_client(backend: str, config: dict[str, Any]) -> PartitionClient:
    """The client for a backend name from ``Settings.kafka_client``."""
    if backend == "confluent":
        return ConfluentClient(config)
    return KafkaPythonClient(config)


# Executor side: clients idle between reads, per connection. A reused Spark Python worker reads one
# range after another (each micro-batch, each partition); a client made per read cost a connection and
# a librdkafka instance each time. A read that fails closes its client instead of returning it.
_IDLE_READERS: dict[tuple[str, str], PartitionClient] = {}


INGEST_TIME = "ingest_time"
_INGEST_TIME_TYPE = pa.timestamp("us", tz="UTC")


def stamped(records: pa.RecordBatch, now_us: int) -> pa.RecordBatch:
    """Records with the ``ingestTime`` column: ``now_us`` (unix microseconds) in every row. Built from a
    buffer: pyarrow's scalar and array constructors import pandas, ~27 MiB of a worker's memory."""
    values = pa.py_buffer(array("q", [now_us]) * records.num_rows)
    column = pa.Array.from_buffers(_INGEST_TIME_TYPE, records.num_rows, [None, values])
    return records.append_column(INGEST_TIME, column)


def checked(records: pa.RecordBatch, contract: str, *, parsed: bool = False) -> pa.RecordBatch:
    """Records with the ``payloadContract`` column: why each value breaks ``contract``, or null; and
    with ``parsed`` the ``payloadParsed`` one, each value typed from the check's own decode."""
    if not parsed:
        return records.append_column(strict_json.REASON_COLUMN, strict_json.reasons(records.column("value"), contract))
    reasons, typed = json_columns.reasons_and_parsed(records.column("value"), contract)
    return records.append_column(strict_json.REASON_COLUMN, reasons).append_column(json_columns.PARSED_COLUMN, typed)


def read_range(options: KafkaSourceOptions, part: KafkaRange | KafkaRanges) -> Iterator[pa.RecordBatch]:
    """Executor side: stream one offset range, or a task's several small ones, as Arrow batches."""
    key = (options.backend, json.dumps(options.client_config, sort_keys=True, default=str))
    client = _IDLE_READERS.pop(key, None) or make_client(options.backend, options.client_config)
    ranges = part.ranges if isinstance(part, KafkaRanges) else (part,)
    finished = False
    try:
        for batch in client.read_ranges([(r.topic, r.partition, r.start, r.end) for r in ranges]):
            if options.payload_contract is not None:
                batch = checked(batch, options.payload_contract, parsed=options.payload_parsed)
            yield batch if not options.ingest_time else stamped(batch, time.time_ns() // 1000)
        finished = True
    finally:
        if finished and key not in _IDLE_READERS:
            _IDLE_READERS[key] = client
        else:
            client.close()


def cap_offsets(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Limit a batch to ``max_rows`` records, shared across partitions in proportion to their lag."""
    lags = {
        (t, p): max(0, stop - start.get(t, {}).get(p, stop)) for t, parts in end.items() for p, stop in parts.items()
    }
    total = sum(lags.values())
    if total <= max_rows:
        return end
    capped: Offsets = {t: dict(parts) for t, parts in end.items()}
    for (t, p), lag in lags.items():
        begin = start.get(t, {}).get(p, end[t][p])
        share = (lag * max_rows) // total
        if lag and share == 0:
            share = 1  # every lagging partition moves, so none starves
        capped[t][p] = begin + min(lag, share)
    return capped


def floor_offsets(start: Offsets, floor: Offsets) -> tuple[Offsets, dict[str, int]]:
    """(``start`` raised to ``floor`` per partition, records skipped per "topic/partition")."""
    raised: Offsets = {}
    skipped: dict[str, int] = {}
    for topic, parts in start.items():
        raised[topic] = {}
        for p, offset in parts.items():
            lowest = floor.get(topic, {}).get(p, offset)
            raised[topic][p] = max(offset, lowest)
            if lowest > offset:
                skipped[f"{topic}/{p}"] = lowest - offset
    return raised, skipped


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader. With ``resumeFrom=latest`` (at-most-once, given only to a run that resumes
    a checkpoint) every batch it plans starts no earlier than the offsets that were latest when it
    first planned, including the batch Spark re-runs after a crash. Whether :meth:`initialOffset` was
    called says nothing here: Spark also asks it for the start of batch 0 when it re-runs batch 0."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self.planner = _KafkaPlanner(options, retry_seconds=BROKER_RETRY_SECONDS)
        self._target: Offsets | None = None
        self._floor: Offsets | None = None  # resumeFrom=latest: where this run's reading begins
        # The broker's end offsets that latestOffset just read: Spark asks for them again at once
        # (reportLatestOffset, for the progress's lag), which would cost two more broker requests.
        self._available: Offsets | None = None

    def initialOffset(self) -> dict:
        return self.planner.starting_offsets()

    def _resume_floor(self) -> Offsets | None:
        if not self.options.resume_from_latest:
            return None
        if self._floor is None:
            self._floor = self.planner.end_offsets()
        return self._floor

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.end_offsets()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._resume_floor()  # fixed before the end offsets below, so the floor never passes a batch's end
        latest = self.planner.end_offsets()
        self._available = {topic: dict(parts) for topic, parts in latest.items()}
        # Partitions that appeared since the last batch start at their earliest offset.
        earliest = None
        for topic, parts in latest.items():
            for p in parts:
                if p not in start.get(topic, {}):
                    earliest = earliest or self.planner.earliest_offsets()
                    start.setdefault(topic, {})[p] = earliest[topic][p]
        self.planner.check_retained(start, latest)
        if self._target is not None:
            latest = {
                t: {p: min(o, self._target.get(t, {}).get(p, start[t][p])) for p, o in parts.items()}
                for t, parts in latest.items()
            }
            latest = {t: {p: max(o, start[t][p]) for p, o in parts.items()} for t, parts in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = cap_offsets(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict | None:
        available, self._available = self._available, None
        return available if available is not None else self.planner.end_offsets()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        floor = self._resume_floor()
        if floor is not None:
            start, skipped = floor_offsets(start, floor)
            start = {t: {p: min(o, end.get(t, {}).get(p, o)) for p, o in parts.items()} for t, parts in start.items()}
            if skipped:
                total = sum(skipped.values())
                log.warning(
                    "resumeFrom=latest: %d record(s) skipped, never to be processed (at-most-once): %s",
                    total,
                    ", ".join(f"{tp}: {n}" for tp, n in sorted(skipped.items())),
                )
        return pack_small(self.planner.split(start, end), self.options.min_records_per_task)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange | KafkaRanges)
        return read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Offsets are tracked in Spark's checkpoint; nothing to commit on the broker."""

    def stop(self) -> None:
        self.planner.close()


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        planner = _KafkaPlanner(options)
        try:
            self._start = planner.starting_offsets()
            self._end = planner.resolve(options.ending, what="endingOffsets", default=LATEST)
            planner.check_retained(self._start, self._end)
            self._ranges = planner.split(self._start, self._end)
        finally:
            planner.close()

    def partitions(self) -> Sequence[InputPartition]:
        return self._ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaRange):  # Spark plans one InputPartition(None) for an empty range
            return iter(())
        return read_range(self.options, partition)


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return KafkaSourceOptions.parse(self.options).schema

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(KafkaSourceOptions.parse(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(KafkaSourceOptions.parse(self.options))


def source_options(settings: Settings, topic: str) -> dict[str, str]:
    """Source options for ``topic`` from the platform settings (the connection: :class:`KafkaConnection`)."""
    return {
        **KafkaConnection.of(settings).options(),
        "kafka.client": settings.kafka_client,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(settings.max_offsets_per_trigger),
        "ingestTime": "true",  # bronze's ingest_time, see ingestTime
    }
