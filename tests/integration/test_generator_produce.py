"""The generator against a real (embedded tansu) broker: what is read back is exactly what was generated.

Read-back uses one consumer per partition because the embedded broker answers a multi-partition
fetch with the first partition's data only, and a fetch wait of at least 1 ms (0 returns nothing).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from tidewater.broker import EmbeddedBroker, free_port
from tidewater.config import Settings
from tidewater.errors import BrokerUnreachableError, TidewaterError, TopicNotFoundError
from tidewater.generator import GeneratorConfig, ensure_topic, generate, parse_ts, produce
from tidewater.generator import cli as generator_cli

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
START = parse_ts("2026-11-21T10:00:00.000Z")
CONFIG = GeneratorConfig(
    seed=11,
    start_time_ms=START,
    duplicate_rate=0.05,
    out_of_order_fraction=0.1,
    late_fraction=0.02,
    malformed_rate=0.03,
    clock_skew_ms=(0, -1500, 2500),
)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:  # stopped on exit, also when a test fails
        yield b


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    return Settings(
        state_dir=str(tmp_path), kafka_bootstrap_servers=broker.bootstrap_servers, kafka_request_timeout_ms=5000
    )


def read_partitions(servers: str, topic: str, partitions: int, *, timeout_s: float = 15.0) -> dict[int, list]:
    """Every record of every partition, one consumer per partition, read up to the high watermark."""
    out: dict[int, list] = {}
    for p in range(partitions):
        tp = TopicPartition(topic, p)
        consumer = KafkaConsumer(
            bootstrap_servers=servers, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=10
        )
        try:
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            records: list = []
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=200).values():
                    records.extend(batch)
                high = consumer.highwater(tp)
                if high is not None and consumer.position(tp) >= high:
                    break
            else:
                pytest.fail(f"partition {p} not read to its end in {timeout_s} s")
            out[p] = records
        finally:
            consumer.close()
    return out


def test_produced_records_read_back_exactly(settings: Settings, broker: EmbeddedBroker) -> None:
    topic = "rsvps-roundtrip"
    ensure_topic(settings, topic, 4)
    ensure_topic(settings, topic, 4)  # idempotent
    reports = []
    report = produce(settings, topic, CONFIG, count=2000, realtime=False, progress=reports.append)
    generated = list(generate(CONFIG, 2000))

    assert report.sent == 2000 and report.errors == 0
    assert {k: v for k, v in report.by_kind.items() if v} == Counter(r.kind for r in generated)
    assert reports and reports[-1] is report  # the final state is reported
    for producer_id in ("producer-0", "producer-1", "producer-2"):
        assert report.last_seq_no[producer_id] == max(r.seq_no for r in generated if r.producer_id == producer_id)

    by_partition = read_partitions(broker.bootstrap_servers, topic, 4)
    assert sum(len(v) for v in by_partition.values()) == 2000
    assert all(by_partition.values()), "a keyed topic of 200 venues uses every partition"

    partition_of_key: dict[bytes, set[int]] = defaultdict(set)
    for p, records in by_partition.items():
        for rec in records:
            partition_of_key[rec.key].add(p)
    assert all(len(ps) == 1 for ps in partition_of_key.values()), "a key landed in two partitions"

    # Per partition, the records are the generated ones in generation order, byte for byte.
    for p, records in by_partition.items():
        want = [r for r in generated if partition_of_key[r.key] == {p}]
        got = [(rec.key, rec.value, rec.timestamp) for rec in records]
        assert got == [(r.key, r.value, r.timestamp_ms) for r in want]
        assert [rec.offset for rec in records] == list(range(len(records)))


def test_realtime_paces_to_the_rate_and_stops_on_request(settings: Settings) -> None:
    topic = "rsvps-paced"
    ensure_topic(settings, topic, 2)
    config = GeneratorConfig(rate=400)  # start_time_ms None: now, read once
    began = int(time.time() * 1000)
    report = produce(settings, topic, config, count=300, realtime=True)
    assert report.sent == 300 and report.errors == 0
    assert 0.6 <= report.elapsed_s <= 2.5  # 300 records at 400/s = 0.75 s
    records = [r for rs in read_partitions(settings.kafka_bootstrap_servers, topic, 2).values() for r in rs]
    # Event times follow the simulated schedule, which started at the wall clock.
    assert abs(min(r.timestamp for r in records) - began) < 2000

    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    report = produce(settings, topic, GeneratorConfig(rate=200), stop=stop)  # unbounded until stopped
    assert 0 < report.sent < 300 and report.errors == 0

    report = produce(settings, topic, GeneratorConfig(rate=200), duration_s=0.5)
    assert 0.4 <= report.elapsed_s <= 1.5 and 50 <= report.sent <= 150


def test_missing_topic_is_refused_and_not_auto_created(settings: Settings) -> None:
    with pytest.raises(TopicNotFoundError) as info:
        produce(settings, "no-such-topic", CONFIG, count=10, realtime=False)
    assert "no-such-topic" in str(info.value) and "\n" not in str(info.value)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    try:
        assert "no-such-topic" not in admin.list_topics()
    finally:
        admin.close()


def test_dead_address_fails_fast_with_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    dead = Settings(state_dir=str(tmp_path), kafka_bootstrap_servers=address, kafka_request_timeout_ms=1500)
    for call in (
        lambda: produce(dead, "rsvps", CONFIG, count=10, realtime=False),
        lambda: ensure_topic(dead, "rsvps", 4),
    ):
        began = time.monotonic()
        with pytest.raises(BrokerUnreachableError) as info:
            call()
        assert time.monotonic() - began < 6
        message = str(info.value)
        assert isinstance(info.value, TidewaterError)
        assert address in message and "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS" in message and "\n" not in message


def test_cli_run_creates_topic_and_prints_summary(settings: Settings, broker: EmbeddedBroker) -> None:
    parser = argparse.ArgumentParser()
    generator_cli.add_arguments(parser)
    flags = (
        "--topic rsvps-cli --partitions 3 --count 500 --as-fast-as-possible --seed 5 --producers 2 "
        "--clock-skew-ms 0,-700 --duplicate-rate 0.1 --malformed-rate 0.02 --start-time 2026-11-21T10:00:00Z"
    )
    args = parser.parse_args(flags.split())
    out = io.StringIO()
    assert generator_cli.run(args, settings, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("generator: sent 500 records") and "rsvps-cli" in lines[-1]
    by_partition = read_partitions(broker.bootstrap_servers, "rsvps-cli", 3)
    values = sorted(r.value for rs in by_partition.values() for r in rs)
    assert values == sorted(r.value for r in generate(generator_cli.config_from_args(args), 500))
    first = json.loads(next(v for v in values if v.startswith(b"{") and b'"producer-1"' in v))
    assert first["producer_id"] == "producer-1"


def test_cli_ctrl_c_flushes_and_exits_130(broker: EmbeddedBroker, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        TIDEWATER_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
        TIDEWATER_STATE_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT / "include"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidewater.generator.cli", "--topic", "rsvps-sigint", "--rate", "500"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Interrupt only once it is producing (the topic exists), then let it run a little.
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            deadline = time.monotonic() + 15
            while "rsvps-sigint" not in admin.list_topics() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            admin.close()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    summary = stdout.strip().splitlines()[-1]
    assert summary.startswith("generator: sent ") and "errors 0" in summary
    sent = int(summary.split()[2])
    records = read_partitions(broker.bootstrap_servers, "rsvps-sigint", 4)
    assert sent > 0 and sum(len(v) for v in records.values()) == sent  # everything sent was flushed


def test_fast_run_of_a_slow_rate_stamps_no_record_in_the_future(settings: Settings, broker: EmbeddedBroker) -> None:
    """Issue 9 item 9: `generate --count 5 --rate 0.0005 --as-fast-as-possible` simulates records 2,000 s
    apart starting now; Apache Kafka 4.1 refuses records more than an hour in the future. The Kafka
    timestamp is the send time at the latest; the payload keeps the simulated times."""
    parser = argparse.ArgumentParser()
    generator_cli.add_arguments(parser)
    args = parser.parse_args(
        ["--topic", "rsvps-future", "--partitions", "1", "--count", "5", "--rate", "0.0005", "--as-fast-as-possible"]
    )
    began = int(time.time() * 1000)
    assert generator_cli.run(args, settings, out=io.StringIO()) == 0
    ended = int(time.time() * 1000)
    records = read_partitions(broker.bootstrap_servers, "rsvps-future", 1)[0]
    assert len(records) == 5
    assert all(began <= r.timestamp <= ended for r in records), [r.timestamp - ended for r in records]
    sent_times = sorted(parse_ts(json.loads(r.value)["sent_time"]) for r in records)
    assert sent_times[-1] - sent_times[0] == 4 * 2_000_000  # simulated: 2,000 s apart, up to 2.2 h ahead
