"""Meetup-style RSVPs: who answered yes/no/waitlist for which venue, and which venues are trending.

Gold:
* ``venue_response_counts``: RSVPs per venue and response in 1-minute tumbling event-time windows.
* ``trending_venues``: RSVPs (and yes answers) per venue in 5-minute windows hopping every minute.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from tidewater.pipelines.base import GoldTable, Pipeline
from tidewater.pipelines.contract import Between, NotAfterArrival, OneOf, Quality, Required
from tidewater.transforms import windowed_counts

RESPONSES = ("yes", "no", "waitlist")
VISIBILITIES = ("public", "members")
WATERMARK = "2 minutes"
CLOCK_SKEW_TOLERANCE = "5 minutes"

PAYLOAD = StructType(
    [
        StructField("event_id", StringType()),
        StructField("event_time", TimestampType()),
        StructField("sent_time", TimestampType()),
        StructField("producer_id", StringType()),
        StructField("seq_no", LongType()),
        StructField("visibility", StringType()),
        StructField("response", StringType()),
        StructField(
            "venue",
            StructType(
                [
                    StructField("venue_id", LongType()),
                    StructField("venue_name", StringType()),
                    StructField("lat", DoubleType()),
                    StructField("lon", DoubleType()),
                ]
            ),
        ),
        StructField(
            "member",
            StructType([StructField("member_id", LongType()), StructField("member_name", StringType())]),
        ),
    ]
)

COLUMNS = {
    "event_id": "p.event_id",
    "event_time": "p.event_time",
    "sent_time": "p.sent_time",
    "producer_id": "p.producer_id",
    "seq_no": "p.seq_no",
    "visibility": "p.visibility",
    "response": "p.response",
    "venue_id": "p.venue.venue_id",
    "venue_name": "p.venue.venue_name",
    "venue_lat": "p.venue.lat",
    "venue_lon": "p.venue.lon",
    "member_id": "p.member.member_id",
    "member_name": "p.member.member_name",
}

CONSTRAINTS = (
    Required(("event_id",), non_empty=True),
    Required(("event_time",), reason="event_time missing or not an ISO-8601 timestamp"),
    Required(("producer_id", "seq_no")),
    OneOf("response", RESPONSES),
    OneOf("visibility", VISIBILITIES),
    Required(("venue_id",)),
    Between("venue_lat", -90, 90, label="venue lat"),
    Between("venue_lon", -180, 180, label="venue lon"),
    Required(("member_id",)),
    # Quarantine compares with the Kafka timestamp (a replay decides the same way); the audit also
    # compares with ingestion time, catching producers whose clocks run ahead.
    NotAfterArrival("event_time", tolerance=CLOCK_SKEW_TOLERANCE),
)


def venue_response_counts(silver: DataFrame) -> DataFrame:
    return windowed_counts(
        silver,
        time_column="event_time",
        watermark=WATERMARK,
        window="1 minute",
        group_by=("venue_id", "response"),
        measures={"venue_name": F.max("venue_name"), "rsvp_count": F.count(F.lit(1))},
    )


def trending_venues(silver: DataFrame) -> DataFrame:
    return windowed_counts(
        silver,
        time_column="event_time",
        watermark=WATERMARK,
        window="5 minutes",
        slide="1 minute",
        group_by=("venue_id",),
        measures={
            "venue_name": F.max("venue_name"),
            "rsvp_count": F.count(F.lit(1)),
            "yes_count": F.sum(F.when(F.col("response") == "yes", 1).otherwise(0)).cast("long"),
        },
    )


PIPELINE = Pipeline(
    name="rsvps",
    description="Meetup-style RSVP events: venue, member, response",
    topic="rsvps",
    payload_schema=PAYLOAD,
    columns=COLUMNS,
    constraints=CONSTRAINTS,
    key="event_id",
    event_time="event_time",
    watermark=WATERMARK,
    clock_skew_tolerance=CLOCK_SKEW_TOLERANCE,
    entity_column="venue_id",
    sequence=("producer_id", "seq_no"),
    quality=Quality(
        rows_per_hour=(1, None),
        tolerated_invalid_fraction=0.01,
        tolerated_duplicate_fraction=0.02,
        # Silver or the counts being wrong means the published numbers would be: hold gold back.
        blocking_suites=("bronze", "silver", "reconciliation"),
    ),
    gold=(
        GoldTable(
            name="venue_response_counts",
            description="RSVPs per venue and response, 1-minute tumbling windows",
            keys=("window_start", "venue_id", "response"),
            window="1 minute",
            build=venue_response_counts,
        ),
        GoldTable(
            name="trending_venues",
            description="RSVPs and yes answers per venue, 5-minute windows every minute",
            keys=("window_start", "window_end", "venue_id"),
            window="5 minutes",
            build=trending_venues,
        ),
    ),
)
