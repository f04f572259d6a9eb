"""Shared fixtures: a real tansu broker, a real local SparkSession, a real moto S3 server.

Every process a fixture starts is stopped by PID in its finalizer, also when tests fail.
Markers (broker, spark, s3) are added from the fixtures a test uses, so ``-m "not spark"``
gives a fast subset while working.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidewater.broker import DurableBroker, EmbeddedBroker, free_port
from tidewater.config import Settings
from tidewater.lake import storage

ROOT = Path(__file__).resolve().parents[1]
S3_BUCKET = "tidewater-test"
MARKED_FIXTURES = {"broker": "broker", "spark": "spark", "s3_server": "s3", "airflow_home": "airflow"}

# The suite's JVMs live seconds to a minute: they run without the C2 compiler (Settings.spark_java_options;
# measured in the README). Every Settings a test builds has it as its default, and every child process
# that reads its settings from the environment gets it too. Unit tests that check exact JVM options
# state the options they expect.
SUITE_SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
Settings.__init__.__kwdefaults__["spark_java_options"] = SUITE_SPARK_JAVA_OPTIONS
os.environ.setdefault("TIDEWATER_SPARK_JAVA_OPTIONS", SUITE_SPARK_JAVA_OPTIONS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in MARKED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def make_topic(broker: EmbeddedBroker) -> Callable[..., str]:
    """Create a fresh topic (unique name) with N partitions."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    def create(partitions: int = 4, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            admin.close()
        return name

    return create


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1 (MinIO cannot be installed here), with one bucket."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import boto3

        deadline = time.monotonic() + 30
        while True:
            try:
                client = boto3.client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id="testing",
                    aws_secret_access_key="testing",
                    region_name="us-east-1",
                )
                client.create_bucket(Bucket=S3_BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield endpoint
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


@pytest.fixture(scope="session")
def s3_env(s3_server: str) -> Iterator[dict[str, str]]:
    """AWS_* and TIDEWATER_S3_* variables for the moto server (set for the whole session, so Spark's
    Python workers, which inherit the JVM's environment, see them too)."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "TIDEWATER_S3_ENDPOINT_URL": s3_server,
        "TIDEWATER_S3_ALLOW_HTTP": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage.reset_cache()
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    storage.reset_cache()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]):
    """One local[2] SparkSession for the whole run (starting one costs ~10 s)."""
    from tidewater.spark import build_session

    state = tmp_path_factory.mktemp("spark-state")
    # build_session exports these settings to the environment: they must carry the moto endpoint,
    # or the defaults (no endpoint) would overwrite what s3_env set, for the driver and the workers.
    # This JVM lives as long as the run and runs most of its Spark work: it keeps the C2 compiler (with C1
    # only, the suite used 19% less CPU in all, but tests on this session ran up to 1.5x longer).
    settings = Settings(
        state_dir=str(state),
        s3_endpoint_url=s3_env["TIDEWATER_S3_ENDPOINT_URL"],
        s3_allow_http=True,
        spark_java_options="",
    )
    session = build_session(settings, "tidewater-tests")
    os.environ["TIDEWATER_SPARK_JAVA_OPTIONS"] = SUITE_SPARK_JAVA_OPTIONS  # for the jobs it starts, not ours
    storage.reset_cache()
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted in this test's temporary directory (no broker)."""
    return Settings(state_dir=str(tmp_path / "state"), kafka_request_timeout_ms=5000)


@pytest.fixture
def kafka_settings(settings: Settings, broker: EmbeddedBroker) -> Settings:
    return settings.replace(kafka_bootstrap_servers=broker.bootstrap_servers)


@pytest.fixture
def rsvp_settings(kafka_settings: Settings, make_topic: Callable[..., str]) -> Settings:
    """Settings with a unique topic prefix (so tests never share the rsvps topic), its topic created."""
    from tidewater.generator.producer import ensure_topic
    from tidewater.pipelines import get_pipeline

    prefix = make_topic(partitions=1, prefix="unused") + "-"
    settings = kafka_settings.replace(kafka_topic_prefix=prefix)
    ensure_topic(settings, settings.topic(get_pipeline("rsvps").source().topic), 4)
    return settings


@pytest.fixture
def lake_uri(tmp_path: Path) -> str:
    return (tmp_path / "lake").as_uri()


@pytest.fixture
def s3_lake_uri(s3_env: dict[str, str]) -> str:
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory):
    """A real Airflow metadata database (SQLite), migrated once for the session's DAG tests."""
    from airflow_helpers import AirflowTestHome

    home = AirflowTestHome(Settings(state_dir=str(tmp_path_factory.mktemp("airflow-state")), airflow_port=free_port()))
    env = home.env()
    result = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return home


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[DurableBroker]:
    """A tansu broker whose log lives in a bucket of an embedded SeaweedFS S3 server, both real
    processes with their data in this test's folder; both stopped by PID, also when the test fails."""
    running = DurableBroker(tmp_path / "durable-broker", log_dir=tmp_path)
    try:
        yield running.start()
    finally:
        running.stop()
