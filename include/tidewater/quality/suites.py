"""Expectation suites derived from a pipeline's declaration, and the copies kept in the repository.

One suite per audited layer (:data:`LAYERS`) of each source (``<source>/silver`` when a pipeline has
several, see :meth:`Pipeline.table_of`), and one per gold table:

* ``bronze``: every Kafka record once ((topic, partition, offset) unique), lineage present.
* ``records``: the interval's arriving records parsed with the pipeline's schema, before quarantine
  and de-duplication: the data contract as producers kept it. Each expectation tolerates the
  declared share of bad records (``mostly``); beyond it the upstream is broken, not the platform.
* ``silver``: the contract held strictly, column types, ``event_id`` unique, row-count bounds.
* ``gold/<table>``: window keys unique and present, windows well formed, status and revision valid.

The JSON files under ``quality/suites/<pipeline>/`` (or the declared ``suites_dir``) are the
reviewed contract: the audits load them, and ``tidewater audit suites --check`` (run by the tests)
fails when a declaration changed without them (``--write`` regenerates). Row-count bounds are suite
parameters (``{"$PARAMETER": "min_rows"}``) because they scale with the audited interval.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.types import DataType, StructType

from tidewater.errors import ConfigError
from tidewater.pipelines.base import FINAL, PROVISIONAL, Pipeline, Source, StreamJoin
from tidewater.pipelines.contract import Expectation, expectation
from tidewater.times import parse_duration

SUITES_DIR = Path(__file__).parent / "suites"
BRONZE, RECORDS, SILVER, RECONCILIATION = "bronze", "records", "silver", "reconciliation"
LAYERS = (BRONZE, RECORDS, SILVER)  # plus gold/<name> per gold table
MIN_ROWS, MAX_ROWS = "min_rows", "max_rows"
# Spark types of the lineage columns every silver row carries (see tidewater.transforms).
_LINEAGE_TYPES = {
    "kafka_topic": "StringType",
    "kafka_partition": "IntegerType",
    "kafka_offset": "LongType",
    "kafka_timestamp": "TimestampType",
    "ingest_time": "TimestampType",
}


def suite_name(pipeline: Pipeline, layer: str) -> str:
    return f"{pipeline.name}.{layer.replace('/', '.')}"


def layers_of(pipeline: Pipeline) -> tuple[str, ...]:
    own = (pipeline.table_of(source, layer) for source in pipeline.sources for layer in LAYERS)
    return (*own, *(f"gold/{g.name}" for g in pipeline.gold))


def source_layer(pipeline: Pipeline, layer: str) -> tuple[Source, str] | None:
    """(source, bronze|records|silver|reconciliation) of a source's layer name, None for a gold table."""
    for source in pipeline.sources:
        for base in (*LAYERS, RECONCILIATION):
            if pipeline.table_of(source, base) == layer:
                return source, base
    return None


def derive(pipeline: Pipeline, layer: str) -> dict[str, Any]:
    """The suite of ``layer`` as Great Expectations JSON (``name``, ``expectations``, ``meta``)."""
    found = source_layer(pipeline, layer)
    base = found[1] if found else None
    if base == BRONZE:
        expectations = _bronze()
    elif found and base == RECORDS:
        expectations = _records(found[0])
    elif found and base == SILVER:
        expectations = _silver(found[0])
    elif layer.startswith("gold/"):
        expectations = _gold(pipeline, layer.removeprefix("gold/"))
    else:
        raise ConfigError(f"no suite for layer {layer!r}; layers: {', '.join(layers_of(pipeline))}")
    return {
        "name": suite_name(pipeline, layer),
        "expectations": expectations,
        "meta": {"tidewater": {"pipeline": pipeline.name, "layer": layer, "derived_from": "the pipeline declaration"}},
    }


def derive_all(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    return {layer: derive(pipeline, layer) for layer in layers_of(pipeline)}


# ---- the committed copies ------------------------------------------------------------------------------


def suites_root(pipeline: Pipeline) -> Path:
    """Where a pipeline's committed suites live: beside its declaration when it says so (a pipeline
    declared outside tidewater.pipelines keeps them in its own folder), else ``quality/suites/``."""
    return Path(pipeline.suites_dir) if pipeline.suites_dir else SUITES_DIR


def suite_path(pipeline: Pipeline, layer: str, root: Path | None = None) -> Path:
    return (root or suites_root(pipeline)) / pipeline.name / f"{layer.replace('/', '.')}.json"


def render(suite: dict[str, Any]) -> str:
    return json.dumps(suite, indent=2, sort_keys=True) + "\n"


def write_suites(pipeline: Pipeline, root: Path | None = None) -> list[Path]:
    written = []
    for layer, suite in derive_all(pipeline).items():
        path = suite_path(pipeline, layer, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(suite))
        written.append(path)
    return written


def stale_suites(pipeline: Pipeline, root: Path | None = None) -> Iterator[str]:
    """Why each committed suite differs from the declaration (nothing when all match)."""
    for layer, suite in derive_all(pipeline).items():
        path = suite_path(pipeline, layer, root)
        if not path.exists():
            yield f"{path} is missing"
        elif path.read_text() != render(suite):
            yield f"{path} differs from the {pipeline.name} declaration"


def load_suite(pipeline: Pipeline, layer: str, root: Path | None = None) -> dict[str, Any]:
    """The committed suite; refuses one that no longer matches the declaration (regenerate it)."""
    path = suite_path(pipeline, layer, root)
    if not path.exists():
        raise ConfigError(f"no expectation suite at {path}: run `tidewater audit suites --write` and commit it")
    suite = json.loads(path.read_text())
    if render(suite) != render(derive(pipeline, layer)):
        raise ConfigError(
            f"expectation suite {path} is stale: the {pipeline.name} declaration changed; "
            "run `tidewater audit suites --write`, review the diff and commit it"
        )
    return suite


# ---- derivation --------------------------------------------------------------------------------------


def _bronze() -> list[Expectation]:
    lineage = ("topic", "partition", "offset", "kafka_timestamp", "ingest_time")
    return [
        expectation("expect_compound_columns_to_be_unique", column_list=["topic", "partition", "offset"]),
        *(expectation("expect_column_values_to_not_be_null", column=c) for c in lineage),
    ]


def _contract(source: Source) -> list[Expectation]:
    return [e for constraint in source.constraints for e in constraint.expectations()]


def _records(source: Source) -> list[Expectation]:
    quality = source.quality
    mostly = round(1.0 - quality.tolerated_invalid_fraction, 6)
    tolerated = {"notes": f"tolerates {quality.tolerated_invalid_fraction:.2%} of arriving records breaking it"}
    out = [
        {**e, "kwargs": {**e["kwargs"], "mostly": mostly}, "meta": {**e["meta"], **tolerated}}
        for e in _contract(source)
    ]
    out.append(_tolerated_resends(source))
    return out


def _tolerated_resends(source: Source) -> Expectation:
    """The key unique but for the re-sends the source tolerates. Every copy of a re-sent event counts as
    unexpected, hence twice the tolerated share of re-sends."""
    share = source.quality.tolerated_duplicate_fraction
    return expectation(
        "expect_column_values_to_be_unique",
        column=source.key,
        mostly=round(1.0 - 2 * share, 6),
        meta={"notes": f"tolerates {share:.2%} of records being re-sends"},
    )


def _silver(source: Source) -> list[Expectation]:
    types = silver_types(source)
    low, high = source.quality.rows_per_hour
    return [
        *_contract(source),
        # at-least-once silver keeps re-sent copies: held to the records' tolerance instead
        expectation("expect_column_values_to_be_unique", column=source.key)
        if source.deduplicate
        else _tolerated_resends(source),
        *(expectation("expect_column_values_to_be_of_type", column=c, type_=t) for c, t in types.items()),
        expectation(
            "expect_table_row_count_to_be_between",
            min_value={"$PARAMETER": MIN_ROWS} if low is not None else None,
            max_value={"$PARAMETER": MAX_ROWS} if high is not None else None,
            meta={"notes": f"{low} to {high if high is not None else 'any number of'} rows per hour of event time"},
        ),
    ]


def _gold(pipeline: Pipeline, name: str) -> list[Expectation]:
    table = pipeline.gold_table(name)
    start, end = table.span
    if start == end:  # a per-event row spans an instant: its time must be there
        span = [expectation("expect_column_values_to_not_be_null", column=start)] if start not in table.keys else []
    else:
        pair = {"column_A": end, "column_B": start}
        if isinstance(table, StreamJoin) and parse_duration(table.bound) == dt.timedelta(0):
            pair["or_equal"] = True  # a join row with no bound after its left event spans an instant
        span = [expectation("expect_column_pair_values_a_to_be_greater_than_b", **pair)]
    # GX refuses a compound expectation of one column
    if len(table.keys) == 1:
        unique = expectation("expect_column_values_to_be_unique", column=table.keys[0])
    else:
        unique = expectation("expect_compound_columns_to_be_unique", column_list=list(table.keys))
    return [
        unique,
        *(expectation("expect_column_values_to_not_be_null", column=c) for c in table.keys),
        *span,
        expectation("expect_column_values_to_be_in_set", column="status", value_set=[PROVISIONAL, FINAL]),
        expectation("expect_column_values_to_be_between", column="revision", min_value=0),
    ]


def silver_types(source: Source) -> dict[str, str]:
    """Spark type names of silver's columns, from the payload schema (``p.a.b`` paths) and lineage."""
    types: dict[str, str] = {}
    for name, expr in source.columns.items():
        data_type = _resolve(source.payload_schema, expr)
        if data_type is not None:
            types[name] = type(data_type).__name__
    types[source.partition_column] = "DateType"
    return {**types, **_LINEAGE_TYPES}


def _resolve(schema: StructType, expr: str) -> DataType | None:
    """The type a ``p.a.b`` column expression selects, or None for computed expressions."""
    parts = expr.split(".")
    if parts[0] != "p" or len(parts) < 2:
        return None
    current: DataType = schema
    for part in parts[1:]:
        if not isinstance(current, StructType) or part not in current.fieldNames():
            return None
        current = current[part].dataType
    return current
