"""A librdkafka (confluent-kafka) backend for the data path of the Spark Kafka source.

kafka-python decodes every record in Python, which caps a reader at roughly 40-50k records/s;
librdkafka decodes in C. Only ``read_arrow`` (the executor-side hot loop) changes: metadata, end
offsets and timestamp search stay on the kafka-python probe, so both backends agree on offsets
by construction. Select it with ``TIDEWATER_KAFKA_CLIENT=confluent`` (source option
``kafka.client=confluent``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
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
    its partition at its start offset, which discards whatever an earlier assignment had fetched."""

    _rd_consumer: Any = None

    def read_arrow(
        self, topic: str, partition: int, start: int, end: int, *, batch_rows: int = 20_000
    ) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        if start >= end:
            return
        if self._rd_consumer is None:
            self._rd_consumer = Consumer(librdkafka_config(self._config))
        consumer = self._rd_consumer
        consumer.assign([TopicPartition(topic, partition, start)])
        columns = empty_columns()
        position = start
        last_progress = time.monotonic()
        while position < end:
            # Ask for no more than the range holds: consume() returns as soon as it has that many.
            messages = consumer.consume(num_messages=min(batch_rows, end - position), timeout=0.5)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # at the high watermark; transaction markers may sit between the last record and it
                        if message.partition() == partition and message.topic() == topic:
                            position = max(position, message.offset())
                        continue
                    if error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        raise retention_lost(topic, partition, start, end)
                    raise BrokerUnreachableError(f"reading {topic}/{partition}: {error.str()}")
                offset = message.offset()
                if offset < position or message.partition() != partition or message.topic() != topic:
                    continue  # fetched for an earlier assignment (librdkafka drops those itself: a guard)
                if offset >= end:
                    position = end
                    break
                ts_type, ts = message.timestamp()
                columns["key"].append(message.key())
                columns["value"].append(message.value())
                columns["topic"].append(topic)
                columns["partition"].append(partition)
                columns["offset"].append(offset)
                columns["timestamp"].append(timestamp_micros(ts))
                columns["timestampType"].append(max(ts_type - 1, 0))  # librdkafka: 1 create, 2 log-append
                columns["headers"].append(message.headers() or [])
                position = offset + 1
            last_progress = self._check_stall(topic, partition, position, end, bool(messages), last_progress)
            if len(columns["offset"]) >= batch_rows:
                yield records_to_arrow(columns)
                columns = empty_columns()
        if columns["offset"]:
            yield records_to_arrow(columns)

    def close(self) -> None:
        if self._rd_consumer is not None:
            consumer, self._rd_consumer = self._rd_consumer, None
            consumer.close()
        super().close()
