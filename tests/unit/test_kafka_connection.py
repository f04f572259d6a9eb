"""One translation of the Kafka connection settings (tidewater.connectors.kafka_client.KafkaConnection).

The generator's producer and admin client, the offset probe, the Spark source (whose options travel
to the executors as strings) and its librdkafka reader all connect from the same settings; these
tests pin that each spelling carries every setting, so a cluster with SASL and a CA file is reached
the same way by every client.
"""

from __future__ import annotations

import dataclasses

import pytest

from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaConnection, kafka_python_config, librdkafka_connection
from tidewater.connectors.kafka_confluent import librdkafka_config
from tidewater.connectors.kafka_source import KafkaSourceOptions, source_options
from tidewater.errors import ConfigError

SECURED = Settings(
    kafka_bootstrap_servers="k1:9093, k2:9093",
    kafka_security_protocol="SASL_SSL",
    kafka_sasl_mechanism="SCRAM-SHA-512",
    kafka_sasl_username="tidewater",
    kafka_sasl_password="s3cret",
    kafka_ssl_cafile="/etc/kafka/ca.pem",
    kafka_request_timeout_ms=7000,
)
KAFKA_PYTHON = {
    "bootstrap_servers": ["k1:9093", "k2:9093"],
    "security_protocol": "SASL_SSL",
    "request_timeout_ms": 7000,
    "bootstrap_timeout_ms": 7000,
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "tidewater",
    "sasl_plain_password": "s3cret",
    "ssl_cafile": "/etc/kafka/ca.pem",
}


def test_every_connection_field_is_a_setting() -> None:
    for f in dataclasses.fields(KafkaConnection):
        assert hasattr(SECURED, f"kafka_{f.name}"), f"KafkaConnection.{f.name} has no setting kafka_{f.name}"


def test_kafka_python_spelling() -> None:
    assert kafka_python_config(SECURED) == KAFKA_PYTHON
    plain = kafka_python_config(Settings(kafka_bootstrap_servers="k1:9092"))
    assert plain == {
        "bootstrap_servers": ["k1:9092"],
        "security_protocol": "PLAINTEXT",
        "request_timeout_ms": 15000,
        "bootstrap_timeout_ms": 15000,
    }


def test_the_spark_source_connects_as_the_settings_say() -> None:
    """Settings -> source options (strings, as Spark passes them to executors) -> the source's client
    config: the same dict the other clients use, for either reader backend."""
    options = source_options(SECURED, "rsvps")
    assert options["kafka.bootstrap.servers"] == "k1:9093, k2:9093"
    assert options["kafka.sasl.username"] == "tidewater" and options["kafka.ssl.cafile"] == "/etc/kafka/ca.pem"
    parsed = KafkaSourceOptions.parse(options)
    assert parsed.client_config == kafka_python_config(SECURED)
    lowered = KafkaSourceOptions.parse({k.lower(): v for k, v in options.items()})  # Spark may lower-case keys
    assert lowered.client_config == parsed.client_config
    assert "kafka.sasl.mechanism" not in source_options(Settings(kafka_bootstrap_servers="k1:9092"), "t")


def test_librdkafka_spelling_is_derived_from_the_kafka_python_one() -> None:
    assert librdkafka_connection(KAFKA_PYTHON) == {
        "bootstrap.servers": "k1:9093,k2:9093",
        "security.protocol": "sasl_ssl",
        "socket.timeout.ms": 7000,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "tidewater",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }
    reader = librdkafka_config(KafkaSourceOptions.parse(source_options(SECURED, "rsvps")).client_config)
    assert reader.items() >= librdkafka_connection(KAFKA_PYTHON).items()
    assert reader["group.id"] == "tidewater-source" and reader["enable.auto.commit"] is False


def test_no_servers_is_one_line_for_every_client() -> None:
    empty = Settings(kafka_bootstrap_servers="")
    for build in (kafka_python_config, lambda s: source_options(s, "t"), KafkaConnection.of):
        with pytest.raises(ConfigError, match=r"^TIDEWATER_KAFKA_BOOTSTRAP_SERVERS is empty: start the platform"):
            build(empty)
    with pytest.raises(ConfigError, match=r"needs option kafka\.bootstrap\.servers"):
        KafkaConnection.from_options({"kafka.bootstrap.servers": " , "})
    for timeout in ("x", "0", "-5", "1.5"):  # one line naming the option, from the options' one parser
        with pytest.raises(ConfigError, match=rf"^tidewater-kafka option kafka\.request\.timeout\.ms='{timeout}' must"):
            KafkaSourceOptions.parse(
                {"kafka.bootstrap.servers": "k:1", "subscribe": "t", "kafka.request.timeout.ms": timeout}
            )
    given = KafkaConnection.from_options({"kafka.bootstrap.servers": "k:1", "KAFKA.REQUEST.TIMEOUT.MS": "2500"})
    assert given.request_timeout_ms == 2500 and given.kafka_python()["request_timeout_ms"] == 2500
