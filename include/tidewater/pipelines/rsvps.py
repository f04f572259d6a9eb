"""Meetup-style RSVPs: who answered yes/no/waitlist for which venue, and which venues are trending.

Gold:
* ``venue_response_counts``: RSVPs per venue and response in 1-minute tumbling event-time windows.
* ``trending_venues``: RSVPs (and yes answers) per venue in 5-minute windows hopping every minute.

Sample events (:data:`SAMPLE_EVENTS`): venues and members from seeded pools, popular venues more often
(Zipf-like, so partition loads are realistically uneven), keyed by venue id.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from tidewater.pipelines.base import Pipeline, Source, WindowAggregate
from tidewater.pipelines.contract import Between, NotAfterArrival, OneOf, Quality, Required
from tidewater.pipelines.samples import (
    EventContext,
    Payload,
    SampleEvents,
    drop_field,
    encode,
    set_field,
    truncated_json,
)
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


# ---- sample events ----------------------------------------------------------------------------------

_CITIES = (
    ("New York", 40.7128, -74.0060),
    ("San Francisco", 37.7749, -122.4194),
    ("London", 51.5074, -0.1278),
    ("Berlin", 52.5200, 13.4050),
    ("Paris", 48.8566, 2.3522),
    ("Tokyo", 35.6762, 139.6503),
    ("Sydney", -33.8688, 151.2093),
    ("São Paulo", -23.5505, -46.6333),
    ("Bangalore", 12.9716, 77.5946),
    ("Toronto", 43.6532, -79.3832),
    ("Cape Town", -33.9249, 18.4241),
    ("Reykjavík", 64.1466, -21.9426),
    ("Mexico City", 19.4326, -99.1332),
    ("Singapore", 1.3521, 103.8198),
    ("Austin", 30.2672, -97.7431),
    ("Amsterdam", 52.3676, 4.9041),
)
_VENUE_ADJ = ("Copper", "Blue", "Old", "Riverside", "Hidden", "Grand", "Little", "Golden", "Rusty", "North")
_VENUE_NOUN = ("Kettle", "Hall", "Loft", "Commons", "Brewery", "Library", "Garage", "Lab", "Café", "Hub")
_FIRST = (
    "Ana", "Ben", "Chloé", "Dmitri", "Eve", "Farah", "Gus", "Hana", "Ivan", "José", "Kai", "Lena",
    "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tomás", "Uma", "Wei", "Yara", "Zoë",
)  # fmt: skip
_LAST = (
    "Smith", "García", "Müller", "Okafor", "Tanaka", "Novak", "Silva", "Khan",
    "Dubois", "Larsen", "Kowalski", "Nguyen", "O'Brien", "Rossi", "Haddad", "Ivanova",
)  # fmt: skip


@dataclass(frozen=True)
class Venue:
    venue_id: int
    venue_name: str
    lat: float
    lon: float


@dataclass(frozen=True)
class Member:
    member_id: int
    member_name: str


@lru_cache(maxsize=8)
def venue_pool(seed: int, size: int) -> tuple[tuple[Venue, ...], tuple[float, ...]]:
    """The venues, fixed per (seed, index) so a venue id always has the same name and place, with the
    cumulative weights that make popular venues (low index) get more RSVPs."""
    rng = random.Random(f"{seed}:venues")
    venues = []
    for i in range(size):
        city, lat, lon = rng.choice(_CITIES)
        name = f"{rng.choice(_VENUE_ADJ)} {rng.choice(_VENUE_NOUN)}, {city}"
        lat = max(-90.0, min(90.0, round(lat + rng.uniform(-0.3, 0.3), 6)))
        lon = max(-180.0, min(180.0, round(lon + rng.uniform(-0.3, 0.3), 6)))
        venues.append(Venue(venue_id=10_000 + i, venue_name=name, lat=lat, lon=lon))
    return tuple(venues), tuple(accumulate(1.0 / (k + 1) ** 0.8 for k in range(size)))


@lru_cache(maxsize=8)
def member_pool(seed: int, size: int) -> tuple[Member, ...]:
    rng = random.Random(f"{seed}:members")
    return tuple(
        Member(member_id=1_000_000 + i, member_name=f"{rng.choice(_FIRST)} {rng.choice(_LAST)}") for i in range(size)
    )


def _pick_response(u: float) -> str:
    # Most RSVPs are yes; a few no; waitlist is rare.
    return "yes" if u < 0.8 else ("no" if u < 0.95 else "waitlist")


def sample_rsvp(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid RSVP, keyed by its venue id (one venue always lands in one partition)."""
    config = context.config
    venues, cum_weights = venue_pool(config.seed, config.venues)
    members = member_pool(config.seed, config.members)
    venue = venues[min(bisect_right(cum_weights, rng.random() * cum_weights[-1]), len(venues) - 1)]
    member = members[rng.randrange(len(members))]
    payload = {
        "event_id": context.event_id,
        "event_time": context.event_time,
        "sent_time": context.sent_time,
        "producer_id": context.producer_id,
        "seq_no": context.seq_no,
        "visibility": "members" if rng.random() < 0.2 else "public",  # mostly public
        "response": _pick_response(rng.random()),
        "venue": {"venue_id": venue.venue_id, "venue_name": venue.venue_name, "lat": venue.lat, "lon": venue.lon},
        "member": {"member_id": member.member_id, "member_name": member.member_name},
    }
    return str(venue.venue_id).encode("utf-8"), payload


def _not_utf8(payload: Payload) -> bytes:
    return b"\xff\xfe\x00garbage" + encode(payload)[:20]


def _member_id_as_text(payload: Payload) -> bytes:
    return set_field("member.member_id", f"m-{payload['member']['member_id']}")(payload)


# Each breaks one rule of the contract above (or the JSON itself); test_rsvps_pipeline names the
# quarantine reason each must get.
SAMPLE_EVENTS = SampleEvents(
    make=sample_rsvp,
    malformations={
        "truncated_json": truncated_json,
        "null_event_id": set_field("event_id", None),
        "lat_out_of_range": set_field("venue.lat", 91.5),
        "bad_response": set_field("response", "maybe"),
        "missing_member": drop_field("member"),
        "wrong_type_member_id": _member_id_as_text,
        "bad_event_time": set_field("event_time", "yesterday"),
        "not_utf8": _not_utf8,
    },
)


PIPELINE = Pipeline(
    name="rsvps",
    description="Meetup-style RSVP events: venue, member, response",
    entity_column="venue_id",
    sample_events=SAMPLE_EVENTS,
    sources=(
        Source(
            name="rsvps",
            topic="rsvps",
            payload_schema=PAYLOAD,
            columns=COLUMNS,
            constraints=CONSTRAINTS,
            key="event_id",
            event_time="event_time",
            watermark=WATERMARK,
            clock_skew_tolerance=CLOCK_SKEW_TOLERANCE,
            sequence=("producer_id", "seq_no"),
            quality=Quality(
                rows_per_hour=(1, None),
                tolerated_invalid_fraction=0.01,
                tolerated_duplicate_fraction=0.02,
                # Silver or the counts being wrong means the published numbers would be: hold gold back.
                blocking_suites=("bronze", "silver", "reconciliation"),
            ),
        ),
    ),
    gold=(
        WindowAggregate(
            name="venue_response_counts",
            description="RSVPs per venue and response, 1-minute tumbling windows",
            keys=("window_start", "venue_id", "response"),
            window="1 minute",
            build=venue_response_counts,
        ),
        WindowAggregate(
            name="trending_venues",
            description="RSVPs and yes answers per venue, 5-minute windows every minute",
            keys=("window_start", "window_end", "venue_id"),
            window="5 minutes",
            build=trending_venues,
        ),
    ),
)
