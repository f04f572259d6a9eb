"""The reader's typing of payloads (tidewater.json_columns): exact where it types, null where it leaves a
payload to Spark's from_json. Its parity with from_json itself is held on real Spark in
tests/integration/test_hostile_records.py; here the pure rules, without Spark."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidewater import json_columns, strict_json
from tidewater.errors import ConfigError
from tidewater.pipelines import get_pipeline

SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("at", TimestampType()),
        StructField("count", IntegerType()),
        StructField("seq", LongType()),
        StructField("place", StructType([StructField("name", StringType()), StructField("since", TimestampType())])),
    ]
)
CONTRACT = SCHEMA.json()
UTC = dt.UTC


def typed(*payloads: dict | bytes | None) -> list[dict | None]:
    raw = [p if p is None or isinstance(p, bytes) else json.dumps(p).encode() for p in payloads]
    reasons, column = json_columns.reasons_and_parsed(pa.array(raw, pa.binary()), CONTRACT)
    assert reasons.equals(strict_json.reasons(pa.array(raw, pa.binary()), CONTRACT))
    assert column.type == json_columns.arrow_type(CONTRACT)
    return column.to_pylist()


def test_every_pipelines_payload_is_typed() -> None:
    for name in ("rsvps", "payments", "pageviews", "ads", "vending"):
        for source in get_pipeline(name).sources:
            assert json_columns.typable(source.payload_schema.json()), (name, source.name)


@pytest.mark.parametrize("spark_type", [DateType(), DecimalType(10, 2), FloatType(), ArrayType(StringType())])
def test_a_type_not_typed_exactly_leaves_the_whole_schema_to_spark(spark_type) -> None:
    schema = StructType(
        [StructField("id", StringType()), StructField("nested", StructType([StructField("x", spark_type)]))]
    )
    assert not json_columns.typable(schema.json())


def test_a_valid_payload_is_typed_with_no_corrupt_record() -> None:
    [row] = typed({"id": "a", "at": "2026-11-21T10:00:00.5+01:00", "count": 3, "seq": 2**62, "place": {"name": "x"}})
    assert row == {
        "id": "a",
        "at": dt.datetime(2026, 11, 21, 9, 0, 0, 500_000, tzinfo=UTC),
        "count": 3,
        "seq": 2**62,
        "place": {"name": "x", "since": None},
        "_corrupt_record": None,
    }


def test_missing_fields_nulls_and_undeclared_keys() -> None:
    rows = typed({}, {"id": None, "place": None, "other": [1, 2]}, {"place": {}})
    assert [row is not None for row in rows] == [True, True, True]
    assert rows[0]["id"] is None and rows[0]["place"] is None
    assert rows[1]["place"] is None
    assert rows[2]["place"] == {"name": None, "since": None}


def test_a_payload_that_breaks_the_contract_is_not_typed() -> None:
    assert typed(b"{", b'{"id": 1}', b'{"id":"a","id":"b"}', b"\xff", None) == [None] * 5


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-21T10:00:00",  # no offset: the session's zone decides
        "2026-11-21 10:00:00Z",
        "2026-11-21T10:00:00z",
        "2026-11-21T10:00:00.1234567Z",  # more than microseconds
        "2026-11-21T10:00:00+18:00",  # Java's bound
        "2026-11-21T10:00:00+0100",
        "2026-11-21",
        "0999-12-31T23:59:59Z",
        "2026-02-29T00:00:00Z",
        "1900-02-29T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-11-21T24:00:00Z",
        "2026-11-21T23:59:60Z",
        " 2026-11-21T10:00:00Z",
        "",
        "yesterday",
    ],
)
def test_a_timestamp_in_another_spelling_leaves_the_record_to_spark(text: str) -> None:
    assert typed({"id": "a", "at": text}) == [None]
    assert typed({"id": "a", "place": {"since": text}}) == [None]  # nested too


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-02-29T00:00:00Z", dt.datetime(2024, 2, 29, tzinfo=UTC)),
        ("2000-02-29T23:59:59.999999Z", dt.datetime(2000, 2, 29, 23, 59, 59, 999_999, tzinfo=UTC)),
        ("1000-01-01T00:00:00Z", dt.datetime(1000, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
        ("2026-11-21T10:00:00.1-17:59", dt.datetime(2026, 11, 22, 3, 59, 0, 100_000, tzinfo=UTC)),
        ("2026-11-21T10:00:00-00:00", dt.datetime(2026, 11, 21, 10, tzinfo=UTC)),
    ],
)
def test_canonical_timestamps_are_typed_to_the_microsecond(text: str, expected: dt.datetime) -> None:
    [row] = typed({"at": text})
    assert row is not None and row["at"] == expected


def test_an_integer_beyond_a_32_bit_field_leaves_the_record_to_spark() -> None:
    rows = typed({"count": 2**31 - 1}, {"count": 2**31}, {"count": -(2**31)}, {"count": -(2**31) - 1})
    assert [row and row["count"] for row in rows] == [2**31 - 1, None, -(2**31), None]


def test_a_value_arrow_refuses_leaves_the_whole_batch_to_spark() -> None:
    good = strict_json.blank(CONTRACT)
    good.id = "a"
    bad = strict_json.blank(CONTRACT)
    bad.id = "\ud800"  # a lone surrogate: not UTF-8
    column = json_columns.parsed([good, bad], CONTRACT)
    assert column.to_pylist() == [None, None]
    assert json_columns.parsed([good], CONTRACT).to_pylist()[0]["id"] == "a"


def test_the_ddl_names_the_same_fields_as_the_arrow_type() -> None:
    quoted = StructType([StructField("a`b", LongType()), *SCHEMA.fields])
    ddl = json_columns.spark_ddl(quoted.json())
    assert ddl.startswith("STRUCT<`a``b`: BIGINT, `id`: STRING, `at`: TIMESTAMP, `count`: INT, `seq`: BIGINT")
    assert ddl.endswith("`place`: STRUCT<`name`: STRING, `since`: TIMESTAMP>, `_corrupt_record`: STRING>")
    assert json_columns.arrow_type(quoted.json()).names == [
        "a`b",
        "id",
        "at",
        "count",
        "seq",
        "place",
        "_corrupt_record",
    ]


def test_the_kafka_source_types_only_with_a_contract_it_can_type() -> None:
    from tidewater.connectors.kafka_source import KafkaSourceOptions, checked

    base = {"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:9"}
    options = KafkaSourceOptions.parse({**base, "payloadContract": CONTRACT, "payloadParsed": "true"})
    assert options.schema.endswith(f"_strict_error STRING, _parsed {json_columns.spark_ddl(CONTRACT)}")
    for bad in ({}, {"payloadContract": StructType([StructField("d", DateType())]).json()}):
        with pytest.raises(ConfigError, match="payloadParsed=true needs a payloadContract"):
            KafkaSourceOptions.parse({**base, **bad, "payloadParsed": "true"})
    records = pa.record_batch({"value": pa.array([b'{"id":"a"}', b"{"], pa.binary())})
    out = checked(records, CONTRACT, parsed=True)
    assert out.schema.names == ["value", "_strict_error", "_parsed"]
    assert [row is None for row in out.column("_parsed").to_pylist()] == [False, True]
