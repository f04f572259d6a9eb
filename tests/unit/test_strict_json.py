"""The strict JSON contract (tidewater.strict_json): what Spark's lenient reader lets through is refused."""

from __future__ import annotations

import pytest

from tidewater.pipelines.rsvps import PAYLOAD
from tidewater.strict_json import contract_problem, violation

SCHEMA = PAYLOAD.json()
VALID = (
    b'{"event_id":"e1","event_time":"2026-11-21T10:00:00Z","producer_id":"p","seq_no":1,'
    b'"visibility":"public","response":"yes","venue":{"venue_id":1,"venue_name":"v","lat":1.5,"lon":2},'
    b'"member":{"member_id":3,"member_name":"m"}}'
)


def test_a_valid_payload_passes() -> None:
    assert violation(VALID, SCHEMA) is None
    assert violation(b'  {"event_id": null}\n', SCHEMA) is None  # whitespace and null are fine
    assert violation(b'{"event_id":"e","unknown":{"deep":[1,2,{"x":null}]}}', SCHEMA) is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"event_id":12}', "Expected `str | null`, got `int` - at `$.event_id`"),
        (b'{"event_id":{"a":1}}', "got `object` - at `$.event_id`"),
        (b'{"venue":{"lat":"12.5"}}', "Expected `float | null`, got `str` - at `$.venue.lat`"),
        (b'{"seq_no":1.5}', "got `float` - at `$.seq_no`"),
        (b'{"seq_no":99999999999999999999}', "at `$.seq_no`"),
        (b'{"event_time":1700000000}', "got `int` - at `$.event_time`"),
        (b'{"event_id":"a"} trailing', "trailing characters"),
        (b'{"event_id":"a"}{"event_id":"b"}', "trailing characters"),
        (b'{"event_id":"a","event_id":"b"}', "duplicate key 'event_id'"),
        (b'{ "event_id": "a", "event_id": "a" }', "duplicate key 'event_id'"),  # not minified
        (b'{"member":{"member_id":1,"member_id":1}}', "duplicate key 'member_id'"),
        # repeated keys where msgspec spells numbers or escapes otherwise (the exact check decides)
        (b'{"venue":{"lat":1.0e3,"lat":2}}', "duplicate key 'lat'"),
        (b'{"event_id":"\\u00e9","x":{"k":1,"k":1}}', "duplicate key 'k'"),
        (b'{"unknown":{"a":[{"b":1,"b":1}]}}', "duplicate key 'b'"),
        (b'{"event_id":"\xff\xfe"}', "not valid UTF-8"),
        (b"\xc3\x28", "not valid UTF-8"),
        (b'{"venue":{"lat":NaN}}', "malformed JSON"),
        (b'{"venue":{"lat":1e999}}', "at `$.venue.lat`"),
        (b"[1, 2]", "Expected `object`, got `array`"),
        (b'"just a string"', "Expected `object`"),
        (b"", "malformed JSON"),
        (b'{"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
        (None, "payload is null"),
    ],
)
def test_lenient_spellings_are_refused_with_a_reason(raw: bytes | None, reason: str) -> None:
    found = violation(raw, SCHEMA)
    assert found is not None and reason in found, found


@pytest.mark.parametrize(
    "raw",
    [
        b'{"venue":{"lat":1.0e3,"lon":-0.0}}',  # spelled otherwise than msgspec would: the exact check runs
        b'{ "event_id" : "a",\n  "venue": {"lat": 1.5} }',  # whitespace: minified before it is compared
        b'{"event_id":"caf\\u00e9 \\/"}',
        b'{"member":{"member_name":"\xc3\xa9"},"other":{"member_name":1}}',  # same key in two objects
    ],
)
def test_payloads_without_repeated_keys_pass_either_way(raw: bytes) -> None:
    assert violation(raw, SCHEMA) is None


def test_reasons_stay_short() -> None:
    found = violation(b'{"event_id":"' + b"x" * 100_000 + b'"} garbage', SCHEMA)
    assert found is not None and len(found) <= 200


def test_a_contract_is_a_spark_schema_as_json() -> None:
    assert contract_problem(SCHEMA) is None
    for bad in ("", "{", '{"fields": 3}', '{"type":"struct","fields":[{"name":"n"}]}'):
        problem = contract_problem(bad)
        assert problem is not None and problem.startswith("not a Spark schema as JSON (StructType.json()): ")
