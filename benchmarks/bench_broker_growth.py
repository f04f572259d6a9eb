"""What the in-memory embedded broker (tansu) holds and spends as its log grows.

tansu's memory engine keeps every record it is sent: it has no retention, topic configs or
DeleteRecords (``../shared/DESIGN.md``). This benchmark starts one (:class:`tidewater.broker.EmbeddedBroker`),
fills a 4-partition topic to each of ``--at`` records with 259-byte values, and at each step follows
the tail for ``--seconds`` (a producer adding records, a consumer reading them as a stream's source
would; ~2,800 records/s here), then prints the broker's share of a core over that window and its RSS. No Spark: the
broker alone. ``./tw run`` quotes the bytes per record it prints
(:data:`tidewater.orchestration.platform.IN_MEMORY_BROKER_BYTES_PER_RECORD`).

    .venv/bin/python benchmarks/bench_broker_growth.py [--at 0,300000,600000,1200000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from bench_stream import cpu_seconds, rss_bytes
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tidewater.broker import EmbeddedBroker

TOPIC, PARTITIONS = "growth", 4
PAYLOAD = (
    b'{"rsvp_id": "%08d", "venue": "v-123", "response": "yes", "event_time": "2026-11-29T09:00:00Z", "pad": "'
    + b"x" * 150
    + b'"}'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", default="0,300000,600000,1200000", help="log sizes (records) to measure at")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds following the tail at each size")
    args = parser.parse_args()
    steps = [int(n) for n in args.at.split(",")]
    print(f"machine: {os.cpu_count()} cores, {platform.platform()}; values of {len(PAYLOAD % 0)} bytes", flush=True)
    with EmbeddedBroker() as broker:
        assert broker.process is not None
        pid = broker.process.pid
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5, batch_size=64 * 1024)
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        sent = 0

        def send(count: int) -> None:
            nonlocal sent
            for _ in range(count):
                producer.send(TOPIC, PAYLOAD % sent, partition=sent % PARTITIONS)
                sent += 1
            producer.flush()

        try:
            for target in steps:
                while sent < target:
                    send(min(10_000, target - sent))
                consumer.seek_to_end(*partitions)
                consumer.poll(timeout_ms=500)
                cpu_before, started, read = cpu_seconds(pid) or 0.0, time.time(), 0
                while time.time() - started < args.seconds:
                    send(200)
                    read += sum(len(batch) for batch in consumer.poll(timeout_ms=100).values())
                    time.sleep(0.05)
                share = 100 * ((cpu_seconds(pid) or 0.0) - cpu_before) / (time.time() - started)
                print(
                    f"log {sent:>10,} records: broker {share:.0f}% of a core following the tail"
                    f" ({read / args.seconds:,.0f} records/s read), RSS {rss_bytes([pid]) / 2**20:,.0f} MiB",
                    flush=True,
                )
        finally:
            producer.close()
            consumer.close()


if __name__ == "__main__":
    main()
