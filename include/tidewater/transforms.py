"""Pure DataFrame -> DataFrame transformations shared by every pipeline.

The streaming job, the scheduled batch recompute, a replay and a late-data correction all call
these same functions; none of them reads or writes anything. (``withWatermark`` is a no-op on a
batch DataFrame, so a gold transform that sets one is still the same code in both modes.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

ERROR_COLUMN = "_error"
CORRUPT_FIELD = "_corrupt_record"

# Lineage every silver row carries back to its bronze record.
LINEAGE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "ingest_time")


@dataclass(frozen=True)
class Rule:
    """A validation rule: rows for which the SQL predicate ``check`` is not true are quarantined
    with ``reason``. SQL text (not a Column) so that declaring a pipeline needs no SparkSession."""

    reason: str
    check: str


def to_bronze(kafka_records: DataFrame) -> DataFrame:
    """Kafka records as bronze rows: everything kept, plus when and on which day they arrived."""
    return kafka_records.select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("timestampType").alias("timestamp_type"),
        "headers",
        F.current_timestamp().alias("ingest_time"),
        F.to_date("timestamp").alias("ingest_date"),
    )


def parse_payload(
    bronze: DataFrame,
    *,
    payload_schema: StructType,
    flatten: Sequence[Column],
    rules: Sequence[Rule],
) -> DataFrame:
    """Bronze rows -> typed rows with lineage and an ``_error`` reason (null when valid).

    Malformed JSON, missing fields and values of the wrong type (which JSON parsing turns into
    nulls) all end up with a reason instead of being dropped.
    """
    text = F.col("value").cast("string")
    # One JSON parse per record: Spark keeps what it could parse and puts the text of a record that
    # failed in the corrupt-record column. A record that yielded no field at all is malformed JSON;
    # one with some fields (a type mismatch somewhere) is judged by the rules on its nulls.
    with_corrupt = StructType([*payload_schema.fields, StructField(CORRUPT_FIELD, StringType())])
    nothing_parsed = " AND ".join(f"p.`{f.name}` IS NULL" for f in payload_schema.fields)
    parsed = bronze.select(
        F.col("value").alias("_raw_value"),
        F.col("key").alias("_raw_key"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        "kafka_timestamp",
        "ingest_time",
        F.from_json(text, with_corrupt, {"columnNameOfCorruptRecord": CORRUPT_FIELD}).alias("p"),
    ).withColumn("_bad_json", F.expr(f"p.`{CORRUPT_FIELD}` IS NOT NULL AND {nothing_parsed}"))
    typed = parsed.select(
        *flatten,
        *LINEAGE_COLUMNS,
        "_raw_value",
        "_raw_key",
        "_bad_json",
    )
    reason: Column = F.when(F.col("_bad_json"), F.lit("malformed JSON"))
    for rule in rules:
        reason = reason.when(~F.coalesce(F.expr(rule.check), F.lit(False)), F.lit(rule.reason))
    return typed.withColumn(ERROR_COLUMN, reason).drop("_bad_json")


def valid_rows(parsed: DataFrame, columns: Sequence[str]) -> DataFrame:
    return parsed.where(F.col(ERROR_COLUMN).isNull()).select(*columns)


def quarantined_rows(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col(ERROR_COLUMN).isNotNull()).select(
        F.col(ERROR_COLUMN).alias("reason"),
        F.col("_raw_value").cast("string").alias("raw_value"),
        F.col("_raw_key").cast("string").alias("raw_key"),
        *LINEAGE_COLUMNS,
        F.to_date("ingest_time").alias("quarantine_date"),
    )


def first_per_key(rows: DataFrame, key: str) -> DataFrame:
    """One row per business key: the first to reach Kafka (lowest partition, then offset)."""
    order = Window.partitionBy(key).orderBy("kafka_partition", "kafka_offset")
    return rows.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")


def windowed_counts(
    events: DataFrame,
    *,
    time_column: str,
    watermark: str,
    window: str,
    slide: str | None = None,
    group_by: Sequence[str],
    measures: Mapping[str, Column],
) -> DataFrame:
    """Event-time window aggregates: tumbling when ``slide`` is None, hopping otherwise.

    Windows are start-inclusive, end-exclusive (Spark's ``window``). The watermark makes the
    streaming aggregation finite; on a batch DataFrame it changes nothing.
    """
    bucket = F.window(time_column, window, slide) if slide else F.window(time_column, window)
    return (
        events.withWatermark(time_column, watermark)
        .groupBy(bucket.alias("w"), *group_by)
        .agg(*[column.alias(name) for name, column in measures.items()])
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            *group_by,
            *measures,
        )
    )
