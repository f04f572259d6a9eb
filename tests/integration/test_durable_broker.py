"""The durable embedded broker: tansu keeping its log in a bucket of the embedded SeaweedFS server.

Real processes throughout (``weed mini``, tansu). A broker stopped with SIGTERM or SIGKILL and started
again on the same bucket and port keeps its topics, records, offsets and committed group offsets. (A
producer and a running stream riding through the broker's kill -9, with every produced offset in the
lake exactly once, are tested on the cluster profile, whose broker is this one:
tests/integration/test_cluster_profile.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from tidewater.broker import DurableBroker
from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaPythonClient
from tidewater.orchestration.platform import PlatformState
from tidewater.s3server import GRPC_OFFSET, S3Server, S3ServerError


def test_s3_server_listens_on_loopback_only_and_keeps_its_credentials(tmp_path: Path):
    import stat
    import subprocess

    data = tmp_path / "s3"
    server = S3Server(data, buckets=["one", "two"])
    try:
        server.start()
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        mine = [line.split()[3] for line in listening.splitlines() if f"pid={server.pid}," in line]
        assert mine and all(address.startswith("127.0.0.1:") for address in mine), mine
        assert {int(a.rsplit(":", 1)[1]) for a in mine} == {
            p + offset for p in server.ports.values() for offset in (0, GRPC_OFFSET)
        }
        assert {b["Name"] for b in server.client().list_buckets()["Buckets"]} == {"one", "two"}
        server.client().put_object(Bucket="two", Key="k", Body=b"v")
        for name in ("credentials.json", "s3.json", "server.json"):
            assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
        with pytest.raises(S3ServerError, match="already runs"):
            S3Server(data).start()  # one server per folder
        first = (server.credentials, dict(server.ports))
        server.kill()
        server = S3Server(data, buckets=["one", "two"]).start()  # same credentials, ports and objects
        assert (server.credentials, server.ports) == first
        assert server.client().get_object(Bucket="two", Key="k")["Body"].read() == b"v"
    finally:
        server.stop()
    assert not list(Path("/tmp").glob(f"seaweedfs-*-{server.port}.sock"))


def test_platform_resumes_on_the_same_broker_log_and_archives_otherwise(tmp_path: Path):
    state = PlatformState(Settings(state_dir=str(tmp_path / "state")))
    offsets = state.settings.checkpoint_dir / "live" / "rsvps" / "bronze" / "offsets"

    def last_run() -> None:
        offsets.mkdir(parents=True, exist_ok=True)
        (offsets / "0").write_text("v1")
        (state.dir / "lake").mkdir(exist_ok=True)

    assert state.resume_or_archive("log-a") is None  # the first run: nothing to keep or move
    last_run()
    assert state.resume_or_archive("log-a") is None  # the same durable log: resume
    assert (offsets / "0").exists()
    archived = state.resume_or_archive("log-b")  # another log (the broker folder was deleted)
    assert archived is not None and (archived / "checkpoints" / "live" / "rsvps" / "bronze" / "offsets").exists()
    assert not offsets.exists() and (archived / "lake").exists()
    last_run()
    assert state.resume_or_archive(None) is not None  # the in-memory broker: always a new log
    last_run()
    assert state.resume_or_archive(None) is not None
    last_run()
    assert state.resume_or_archive("log-b") is not None  # after an in-memory run, even a known log
    assert state.read()["broker_identity"] == "log-b"


@pytest.mark.broker
def test_platform_stops_the_broker_a_killed_platform_left_running(tmp_path: Path):
    state = PlatformState(Settings(state_dir=str(tmp_path / "state")))
    left = DurableBroker(state.broker_dir, log_dir=tmp_path)
    try:
        left.start()
        pids = left.pids
        state.record(broker_pid=pids["broker"], s3_server_pid=pids["s3_server"])
        assert left.is_ours(pids["broker"]) and left.is_ours(pids["s3_server"])
        assert not left.is_ours(os.getpid()) and not DurableBroker(tmp_path / "other").is_ours(pids["s3_server"])
        stopped = state.stop_orphans()  # what the next platform start does first
        assert len(stopped) == 2
        for process in (left.broker.process, left.s3.process):  # type: ignore[union-attr]
            assert process is not None and process.wait(timeout=20) is not None
        assert state.read()["broker_pid"] is None
    finally:
        left.stop()


def topic_contents(bootstrap: str, topic: str, partitions: int) -> tuple[dict[int, int], list[tuple[int, int, bytes]]]:
    """End offsets (from a fetch's high watermark, as the Spark source reads them) and every record."""
    client = KafkaPythonClient({"bootstrap_servers": [bootstrap], "request_timeout_ms": 5000})
    try:
        ends = client.end_offsets(topic, list(range(partitions)))
        records = []
        for partition in range(partitions):
            for batch in client.read_arrow(topic, partition, 0, ends[partition]):
                cols = batch.to_pydict()
                records += list(zip(cols["partition"], cols["offset"], cols["value"], strict=True))
    finally:
        client.close()
    return ends, records


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    try:
        futures = [producer.send(topic, value=v, partition=i % 2) for i, v in enumerate(values)]
        producer.flush(timeout=30)
        return [(f.get(timeout=0).partition, f.get(timeout=0).offset) for f in futures]
    finally:
        producer.close()


@pytest.mark.broker
def test_topic_records_and_group_offsets_survive_restarts(durable_broker: DurableBroker, tmp_path: Path):
    bootstrap, topic = durable_broker.bootstrap_servers, "durable"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        admin.close()
    produce(bootstrap, topic, [f"a{i}".encode() for i in range(400)])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="g", enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(123, "", -1)})
        consumer.commit({TopicPartition(topic, 1): OffsetAndMetadata(45, "", -1)})
    finally:
        consumer.close()
    before = topic_contents(bootstrap, topic, 2)
    assert before[0] == {0: 200, 1: 200}
    identity = durable_broker.identity

    for kill in (False, True):  # SIGTERM, then SIGKILL: same port, same bucket
        durable_broker.restart_broker(kill=kill)
        assert durable_broker.bootstrap_servers == bootstrap
        assert topic_contents(bootstrap, topic, 2) == before
        assert committed(bootstrap, "g", topic, 2) == {0: 123, 1: 45}
        ends = before[0]
        new = produce(bootstrap, topic, [f"after-{kill}-{i}".encode() for i in range(4)])
        assert sorted(new) == [(0, ends[0]), (0, ends[0] + 1), (1, ends[1]), (1, ends[1] + 1)]  # offsets continue
        before = topic_contents(bootstrap, topic, 2)

    # Both processes killed with SIGKILL, then a new DurableBroker on the same folder: the same log.
    assert durable_broker.broker is not None
    durable_broker.broker.kill()
    durable_broker.s3.kill()
    again = DurableBroker(durable_broker.data_dir, log_dir=tmp_path)
    try:
        again.start()
        assert again.bootstrap_servers == bootstrap  # the recorded port, free again
        assert again.identity == identity
        assert topic_contents(bootstrap, topic, 2) == before
        assert committed(bootstrap, "g", topic, 2) == {0: 123, 1: 45}
    finally:
        again.stop()

    # A deleted folder is a new log, with a new identity.
    fresh = DurableBroker(tmp_path / "fresh", log_dir=tmp_path / "fresh-logs")
    try:
        assert fresh.start().identity != identity
    finally:
        fresh.stop()
