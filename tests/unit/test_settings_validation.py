"""Every setting is validated from its declaration, before anything starts, in one actionable line.

``Settings.validate`` runs the check each field declares in its metadata; these tests make sure no
field can be added without one (a number without bounds fails here), and that the values that used
to reach the JVM (a negative trigger, ``lots`` of driver memory, a negative offsets cap...) are
refused as ``TIDEWATER_<NAME>=<value>: what is wrong; what to do``.
"""

from __future__ import annotations

import dataclasses

import pytest

from tidewater.config import CHECK, Check, Range, Settings
from tidewater.errors import ConfigError, one_line

FIELDS = dataclasses.fields(Settings)


@pytest.mark.parametrize("f", FIELDS, ids=[f.name for f in FIELDS])
def test_every_setting_declares_its_check(f: dataclasses.Field) -> None:
    check = f.metadata.get(CHECK)
    assert isinstance(check, Check), f"Settings.{f.name} declares no check: use setting(default, <Check>)"
    if f.type in ("int", "float"):
        assert isinstance(check, Range) and check.bounded, (
            f"Settings.{f.name} is a number without a lower and an upper bound: declare Range(ge/gt=..., le/lt=...)"
        )


def test_defaults_and_their_round_trip_through_the_environment_are_valid(tmp_path) -> None:
    settings = Settings(state_dir=str(tmp_path))
    settings.validate({})
    # Child processes (spark-submit, executors, Airflow tasks) rebuild the settings from to_env().
    assert Settings.from_env(settings.to_env()) == settings


def refused(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    line = one_line(caught.value)
    assert "\n" not in line and line.startswith("ConfigError: TIDEWATER_"), line
    return line


@pytest.mark.parametrize(
    ("name", "value", "fragments"),
    [
        ("TRIGGER_SECONDS", "-1", ["=-1.0: must be > 0", "default (1.0)"]),
        ("TRIGGER_SECONDS", "0", ["=0.0: must be > 0"]),
        ("TRIGGER_SECONDS", "nan", ["=nan: must be a finite number"]),
        ("TRIGGER_SECONDS", "inf", ["=inf: must be a finite number"]),
        ("GOLD_TRIGGER_SECONDS", "-inf", ["finite"]),
        ("TRIGGER_SECONDS", "soon", ["='soon': must be a number > 0"]),
        ("SPARK_DRIVER_MEMORY", "lots", ["='lots': must be a JVM memory size such as 512m, 2g"]),
        ("SPARK_DRIVER_MEMORY", "2gb", ["JVM memory size"]),
        ("SPARK_DRIVER_MEMORY", "-2g", ["JVM memory size"]),
        ("SPARK_DRIVER_MEMORY", "64m", ["at least 450m"]),
        ("STREAM_OFF_HEAP_MEMORY", "256 MB", ["='256 MB': must be a JVM memory size"]),
        ("STREAM_JAVA_OPTIONS", "XX:+UseSerialGC", ["JVM options, each starting with '-'"]),
        ("STREAM_JAVA_OPTIONS", "-XX:+UseSerialGC Xmx2g", ["e.g. -XX:+UseSerialGC"]),
        ("MAX_OFFSETS_PER_TRIGGER", "-5", ["=-5: must be from 1 to"]),
        ("MAX_OFFSETS_PER_TRIGGER", "0", ["from 1"]),
        ("MAX_OFFSETS_PER_TRIGGER", "1.5", ["must be a whole number"]),
        ("SPARK_SHUFFLE_PARTITIONS", "0", ["=0: must be from 1"]),
        ("AIRFLOW_PORT", "70000", ["=70000: must be from 1 to 65535"]),
        ("AIRFLOW_PORT", "0", ["from 1 to 65535"]),
        ("EMBEDDED_BROKER_PORT", "-1", ["from 0 to 65535"]),
        ("KAFKA_BOOTSTRAP_SERVERS", "broker:99999", ["ports 1 to 65535", "'broker:99999'"]),
        ("KAFKA_BOOTSTRAP_SERVERS", "a:9092,,b:9092", ["host:port"]),
        ("S3_ENDPOINT_URL", "http://minio:0", ["http(s)://host[:port]"]),
        ("S3_ENDPOINT_URL", "minio:9000", ["http(s)://host[:port]"]),
        ("KAFKA_REQUEST_TIMEOUT_MS", "-3000", ["from 100 to"]),
        ("TABLE_LOCK_TIMEOUT_SECONDS", "-1", ["from 0 to"]),
        ("STREAM_STALL_SECONDS", "-5", ["> 0"]),
        ("STREAM_STARTUP_SECONDS", "0", ["> 0"]),
        ("STREAM_START_GATE_SECONDS", "-1", ["from 0 to"]),
        ("STREAM_STOP_TIMEOUT_SECONDS", "-1", ["from 0 to"]),
        ("BATCH_SETTLE_MINUTES", "-1", ["from 0 to"]),
        ("CORRECTION_LOOKBACK_HOURS", "0", ["> 0"]),
        ("VACUUM_RETENTION_HOURS", "-1", ["from 0 to"]),
        ("BATCH_MAX_ACTIVE_RUNS", "0", ["from 1 to"]),
        ("AIRFLOW_PARALLELISM", "0", ["from 1 to"]),
        ("KAFKA_TOPIC_PARTITIONS", "0", ["from 1 to"]),
        ("SUPERVISE_SCHEDULE", "every minute", ["cron expression", "@hourly", "@continuous"]),
        ("BATCH_SCHEDULE", "@continuous", ["cron expression"]),  # only the supervisor's runs wait for something
        ("SUPERVISE_WATCH_SECONDS", "0", ["from 1 to"]),
        ("SUPERVISE_POLL_SECONDS", "0", ["from 0.1 to"]),
        ("BATCH_SCHEDULE", "61 * * * *", ["cron expression"]),
        ("BATCH_START_DATE", "yesterday", ["ISO-8601"]),
        ("SILVER_QUERY", "maybe", ["true or false"]),
        ("SPARK_MASTER", "local[0]", ["local[N]"]),
        ("SPARK_MASTER", "cluster", ["spark://host:port"]),
        ("KAFKA_SECURITY_PROTOCOL", "TLS", ["one of PLAINTEXT, SSL"]),
        ("KAFKA_SASL_MECHANISM", "plain", ["one of empty, PLAIN"]),
        ("KAFKA_CLIENT", "java", ["one of kafka-python, confluent"]),
        ("KAFKA_SSL_CAFILE", "/no/such/ca.pem", ["readable file"]),
        ("KAFKA_TOPIC_PREFIX", "my topics/", ["letters, digits"]),
        ("NAMESPACE", "my sandbox!", ["may hold only letters, digits, - and _"]),
        ("NAMESPACE", "café", ["may hold only letters, digits, - and _"]),  # one segment of every path and URI
        ("NAMESPACE", "..", ["may hold only letters, digits, - and _"]),
    ],
)
def test_bad_values_are_one_actionable_line(name: str, value: str, fragments: list[str]) -> None:
    line = refused({f"TIDEWATER_{name}": value})
    assert line.startswith(f"ConfigError: TIDEWATER_{name}="), line
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPARK_DRIVER_MEMORY", "512m"),
        ("SPARK_DRIVER_MEMORY", "2g"),
        ("SPARK_DRIVER_MEMORY", "2G"),
        ("SPARK_DRIVER_MEMORY", "1048576k"),
        ("SPARK_DRIVER_MEMORY", "1T"),
        ("SPARK_DRIVER_MEMORY", "2147483648"),
        ("TRIGGER_SECONDS", "0.25"),
        ("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092"),
        ("KAFKA_BOOTSTRAP_SERVERS", "[::1]:9092"),
        ("KAFKA_BOOTSTRAP_SERVERS", "kafka"),
        ("S3_ENDPOINT_URL", "http://127.0.0.1:9000"),
        ("SPARK_MASTER", "local[*]"),
        ("SPARK_MASTER", "local"),
        ("SPARK_MASTER", "spark://host-a:7077,host-b:7077"),
        ("SUPERVISE_SCHEDULE", "*/5 * * * *"),
        ("SUPERVISE_SCHEDULE", "@continuous"),
        ("MAINTENANCE_SCHEDULE", "@weekly"),
        ("BATCH_START_DATE", "2026-11-21T10:00:00+00:00"),
        ("SILVER_QUERY", "yes"),
        ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        ("NAMESPACE", "sandbox_2026-11-21"),
        ("STREAM_STOP_TIMEOUT_SECONDS", "0"),
        ("STREAM_OFF_HEAP_MEMORY", "0"),  # Spark's pages back on the heap
    ],
)
def test_good_values_pass(name: str, value: str) -> None:
    Settings.from_env({f"TIDEWATER_{name}": value})


def test_overrides_and_direct_construction_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"^TIDEWATER_TRIGGER_SECONDS=-1: must be > 0"):
        Settings.from_env({}, trigger_seconds=-1)
    with pytest.raises(ConfigError, match=r"^TIDEWATER_SPARK_SHUFFLE_PARTITIONS='2': must be a whole number"):
        Settings(spark_shuffle_partitions="2").validate({})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^TIDEWATER_SILVER_QUERY=1: must be true or false"):
        Settings(silver_query=1).validate({})  # type: ignore[arg-type]


def test_cross_field_rules_still_apply() -> None:
    assert "TIDEWATER_KAFKA_SASL_MECHANISM" in refused({"TIDEWATER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    assert "AWS_ACCESS_KEY_ID" in refused({"TIDEWATER_LAKE_ROOT": "s3://bucket/lake"})
    assert "not object storage" in refused({"TIDEWATER_CHECKPOINT_ROOT": "s3://bucket/checkpoints"})
