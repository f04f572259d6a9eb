"""Hostile Kafka records for the property-based, fuzz and chaos tests: the whole domain of every field.

``records()`` is a Hypothesis strategy of :class:`Hostile` records (payload bytes, key, headers,
Kafka timestamp): RSVP payloads whose fields range over their type's whole domain (timestamps from
year 1 to 9999 and beyond what Spark parses, NaN and infinities, empty, huge and NUL-laden strings,
64-bit overflow, deep nesting), the lenient spellings the strict contract refuses (numbers for
strings, trailing data, concatenated objects, duplicate keys, invalid UTF-8), and random bytes.
``corpus()`` loads ``tests/corpus/hostile_records.jsonl``: every input that ever broke a writer or a
query, kept as a regression case.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from tidewater.connectors.kafka_client import numbered_records

CORPUS = Path(__file__).parent / "corpus" / "hostile_records.jsonl"
NOW_MS = int(dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC).timestamp() * 1000)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Hostile:
    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = NOW_MS
    headers: tuple[tuple[str, bytes | None], ...] = ()
    note: str = ""
    event_id: str | None = field(default=None, compare=False)  # when the payload is a valid-looking event


def _text(max_size: int = 40) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(["", "\x00", "a\x00b", "\u2028", "😀" * 3, "'; DROP TABLE x; --", "%s%n", "\\", '"']),
        st.builds(lambda n: "x" * n, st.integers(10_000, 60_000)),
    )


def _timestamp_text() -> st.SearchStrategy[Any]:
    instants = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59))
    return st.one_of(
        instants.map(lambda d: d.isoformat() + "Z"),
        instants.map(lambda d: f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:00Z"),
        st.sampled_from(
            [
                "0999-12-31T23:59:59Z",
                "0001-01-01T00:00:00Z",
                "9999-12-31T23:59:59.999999Z",
                "+10000-01-01T00:00:00Z",
                "-0001-01-01T00:00:00Z",
                "0000-01-01T00:00:00Z",
                "2026-02-30T00:00:00Z",
                "2026-11-21T10:00:00+14:00",
                "2026-11-21 10:00:00",
                "yesterday",
                "",
            ]
        ),
        st.integers(*INT64),
        st.floats(allow_nan=True, allow_infinity=True),
        st.none(),
    )


def _number() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(*INT64),
        st.integers(min_value=2**63, max_value=2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(["12.5", "1e999", None, True]),
    )


class _Nested:
    """An undeclared member nested ``depth`` levels deep, spelled out as text (json.dumps would recurse)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def text(self) -> str:
        return '{"n":' * self.depth + "1" + "}" * self.depth


@st.composite
def _payload_dict(draw: st.DrawFn) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "event_id": draw(st.one_of(st.uuids().map(str), _text(), st.integers(), st.none())),
        "event_time": draw(_timestamp_text()),
        "sent_time": draw(_timestamp_text()),
        "producer_id": draw(st.one_of(_text(12), st.none())),
        "seq_no": draw(_number()),
        "visibility": draw(st.sampled_from(["public", "members", "", "PUBLIC", None])),
        "response": draw(st.sampled_from(["yes", "no", "waitlist", "maybe", None])),
        "venue": draw(
            st.one_of(
                st.fixed_dictionaries(
                    {"venue_id": _number(), "venue_name": _text(), "lat": _number(), "lon": _number()}
                ),
                st.none(),
                st.just("not an object"),
            )
        ),
        "member": draw(st.one_of(st.fixed_dictionaries({"member_id": _number(), "member_name": _text()}), st.none())),
    }
    if draw(st.booleans()):
        payload["extra"] = _Nested(draw(st.sampled_from([1, 10, 100, 2_000])))
    return payload


def _encode(payload: dict[str, Any]) -> bytes:
    nested = payload.pop("extra", None)
    text = json.dumps(payload, ensure_ascii=False, allow_nan=True)
    if isinstance(nested, _Nested):
        text = text[:-1] + ',"extra":' + nested.text() + "}"
    return text.encode("utf-8", "surrogatepass")


@st.composite
def _payload_bytes(draw: st.DrawFn) -> tuple[bytes, str | None]:
    kind = draw(st.sampled_from(["event", "event", "event", "lenient", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)), None
    payload = draw(_payload_dict())
    event_id = payload["event_id"] if isinstance(payload["event_id"], str) else None
    body = _encode(payload)
    if kind == "lenient":
        body = draw(
            st.sampled_from(
                [
                    body + b" trailing",
                    body + body,
                    body[:-1] + b',"response":"no"}',
                    body.replace(b'"event_id"', b'"event_id":"dup","event_id"', 1),
                    b"\xff" + body,
                    body[: len(body) // 2],
                ]
            )
        )
    return body, event_id


@st.composite
def records(draw: st.DrawFn) -> Hostile:
    body, event_id = draw(_payload_bytes())
    key = draw(st.one_of(st.none(), st.binary(max_size=50), st.builds(lambda n: b"k" * n, st.integers(1_000, 10_000))))
    timestamp = draw(
        st.one_of(
            st.just(NOW_MS),
            st.integers(NOW_MS - 10**9, NOW_MS + 10**6),
            st.integers(*INT64),
            st.sampled_from([-1, 0, 253402300799000, 2**63 - 1]),
        )
    )
    headers = draw(st.lists(st.tuples(_text(20), st.one_of(st.none(), st.binary(max_size=100))), max_size=3).map(tuple))
    return Hostile(body, key, timestamp, headers, event_id=event_id)


def corpus() -> list[Hostile]:
    """The regression cases: every input that once broke a writer or a query."""
    out = []
    for line in CORPUS.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        value = base64.b64decode(item["value_b64"]) if "value_b64" in item else item["value"].encode("utf-8")
        key = base64.b64decode(item["key_b64"]) if item.get("key_b64") else None
        out.append(Hostile(value, key, int(item.get("timestamp_ms", NOW_MS)), note=item["note"]))
    return out


def kafka_batch(
    items: Iterable[Hostile], *, topic: str = "hostile", partitions: int = 4, first_offset: int = 0
) -> pa.RecordBatch:
    """Hostile records as the Kafka source hands them to Spark (same conversion of timestamps), spread
    over ``partitions`` with offsets from ``first_offset`` on."""
    records = ((i % partitions, item.key, item.value, item.timestamp_ms, item.headers) for i, item in enumerate(items))
    return numbered_records(topic, records, first_offset=first_offset)
