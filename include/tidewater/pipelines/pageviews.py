"""Page views of a web site: how many pages each visitor sees per hour, and their visits (sessions).

The streaming literature's warning is the reason this pipeline exists: "an in-memory hourly count
that fails at minute 59 is lost". Here the per-visitor hour is Spark state checkpointed with every
micro-batch, so a driver killed at minute 59 resumes with the hour's counts intact
(tests/integration/test_pageviews.py kills it there).

Gold:
* ``views_per_visitor_hour``: per visitor and 1-hour tumbling event-time window, the views and the
  distinct pages seen (a window aggregate, updated while the hour is open).
* ``visitor_sessions``: per visitor, each visit: views that follow one another within 30 minutes
  (a session aggregate). ``window_start`` is the first view, ``last_view_at`` the last one and
  ``window_end`` the last view + 30 minutes (when the session is over); ``views``, ``distinct_pages``,
  ``landing_page`` (first page) and ``exit_page`` (last page). The stream emits a session once the
  watermark passes its end; a late view that falls between two visits of a visitor bridges them, and
  the late-data correction replaces both with one (ledger: one changed row, one removed).
* ``pricing_conversions``: each view of the pricing page joined to the same visitor's sign-up views
  of the 30 minutes after it (a stream-stream join with both sides watermarked); a pricing view no
  sign-up followed is emitted once the watermark passes it + 30 minutes, with ``converted`` false:
  ``window_start`` = the pricing view, ``window_end`` = 30 minutes later, ``visitor_id``,
  ``pricing_view_id``, ``signup_view_id`` (empty when none), ``signup_at``, ``converted``.
* ``signups``: every view of the sign-up page, as it happened (a projection: one row per event, no
  state, nothing waits for a watermark): ``view_id``, ``viewed_at``, ``visitor_id``, ``referrer``,
  ``device``.

Sample events (:data:`SAMPLE_EVENTS`): visitors from a seeded pool, a few of them very active
(Zipf-like) and who is online changing every 10 minutes (so visits end), reading pages of a small
site, keyed by visitor id (a visitor always lands in one partition, so its views stay in order there).
"""

from __future__ import annotations

import random
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from tidewater.pipelines.base import Pipeline, Projection, SessionAggregate, Source, StreamJoin, WindowAggregate
from tidewater.pipelines.contract import NotAfterArrival, OneOf, Quality, Required
from tidewater.pipelines.samples import (
    EventContext,
    Payload,
    SampleEvents,
    drop_field,
    parse_ts,
    set_field,
    truncated_json,
)
from tidewater.transforms import bounded_join, session_aggregates, windowed_counts

WATERMARK = "2 minutes"
SESSION_GAP = "30 minutes"
DEVICES = ("desktop", "mobile", "tablet")
SIGNUP_PAGE = "/signup"
PRICING_PAGE = "/pricing"
CONVERSION_BOUND = "30 minutes"

PAYLOAD = StructType(
    [
        StructField("view_id", StringType()),
        StructField("viewed_at", TimestampType()),
        StructField("visitor_id", StringType()),
        StructField("page", StringType()),
        StructField("referrer", StringType()),
        StructField("device", StringType()),
    ]
)

COLUMNS = {
    "view_id": "p.view_id",
    "viewed_at": "p.viewed_at",
    "visitor_id": "p.visitor_id",
    "page": "p.page",
    "referrer": "p.referrer",
    "device": "p.device",
}

CONSTRAINTS = (
    Required(("view_id",), non_empty=True),
    Required(("viewed_at",), reason="viewed_at missing or not an ISO-8601 timestamp"),
    Required(("visitor_id", "page"), non_empty=True),
    OneOf("device", DEVICES),
    NotAfterArrival("viewed_at", tolerance="5 minutes"),
)


def views_per_visitor_hour(silver: DataFrame) -> DataFrame:
    return windowed_counts(
        silver,
        time_column="viewed_at",
        watermark=WATERMARK,
        window="1 hour",
        group_by=("visitor_id",),
        measures={
            "views": F.count(F.lit(1)),
            # distinct aggregates are not allowed in a streaming aggregation; a set's size is
            "distinct_pages": F.size(F.collect_set("page")),
        },
    )


def _first(column: str) -> F.Column:
    """The ``column`` of the earliest view (ties broken by view id, so stream and batch agree)."""
    return F.min(F.struct("viewed_at", "view_id", column))[column]


def _last(column: str) -> F.Column:
    return F.max(F.struct("viewed_at", "view_id", column))[column]


def visitor_sessions(silver: DataFrame) -> DataFrame:
    return session_aggregates(
        silver,
        time_column="viewed_at",
        watermark=WATERMARK,
        gap=SESSION_GAP,
        group_by=("visitor_id",),
        measures={
            "views": F.count(F.lit(1)),
            "distinct_pages": F.size(F.collect_set("page")),
            "landing_page": _first("page"),
            "exit_page": _last("page"),
            "last_view_at": F.max("viewed_at"),
        },
    )


def pricing_conversions(silver: DataFrame) -> DataFrame:
    pricing = silver.where(F.col("page") == PRICING_PAGE).select(
        F.col("view_id").alias("pricing_view_id"), F.col("visitor_id"), F.col("viewed_at").alias("pricing_at")
    )
    signup = silver.where(F.col("page") == SIGNUP_PAGE).select(
        F.col("view_id").alias("signup_view_id"),
        F.col("visitor_id").alias("signup_visitor"),
        F.col("viewed_at").alias("signup_at"),
    )
    joined = bounded_join(
        pricing,
        signup,
        left_time="pricing_at",
        right_time="signup_at",
        key=("visitor_id", "signup_visitor"),
        bound=CONVERSION_BOUND,
        watermark=WATERMARK,
    )
    return joined.select(
        F.col("pricing_at").alias("window_start"),
        (F.col("pricing_at") + F.expr(f"INTERVAL {CONVERSION_BOUND}")).alias("window_end"),
        "visitor_id",
        "pricing_view_id",
        F.coalesce("signup_view_id", F.lit("")).alias("signup_view_id"),  # a key column: never null
        "signup_at",
        F.col("signup_view_id").isNotNull().alias("converted"),
    )


def signups(silver: DataFrame) -> DataFrame:
    return silver.where(F.col("page") == SIGNUP_PAGE).select("view_id", "viewed_at", "visitor_id", "referrer", "device")


# ---- sample events ----------------------------------------------------------------------------------

PAGES = (
    "/", "/pricing", "/docs", "/docs/quickstart", "/docs/streaming", "/docs/batch", "/docs/sql",
    "/blog", "/blog/watermarks", "/blog/exactly-once", "/blog/sessions", "/careers", "/contact",
    "/signup", "/login", "/changelog",
)  # fmt: skip
REFERRERS = ("", "search", "newsletter", "social", "partner")


@lru_cache(maxsize=8)
def visitor_pool(seed: int, size: int) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Visitor ids, fixed per (seed, index), and the cumulative Zipf-like weights of the visitors online
    at one time (a tenth of the pool): a few of them very active."""
    rng = random.Random(f"{seed}:visitors")
    ids = tuple(f"v-{rng.getrandbits(40):010x}" for _ in range(size))
    online = max(1, size // 10)
    return ids, tuple(accumulate(1.0 / (k + 1) ** 0.9 for k in range(online)))


# Visitors come and go: who is online changes every VISIT_BLOCK_MS (a visitor is online in about one
# block in ten), so most visits end (30 minutes without a view) and the sessions table fills.
VISIT_BLOCK_MS = 10 * 60 * 1000


def sample_view(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid page view (``members`` of the generator config is the size of the visitor pool)."""
    ids, cum_weights = visitor_pool(context.config.seed, context.config.members)
    rank = min(bisect_right(cum_weights, rng.random() * cum_weights[-1]), len(cum_weights) - 1)
    block = parse_ts(context.event_time) // VISIT_BLOCK_MS
    visitor = ids[(rank + block * 2917) % len(ids)]  # each block, another stretch of the pool is online
    payload = {
        "view_id": context.event_id,
        "viewed_at": context.event_time,
        "visitor_id": visitor,
        "page": PAGES[min(int(rng.expovariate(0.35)), len(PAGES) - 1)],  # the home page most often
        "referrer": rng.choice(REFERRERS),
        "device": "mobile" if rng.random() < 0.55 else ("desktop" if rng.random() < 0.85 else "tablet"),
    }
    return visitor.encode("utf-8"), payload


SAMPLE_EVENTS = SampleEvents(
    make=sample_view,
    malformations={
        "truncated_json": truncated_json,
        "missing_visitor": drop_field("visitor_id"),
        "bad_device": set_field("device", "smart-fridge"),
        "bad_viewed_at": set_field("viewed_at", "just now"),
    },
)


PIPELINE = Pipeline(
    name="pageviews",
    description="Page views of a web site: visitor, page, referrer, device",
    entity_column="visitor_id",
    sample_events=SAMPLE_EVENTS,
    sources=(
        Source(
            name="pageviews",
            topic="pageviews",
            payload_schema=PAYLOAD,
            columns=COLUMNS,
            constraints=CONSTRAINTS,
            key="view_id",
            event_time="viewed_at",
            watermark=WATERMARK,
            partition_column="view_date",
            quality=Quality(
                rows_per_hour=(1, None),
                tolerated_invalid_fraction=0.01,
                tolerated_duplicate_fraction=0.02,
                blocking_suites=("bronze", "silver", "reconciliation"),
            ),
        ),
    ),
    gold=(
        WindowAggregate(
            name="views_per_visitor_hour",
            description="Page views and distinct pages per visitor, 1-hour tumbling windows",
            keys=("window_start", "visitor_id"),
            window="1 hour",
            build=views_per_visitor_hour,
        ),
        SessionAggregate(
            name="visitor_sessions",
            description="Visits per visitor: views within 30 minutes of each other, landing and exit page",
            keys=("window_start", "visitor_id"),
            gap=SESSION_GAP,
            build=visitor_sessions,
        ),
        StreamJoin(
            name="pricing_conversions",
            description="Pricing-page views and the sign-ups of the same visitor within 30 minutes after",
            keys=("window_start", "pricing_view_id", "signup_view_id"),
            bound=CONVERSION_BOUND,
            build=pricing_conversions,
        ),
        Projection(
            name="signups",
            description="Every view of the sign-up page: visitor, referrer, device",
            keys=("view_id",),
            time_column="viewed_at",
            build=signups,
        ),
    ),
)
