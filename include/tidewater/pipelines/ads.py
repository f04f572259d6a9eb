"""Ad impressions and their clicks: two topics joined in event time (the literature's stream-stream join).

Sources:
* ``impressions`` (topic ``ad-impressions``): an ad shown to a user: ``impression_id``, ``shown_at``,
  ``campaign_id``, ``ad_id``, ``user_id``, ``placement``; numbered per producer (``producer_id``,
  ``seq_no``), so the reconciliation reports impressions lost before Kafka.
* ``clicks`` (topic ``ad-clicks``): a click on an impression: ``click_id``, ``clicked_at``,
  ``impression_id`` (the impression clicked), ``campaign_id``, ``user_id``.

Gold:
* ``clicked_impressions``: every impression with the clicks that came within 10 minutes of it
  (stream-stream join, both sides watermarked). A click appears as soon as both sides are in; an
  impression nobody clicked appears once the watermark passes ``shown_at`` + 10 minutes, with
  ``clicked`` false and an empty ``click_id``. ``window_start`` = ``shown_at``, ``window_end`` = 10
  minutes later; ``seconds_to_click`` from impression to click.
* ``orphan_clicks``: every click that cannot be credited to an impression, with the ``reason``:
  ``impression_too_old`` (its impression was shown more than 10 minutes before the click; ``shown_at``
  and ``minutes_after_impression`` say when) or ``impression_missing`` (no impression with that id in the
  hour before the click: lost, malformed, never sent, or a forged click). A click is never dropped
  silently: each lands in exactly one of the two tables (tests/integration/test_ads.py proves it across
  kill -9). ``window_start`` = ``window_end`` = ``clicked_at``: an orphan is final once the watermark
  passes the click (the impression side can no longer deliver a match).
* ``ctr_per_campaign``: per campaign and 5-minute tumbling window, ``impressions`` shown and ``clicks``
  made in it, and ``ctr`` = clicks / impressions (null without impressions).

Sample events: impressions of a seeded pool of campaigns (a few much bigger than the rest), each
clicked with its campaign's click-through rate a little after it is shown (a few long after, beyond
the bound), plus rare clicks on impressions that never existed; see :data:`SAMPLE_EVENTS`.
"""

from __future__ import annotations

import random
import uuid
from functools import lru_cache

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from tidewater.pipelines.base import Pipeline, Source, StreamJoin, WindowAggregate
from tidewater.pipelines.contract import NotAfterArrival, OneOf, Quality, Required
from tidewater.pipelines.samples import (
    EventContext,
    FollowUp,
    Payload,
    SampleEvents,
    drop_field,
    format_ts,
    parse_ts,
    set_field,
    truncated_json,
)
from tidewater.transforms import bounded_join, watermarked_union, windowed_counts

WATERMARK = "2 minutes"
CLICK_BOUND = "10 minutes"  # a click counts for its impression this long after it was shown
ORPHAN_LOOKBACK = "1 hour"  # how far back an orphan click's impression is looked for (too old vs missing)
CTR_WINDOW = "5 minutes"
PLACEMENTS = ("feed", "sidebar", "search", "video")
TOO_OLD, MISSING = "impression_too_old", "impression_missing"

IMPRESSION = StructType(
    [
        StructField("impression_id", StringType()),
        StructField("shown_at", TimestampType()),
        StructField("campaign_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("user_id", StringType()),
        StructField("placement", StringType()),
        StructField("producer_id", StringType()),
        StructField("seq_no", LongType()),
    ]
)
CLICK = StructType(
    [
        StructField("click_id", StringType()),
        StructField("clicked_at", TimestampType()),
        StructField("impression_id", StringType()),
        StructField("campaign_id", StringType()),
        StructField("user_id", StringType()),
    ]
)


def _seconds_between(earlier: str, later: str) -> F.Column:
    """Exact to the microsecond (a timestamp cast to double seconds is not)."""
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / 1_000_000


def clicked_impressions(impressions: DataFrame, clicks: DataFrame) -> DataFrame:
    shown = impressions.select("impression_id", "shown_at", "campaign_id", "ad_id", "placement")
    clicked = clicks.select("click_id", "clicked_at", F.col("impression_id").alias("clicked_impression_id"))
    joined = bounded_join(
        shown,
        clicked,
        left_time="shown_at",
        right_time="clicked_at",
        key=("impression_id", "clicked_impression_id"),
        bound=CLICK_BOUND,
        watermark=WATERMARK,
    )
    return joined.select(
        F.col("shown_at").alias("window_start"),
        (F.col("shown_at") + F.expr(f"INTERVAL {CLICK_BOUND}")).alias("window_end"),
        "campaign_id",
        "impression_id",
        F.coalesce("click_id", F.lit("")).alias("click_id"),  # a key column: never null
        "ad_id",
        "placement",
        "clicked_at",
        F.col("click_id").isNotNull().alias("clicked"),
        _seconds_between("shown_at", "clicked_at").alias("seconds_to_click"),
    )


def orphan_clicks(clicks: DataFrame, impressions: DataFrame) -> DataFrame:
    click = clicks.select("click_id", "clicked_at", "impression_id", "campaign_id", "user_id")
    shown = impressions.select(F.col("impression_id").alias("shown_impression_id"), "shown_at")
    joined = bounded_join(
        click,
        shown,
        left_time="clicked_at",
        right_time="shown_at",
        key=("impression_id", "shown_impression_id"),
        bound="0 seconds",
        lookback=ORPHAN_LOOKBACK,
        watermark=WATERMARK,
    )
    too_old = F.col("shown_at") < F.col("clicked_at") - F.expr(f"INTERVAL {CLICK_BOUND}")
    orphans = joined.where(F.col("shown_at").isNull() | too_old)
    return orphans.select(
        F.col("clicked_at").alias("window_start"),
        F.col("clicked_at").alias("window_end"),
        "campaign_id",
        "click_id",
        "impression_id",
        "user_id",
        F.when(F.col("shown_at").isNull(), F.lit(MISSING)).otherwise(F.lit(TOO_OLD)).alias("reason"),
        "shown_at",
        (_seconds_between("shown_at", "clicked_at") / 60).alias("minutes_after_impression"),
    )


def ctr_per_campaign(impressions: DataFrame, clicks: DataFrame) -> DataFrame:
    """Impressions and clicks of each window counted where each happened (a click in the window of its
    own time, as a dashboard of the last 5 minutes would show it)."""
    shown = impressions.select("campaign_id", F.col("shown_at").alias("at"), F.lit(1).alias("i"), F.lit(0).alias("c"))
    clicked = clicks.select("campaign_id", F.col("clicked_at").alias("at"), F.lit(0).alias("i"), F.lit(1).alias("c"))
    counts = windowed_counts(
        watermarked_union((shown, clicked), time_column="at", watermark=WATERMARK),  # each input its own
        time_column="at",
        watermark=None,
        window=CTR_WINDOW,
        group_by=("campaign_id",),
        measures={"impressions": F.sum("i"), "clicks": F.sum("c")},
    )
    ctr = F.when(F.col("impressions") > 0, F.col("clicks") / F.col("impressions"))
    return counts.withColumn("ctr", ctr)


# ---- sample events ----------------------------------------------------------------------------------

CAMPAIGNS = 24


@lru_cache(maxsize=8)
def campaign_pool(seed: int) -> tuple[tuple[str, float, float], ...]:
    """(campaign id, share of impressions, click-through rate): a few big campaigns, rates 2-15 %."""
    rng = random.Random(f"{seed}:campaigns")
    weights = [1.0 / (k + 1) for k in range(CAMPAIGNS)]
    total = sum(weights)
    return tuple((f"c-{k:03d}", w / total, rng.uniform(0.02, 0.15)) for k, w in enumerate(weights))


def _user(rng: random.Random, context: EventContext) -> str:
    return f"u-{rng.randrange(context.config.members):06d}"


def sample_impression(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid impression, keyed by its user (a user's impressions and clicks share a partition)."""
    campaigns = campaign_pool(context.config.seed)
    campaign = rng.choices(campaigns, weights=[share for _, share, _ in campaigns])[0][0]
    user = _user(rng, context)
    payload = {
        "impression_id": context.event_id,
        "shown_at": context.event_time,
        "campaign_id": campaign,
        "ad_id": f"{campaign}-ad-{rng.randrange(4)}",
        "user_id": user,
        "placement": rng.choice(PLACEMENTS),
        "producer_id": context.producer_id,
        "seq_no": context.seq_no,
    }
    return user.encode("utf-8"), payload


# Share of clicks that come long after their impression (beyond CLICK_BOUND: orphans "too old"), and of
# impressions followed by a click on an impression id nobody showed (orphans "missing").
LATE_CLICK_SHARE = 0.05
FORGED_CLICK_RATE = 0.002


def clicks_on(rng: random.Random, context: EventContext, impression: Payload) -> list[FollowUp]:
    """The clicks an impression causes: with its campaign's click-through rate, one click most often a
    few seconds after it was shown (rarely a second one, or one long after); sometimes a forged click."""
    rate = {c: ctr for c, _, ctr in campaign_pool(context.config.seed)}[impression["campaign_id"]]
    shown = parse_ts(context.event_time)
    out = []
    clicks = 0 if rng.random() >= rate else (2 if rng.random() < 0.05 else 1)
    for _ in range(clicks):
        if rng.random() < LATE_CLICK_SHARE:
            after_ms = rng.randrange(11 * 60_000, 25 * 60_000)  # beyond the bound
        else:
            after_ms = min(int(rng.expovariate(1 / 20_000)) + 500, 9 * 60_000)
        out.append(
            _click(rng, impression["impression_id"], impression["campaign_id"], impression["user_id"], shown + after_ms)
        )
    if rng.random() < FORGED_CLICK_RATE:
        forged = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        out.append(_click(rng, forged, impression["campaign_id"], _user(rng, context), shown + 1_000))
    return out


def _click(rng: random.Random, impression_id: str, campaign: str, user: str, at_ms: int) -> FollowUp:
    click_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    payload = {
        "click_id": click_id,
        "clicked_at": format_ts(at_ms),
        "impression_id": impression_id,
        "campaign_id": campaign,
        "user_id": user,
    }
    return FollowUp(source="clicks", event_id=click_id, key=user.encode("utf-8"), payload=payload, at_ms=at_ms)


SAMPLE_EVENTS = SampleEvents(
    make=sample_impression,
    malformations={
        "truncated_json": truncated_json,
        "missing_campaign": drop_field("campaign_id"),
        "bad_placement": set_field("placement", "billboard"),
        "bad_shown_at": set_field("shown_at", "a moment ago"),
    },
    follow_ups=clicks_on,
)

QUALITY = Quality(
    rows_per_hour=(1, None),
    tolerated_invalid_fraction=0.01,
    tolerated_duplicate_fraction=0.02,
    blocking_suites=("bronze", "silver", "reconciliation"),
)

PIPELINE = Pipeline(
    name="ads",
    description="Ad impressions and clicks: clicks credited to impressions, orphans, click-through rates",
    entity_column="campaign_id",
    sample_events=SAMPLE_EVENTS,
    sources=(
        Source(
            name="impressions",
            topic="ad-impressions",
            payload_schema=IMPRESSION,
            columns={name: f"p.{name}" for name in IMPRESSION.fieldNames()},
            constraints=(
                Required(("impression_id",), non_empty=True),
                Required(("shown_at",), reason="shown_at missing or not an ISO-8601 timestamp"),
                Required(("campaign_id", "ad_id", "user_id"), non_empty=True),
                OneOf("placement", PLACEMENTS),
                NotAfterArrival("shown_at", tolerance="5 minutes"),
            ),
            key="impression_id",
            event_time="shown_at",
            watermark=WATERMARK,
            partition_column="shown_date",
            sequence=("producer_id", "seq_no"),
            quality=QUALITY,
        ),
        Source(
            name="clicks",
            topic="ad-clicks",
            payload_schema=CLICK,
            columns={name: f"p.{name}" for name in CLICK.fieldNames()},
            constraints=(
                Required(("click_id",), non_empty=True),
                Required(("clicked_at",), reason="clicked_at missing or not an ISO-8601 timestamp"),
                Required(("impression_id", "campaign_id"), non_empty=True),
                NotAfterArrival("clicked_at", tolerance="5 minutes"),
            ),
            key="click_id",
            event_time="clicked_at",
            watermark=WATERMARK,
            partition_column="click_date",
            # a quiet hour may have no click at all
            quality=Quality(
                rows_per_hour=(0, None),
                tolerated_invalid_fraction=0.01,
                tolerated_duplicate_fraction=0.05,  # clicks are few: a handful of client retries is 2-5 %
                blocking_suites=("bronze", "silver", "reconciliation"),
            ),
        ),
    ),
    gold=(
        StreamJoin(
            name="clicked_impressions",
            description="Impressions with the clicks of the 10 minutes after them; unclicked ones once closed",
            keys=("window_start", "campaign_id", "impression_id", "click_id"),
            inputs=("impressions", "clicks"),
            bound=CLICK_BOUND,
            build=clicked_impressions,
        ),
        StreamJoin(
            name="orphan_clicks",
            description="Clicks no impression of the 10 minutes before them explains, with the reason",
            keys=("window_start", "campaign_id", "click_id"),
            inputs=("clicks", "impressions"),
            bound="0 seconds",
            lookback=ORPHAN_LOOKBACK,
            build=orphan_clicks,
        ),
        WindowAggregate(
            name="ctr_per_campaign",
            description="Impressions, clicks and click-through rate per campaign, 5-minute tumbling windows",
            keys=("window_start", "campaign_id"),
            inputs=("impressions", "clicks"),
            window=CTR_WINDOW,
            build=ctr_per_campaign,
        ),
    ),
)
