"""Vending machine telemetry joined to where each machine stood: at-least-once, a versioned dimension.

Source ``telemetry`` (topic ``vending-telemetry``): a machine's reading: ``reading_id``, ``machine_id``,
``read_at``, sales since the last reading (``sales_count``, ``sales_amount``), ``temperature_c``,
``stock_level``. Source ``machines`` (topic ``vending-machines``): the changelog of a machine's
metadata: ``change_id``, ``machine_id``, ``changed_at`` (when it took effect), ``location``, ``model``,
``operator``. Both keyed by machine id.

The pipeline is **at-least-once**: a reading may be stored twice (silver keeps every copy, no key
lookup on the hot path; the audit counts the copies), never lost. The gold tables count a re-sent
reading once, inside each machine's state.

Gold (each machine's events folded in event-time order: see :mod:`.machines`):

* ``machines``: the machines dimension, SCD type 2 (``valid_from``/``valid_to``/``is_current``), keyed
  by machine and sequenced by ``changed_at`` (AUTO CDC's rules, :mod:`tidewater.scd2`), MERGEd on
  (machine_id, valid_from). Changes out of order within the watermark are folded in order; one that
  arrives later is folded in by the late-data correction (versions rewritten, ledger entries).
* ``sales_by_location_hour``: per location, hour and machine, the sales at the location the machine
  stood at when they happened (as of event time). Per location: ``SUM(...) GROUP BY location,
  window_start``. A relocation that arrives after the readings it governs is re-joined by the correction.
* ``silent_machines``: a machine with no reading for longer than 15 minutes (a deadline in its state,
  not a scan), with its location then.
* ``temperature_alerts``: readings with the cabinet outside 0-10 °C.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType, TimestampType

from tidewater.keyed_state import keyed_state_machine
from tidewater.pipelines.base import Delivery, KeyedStateMachine, Pipeline, Projection, Source
from tidewater.pipelines.contract import Between, NotAfterArrival, Quality, Required
from tidewater.pipelines.vending import machines
from tidewater.pipelines.vending.samples import SAMPLE_EVENTS

WATERMARK = "1 minute"
TEMPERATURE_RANGE = (0.0, 10.0)  # °C a cabinet should hold

TELEMETRY = StructType(
    [
        StructField("reading_id", StringType()),
        StructField("machine_id", StringType()),
        StructField("read_at", TimestampType()),
        StructField("sales_count", IntegerType()),
        StructField("sales_amount", DoubleType()),
        StructField("temperature_c", DoubleType()),
        StructField("stock_level", IntegerType()),
    ]
)

CHANGES = StructType(
    [
        StructField("change_id", StringType()),
        StructField("machine_id", StringType()),
        StructField("changed_at", TimestampType()),
        StructField("location", StringType()),
        StructField("model", StringType()),
        StructField("operator", StringType()),
    ]
)

QUALITY = Quality(
    rows_per_hour=(1, None),
    tolerated_invalid_fraction=0.02,
    tolerated_duplicate_fraction=0.05,
    blocking_suites=("bronze", "silver", "reconciliation"),
)


def reading_events(telemetry: DataFrame) -> DataFrame:
    """Readings as machine events (:data:`machines.EVENT_COLUMNS`; the change columns null)."""
    none = F.lit(None)
    return telemetry.select(
        "machine_id",
        F.col("read_at").alias("at"),
        F.concat(F.lit(machines.READING_ID_PREFIX), "reading_id").alias("event_id"),
        F.col("sales_count").cast("long").alias("sales_count"),
        "sales_amount",
        none.cast("string").alias("change_id"),
        *[none.cast("string").alias(name) for name in machines.ATTRIBUTES],
    )


def change_events(changes: DataFrame) -> DataFrame:
    """Changes as machine events (the reading columns null)."""
    none = F.lit(None)
    return changes.select(
        "machine_id",
        F.col("changed_at").alias("at"),
        F.concat(F.lit(machines.CHANGE_ID_PREFIX), "change_id").alias("event_id"),
        none.cast("long").alias("sales_count"),
        none.cast("double").alias("sales_amount"),
        "change_id",
        *machines.ATTRIBUTES,
    )


def machine_events(telemetry: DataFrame, changes: DataFrame) -> DataFrame:
    return reading_events(telemetry).unionByName(change_events(changes))


def machine_versions(changes: DataFrame) -> DataFrame:
    return keyed_state_machine(change_events(changes), machine=machines.VERSIONS, key="machine_id", watermark=WATERMARK)


def sales_by_location_hour(telemetry: DataFrame, changes: DataFrame) -> DataFrame:
    events = machine_events(telemetry, changes)
    return keyed_state_machine(events, machine=machines.SALES, key="machine_id", watermark=WATERMARK)


def silent_machines(telemetry: DataFrame, changes: DataFrame) -> DataFrame:
    events = machine_events(telemetry, changes)
    return keyed_state_machine(events, machine=machines.SILENCE, key="machine_id", watermark=WATERMARK)


def temperature_alerts(telemetry: DataFrame) -> DataFrame:
    low, high = TEMPERATURE_RANGE
    outside = telemetry.where((F.col("temperature_c") < low) | (F.col("temperature_c") > high))
    # At-least-once: a re-sent reading alerts once (on the stream, the copies come within the watermark).
    if outside.isStreaming:
        once = outside.withWatermark("read_at", WATERMARK).dropDuplicatesWithinWatermark(["reading_id"])
    else:
        once = outside.dropDuplicates(["reading_id"])
    return once.select("machine_id", "reading_id", "read_at", "temperature_c")


PIPELINE = Pipeline(
    name="vending",
    description="Vending machine telemetry joined as of event time to a versioned machines dimension",
    delivery=Delivery.AT_LEAST_ONCE,
    entity_column="machine_id",
    sample_events=SAMPLE_EVENTS,
    sources=(
        Source(
            name="telemetry",
            topic="vending-telemetry",
            payload_schema=TELEMETRY,
            columns={name: f"p.{name}" for name in TELEMETRY.fieldNames()},
            constraints=(
                Required(("reading_id", "machine_id"), non_empty=True),
                Required(("read_at",), reason="read_at missing or not an ISO-8601 timestamp"),
                Between("temperature_c", -40.0, 90.0, label="temperature outside the sensor's range"),
                Between("sales_count", 0, 1000),
                Between("sales_amount", 0.0, 100_000.0),
                NotAfterArrival("read_at", tolerance="5 minutes"),
            ),
            key="reading_id",
            event_time="read_at",
            watermark=WATERMARK,
            partition_column="read_date",
            quality=QUALITY,
        ),
        Source(
            name="machines",
            topic="vending-machines",
            payload_schema=CHANGES,
            columns={name: f"p.{name}" for name in CHANGES.fieldNames()},
            constraints=(
                Required(("change_id", "machine_id", "location"), non_empty=True),
                Required(("changed_at",), reason="changed_at missing or not an ISO-8601 timestamp"),
                NotAfterArrival("changed_at", tolerance="5 minutes"),
            ),
            key="change_id",
            event_time="changed_at",
            watermark=WATERMARK,
            partition_column="changed_date",
            # A few changes a second beside thousands of readings: a micro-batch every second cost the
            # changelog ~1.3 s of a busy 2-core host each (bench at 2,000 events/s) for ~9 records.
            trigger_interval="5 seconds",
            # A re-sent change is harmless (the versions absorb it) and a changelog is small: a few
            # copies are a large share of an hour's changes.
            quality=dataclasses.replace(QUALITY, rows_per_hour=(0, None), tolerated_duplicate_fraction=0.25),
        ),
    ),
    gold=(
        KeyedStateMachine(
            name="machines",
            description="Machines, SCD type 2: where each stood, its model and operator, from when to when",
            keys=("machine_id", "valid_from"),
            inputs=("machines",),
            history=("machines",),
            # A version is final once the watermark passes its start; a later change closes it (valid_to
            # is a measure: the stream updates it, a correction records the change in the ledger).
            time_column="valid_from",
            horizon="0 seconds",
            build=machine_versions,
        ),
        KeyedStateMachine(
            name="sales_by_location_hour",
            description="Sales per location and hour (per machine), at where the machine stood then",
            keys=("location", "window_start", "machine_id"),
            inputs=("telemetry", "machines"),
            history=("machines",),
            time_column="window_start",
            end_column="window_end",
            horizon="0 seconds",
            lookahead="62 minutes",  # the hour, then the watermark past its end
            build=sales_by_location_hour,
        ),
        KeyedStateMachine(
            name="silent_machines",
            description=f"Machines with no reading for longer than {machines.SILENT_AFTER}",
            keys=("machine_id", "silent_since"),
            inputs=("telemetry", "machines"),
            history=("machines",),
            time_column="silent_since",
            end_column="detected_at",
            horizon="0 seconds",
            lookahead="17 minutes",  # the silence, then the watermark past its end
            build=silent_machines,
        ),
        Projection(
            name="temperature_alerts",
            description="Readings with the cabinet outside 0-10 °C",
            keys=("machine_id", "reading_id"),
            inputs=("telemetry",),
            time_column="read_at",
            build=temperature_alerts,
        ),
    ),
)
