"""One JSON encoding of query answers (tidewater.query.encode.json_value), wherever they are asked.

``tidewater sql --format json``, the table listing and the UI's JSON API used to encode binary,
NaN and nested values each their own way (hex or base64, "nan" or null), so one query answered with
two JSONs. These pin the one encoding and that the CLI and the UI both go through it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from types import MappingProxyType

from tidewater.query import cli as query_cli
from tidewater.query.encode import json_text, json_value
from tidewater.query.sql import QueryResult
from tidewater.ui import format as ui_format

WHEN = dt.datetime(2026, 11, 21, 10, 0, 5, 123456, tzinfo=dt.UTC)


def test_values_json_has_no_type_for() -> None:
    assert json_value(WHEN) == "2026-11-21T10:00:05.123456+00:00"
    assert json_value(WHEN.date()) == "2026-11-21" and json_value(dt.time(10, 0)) == "10:00:00"
    assert json_value(dt.timedelta(minutes=1, milliseconds=500)) == 60.5
    assert json_value(decimal.Decimal("1.50")) == "1.50"  # as text: a float would round it
    assert json_value(b"\x00\x01") == json_value(bytearray(b"\x00\x01")) == json_value(memoryview(b"\x00\x01"))
    assert json_value(b"\x00\x01") == "AAE="  # base64
    assert [json_value(v) for v in (math.nan, math.inf, -math.inf, 1.5)] == [None, None, None, 1.5]
    assert [json_value(v) for v in (None, True, 3, "x")] == [None, True, 3, "x"]


def test_nested_values() -> None:
    nested = {"t": (WHEN, {b"\x01"}), 2: MappingProxyType({"d": decimal.Decimal("2")}), "f": frozenset({math.nan})}
    assert json_value(nested) == {"t": ["2026-11-21T10:00:05.123456+00:00", ["AQ=="]], "2": {"d": "2"}, "f": [None]}
    text = json_text([nested, "é"])
    assert json.loads(text) == [json_value(nested), "é"] and "\\u00e9" in text
    assert "é" in json_text("é", ensure_ascii=False)


def test_the_cli_and_the_ui_answer_a_query_with_the_same_json() -> None:
    result = QueryResult(
        columns=["t", "b", "x", "n"],
        rows=[[WHEN, b"\xff", math.nan, [decimal.Decimal("0.1"), None]]],
        page=1,
        page_size=10,
        has_more=False,
        tables={"rsvps.silver@v2": {"version": 2, "as_of": ["latest"]}},
        elapsed_s=0.01,
        types=["timestamp[us, tz=UTC]", "binary", "double", "list<decimal128(3, 1)>"],
    )
    as_json = json.loads(result.to_json())  # what `tidewater sql --format json` prints
    assert as_json == result.as_dict()  # what /tidewater/api/sql answers
    assert as_json["rows"] == [["2026-11-21T10:00:05.123456+00:00", "/w==", None, ["0.1", None]]]
    # Text and CSV cells show binary as hex, nested values as that JSON; the UI's cells too.
    assert query_cli._csv_value(result.rows[0][3]) == '["0.1", null]'
    assert query_cli._cell(result.rows[0][1], "NULL") == "ff"
    assert ui_format.cell_text(result.rows[0][3]) == '["0.1", null]'
    assert ui_format.json_value is json_value
