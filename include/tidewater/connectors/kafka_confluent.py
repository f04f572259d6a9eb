"""A librdkafka (confluent-kafka) backend for the data path of the Spark Kafka source.

kafka-python decodes every record in Python, which caps a reader at roughly 40-50k records/s;
librdkafka decodes in C. Only ``read_arrow`` (the executor-side hot loop) changes: metadata, end
offsets and timestamp search stay on the kafka-python probe, so both backends agree on offsets
by construction. Select it with ``TIDEWATER_KAFKA_CLIENT=confluent`` (source option
``kafka.client=confluent``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from tidewater.connectors.kafka_client import (
    KafkaPythonClient,
    empty_columns,
    librdkafka_connection,
    records_to_arrow,
    retention_lost,
    timestamp_micros,
)
from tidewater.errors import BrokerUnreachableError


def librdkafka_config(config: dict[str, Any]) -> dict[str, Any]:
    """The reader's librdkafka properties: the connection of the kafka-python ``config``
    (:func:`librdkafka_connection`) and how this reader consumes."""
    return {
        **librdkafka_connection(config),
        "group.id": "tidewater-source",  # required by librdkafka; offsets are never committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
    }


class ConfluentClient(KafkaPythonClient):
    """kafka-python for metadata and offsets, librdkafka for reading records.

    The librdkafka consumer is kept between reads (a Spark Python worker reads one range after another
    with the same client, see :func:`tidewater.connectors.kafka_source.read_range`): each read assigns
    its partitions at their start offsets, which discards whatever an earlier assignment had fetched.
    A read ends by unassigning them: librdkafka keeps fetching for an assigned partition, so an idle
    reader left at a partition's end long-polls the broker every ``fetch.wait.max.ms`` for records no
    one will read (two such readers on four partitions took 10% of a core of the embedded broker, 2%
    unassigned; README, Benchmarks)."""

    _rd_consumer: Any = None

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        return self.read_ranges([(topic, partition, start, end)], batch_rows=batch_rows)

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int, int]], *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        """Every ``(topic, partition, start, end)``, all partitions in one assignment, so a small
        micro-batch's ranges are fetched together (one after another, each re-assignment cost up to
        ~100 ms on the embedded broker). Ranges of a partition that repeats (a large range split in
        pieces) are read in later assignments, one piece each."""
        rounds: list[list[tuple[str, int, int, int]]] = []
        for item in ranges:
            free = next((r for r in rounds if all(other[:2] != item[:2] for other in r)), None)
            if free is None:
                rounds.append(free := [])
            free.append(item)
        for assignment in rounds:
            yield from self._read_assigned(assignment, batch_rows)

    def _read_assigned(self, ranges: Sequence[tuple[str, int, int, int]], batch_rows: int) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Consumer, TopicPartition

        # (topic, partition) -> [next offset wanted, end, start]
        wanted = {(t, p): [start, end, start] for t, p, start, end in ranges if start < end}
        if not wanted:
            return
        if self._rd_consumer is None:
            self._rd_consumer = Consumer(librdkafka_config(self._config))
        consumer = self._rd_consumer
        consumer.assign([TopicPartition(t, p, state[0]) for (t, p), state in wanted.items()])
        try:
            yield from self._consume(consumer, wanted, batch_rows)
        finally:
            consumer.unassign()

    def _consume(
        self, consumer: Any, wanted: dict[tuple[str, int], list[int]], batch_rows: int
    ) -> Iterator[pa.RecordBatch]:
        """The records of the assigned ``wanted`` ranges, until each partition reached its end."""
        from confluent_kafka import KafkaError

        pending = set(wanted)
        columns = empty_columns()
        last_progress = time.monotonic()
        while pending:
            remaining = sum(wanted[tp][1] - wanted[tp][0] for tp in pending)
            # Ask for no more than the ranges hold: consume() returns as soon as it has that many.
            messages = consumer.consume(num_messages=max(1, min(batch_rows, remaining)), timeout=0.5)
            progressed = False
            for message in messages:
                tp = (message.topic(), message.partition())
                if tp not in pending:
                    continue  # done already, or fetched for an earlier assignment (librdkafka drops those too)
                state = wanted[tp]
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # at the high watermark; transaction markers may sit between the last record and it
                        state[0] = max(state[0], message.offset())
                        progressed = True
                    elif error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        raise retention_lost(tp[0], tp[1], state[2], state[1])
                    else:
                        raise BrokerUnreachableError(f"reading {tp[0]}/{tp[1]}: {error.str()}")
                else:
                    offset = message.offset()
                    if offset < state[0]:
                        continue
                    progressed = True
                    if offset >= state[1]:
                        state[0] = state[1]
                    else:
                        ts_type, ts = message.timestamp()
                        columns["key"].append(message.key())
                        columns["value"].append(message.value())
                        columns["topic"].append(tp[0])
                        columns["partition"].append(tp[1])
                        columns["offset"].append(offset)
                        columns["timestamp"].append(timestamp_micros(ts))
                        columns["timestampType"].append(max(ts_type - 1, 0))  # librdkafka: 1 create, 2 log-append
                        columns["headers"].append(message.headers() or [])
                        state[0] = offset + 1
                if state[0] >= state[1]:
                    pending.discard(tp)
            if pending:
                topic, partition = min(pending)
                state = wanted[(topic, partition)]
                last_progress = self._check_stall(topic, partition, state[0], state[1], progressed, last_progress)
            if len(columns["offset"]) >= batch_rows:
                yield records_to_arrow(columns)
                columns = empty_columns()
        consumer.unassign()  # before the last batch goes to Spark, not after
        if columns["offset"]:
            yield records_to_arrow(columns)

    def close(self) -> None:
        if self._rd_consumer is not None:
            consumer, self._rd_consumer = self._rd_consumer, None
            consumer.close()
        super().close()
