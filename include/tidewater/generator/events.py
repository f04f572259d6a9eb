"""Synthetic Meetup RSVP events: pure, seeded, no I/O.

Everything downstream (bronze parsing, silver dedup, watermarks, quarantine) is tested against
what this module produces, so the generator must be exactly reproducible: the same
:class:`GeneratorConfig` always yields the same records, byte for byte. Time therefore comes
from a *simulated* clock that starts at ``start_time_ms`` and advances by ``1000 / rate`` ms
per record (faster during bursts); the wall clock is read at most once, and only when
``start_time_ms`` is None. Simulated times may run ahead of the wall clock (a fast run of a slow
rate, clock skew); they stay in the payload, while the Kafka record timestamp the producer sets is
never later than the moment it sends (see :func:`tidewater.generator.producer.kafka_timestamp`).

The imperfections a real collection tier shows are injected on purpose and labelled in
:attr:`GeneratedRecord.kind`, so a test can tell which records silver must keep, drop or
quarantine:

- ``duplicate``: a re-send of an earlier event (same bytes, new Kafka record), as after a retry;
- ``out_of_order``: the event happened a little before it was sent (within ``out_of_order_max_ms``);
- ``late``: it happened far before it was sent (``late_delay_ms`` + a draw), beyond a watermark;
- ``malformed``: the value is not valid JSON or violates the schema, with the reason recorded;
- ``lost`` (``loss_rate``): lost upstream of Kafka, as by a crashed producer's buffer: its
  ``seq_no`` is used up but the record is never yielded, so only a gap in its producer's sequence
  numbers shows it (what the reconciliation audit reports).
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import accumulate
from typing import Any

from tidewater.errors import ConfigError

RESPONSES = ("yes", "no", "waitlist")
VISIBILITIES = ("public", "members")
DELAY_DISTRIBUTIONS = ("exponential", "uniform", "fixed")
KINDS = ("ok", "duplicate", "out_of_order", "late", "malformed", "lost")
# The ways a malformed record is broken, used in turn so every kind shows up in small samples.
MALFORMED_REASONS = (
    "truncated_json",
    "null_event_id",
    "lat_out_of_range",
    "bad_response",
    "missing_member",
    "wrong_type_member_id",
    "bad_event_time",
    "not_utf8",
)
# Duplicates re-send one of the most recent valid events, as a producer retry would.
DUPLICATE_WINDOW = 1000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """Every knob of the generator. Fractions are of all records and are mutually exclusive."""

    seed: int = 42
    producers: int = 3  # logical producers "producer-0" .. "producer-{N-1}"
    venues: int = 200
    members: int = 5000
    start_time_ms: int | None = None  # None = the wall clock when generation starts
    rate: float = 1000.0  # offered events per second (simulated, and paced when producing in real time)
    burst_every_s: float = 0.0  # 0 = no bursts
    burst_seconds: float = 0.0
    burst_multiplier: float = 1.0
    duplicate_rate: float = 0.0
    out_of_order_fraction: float = 0.0
    late_fraction: float = 0.0
    delay_distribution: str = "exponential"
    delay_mean_ms: int = 2000
    out_of_order_max_ms: int = 10000
    late_delay_ms: int = 600000
    clock_skew_ms: tuple[int, ...] = ()  # one entry per producer (or empty = no skew)
    malformed_rate: float = 0.0
    loss_rate: float = 0.0  # records never sent (count still counts them)

    def __post_init__(self) -> None:
        for name in ("duplicate_rate", "out_of_order_fraction", "late_fraction", "malformed_rate", "loss_rate"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"generator {name}={value!r} must be a fraction in [0, 1]")
        total = (
            self.duplicate_rate + self.out_of_order_fraction + self.late_fraction + self.malformed_rate + self.loss_rate
        )
        if total > 1.0 + 1e-9:
            raise ConfigError(
                f"generator duplicate, out-of-order, late, malformed and loss fractions add up to {total:g}; "
                "they are shares of the same records and must add up to at most 1"
            )
        if not (isinstance(self.rate, int | float) and math.isfinite(self.rate) and self.rate > 0):
            raise ConfigError(f"generator rate={self.rate!r} must be a positive number of events per second")
        for name in ("producers", "venues", "members"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"generator {name}={value!r} must be an integer >= 1")
        if self.burst_every_s < 0 or self.burst_seconds < 0:
            raise ConfigError("generator burst_every_s and burst_seconds must be >= 0")
        if self.burst_every_s > 0 and not 0 < self.burst_seconds <= self.burst_every_s:
            raise ConfigError(
                f"generator burst_seconds={self.burst_seconds:g} must be > 0 and <= burst_every_s="
                f"{self.burst_every_s:g} when bursts are on"
            )
        if not (math.isfinite(self.burst_multiplier) and self.burst_multiplier > 0):
            raise ConfigError(f"generator burst_multiplier={self.burst_multiplier!r} must be > 0")
        if self.delay_distribution not in DELAY_DISTRIBUTIONS:
            raise ConfigError(
                f"generator delay_distribution={self.delay_distribution!r} is not one of "
                f"{', '.join(DELAY_DISTRIBUTIONS)}"
            )
        if self.delay_mean_ms < 1 or self.out_of_order_max_ms < 1:
            raise ConfigError("generator delay_mean_ms and out_of_order_max_ms must be >= 1")
        if self.late_delay_ms < 0:
            raise ConfigError(f"generator late_delay_ms={self.late_delay_ms} must be >= 0")
        if self.clock_skew_ms and len(self.clock_skew_ms) != self.producers:
            raise ConfigError(
                f"generator clock_skew_ms has {len(self.clock_skew_ms)} entries but there are "
                f"{self.producers} producers: give one skew per producer or none"
            )
        if not all(isinstance(s, int) for s in self.clock_skew_ms):
            raise ConfigError(f"generator clock_skew_ms={self.clock_skew_ms!r} must hold whole milliseconds")

    def skew_of(self, producer: int) -> int:
        """Clock skew (ms) of producer number ``producer``."""
        return self.clock_skew_ms[producer] if self.clock_skew_ms else 0


@dataclass(frozen=True)
class GeneratedRecord:
    """One Kafka record as the generator means it to be sent, plus what it is (for tests)."""

    key: bytes  # venue_id as utf-8: the entity key, so one venue always lands in one partition
    value: bytes
    # When (by its producer's simulated clock) the record is sent: the payload's sent_time. The producer
    # stamps Kafka's timestamp with min(this, wall clock): brokers refuse records from the future.
    timestamp_ms: int
    kind: str  # one of KINDS
    event_id: str | None
    producer_id: str
    seq_no: int
    event_time_ms: int | None
    malformed_reason: str | None = None


# ---- timestamps -----------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _second_prefix(seconds: int) -> str:
    # Cached: consecutive events share their second, and strftime dominates generation time.
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")


def format_ts(ms: int) -> str:
    """Epoch milliseconds -> ``2026-11-21T10:00:00.123Z`` (ISO-8601, UTC, ms, Z)."""
    return f"{_second_prefix(ms // 1000)}.{ms % 1000:03d}Z"


def parse_ts(text: str) -> int:
    """ISO-8601 -> epoch milliseconds; a time without an offset is taken as UTC."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(milliseconds=1)


# ---- the simulated clock --------------------------------------------------------------------------


def rate_at(config: GeneratorConfig, elapsed_s: float) -> float:
    """Offered events/s at ``elapsed_s`` after the start: ``rate``, times the multiplier in a burst.

    Shared by :func:`generate` (simulated time) and the producer's pacing (real time), so a
    paced run's event times track the wall clock.
    """
    if config.burst_every_s > 0 and (elapsed_s % config.burst_every_s) < config.burst_seconds:
        return config.rate * config.burst_multiplier
    return config.rate


# ---- entity pools ---------------------------------------------------------------------------------

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
    "Ana",
    "Ben",
    "Chloé",
    "Dmitri",
    "Eve",
    "Farah",
    "Gus",
    "Hana",
    "Ivan",
    "José",
    "Kai",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tomás",
    "Uma",
    "Wei",
    "Yara",
    "Zoë",
)
_LAST = (
    "Smith",
    "García",
    "Müller",
    "Okafor",
    "Tanaka",
    "Novak",
    "Silva",
    "Khan",
    "Dubois",
    "Larsen",
    "Kowalski",
    "Nguyen",
    "O'Brien",
    "Rossi",
    "Haddad",
    "Ivanova",
)


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


def venue_pool(config: GeneratorConfig) -> list[Venue]:
    """The venues, fixed per (seed, index): a venue id always has the same name and place."""
    rng = random.Random(f"{config.seed}:venues")
    venues = []
    for i in range(config.venues):
        city, lat, lon = rng.choice(_CITIES)
        name = f"{rng.choice(_VENUE_ADJ)} {rng.choice(_VENUE_NOUN)}, {city}"
        lat = max(-90.0, min(90.0, round(lat + rng.uniform(-0.3, 0.3), 6)))
        lon = max(-180.0, min(180.0, round(lon + rng.uniform(-0.3, 0.3), 6)))
        venues.append(Venue(venue_id=10_000 + i, venue_name=name, lat=lat, lon=lon))
    return venues


def member_pool(config: GeneratorConfig) -> list[Member]:
    rng = random.Random(f"{config.seed}:members")
    return [
        Member(member_id=1_000_000 + i, member_name=f"{rng.choice(_FIRST)} {rng.choice(_LAST)}")
        for i in range(config.members)
    ]


# ---- generation -----------------------------------------------------------------------------------


def _pick_response(u: float) -> str:
    # Most RSVPs are yes; a few no; waitlist is rare.
    return "yes" if u < 0.8 else ("no" if u < 0.95 else "waitlist")


def _draw_delay(rng: random.Random, config: GeneratorConfig) -> int:
    """A delay (ms) from the configured distribution, clipped to [1, out_of_order_max_ms]."""
    mean = config.delay_mean_ms
    if config.delay_distribution == "exponential":
        raw = rng.expovariate(1.0 / mean)
    elif config.delay_distribution == "uniform":
        raw = rng.uniform(0, 2 * mean)
    else:
        raw = float(mean)
    return max(1, min(config.out_of_order_max_ms, round(raw)))


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _malform(payload: dict[str, Any], reason: str) -> bytes:
    """Break a valid payload in the way ``reason`` names."""
    bad = json.loads(json.dumps(payload))  # deep copy
    if reason == "truncated_json":
        whole = _encode(payload)
        return whole[: len(whole) // 2]
    if reason == "not_utf8":
        return b"\xff\xfe\x00garbage" + _encode(payload)[:20]
    if reason == "null_event_id":
        bad["event_id"] = None
    elif reason == "lat_out_of_range":
        bad["venue"]["lat"] = 91.5
    elif reason == "bad_response":
        bad["response"] = "maybe"
    elif reason == "missing_member":
        del bad["member"]
    elif reason == "wrong_type_member_id":
        bad["member"]["member_id"] = f"m-{bad['member']['member_id']}"
    elif reason == "bad_event_time":
        bad["event_time"] = "yesterday"
    else:  # pragma: no cover - MALFORMED_REASONS and this function go together
        raise AssertionError(reason)
    return _encode(bad)


def generate(config: GeneratorConfig, count: int | None) -> Iterator[GeneratedRecord]:
    """Yield ``count`` records (forever if None), identical for identical configs.

    Record ``i`` is sent at simulated time ``start + sum(1000 / rate_at(t))`` (so event time
    advances at the offered rate) and stamped with its producer's skewed clock.
    """
    if count is not None and count < 0:
        raise ConfigError(f"generator count={count} must be >= 0")
    rng = random.Random(config.seed)
    venues = venue_pool(config)
    members = member_pool(config)
    # Popular venues get more RSVPs (Zipf-like), which makes partition loads realistically uneven.
    cum_weights = list(accumulate(1.0 / (k + 1) ** 0.8 for k in range(len(venues))))
    total_weight = cum_weights[-1]
    start_ms = config.start_time_ms if config.start_time_ms is not None else int(time.time() * 1000)
    producer_ids = [f"producer-{p}" for p in range(config.producers)]
    next_seq = [0] * config.producers
    recent: deque[GeneratedRecord] = deque(maxlen=DUPLICATE_WINDOW)
    malformed_seen = 0

    # Thresholds over one uniform draw: the kinds are mutually exclusive shares of all records.
    t_dup = config.duplicate_rate
    t_bad = t_dup + config.malformed_rate
    t_late = t_bad + config.late_fraction
    t_ooo = t_late + config.out_of_order_fraction
    t_lost = t_ooo + config.loss_rate

    sim_ms = 0.0  # simulated ms since start
    i = 0
    while count is None or i < count:
        now_ms = start_ms + int(sim_ms)
        u = rng.random()
        if u < t_dup and recent:
            orig = rng.choice(recent)
            skew = config.skew_of(int(orig.producer_id.rsplit("-", 1)[1]))
            yield GeneratedRecord(
                key=orig.key,
                value=orig.value,
                timestamp_ms=now_ms + skew,  # a new Kafka record, sent now
                kind="duplicate",
                event_id=orig.event_id,
                producer_id=orig.producer_id,
                seq_no=orig.seq_no,
                event_time_ms=orig.event_time_ms,
            )
        else:
            if u < t_dup:
                kind = "ok"  # nothing to duplicate yet
            elif u < t_bad:
                kind = "malformed"
            elif u < t_late:
                kind = "late"
            elif u < t_ooo:
                kind = "out_of_order"
            elif u < t_lost:
                kind = "lost"
            else:
                kind = "ok"
            p = rng.randrange(config.producers)
            seq_no = next_seq[p]
            next_seq[p] += 1
            skew = config.skew_of(p)
            venue = venues[min(bisect_right(cum_weights, rng.random() * total_weight), len(venues) - 1)]
            member = members[rng.randrange(len(members))]
            event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            delay = 0
            if kind == "out_of_order":
                delay = _draw_delay(rng, config)
            elif kind == "late":
                delay = config.late_delay_ms + _draw_delay(rng, config)
            event_time_ms = now_ms - delay + skew
            sent_ms = now_ms + skew
            payload = {
                "event_id": event_id,
                "event_time": format_ts(event_time_ms),
                "sent_time": format_ts(sent_ms),
                "producer_id": producer_ids[p],
                "seq_no": seq_no,
                "visibility": "members" if rng.random() < 0.2 else "public",  # mostly public
                "response": _pick_response(rng.random()),
                "venue": {
                    "venue_id": venue.venue_id,
                    "venue_name": venue.venue_name,
                    "lat": venue.lat,
                    "lon": venue.lon,
                },
                "member": {"member_id": member.member_id, "member_name": member.member_name},
            }
            reason = None
            if kind == "malformed":
                reason = MALFORMED_REASONS[malformed_seen % len(MALFORMED_REASONS)]
                malformed_seen += 1
                value = _malform(payload, reason)
            else:
                value = _encode(payload)
            record = GeneratedRecord(
                key=str(venue.venue_id).encode("utf-8"),
                value=value,
                timestamp_ms=sent_ms,
                kind=kind,
                event_id=None if reason == "null_event_id" else event_id,
                producer_id=producer_ids[p],
                seq_no=seq_no,
                event_time_ms=event_time_ms,
                malformed_reason=reason,
            )
            if kind not in ("malformed", "lost"):
                recent.append(record)
            if kind != "lost":
                yield record
        sim_ms += 1000.0 / rate_at(config, sim_ms / 1000.0)
        i += 1


def expected_events(config: GeneratorConfig, count: int) -> dict[str, GeneratedRecord]:
    """The distinct valid events of ``generate(config, count)``: what silver must end up holding."""
    out: dict[str, GeneratedRecord] = {}
    for record in generate(config, count):
        if record.kind in ("malformed", "duplicate") or record.event_id is None:
            continue
        out.setdefault(record.event_id, record)
    return out
