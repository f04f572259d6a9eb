"""A tiny Kafka client interface for the Spark source, with a kafka-python backend.

The Spark source needs five things from Kafka: the partitions of a topic, the earliest retained
offset, the true end offset, an offset for an event timestamp, and the records of one partition
between two offsets. Keeping them behind :class:`PartitionClient` lets a librdkafka backend sit
beside this one.

Why not ``KafkaConsumer.end_offsets``: the embedded broker answers ListOffsets(latest) with the
base offset of the last stored batch + 1, not the end. The high watermark in a *fetch* response is
right on every broker, so end offsets come from a fetch probe of all the topic's partitions at
once, polled until each has answered (the embedded broker may answer a multi-partition fetch
with some partitions only, and a fetch with ``max_wait_ms=0`` with nothing: hence the loop and a
1 ms wait). One probe per partition in turn cost ~100 ms for 4 partitions on a topic the embedded
broker had taken 60k records into, the probe of all ~30 ms (``latestOffset`` runs every trigger).

Where Kafka is and how to talk to it (servers, security protocol, SASL, CA file, request timeout)
is :class:`KafkaConnection`, the one translation of the settings into each client's spelling:
kafka-python's keywords (the generator's producer and admin client, the offset probe), the Spark
source's options (strings that travel to the executors) and, from the kafka-python dict,
librdkafka's properties (:func:`librdkafka_connection`). A new connection setting is added there
once and reaches every client.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from tidewater.config import Settings
from tidewater.connectors.options import option, whole_number
from tidewater.errors import BrokerUnreachableError, ConfigError, DataLossError, TopicNotFoundError

# Arrow layout of a Kafka record, matching Spark's Kafka source columns.
HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
RECORD_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(HEADER_TYPE)),
    ]
)
SPARK_RECORD_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


@dataclass(frozen=True)
class KafkaConnection:
    """Where Kafka is and how to talk to it.

    Each field ``x`` is the setting ``kafka_x`` (``TIDEWATER_KAFKA_X``) and the Spark source option
    ``kafka.x`` with dots for underscores (``kafka.bootstrap.servers``, ``kafka.sasl.username``), so the
    two spellings cannot drift from the fields.
    """

    bootstrap_servers: str  # host:port[,host:port]
    security_protocol: str = "PLAINTEXT"
    request_timeout_ms: int = 15000
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""
    ssl_cafile: str = ""

    @classmethod
    def of(cls, settings: Settings) -> KafkaConnection:
        """The settings' connection; no servers is one line (every client needs them)."""
        connection = cls(**{f.name: getattr(settings, f"kafka_{f.name}") for f in dataclasses.fields(cls)})
        if not connection.servers:
            raise ConfigError(
                "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS is empty: start the platform (./tw run) for the embedded "
                "broker or point it at a Kafka cluster"
            )
        return connection

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaConnection:
        """The connection a Spark source was given (option keys lower-cased, as Spark may pass them)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = _option(f.name)
            numeric = f.type in ("int", int)
            value = whole_number(options, name, source="tidewater-kafka") if numeric else option(options, name)
            if value:
                values[f.name] = value
        connection = cls(**{"bootstrap_servers": "", **values})
        if not connection.servers:
            raise ConfigError("tidewater-kafka needs option kafka.bootstrap.servers (host:port[,host:port])")
        return connection

    @property
    def servers(self) -> list[str]:
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    def options(self) -> dict[str, str]:
        """As Spark source options (strings); empty optional settings are left out."""
        return {_option(f.name): str(getattr(self, f.name)) for f in dataclasses.fields(self) if getattr(self, f.name)}

    def kafka_python(self) -> dict[str, Any]:
        """In kafka-python's keywords (KafkaConsumer, KafkaProducer, KafkaAdminClient)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.servers,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            # Fail as fast as a request would when no broker answers, not after kafka-python's 30 s.
            "bootstrap_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism:
            config["sasl_mechanism"] = self.sasl_mechanism
            config["sasl_plain_username"] = self.sasl_username
            config["sasl_plain_password"] = self.sasl_password
        if self.ssl_cafile:
            config["ssl_cafile"] = self.ssl_cafile
        return config


def _option(name: str) -> str:
    return "kafka." + name.replace("_", ".")


def kafka_python_config(settings: Settings) -> dict[str, Any]:
    """The settings' Kafka connection in kafka-python's keywords (see :class:`KafkaConnection`)."""
    return KafkaConnection.of(settings).kafka_python()


def librdkafka_connection(config: Mapping[str, Any]) -> dict[str, Any]:
    """A kafka-python connection dict (:meth:`KafkaConnection.kafka_python`) in librdkafka's properties:
    derived from that one dict, so confluent-kafka connects exactly as kafka-python does."""
    out: dict[str, Any] = {
        "bootstrap.servers": ",".join(config["bootstrap_servers"]),
        "security.protocol": config.get("security_protocol", "PLAINTEXT").lower(),
        "socket.timeout.ms": config.get("request_timeout_ms", 15000),
    }
    if config.get("sasl_mechanism"):
        out["sasl.mechanism"] = config["sasl_mechanism"]
        out["sasl.username"] = config.get("sasl_plain_username", "")
        out["sasl.password"] = config.get("sasl_plain_password", "")
    if config.get("ssl_cafile"):
        out["ssl.ca.location"] = config["ssl_cafile"]
    return out


def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """The partitions of ``topic``: broker reachable and topic present (one-line errors otherwise),
    checked before Spark plans a read of it."""
    client = KafkaPythonClient(kafka_python_config(settings), stall_timeout_s=15)
    try:
        return client.partitions(topic)
    finally:
        client.close()


class PartitionClient(Protocol):
    """What the Spark Kafka source needs from a Kafka client."""

    def partitions(self, topic: str) -> list[int]: ...

    def earliest_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]: ...

    def first_readable(self, topic: str, partition: int, reported: int) -> int: ...

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]: ...

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int: ...

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]: ...

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int, int]], *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]: ...

    def close(self) -> None: ...


# Kafka timestamps are any int64 of milliseconds a producer chose; Spark, Delta and Python hold years
# 1-9999 only (see tidewater.times). Outside that the record is kept with a null timestamp.
_MIN_TS_MS, _MAX_TS_MS = -62_135_596_800_000, 253_402_300_799_999


def timestamp_micros(ms: int | None) -> int | None:
    """A record's Kafka timestamp (ms) as epoch microseconds, or None when no reader could hold it."""
    if ms is None or not _MIN_TS_MS <= ms <= _MAX_TS_MS:
        return None
    return ms * 1000


def records_to_arrow(rows: dict[str, list[Any]]) -> pa.RecordBatch:
    """Column lists -> one Arrow batch in :data:`RECORD_SCHEMA`."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(rows["key"], pa.binary()),
            pa.array(rows["value"], pa.binary()),
            pa.array(rows["topic"], pa.string()),
            pa.array(rows["partition"], pa.int32()),
            pa.array(rows["offset"], pa.int64()),
            pa.array(rows["timestamp"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(rows["timestampType"], pa.int32()),
            pa.array(rows["headers"], pa.list_(HEADER_TYPE)),
        ],
        schema=RECORD_SCHEMA,
    )


def retention_lost(topic: str, partition: int, start: int, end: int) -> DataLossError:
    return DataLossError(
        f"offsets {start}..{end - 1} of {topic}/{partition} are no longer on the broker (retention): the data "
        "is lost upstream; reset the query's starting offsets deliberately if you accept that"
    )


def empty_columns() -> dict[str, list[Any]]:
    return {name: [] for name in RECORD_SCHEMA.names}


# (partition, key, value, Kafka timestamp in ms, headers as (key, value) pairs) of one record.
RecordItem = tuple[int, bytes | None, bytes | None, int | None, Sequence[tuple[str, bytes | None]]]


def numbered_records(topic: str, items: Iterable[RecordItem], *, first_offset: int = 0) -> pa.RecordBatch:
    """Records of ``topic`` as the Kafka source hands them to Spark, each partition's offsets counted from
    ``first_offset`` in the order given: what tests and benchmarks feed the parse without a broker."""
    rows = empty_columns()
    offsets: dict[int, int] = {}
    for partition, key, value, timestamp_ms, headers in items:
        offset = offsets.get(partition, first_offset)
        offsets[partition] = offset + 1
        rows["key"].append(key)
        rows["value"].append(value)
        rows["topic"].append(topic)
        rows["partition"].append(partition)
        rows["offset"].append(offset)
        rows["timestamp"].append(timestamp_micros(timestamp_ms))
        rows["timestampType"].append(0)
        rows["headers"].append(list(headers))
    return records_to_arrow(rows)


class KafkaPythonClient:
    """:class:`PartitionClient` on kafka-python. One instance per process; not thread-safe."""

    def __init__(self, config: dict[str, Any], *, stall_timeout_s: float = 60.0) -> None:

        self._servers = ",".join(config.get("bootstrap_servers", []))
        self._stall_timeout_s = stall_timeout_s
        self._config = dict(config)
        base = dict(config)
        # A hand-built config (tests) fails fast too, as KafkaConnection.kafka_python's does.
        base.setdefault("bootstrap_timeout_ms", base.get("request_timeout_ms", 10_000))
        self._probe_config = dict(base, enable_auto_commit=False, auto_offset_reset="none", fetch_max_wait_ms=1)
        self._probe_consumer: Any = None
        self._reader: Any = None
        self._reader_config = dict(
            base,
            enable_auto_commit=False,
            auto_offset_reset="none",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_wait_ms=100,
        )

    @property
    def _probe(self) -> Any:
        """The probe consumer (tiny fetches that return the high watermark), created on first use so
        that executors, which only read, never pay for it."""
        if self._probe_consumer is None:
            self._probe_consumer = self._connect(self._probe_config)
        return self._probe_consumer

    def _connect(self, config: dict[str, Any]) -> Any:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaTimeoutError

        try:
            return KafkaConsumer(**config)
        except KafkaTimeoutError:
            raise BrokerUnreachableError(
                f"cannot reach a Kafka broker at {self._servers}: check TIDEWATER_KAFKA_BOOTSTRAP_SERVERS "
                "and that the broker is running"
            ) from None

    # ---- metadata -------------------------------------------------------------------------------

    def partitions(self, topic: str) -> list[int]:
        found = self._probe.partitions_for_topic(topic)
        if not found:
            # Metadata may lag topic creation by a moment; ask once more after a refresh.
            self._probe.topics()
            found = self._probe.partitions_for_topic(topic)
        if not found:
            raise TopicNotFoundError(
                f"Kafka topic {topic!r} does not exist on {self._servers}: create it "
                f"(`tidewater topics create {topic}`) or fix the pipeline's topic name"
            )
        return sorted(found)

    def earliest_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        from kafka import TopicPartition

        found = self._probe.beginning_offsets([TopicPartition(topic, p) for p in partitions])
        return {tp.partition: int(offset) for tp, offset in found.items()}

    def first_readable(self, topic: str, partition: int, reported: int) -> int:
        """The first offset the broker serves at or below ``reported`` (its ListOffsets(earliest)).

        The embedded broker (tansu) has answered ListOffsets(earliest) with 145 for a partition whose
        offsets 0..144 it still served (two producers writing at once): trusted, a new stream would skip
        them, and a running one would be told they were deleted. So a fetch from 0 decides; on a broker
        whose retention did delete them the fetch is out of range and ``reported`` stands."""
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        if reported <= 0:
            return reported
        try:
            record = self._record_at(TopicPartition(topic, partition), 0, reported)
        except OffsetOutOfRangeError:
            return reported
        return reported if record is None else min(reported, int(record.offset))

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        from kafka import TopicPartition

        if not partitions:
            return {}
        hints = self._probe.end_offsets([TopicPartition(topic, p) for p in partitions])  # <= the true ends
        return {tp.partition: end for tp, end in self._high_watermarks(hints).items()}

    def _high_watermarks(self, seek_to: Mapping[Any, int]) -> dict[Any, int]:
        """The high watermark of each partition, from fetches made after this call began."""
        probe = self._probe
        probe.assign(list(seek_to))
        for tp, offset in seek_to.items():
            probe.seek(tp, offset)
            # Forget any watermark of an earlier probe so the value we return comes from this fetch.
            probe._subscription.assignment[tp].highwater = None
        deadline = time.monotonic() + self._stall_timeout_s
        while missing := [tp for tp in seek_to if probe.highwater(tp) is None]:
            if time.monotonic() > deadline:
                raise BrokerUnreachableError(
                    f"no fetch response for {missing[0].topic}/{missing[0].partition} from {self._servers} "
                    f"within {self._stall_timeout_s:.0f} s"
                )
            probe.poll(timeout_ms=20, max_records=1)
        return {tp: int(probe.highwater(tp)) for tp in seek_to}

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """First offset whose record timestamp is >= ``timestamp_ms`` (the end if none).

        A binary search over record timestamps: the embedded broker's offsets_for_times ignores
        them, and the search is exact wherever timestamps grow with offsets (producer CreateTime).
        """
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        lo = self.earliest_offsets(topic, [partition])[partition]
        hi = self.end_offsets(topic, [partition])[partition]
        while lo < hi:
            mid = (lo + hi) // 2
            record = self._record_at(tp, mid, hi)
            if record is None or record.timestamp >= timestamp_ms:
                hi = mid  # the first record at/after mid qualifies (or there is none): look left
            else:
                lo = record.offset + 1
        return lo

    def _record_at(self, tp: Any, offset: int, end: int) -> Any:
        """The first record at or after ``offset`` and before ``end``."""
        self._probe.assign([tp])
        self._probe.seek(tp, offset)
        deadline = time.monotonic() + self._stall_timeout_s
        while time.monotonic() < deadline:
            polled = self._probe.poll(timeout_ms=100, max_records=1).get(tp, [])
            if polled:
                return polled[0] if polled[0].offset < end else None
            if self._probe.position(tp) >= end:
                return None
        raise BrokerUnreachableError(f"timed out reading {tp.topic}/{tp.partition} at offset {offset}")

    # ---- data -----------------------------------------------------------------------------------

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        """Records with ``start <= offset < end`` as Arrow batches; fails if any are gone."""
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        if start >= end:
            return
        if self._reader is None:
            self._reader = self._connect(self._reader_config)
        consumer = self._reader
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        columns = empty_columns()
        position = start
        last_progress = time.monotonic()
        while position < end:
            try:
                polled = consumer.poll(timeout_ms=500, max_records=min(batch_rows, end - position)).get(tp, [])
            except OffsetOutOfRangeError:
                raise retention_lost(topic, partition, start, end) from None
            for record in polled:
                if record.offset >= end:
                    break
                columns["key"].append(record.key)
                columns["value"].append(record.value)
                columns["topic"].append(topic)
                columns["partition"].append(partition)
                columns["offset"].append(record.offset)
                columns["timestamp"].append(timestamp_micros(record.timestamp))
                columns["timestampType"].append(record.timestamp_type)
                columns["headers"].append([(k, v) for k, v in (record.headers or [])])
            position = consumer.position(tp)
            last_progress = self._check_stall(topic, partition, position, end, bool(polled), last_progress)
            if len(columns["offset"]) >= batch_rows:
                yield records_to_arrow(columns)
                columns = empty_columns()
        if columns["offset"]:
            yield records_to_arrow(columns)

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int, int]], *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        """Every ``(topic, partition, start, end)`` range, one after another."""
        for topic, partition, start, end in ranges:
            yield from self.read_arrow(topic, partition, start, end, batch_rows=batch_rows)

    def _check_stall(
        self, topic: str, partition: int, position: int, end: int, got_records: bool, last_progress: float
    ) -> float:
        """The new time of last progress; raises when a read made none for the stall timeout."""
        now = time.monotonic()
        if got_records:
            return now
        if now - last_progress > self._stall_timeout_s:
            raise BrokerUnreachableError(
                f"reading {topic}/{partition} stalled at offset {position} (want {end}) for "
                f"{self._stall_timeout_s:.0f} s on {self._servers}"
            )
        return last_progress

    def close(self) -> None:
        if self._probe_consumer is not None:
            self._probe_consumer.close()
        if self._reader is not None:
            self._reader.close()
