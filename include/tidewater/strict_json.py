"""The strict JSON contract of a payload: what Spark's lenient ``from_json`` lets through, refused.

Spark's JSON reader accepts a number or an object where the schema declares a string (it keeps the
text), ignores what follows the first object (so a second concatenated object, and its event, is
silently lost), keeps the last of duplicate keys and replaces invalid UTF-8 with U+FFFD. A pipeline
parses strictly unless its declaration opts into leniency: :func:`violation` says why a payload
breaks the declared schema, or None when it holds. It runs in Spark's Python workers, one call per
record: in the stream's Kafka reader as it decodes the records (``payloadContract``, see
:mod:`tidewater.connectors.kafka_source`), in an Arrow UDF where rows come from bronze (see
:func:`tidewater.transforms.parse_payload`). It is pure, so it is unit-tested without Spark.

Rules: bytes are UTF-8; the payload is exactly one JSON object (surrounding whitespace allowed);
no key repeats within an object; a declared string is a JSON string, an integer a JSON integer
within 64 bits, a double a JSON number (integers allowed), a boolean a JSON boolean, a timestamp
or date a JSON string (its format is judged by the typed parse), a struct a JSON object; ``null``
is allowed everywhere (required-ness is the contract's business). Undeclared keys are allowed.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any

import msgspec
import pyarrow as pa

# The column that carries each payload's reason beside its record, where the check runs before Spark's
# parse (the Kafka source's ``payloadContract`` option; see tidewater.transforms.parse_payload).
REASON_COLUMN = "_strict_error"
INT64 = msgspec.Meta(ge=-(2**63), le=2**63 - 1)
MAX_REASON = 200


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKeyError(key)
        seen[key] = value
    return seen


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _python_type(spark_type: dict[str, Any] | str) -> Any:
    """A Spark type (its JSON form) -> the msgspec type that accepts exactly its JSON spelling, or null."""
    if isinstance(spark_type, dict) and spark_type.get("type") == "struct":
        return _struct(json.dumps(spark_type, sort_keys=True)) | None
    if isinstance(spark_type, dict) and spark_type.get("type") == "array":
        return list[_python_type(spark_type["elementType"])] | None  # type: ignore[misc]
    if isinstance(spark_type, dict) and spark_type.get("type") == "map":
        return dict[str, _python_type(spark_type["valueType"])] | None  # type: ignore[misc]
    name = str(spark_type)
    if name in ("string", "timestamp", "timestamp_ntz", "date", "binary") or name.startswith(("char", "varchar")):
        return str | None
    if name in ("long", "integer", "short", "byte"):
        return Annotated[int, INT64] | None
    if name in ("double", "float") or name.startswith("decimal"):
        return float | None
    if name == "boolean":
        return bool | None
    return Any


@lru_cache(maxsize=64)
def _struct(schema_json: str) -> type:
    schema = json.loads(schema_json)
    fields = [(f["name"], _python_type(f["type"]), None) for f in schema["fields"]]
    return msgspec.defstruct("Payload", fields, forbid_unknown_fields=False, gc=False)


@lru_cache(maxsize=16)
def _decoder(schema_json: str) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(_struct(schema_json), strict=True)


def contract_problem(schema_json: str) -> str | None:
    """Why ``schema_json`` is not a contract the check can hold payloads to (not a Spark schema as
    JSON, ``StructType.json()``), or None: a bad contract is a configuration error, found before any
    record is read."""
    try:
        _decoder(schema_json)
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, not a struct's fields, a field without a name
        return f"not a Spark schema as JSON (StructType.json()): {type(exc).__name__}: {_short(str(exc))}"
    return None


def violation(raw: bytes | None, schema_json: str) -> str | None:
    """Why ``raw`` breaks the strict contract of the Spark schema ``schema_json`` (``StructType.json()``),
    or None. Never raises: anything unexpected is itself a reason."""
    return _checked(raw, schema_json)[0]


def _checked(raw: bytes | None, schema_json: str) -> tuple[str | None, Any]:
    """(:func:`violation`, the payload decoded as the contract's struct where it holds, else None)."""
    if raw is None:
        return "payload is null", None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"payload is not valid UTF-8 (byte {exc.start})", None
    try:
        decoded = _decoder(schema_json).decode(raw)
    except msgspec.ValidationError as exc:
        return _short(f"payload does not match the contract: {exc}"), None
    except msgspec.DecodeError as exc:
        return _short(f"malformed JSON: {str(exc).removeprefix('JSON is malformed: ')}"), None
    except RecursionError:
        return "malformed JSON: nested too deeply", None
    except Exception as exc:  # the contract must never crash a query
        return _short(f"payload could not be checked: {type(exc).__name__}: {exc}"), None
    if _surely_no_duplicate_keys(raw):
        return None, decoded
    try:  # msgspec keeps the last of duplicate keys; the standard parser tells us about them
        json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKeyError as exc:
        return _short(f"malformed JSON: duplicate key {str(exc)!r}"), None
    except RecursionError:
        return "malformed JSON: nested too deeply", None
    except ValueError as exc:
        return _short(f"malformed JSON: {exc}"), None
    return None, decoded


def reasons(payloads: pa.Array | pa.ChunkedArray, schema_json: str) -> pa.Array:
    """:func:`violation` of every payload of an Arrow column (binary), as a string column."""
    return pa.array([violation(v, schema_json) for v in payloads.to_pylist()], pa.string())


def reasons_and_decoded(payloads: pa.Array | pa.ChunkedArray, schema_json: str) -> tuple[pa.Array, list[Any]]:
    """:func:`reasons`, and each payload decoded as the contract's struct where it holds (else None):
    what :mod:`tidewater.json_columns` types, from the one decode the check made."""
    reasons, decoded = [], []
    for payload in payloads.to_pylist():  # one short-lived pair a record: no work for the collector
        reason, value = _checked(payload, schema_json)
        reasons.append(reason)
        decoded.append(value)
    return pa.array(reasons, pa.string()), decoded


def blank(struct_json: str) -> Any:
    """An instance of the contract's struct for ``struct_json`` with every field None."""
    return _struct(struct_json)()


def _surely_no_duplicate_keys(raw: bytes) -> bool:
    """True when no object of ``raw`` repeats a key, decided at msgspec's speed (the exact check below
    costs ~5x more per record). Decoding keeps one copy of a repeated key, so the decoded value encodes
    back to the payload's own minified text only if no key repeated. False (a repeated key, or numbers
    or escapes spelled otherwise than msgspec spells them) leaves the decision to the exact check.
    A payload already minified as msgspec spells it (every generator's here) is compared as it is,
    without minifying it again: 2.1-2.2 µs against 3.2 for 200k rsvps payloads."""
    try:
        again = msgspec.json.encode(msgspec.json.decode(raw))
        return again == raw or again == msgspec.json.format(raw, indent=-1)
    except Exception:
        return False


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
