"""Pure DataFrame -> DataFrame transformations shared by every pipeline.

The streaming job, the scheduled batch recompute, a replay and a late-data correction all call
these same functions; none of them reads or writes anything. (``withWatermark`` is a no-op on a
batch DataFrame, so a gold transform that sets one is still the same code in both modes.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from tidewater import json_columns, strict_json

ERROR_COLUMN = "_error"
CORRUPT_FIELD = json_columns.CORRUPT_FIELD

# Lineage every silver row carries back to its bronze record.
LINEAGE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "ingest_time")
# A record's strict-contract reason, where the reader checked it (see parse_payload).
STRICT_ERROR_COLUMN = strict_json.REASON_COLUMN
# A record's payload typed where the reader decoded it (see parse_payload): for the parse, not for bronze.
PARSED_COLUMN = json_columns.PARSED_COLUMN


@dataclass(frozen=True)
class Rule:
    """A validation rule: rows for which the SQL predicate ``check`` is not true are quarantined
    with ``reason``. SQL text (not a Column) so that declaring a pipeline needs no SparkSession."""

    reason: str
    check: str


def to_bronze(kafka_records: DataFrame) -> DataFrame:
    """Kafka records as bronze rows: everything kept, plus when and on which day they arrived (and the
    payload's strict-contract reason and typed fields where the source made them: for silver, not bronze
    columns).

    When they arrived is the reader's ``ingest_time`` where it has one (the Kafka source's
    ``ingestTime``), else this query's ``current_timestamp()``. The latter is a literal that Spark
    writes into the code it generates: a stream would compile that code again every micro-batch."""
    checked = [name for name in (STRICT_ERROR_COLUMN, PARSED_COLUMN) if name in kafka_records.columns]
    ingest_time = F.col("ingest_time") if "ingest_time" in kafka_records.columns else F.current_timestamp()
    return kafka_records.select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("timestampType").alias("timestamp_type"),
        "headers",
        ingest_time.alias("ingest_time"),
        # A record whose Kafka timestamp no reader can hold has none (null): it still gets a date.
        F.to_date(F.coalesce("timestamp", ingest_time)).alias("ingest_date"),
        *checked,
    )


def strict_violations(value: Column, payload_schema: StructType) -> Column:
    """Per record: why its payload breaks the strict JSON contract, or null (see :mod:`tidewater.strict_json`).

    An Arrow UDF: one Python call per record in a worker, no pandas in between."""
    schema_json = payload_schema.json()

    @F.arrow_udf(StringType())  # type: ignore[call-overload, misc]
    def check(values: pa.Array) -> pa.Array:
        return strict_json.reasons(values, schema_json)

    return check(value)


def strict_violations_and_parsed(value: Column, payload_schema: StructType) -> Column:
    """Per record: :func:`strict_violations` as ``reason`` and, from the same decode, the payload typed
    as ``parsed`` (null where ``from_json`` must parse it; :mod:`tidewater.json_columns`). For a schema
    :func:`tidewater.json_columns.typable` accepts."""
    schema_json = payload_schema.json()
    parsed = _with_corrupt_field(payload_schema)
    result = StructType([StructField("reason", StringType()), StructField("parsed", parsed)])

    @F.arrow_udf(result)  # type: ignore[call-overload, misc]
    def check(values: pa.Array) -> pa.Array:
        reasons, typed = json_columns.reasons_and_parsed(values, schema_json)
        return pa.StructArray.from_arrays([reasons, typed], names=["reason", "parsed"])

    return check(value)


def _checked_in_python(bronze: DataFrame, payload_schema: StructType) -> DataFrame:
    """``bronze`` with :data:`STRICT_ERROR_COLUMN` and, where the schema is typable, :data:`PARSED_COLUMN`:
    one Arrow UDF over the payloads, as the Kafka source makes them while it reads. For 1M rsvps
    payloads in a warm session the parse with the typed column took 7.3-9.3 s against 8.4-10.6 s."""
    if not json_columns.typable(payload_schema.json()):
        return bronze.withColumn(STRICT_ERROR_COLUMN, strict_violations(F.col("value"), payload_schema))
    checked = bronze.withColumn("_checked", strict_violations_and_parsed(F.col("value"), payload_schema))
    fields = {STRICT_ERROR_COLUMN: F.col("_checked.reason"), PARSED_COLUMN: F.col("_checked.parsed")}
    return checked.withColumns(fields).drop("_checked")


def _with_corrupt_field(payload_schema: StructType) -> StructType:
    """What ``from_json`` gives with the corrupt-record field, and the typed column too
    (:func:`tidewater.json_columns.with_corrupt_field`)."""
    return StructType.fromJson(json.loads(json_columns.with_corrupt_field(payload_schema.json())))


def quoted(name: str) -> str:
    """``name`` as a SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# The bronze columns parse_payload keeps, each under the name it has in a parsed row; it can carry any
# other one as it is (see bronze_passthrough).
PARSED_BRONZE = {
    "value": "_raw_value",
    "key": "_raw_key",
    "topic": "kafka_topic",
    "partition": "kafka_partition",
    "offset": "kafka_offset",
    "kafka_timestamp": "kafka_timestamp",
    "ingest_time": "ingest_time",
}


def parse_payload(
    bronze: DataFrame,
    *,
    payload_schema: StructType,
    flatten: Mapping[str, str],
    rules: Sequence[Rule],
    strict: bool = True,
    derived: Mapping[str, str] | None = None,
    carry: Sequence[str] = (),
) -> DataFrame:
    """Bronze rows -> typed rows with lineage and an ``_error`` reason (null when valid).

    ``flatten``: each silver column's SQL expression over the parsed payload ``p``; ``derived``: more
    columns, SQL over the flattened ones (a silver partition's date); ``carry``: bronze columns passed
    through as they are (see :func:`bronze_passthrough`). Malformed JSON,
    missing fields and values of the wrong type all end up with a reason instead of being dropped.
    ``strict`` (the default) first holds each payload to the strict JSON contract; a payload that
    breaks it is never handed to Spark's lenient parser (nor to its nesting limits). Rows that carry
    :data:`STRICT_ERROR_COLUMN` were checked already, where they were read (the Kafka source's
    ``payloadContract``: the stream's micro-batch), and need no Python worker here. Rows that carry
    :data:`PARSED_COLUMN` were typed there too (``payloadParsed``, :mod:`tidewater.json_columns`):
    ``from_json`` parses only those it left null.

    The plan is built from SQL text (two ``selectExpr``): a stream builds it every micro-batch, and
    building it from Column objects cost ~1,400 py4j round trips, ~150 ms of each trigger.
    """
    strict_error = quoted(STRICT_ERROR_COLUMN)
    if not strict:
        strict_error = "CAST(NULL AS STRING)"
    elif STRICT_ERROR_COLUMN not in bronze.columns:  # not checked as read: checked (and typed) here
        bronze = _checked_in_python(bronze, payload_schema)
    # One JSON parse per record: Spark keeps what it could parse and puts the text of a record that
    # failed in the corrupt-record column. A record that yielded no field at all is malformed JSON;
    # one with some fields (a type mismatch somewhere) is judged by the rules on its nulls.
    with_corrupt = _with_corrupt_field(payload_schema)
    nothing_parsed = " AND ".join(f"p.{quoted(f.name)} IS NULL" for f in payload_schema.fields)
    options = f"map('columnNameOfCorruptRecord', {sql_string(CORRUPT_FIELD)})"
    text = f"CASE WHEN {strict_error} IS NULL THEN CAST(value AS STRING) END"
    parse = f"from_json({text}, {sql_string(with_corrupt.json())}, {options})"
    if PARSED_COLUMN in bronze.columns:  # typed as read; coalesce evaluates from_json only where it is null
        parse = f"coalesce({quoted(PARSED_COLUMN)}, {parse})"
    parsed = bronze.selectExpr(
        *(f"{quoted(name)} AS {quoted(as_parsed)}" for name, as_parsed in PARSED_BRONZE.items()),
        f"{strict_error} AS _strict",
        f"{parse} AS p",
        # Nondeterministic, so Spark pushes no filter on the parsed fields (silver's "no error") below
        # this projection: it would inline the parse into the filter once per field it reads (27
        # from_json in rsvps's plan, and the strict check twice; test_hostile_records checks the plan).
        "spark_partition_id() AS _parse_barrier",
        *map(quoted, carry),
    )
    typed = parsed.selectExpr(
        *[f"({expression}) AS {quoted(name)}" for name, expression in flatten.items()],
        *LINEAGE_COLUMNS,
        "_raw_value",
        "_raw_key",
        f"(p.{quoted(CORRUPT_FIELD)} IS NOT NULL AND {nothing_parsed}) AS _bad_json",
        "_strict",
        "_parse_barrier",
        *map(quoted, carry),
    )
    # The barrier is read here (a partition id is never negative) so the optimizer keeps it.
    reasons = [
        "WHEN _parse_barrier < 0 THEN 'unreachable'",
        "WHEN _strict IS NOT NULL THEN _strict",
        "WHEN _bad_json THEN 'malformed JSON'",
        *[f"WHEN NOT coalesce(({rule.check}), false) THEN {sql_string(rule.reason)}" for rule in rules],
    ]
    kept = [*(quoted(name) for name in flatten), *LINEAGE_COLUMNS, "_raw_value", "_raw_key", *map(quoted, carry)]
    extra = [f"({expression}) AS {quoted(name)}" for name, expression in (derived or {}).items()]
    return typed.selectExpr(*kept, f"CASE {' '.join(reasons)} END AS {ERROR_COLUMN}", *extra)


def valid_rows(parsed: DataFrame, columns: Sequence[str]) -> DataFrame:
    return parsed.where(f"{ERROR_COLUMN} IS NULL").select(*columns)


def _quarantine_columns() -> dict[str, str]:
    """A quarantine row's columns (SQL over a parsed row that has a reason)."""
    return {
        "reason": ERROR_COLUMN,
        # The payload exactly as it arrived: bytes, so one that is not UTF-8 is kept and stays queryable.
        "raw_value": "_raw_value",
        "raw_key": "_raw_key",
        **{name: name for name in LINEAGE_COLUMNS},
        "quarantine_date": "to_date(ingest_time)",
    }


def quarantined_rows(parsed: DataFrame) -> DataFrame:
    return parsed.where(f"{ERROR_COLUMN} IS NOT NULL").selectExpr(
        *[f"{expression} AS {quoted(name)}" for name, expression in _quarantine_columns().items()]
    )


OUTCOME_PREFIX = "_quarantine_"


def outcomes(parsed: DataFrame, silver_columns: Sequence[str], *, keep: Mapping[str, str] | None = None) -> DataFrame:
    """Every parsed row once, with the columns of its silver row and those of its quarantine row
    (prefixed ``_quarantine_``), for :func:`split_outcomes` to divide on the driver; ``keep``: more
    columns (name -> SQL over the parsed row), such as :func:`bronze_passthrough`'s.

    A micro-batch needs both tables' rows of the same parse: two filtered reads would parse twice or
    cache the parse (measured on 100k records: 1.4-1.7 s this way, 1.9-2.4 s with the cache). A valid
    row's quarantine columns are null: its payload is not shipped to the driver a second time."""
    return parsed.selectExpr(
        *(quoted(name) for name in silver_columns),
        *[
            f"CASE WHEN {ERROR_COLUMN} IS NOT NULL THEN {expression} END AS {quoted(OUTCOME_PREFIX + name)}"
            for name, expression in _quarantine_columns().items()
        ],
        *[f"{expression} AS {quoted(name)}" for name, expression in (keep or {}).items()],
    )


def split_outcomes(rows: pa.Table, silver_columns: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(quarantine rows, silver rows) of :func:`outcomes`' rows: the same rows
    :func:`quarantined_rows` and :func:`valid_rows` select, by whether a row has a reason."""
    rejected = pc.is_valid(rows.column(OUTCOME_PREFIX + "reason"))
    names = [name for name in rows.column_names if name.startswith(OUTCOME_PREFIX)]
    # Select, then filter: a filter copies every column it is given, and the rows also carry the
    # other table's columns and bronze's payload (rsvps, 200k rows: 21-29 ms this way, 133-729 before).
    quarantine = rows.select(names).filter(rejected)
    quarantine = quarantine.rename_columns([name.removeprefix(OUTCOME_PREFIX) for name in names])
    return quarantine, rows.select(list(silver_columns)).filter(pc.invert(rejected))


BRONZE_PREFIX = "_bronze_"


def bronze_passthrough(bronze_columns: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """What gives each row of :func:`outcomes` its bronze row too: (the columns :func:`parse_payload`
    must carry, the columns :func:`outcomes` must keep), for :func:`split_bronze`. A stream's
    micro-batch then reads Kafka, parses and brings every table's rows to the driver in one Spark job."""
    bronze_columns = [name for name in bronze_columns if name != PARSED_COLUMN]  # the parse's alone
    carry = [name for name in bronze_columns if name not in PARSED_BRONZE]
    keep = {BRONZE_PREFIX + name: quoted(PARSED_BRONZE.get(name, name)) for name in bronze_columns}
    return carry, keep


def _bronze_names(columns: Sequence[str]) -> dict[str, str]:
    """Each column of :func:`outcomes`' rows that :func:`bronze_passthrough` kept -> its bronze name."""
    return {name: name.removeprefix(BRONZE_PREFIX) for name in columns if name.startswith(BRONZE_PREFIX)}


def split_bronze(rows: pa.Table) -> pa.Table:
    """The bronze rows of :func:`outcomes`' rows kept with :func:`bronze_passthrough`."""
    names = _bronze_names(rows.column_names)
    return rows.select(list(names)).rename_columns(list(names.values()))


def bronze_of(outcomes: DataFrame) -> DataFrame:
    """The bronze rows of :func:`outcomes` kept with :func:`bronze_passthrough`, as a plan: it reads
    no parsed column, so Spark's optimizer prunes the parse from it."""
    return outcomes.select(*[F.col(quoted(kept)).alias(name) for kept, name in _bronze_names(outcomes.columns).items()])


def first_per_key(rows: DataFrame, key: str, *, kept: DataFrame | None = None) -> DataFrame:
    """One row per business key: the first copy to arrive (lowest partition, then offset).

    ``kept`` (the key and Kafka lineage of rows a table already holds) records earlier decisions: a
    copy with that lineage wins over any other, so a bounded rebuild keeps the copy the stream kept
    (the stream's "first" is the first *processed*, which partition order alone cannot tell).
    """
    lineage = ("kafka_topic", "kafka_partition", "kafka_offset")
    if kept is not None:
        marks = kept.select(key, *[F.col(c).alias(f"_kept_{c}") for c in lineage]).dropDuplicates([key])
        same = [F.col(c).eqNullSafe(F.col(f"_kept_{c}")) for c in lineage]
        rows = rows.join(marks, on=key, how="left").withColumn(
            "_preference", F.when(same[0] & same[1] & same[2], 0).otherwise(1)
        )
        rows = rows.drop(*[f"_kept_{c}" for c in lineage])
    else:
        rows = rows.withColumn("_preference", F.lit(1))
    order = Window.partitionBy(key).orderBy("_preference", "kafka_partition", "kafka_offset")
    return rows.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank", "_preference")


HELD_METRIC = "held_ahead_of_clock"


def watermark_safe(events: DataFrame, time_column: str, max_lead: str, *, metric: str = HELD_METRIC) -> DataFrame:
    """The events a streaming watermark may follow: none more than ``max_lead`` ahead of ``ingest_time``.

    Spark's watermark is the latest event time seen minus the delay, so a single event stamped far
    ahead (a producer's clock, or a forged time) would push it past every on-time event and drop them
    all. Events ahead of the platform's clock are held out of the stream (counted in the query's
    observed metric ``metric``, ``held_ahead_of_clock`` or, per input of a join,
    ``held_ahead_of_clock_<source>``); they stay in silver, and the batch recompute and the late-data
    correction count them once their windows close. Batch jobs do not call this.
    """
    ahead = F.col(time_column) > F.col("ingest_time") + F.expr(f"INTERVAL {max_lead}")
    observed = events.observe(metric, F.sum(F.when(ahead, 1).otherwise(0)).alias("rows"))
    return observed.where(~ahead)


GOLD_TAG = "_gold"


def tagged_union(frames: Mapping[str, DataFrame]) -> DataFrame:
    """Several outputs of one streaming query in one DataFrame: ``_gold`` names the output a row is
    of, and the row itself is a struct in the column of that name (null in the others). A query has
    one sink, and outputs of different columns cannot be unioned as they are; the writer splits the
    micro-batch by the tag (:func:`untagged`)."""
    packed = [
        frame.select(F.lit(name).alias(GOLD_TAG), _nullable_struct(frame).alias(name)) for name, frame in frames.items()
    ]
    first, *rest = packed
    return reduce(lambda left, right: left.unionByName(right, allowMissingColumns=True), rest, first)


def _nullable_struct(frame: DataFrame) -> Column:
    """The frame's columns as one struct whose fields may all be null: on the other outputs' rows the
    struct is null, which Arrow refuses under a field Spark marked non-null (a literal status)."""
    fields = [StructField(field.name, field.dataType, True) for field in frame.schema.fields]
    return F.struct(*frame.columns).cast(StructType(fields))


def untagged(rows: pa.Table, name: str) -> pa.Table:
    """The rows of output ``name`` of a :func:`tagged_union` micro-batch, as the output's own columns."""
    mine = pc.filter(rows.column(name), pc.equal(rows.column(GOLD_TAG), name))  # this output's column alone
    return pa.Table.from_struct_array(mine)


def watermarked_union(frames: Sequence[DataFrame], *, time_column: str, watermark: str) -> DataFrame:
    """The union of several inputs' events (same columns), each watermarked on its own first.

    One watermark over the union would follow the input furthest ahead: when one source's silver runs
    ahead of another's (its query drained its backlog first), the other's events behind it would be
    dropped as late. Spark's watermark over several is their minimum, an input without data yet
    counting as 0, so it waits for the slowest (what the batch path assumes:
    :func:`tidewater.batch.windows.gold_closed_before`). Aggregate the result with ``watermark=None``
    (Spark disallows redefining a watermark). On batch DataFrames the watermarks change nothing.
    Not for a changelog (a gold table's ``history`` input): quiet for hours, it would hold the stream
    back; vending's machine events keep one watermark over telemetry and changes, and a change behind
    it is folded by the late-data correction.
    """
    first, *rest = (frame.withWatermark(time_column, watermark) for frame in frames)
    return reduce(DataFrame.unionByName, rest, first)


def windowed_counts(
    events: DataFrame,
    *,
    time_column: str,
    watermark: str | None,
    window: str,
    slide: str | None = None,
    group_by: Sequence[str],
    measures: Mapping[str, Column],
) -> DataFrame:
    """Event-time window aggregates: tumbling when ``slide`` is None, hopping otherwise.

    Windows are start-inclusive, end-exclusive (Spark's ``window``). The watermark makes the
    streaming aggregation finite; on a batch DataFrame it changes nothing. ``watermark`` None: the
    events carry theirs already (:func:`watermarked_union`).
    """
    bucket = F.window(time_column, window, slide) if slide else F.window(time_column, window)
    return _aggregate(events, time_column, watermark, bucket, group_by, measures)


def session_aggregates(
    events: DataFrame,
    *,
    time_column: str,
    watermark: str,
    gap: str,
    group_by: Sequence[str],
    measures: Mapping[str, Column],
) -> DataFrame:
    """Session windows per ``group_by`` key: events closer than ``gap`` to each other form one session.

    ``window_start`` is the session's first event, ``window_end`` its last event + ``gap`` (Spark's
    ``session_window``). On a stream the watermark closes a session once it passes ``window_end``;
    only then is it emitted (append mode). On a batch DataFrame the watermark changes nothing.
    """
    return _aggregate(events, time_column, watermark, F.session_window(time_column, gap), group_by, measures)


def _aggregate(
    events: DataFrame,
    time_column: str,
    watermark: str | None,
    bucket: Column,
    group_by: Sequence[str],
    measures: Mapping[str, Column],
) -> DataFrame:
    """Watermarked aggregate per (time bucket, keys), the bucket's bounds as ``window_start``/``window_end``."""
    watermarked = events if watermark is None else events.withWatermark(time_column, watermark)
    return (
        watermarked.groupBy(bucket.alias("w"), *group_by)
        .agg(*[column.alias(name) for name, column in measures.items()])
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            *group_by,
            *measures,
        )
    )


def bounded_join(
    left: DataFrame,
    right: DataFrame,
    *,
    left_time: str,
    right_time: str,
    key: tuple[str, str],
    bound: str,
    watermark: str | tuple[str, str],
    lookback: str | None = None,
    how: str = "left_outer",
) -> DataFrame:
    """``left`` joined to the ``right`` rows of the same key (``key`` = (left column, right column)) whose
    ``right_time`` lies in ``[left_time - lookback, left_time + bound]`` (``lookback`` None: from
    ``left_time``); both sides watermarked (``watermark``: one delay, or (left's, right's)), so a stream keeps
    bounded state and emits a left row no right row matched once the watermark passes its bound.
    Column names of the two sides must differ (a self-join renames one side first). On batch
    DataFrames the watermarks change nothing."""
    earliest = F.col(left_time) - F.expr(f"INTERVAL {lookback}") if lookback else F.col(left_time)
    condition = (
        (F.col(key[0]) == F.col(key[1]))
        & (F.col(right_time) >= earliest)
        & (F.col(right_time) <= F.col(left_time) + F.expr(f"INTERVAL {bound}"))
    )
    left_delay, right_delay = (watermark, watermark) if isinstance(watermark, str) else watermark
    return left.withWatermark(left_time, left_delay).join(right.withWatermark(right_time, right_delay), condition, how)
