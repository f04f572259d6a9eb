"""Exactly-once publication of streaming micro-batches to a Kafka topic.

A micro-batch may run more than once: Spark re-runs a batch (same id, same records) when the process
died after the batch's side effects but before its checkpoint commit. :class:`BatchPublisher` makes
the re-run harmless with one Kafka transaction per batch that holds the batch's records *and* a marker
record ``{"app_id", "batch_id", "records"}`` in a one-partition control topic; the commit makes both
visible at once, so "the marker of batch N is committed" and "the records of batch N are committed" are
the same fact. Where a kill -9 can land:

- before the commit: the transaction stays open. The next publisher with the same ``transactional.id``
  (the re-run) fences it on start (InitProducerId bumps the epoch and aborts the open transaction; on
  real Kafka the broker also aborts it after ``transaction.timeout.ms``). No marker of N is committed,
  so the re-run publishes N again: its records are seen once, the zombie's never.
- after the commit, before Spark's checkpoint commit: the marker of N is committed, so the re-run finds
  it and skips N (``publish`` returns False).
- during the commit: the broker completes or aborts the transaction on its own; the re-run fences first
  and only then reads the markers, so it sees the outcome and does one of the two above.
- a zombie that is still alive cannot commit after being fenced: its epoch is stale (on tansu its
  next request fails with _FENCED, or the broker drops its connection and the commit times out).

The last published batch id is read once (at the first publish) and then kept in memory: in the steady
state a batch costs one transaction and no read.

Reading committed data ourselves: the embedded broker (tansu 0.6) sends no AbortedTransactions in its
fetch responses, so a stock ``read_committed`` consumer (measured: kafka-python and librdkafka; every
client relies on that list) returns the records of *aborted* transactions there -- the zombie's records,
and its marker: trusting it would make the re-run skip a batch that was never committed. The marker lookup and
:func:`read_committed` therefore decide visibility in this client: they fetch the raw record batches
(including control batches) and keep a transaction's records only when its COMMIT marker follows. That
is the read_committed rule itself, and it is right on real Kafka too. Open transactions hold the last
stable offset as on Kafka; tansu did not abort one after its ``transaction.timeout.ms`` (3 s, still open
8 s later): there only the same ``transactional.id`` coming back ends it.

Clients, measured against tansu: confluent-kafka produces transactionally at ~170k records/s against
~10k for kafka-python, and every call takes a timeout (a fenced kafka-python producer hangs in
``commit_transaction``). Raw fetches use kafka-python's protocol classes, the one client here that
exposes record batches with their producer ids and control records.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tidewater.connectors.kafka_client import librdkafka_connection
from tidewater.errors import BrokerUnreachableError, TidewaterError, TopicNotFoundError

CONTROL_PARTITION = 0  # markers always go to partition 0 of the control topic
_FIRST_WINDOW = 256  # control-topic offsets read first when looking for the last marker (then x4)
_FETCH_BYTES = 4 * 1024 * 1024
_BROKER_DOWN = {"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_MSG_TIMED_OUT", "_RESOLVE"}
_FENCED = {"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "INVALID_PRODUCER_ID_MAPPING"}


@dataclass(frozen=True)
class OutgoingRecord:
    """One record to publish: Kafka picks the partition from the key (murmur2, as Java and kafka-python)."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class _Committed:
    offset: int
    key: bytes | None
    value: bytes


class BatchPublisher:
    """Publishes micro-batches to ``topic`` exactly once per ``app_id`` (see the module docstring).

    Constructing one takes over ``transactional_id``: an earlier process's open transaction is aborted
    and that process can no longer commit. One publisher per query; not thread-safe.
    """

    def __init__(
        self,
        connection_config: dict[str, Any],
        *,
        topic: str,
        control_topic: str,
        transactional_id: str,
        app_id: str,
        timeout_s: float = 30.0,
    ) -> None:
        self._config = dict(connection_config)
        self._topic = topic
        self._control_topic = control_topic
        self._transactional_id = transactional_id
        self._app_id = app_id
        self._timeout_s = timeout_s
        self._producer: Any = None
        self._last: int | None = None
        self._looked_up = False
        self._delivery_error: str | None = None
        self._log = _RawLog(self._config, timeout_s=timeout_s)
        try:
            self._log.leaders(topic)
            self._log.leaders(control_topic)
            self._ensure_producer()
        except BaseException:
            self.close()
            raise

    def last_published(self) -> int | None:
        """The id of the last batch this app committed, None if none. Read from the control topic once
        (after fencing, so no earlier process can still change it), then kept in memory."""
        self._ensure_producer()
        if not self._looked_up:
            self._last = self._lookup()
            self._looked_up = True
        return self._last

    def publish(
        self, batch_id: int, records: Sequence[OutgoingRecord], *, before_commit: Callable[[], None] | None = None
    ) -> bool:
        """Publish ``records`` as batch ``batch_id`` in one transaction with its marker.

        Returns False, publishing nothing, when a batch with this id or a later one is already committed
        (a re-run). On failure the transaction is aborted and the state forgotten: the next call fences
        again and re-reads the markers, so a retry can neither lose nor repeat the batch.
        """
        last = self.last_published()
        if last is not None and batch_id <= last:
            return False
        producer = self._ensure_producer()
        marker = json.dumps({"app_id": self._app_id, "batch_id": batch_id, "records": len(records)})
        deadline = time.monotonic() + self._timeout_s
        self._delivery_error = None
        try:
            producer.begin_transaction()
            for record in records:
                self._produce(producer, deadline, self._topic, record.key, record.value, list(record.headers))
            self._produce(
                producer, deadline, self._control_topic, self._app_id.encode(), marker.encode(), [], CONTROL_PARTITION
            )
            if before_commit is not None:  # the chaos tests' fault point: every record is on the broker
                producer.flush(max(deadline - time.monotonic(), 1.0))
                before_commit()
            producer.commit_transaction(max(deadline - time.monotonic(), 1.0))
        except BaseException as exc:
            self._discard(abort=True)
            error = self._error(exc, f"publishing batch {batch_id} of {self._app_id} to {self._topic}")
            if error is exc:
                raise
            raise error from None
        self._last = batch_id
        return True

    def close(self) -> None:
        """Release the connections (between batches no transaction is open, so nothing is lost)."""
        self._discard(abort=False)
        self._log.close()

    # ---- internals ------------------------------------------------------------------------------

    def _ensure_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            producer = Producer(
                {
                    **librdkafka_connection(self._config),
                    "transactional.id": self._transactional_id,
                    "partitioner": "murmur2_random",  # the partitions Java clients and kafka-python choose
                    "linger.ms": 5,
                    "log.connection.close": False,  # tansu closes idle connections; not worth a log line
                    "on_delivery": self._on_delivery,
                    "delivery.report.only.error": True,
                }
            )
            try:
                producer.init_transactions(self._timeout_s)  # fences the previous holder of the id
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    producer.close()
                error = self._error(exc, f"taking over transactional id {self._transactional_id!r}")
                if error is exc:
                    raise
                raise error from None
            self._producer = producer
            self._looked_up = False  # markers are only trusted when read after fencing
        return self._producer

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is not None and self._delivery_error is None:
            self._delivery_error = f"{message.topic()}: {error.str()}"

    @staticmethod
    def _produce(
        producer: Any,
        deadline: float,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        partition: int | None = None,
    ) -> None:
        extra: dict[str, Any] = {"headers": headers} if headers else {}
        if partition is not None:
            extra["partition"] = partition
        while True:
            try:
                producer.produce(topic, value=value, key=key, **extra)
                return
            except BufferError:  # the local queue is full: let librdkafka send, then retry
                if time.monotonic() > deadline:
                    raise
                producer.poll(0.05)

    def _discard(self, *, abort: bool) -> None:
        """Drop the producer and the cached batch id (best-effort abort of an open transaction)."""
        producer, self._producer = self._producer, None
        self._looked_up = False
        self._last = None
        if producer is None:
            return
        if abort:  # fenced or broker gone: then the next holder of the id aborts it when it starts
            with contextlib.suppress(Exception):
                producer.abort_transaction(min(self._timeout_s, 5.0))
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # close() retries the abort above and warns when it fails
            producer.close()

    def _lookup(self) -> int | None:
        """The highest batch id among this app's committed markers: the control topic is read backwards
        in growing windows (each batch adds a marker and a commit record), so a restart reads little.

        Every committed marker counts, also past another app's open transaction (which would hold a
        read_committed consumer's last stable offset): our own transactions are all decided, we fenced."""
        leader = self._log.leaders(self._control_topic)[CONTROL_PARTITION]
        log_start, end = self._log.bounds(self._control_topic, CONTROL_PARTITION, leader)
        window = _FIRST_WINDOW
        while True:
            start = max(log_start, end - window)
            found = [
                batch_id
                for record in self._log.committed(
                    self._control_topic, CONTROL_PARTITION, leader, start, end, stable_only=False
                )
                if (batch_id := _marker_batch(record.value, self._app_id)) is not None
            ]
            if found:
                return max(found)
            if start <= log_start:
                return None
            window *= 4

    def _error(self, exc: BaseException, doing: str) -> BaseException:
        """One actionable line for a client failure (non-Kafka errors pass through unchanged)."""
        from confluent_kafka import KafkaException

        if isinstance(exc, TidewaterError) or not isinstance(exc, KafkaException | BufferError):
            return exc
        servers = ",".join(self._config.get("bootstrap_servers", []))
        if isinstance(exc, BufferError):
            return BrokerUnreachableError(f"{doing}: the local send queue stayed full for {self._timeout_s:.0f} s")
        error = exc.args[0] if exc.args else None
        name = error.name() if hasattr(error, "name") else ""
        text = (error.str() if hasattr(error, "str") else str(exc)).replace("\n", " ")
        if self._delivery_error:
            text = f"{text} (first failed record: {self._delivery_error})"
        if name in _FENCED:
            return TidewaterError(
                f"{doing}: another publisher took over transactional id {self._transactional_id!r} "
                "(is the query running twice?)"
            )
        if name == "UNKNOWN_TOPIC_OR_PART":
            return TopicNotFoundError(f"{doing}: {text}; create {self._topic!r} and {self._control_topic!r}")
        if name in _BROKER_DOWN:
            return BrokerUnreachableError(f"{doing}: no answer from the Kafka broker at {servers}: {text}")
        return TidewaterError(f"{doing} failed: {text}")


def rows_to_records(rows: pa.Table, *, key: str) -> list[OutgoingRecord]:
    """Table rows as Kafka records: the ``key`` column's value as the key, the row as JSON (timestamps
    as ISO-8601 UTC text) as the value."""
    out = []
    for row in rows.to_pylist():
        value = json.dumps(row, default=_json_value, separators=(",", ":"), ensure_ascii=False)
        out.append(OutgoingRecord(key=None if row[key] is None else str(row[key]).encode(), value=value.encode()))
    return out


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        aware = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        return aware.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | bytes):
        return value.isoformat() if isinstance(value, dt.date) else value.hex()
    raise TypeError(f"cannot publish a {type(value).__name__} as JSON")


def read_committed(
    connection_config: dict[str, Any], topic: str, *, timeout_s: float = 10.0
) -> list[tuple[bytes | None, bytes, int, int]]:
    """Every committed record of topic (key, value, partition, offset), read to the end of each partition.

    The end is each partition's high watermark when its first fetch answers; records of transactions
    still open there, and everything after the first of them (the last stable offset), are left out, as
    a read_committed consumer at that moment would. Aborted records are left out even on brokers that
    do not report aborted transactions (tansu): see the module docstring. Sorted by partition, offset.
    """
    log = _RawLog(connection_config, timeout_s=timeout_s)
    try:
        out: list[tuple[bytes | None, bytes, int, int]] = []
        for partition, leader in sorted(log.leaders(topic).items()):
            log_start, end = log.bounds(topic, partition, leader)
            out.extend(
                (r.key, r.value, partition, r.offset) for r in log.committed(topic, partition, leader, log_start, end)
            )
        return out
    finally:
        log.close()


def _marker_batch(value: bytes, app_id: str) -> int | None:
    try:
        marker = json.loads(value)
        return int(marker["batch_id"]) if marker.get("app_id") == app_id else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # not one of our markers


class _RawLog:
    """Raw record batches of one partition at a time, through kafka-python's admin client connection.

    Fetches ask for read_uncommitted on purpose: that returns every batch, control batches included,
    and :meth:`committed` applies the read_committed rule from them. One partition per fetch (tansu
    answers a multi-partition fetch with the first partition only) and a 1 ms wait (tansu answers a
    0 ms wait with nothing).
    """

    def __init__(self, config: Mapping[str, Any], *, timeout_s: float) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        self._servers = ",".join(config.get("bootstrap_servers", []))
        self._timeout_s = timeout_s
        base = dict(config)
        base.setdefault("bootstrap_timeout_ms", base.get("request_timeout_ms", 10_000))
        try:
            self._admin: Any = KafkaAdminClient(**base)
        except KafkaError:
            raise BrokerUnreachableError(
                f"cannot reach a Kafka broker at {self._servers}: check TIDEWATER_KAFKA_BOOTSTRAP_SERVERS "
                "and that the broker is running"
            ) from None

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader node id; the topic must exist (metadata may lag creation: asked twice)."""
        for attempt in range(2):
            described = self._admin.describe_topics([topic])[0]
            if described["error_code"] == 0 and described["partitions"]:
                return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}
            if attempt == 0:
                time.sleep(0.3)
        raise TopicNotFoundError(
            f"Kafka topic {topic!r} does not exist on {self._servers}: create it "
            f"(`tidewater topics create {topic}`) or fix the topic name"
        )

    def bounds(self, topic: str, partition: int, leader: int) -> tuple[int, int]:
        """(log start offset, high watermark) from one small fetch (ListOffsets(latest) is wrong on tansu)."""
        data = self._fetch(topic, partition, leader, 0, max_bytes=1)
        return max(int(data.log_start_offset or 0), 0), int(data.high_watermark)

    def committed(
        self, topic: str, partition: int, leader: int, start: int, end: int, *, stable_only: bool = True
    ) -> list[_Committed]:
        """Committed records with ``start <= offset < end``, by offset; with ``stable_only`` only those
        below the last stable offset (the first record of a transaction still open at ``end``).

        Non-transactional records are committed as written; a transaction's records wait in ``pending``
        (per producer id) until its control record says COMMIT (kept) or ABORT (dropped).
        """
        from kafka.record import MemoryRecords

        visible: list[_Committed] = []
        pending: dict[int, list[_Committed]] = {}
        offset = start
        last_progress = time.monotonic()
        while offset < end:
            records = MemoryRecords(self._fetch(topic, partition, leader, offset).records or b"")
            progressed = False
            while (batch := records.next_batch()) is not None:
                if batch.base_offset >= end:
                    offset = end  # past the snapshot: its decisions are not part of this read
                    break
                if batch.is_control_batch:
                    for control in batch:
                        decided = pending.pop(batch.producer_id, [])
                        if control.commit:
                            visible.extend(decided)
                else:
                    target = pending.setdefault(batch.producer_id, []) if batch.is_transactional else visible
                    target.extend(_Committed(r.offset, r.key, r.value) for r in batch if start <= r.offset < end)
                if batch.next_offset > offset:
                    offset, progressed = batch.next_offset, True
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self._timeout_s:
                raise BrokerUnreachableError(
                    f"reading {topic}/{partition} stalled at offset {offset} (want {end}) for "
                    f"{self._timeout_s:.0f} s on {self._servers}"
                )
        stable = min((txn[0].offset for txn in pending.values() if txn), default=end) if stable_only else end
        return sorted((r for r in visible if r.offset < stable), key=lambda r: r.offset)

    def _fetch(self, topic: str, partition: int, leader: int, offset: int, *, max_bytes: int = _FETCH_BYTES) -> Any:
        from kafka.errors import KafkaError, for_code
        from kafka.protocol.consumer import FetchRequest

        fetch_partition = FetchRequest.FetchTopic.FetchPartition(
            partition=partition,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=max_bytes,
        )
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=1,
            min_bytes=1,
            max_bytes=max_bytes,
            isolation_level=0,  # read_uncommitted: all batches; committed() decides visibility
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[fetch_partition])],
            forgotten_topics_data=[],
            rack_id="",
            max_version=12,  # v13+ names topics by id
        )
        manager = self._admin._manager  # kafka-python 3.0 has no public raw-request API
        try:
            response = manager.run(manager.send, request, leader)
        except KafkaError as exc:
            raise BrokerUnreachableError(f"fetching {topic}/{partition} from {self._servers} failed: {exc}") from None
        data = response.responses[0].partitions[0]
        if data.error_code == 1 and data.log_start_offset is not None and data.log_start_offset > offset:
            return self._fetch(topic, partition, leader, data.log_start_offset, max_bytes=max_bytes)  # retention
        if data.error_code == 3:
            raise TopicNotFoundError(f"Kafka topic {topic!r} does not exist on {self._servers}")
        if data.error_code != 0:
            error = for_code(data.error_code)
            raise BrokerUnreachableError(f"fetching {topic}/{partition} from {self._servers}: {error.__name__}")
        return data

    def close(self) -> None:
        self._admin.close()
