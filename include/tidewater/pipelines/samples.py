"""Sample events for a pipeline: a seeded, pure generator with the faults a real collection tier shows.

A pipeline declares *what* one of its events looks like (:class:`SampleEvents`: a valid payload and
its Kafka key, and the ways a payload gets broken); this module decides *when* and *how badly* each
record goes wrong, the same way for every pipeline. It lives with the declarations (not in
:mod:`tidewater.generator`, which adds the Kafka producer and the command) so that a pipeline module
can import it without an import cycle.

Everything downstream (bronze parsing, silver dedup, watermarks, quarantine) is tested against what
this module produces, so generation must be exactly reproducible: the same :class:`GeneratorConfig`
and :class:`SampleEvents` always yield the same records, byte for byte. Time therefore comes from a
*simulated* clock that starts at ``start_time_ms`` and advances by ``1000 / rate`` ms per record
(faster during bursts); the wall clock is read at most once, and only when ``start_time_ms`` is None.
Simulated times may run ahead of the wall clock (a fast run of a slow rate, clock skew); they stay in
the payload, while the Kafka record timestamp the producer sets is never later than the moment it
sends (see :func:`tidewater.generator.producer.kafka_timestamp`).

The imperfections are injected on purpose and labelled in :attr:`GeneratedRecord.kind`, so a test
can tell which records silver must keep, drop or quarantine:

- ``duplicate``: a re-send of an earlier event (same bytes, new Kafka record), as after a retry;
- ``out_of_order``: the event happened a little before it was sent (within ``out_of_order_max_ms``);
- ``late``: it happened far before it was sent (``late_delay_ms`` + a draw), beyond a watermark;
- ``malformed``: the value is broken by one of the pipeline's malformations, used in turn, and the
  malformation's name is recorded;
- ``lost`` (``loss_rate``): lost upstream of Kafka, as by a crashed producer's buffer: its
  ``seq_no`` is used up but the record is never yielded, so only a gap in its producer's sequence
  numbers shows it (what the reconciliation audit reports).

A pipeline of several sources declares the events of its first source, and the records of other
sources each event causes (:class:`FollowUp`: an ad click some seconds after its impression). They
come out of the same seeded generator, interleaved in send-time order, so a click can only ever
reference an impression that was really generated (or lost, or broken: then the click is an orphan).
"""

from __future__ import annotations

import copy
import heapq
import json
import math
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from tidewater.errors import ConfigError

DELAY_DISTRIBUTIONS = ("exponential", "uniform", "fixed")
KINDS = ("ok", "duplicate", "out_of_order", "late", "malformed", "lost")
# Duplicates re-send one of the most recent valid events, as a producer retry would.
DUPLICATE_WINDOW = 1000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """Every knob of the generator. Fractions are of all records and are mutually exclusive."""

    seed: int = 42
    producers: int = 3  # logical producers "producer-0" .. "producer-{N-1}"
    # Entity pool sizes, for the sample events that draw from pools (rsvps: venues and members).
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

    key: bytes  # the entity key the sample events chose (rsvps: the venue id), so an entity keeps its partition
    value: bytes
    # When (by its producer's simulated clock) the record is sent: the payload's sent_time. The producer
    # stamps Kafka's timestamp with min(this, wall clock): brokers refuse records from the future.
    timestamp_ms: int
    kind: str  # one of KINDS
    # The id the event was generated with (a malformed record's bytes may no longer carry it).
    event_id: str | None
    producer_id: str
    seq_no: int  # -1 for a follow-up (not numbered by its producer)
    event_time_ms: int | None
    malformed_reason: str | None = None
    source: str | None = None  # the pipeline source (topic) it goes to; None: the first source
    # When the simulated schedule sends it, without its producer's clock skew (None: timestamp_ms): a
    # paced run sends each record once the wall clock has run as far from the start as this has.
    scheduled_ms: int | None = None


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A record of another source that an event causes (a click on an ad impression)."""

    source: str  # the name of the pipeline source it is sent to
    event_id: str
    key: bytes
    payload: Payload
    at_ms: int  # when it happens (epoch ms); it is sent then, or with its cause if that is later


# ---- what a pipeline declares ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventContext:
    """What the generic core has decided about one event before its payload is made."""

    event_id: str  # a UUID4 drawn from the seeded rng
    event_time: str  # ISO-8601 text (format_ts): when it happened, by its producer's skewed clock
    sent_time: str  # when it is sent, same clock
    producer_id: str  # "producer-N"
    seq_no: int  # the producer's next sequence number (0, 1, 2, ...; lost records leave gaps)
    config: GeneratorConfig
    # What the sample events remember within one run of the generator (a machine already installed):
    # the same dict for every event of the run, a new one per run, so every run is reproducible.
    run: dict[str, Any] = field(default_factory=dict)


Payload = dict[str, Any]
# (rng, context) -> (Kafka key, valid payload). Draw only from ``rng``: generation must stay reproducible.
MakeEvent = Callable[[random.Random, EventContext], tuple[bytes, Payload]]
# A valid payload -> the bytes of a broken record. Must not change its argument (copy it first).
Malformation = Callable[[Payload], bytes]
# (rng, context, the event's valid payload) -> the records it causes in other sources. Draw only from ``rng``.
MakeFollowUps = Callable[[random.Random, EventContext, Payload], Sequence[FollowUp]]


@dataclass(frozen=True, kw_only=True)
class SampleEvents:
    """A pipeline's sample events: how one valid event looks and the ways a record of it is broken.

    The generic core (:func:`generate`) adds timing, producers, sequence numbers and every fault knob
    of :class:`GeneratorConfig`, so a pipeline declares only its payload.
    """

    make: MakeEvent
    # reason -> how to break a valid payload; used in turn (declaration order), so every reason shows
    # up in small samples. Empty: the pipeline has none, and malformed_rate must be 0.
    malformations: Mapping[str, Malformation] = field(default_factory=dict)
    # The records of the pipeline's other sources each event causes (None: a single-source pipeline).
    follow_ups: MakeFollowUps | None = None

    def __post_init__(self) -> None:
        if not callable(self.make):
            raise ConfigError(f"SampleEvents make={self.make!r} must be a function (rng, context) -> (key, payload)")
        for reason, breaks in self.malformations.items():
            if not (isinstance(reason, str) and reason) or not callable(breaks):
                raise ConfigError(
                    f"SampleEvents malformation {reason!r} must be a name and a function payload -> bytes"
                )

    @property
    def reasons(self) -> tuple[str, ...]:
        """The malformation names, in the order they are used."""
        return tuple(self.malformations)


# ---- building blocks for declarations ------------------------------------------------------------


def encode(payload: Payload) -> bytes:
    """A payload as the generator sends it: compact UTF-8 JSON, non-ASCII kept as is."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def truncated_json(payload: Payload) -> bytes:
    """Malformation: the first half of the encoded payload (not valid JSON)."""
    whole = encode(payload)
    return whole[: len(whole) // 2]


def set_field(path: str, value: Any) -> Malformation:
    """Malformation: the field at dotted ``path`` (e.g. ``"venue.lat"``) set to ``value``."""
    *parents, name = path.split(".")

    def breaks(payload: Payload) -> bytes:
        bad = copy.deepcopy(payload)
        _walk(bad, parents)[name] = value
        return encode(bad)

    return breaks


def drop_field(path: str) -> Malformation:
    """Malformation: the field at dotted ``path`` removed."""
    *parents, name = path.split(".")

    def breaks(payload: Payload) -> bytes:
        bad = copy.deepcopy(payload)
        del _walk(bad, parents)[name]
        return encode(bad)

    return breaks


def _walk(payload: Payload, parents: list[str]) -> Payload:
    for part in parents:
        payload = payload[part]
    return payload


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

    In simulated time: a paced run (:func:`tidewater.generator.producer.produce`) sends each record
    when the wall clock reaches its place on this schedule.
    """
    if config.burst_every_s > 0 and (elapsed_s % config.burst_every_s) < config.burst_seconds:
        return config.rate * config.burst_multiplier
    return config.rate


def _next_ms(config: GeneratorConfig, sim_ms: float) -> float:
    """The simulated clock one record later (ms since the start): the one step of :func:`generate`'s clock."""
    return sim_ms + 1000.0 / rate_at(config, sim_ms / 1000.0)


def schedule_span_ms(config: GeneratorConfig, count: int) -> int:
    """Simulated ms from the first of ``count`` records to the last: how far :func:`generate` moves its
    clock over them (bursts included; follow-ups ride on their events' times)."""
    sim_ms = 0.0
    for _ in range(count - 1):
        sim_ms = _next_ms(config, sim_ms)
    return int(sim_ms)


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


# ---- generation -----------------------------------------------------------------------------------


def generate(config: GeneratorConfig, count: int | None, events: SampleEvents) -> Iterator[GeneratedRecord]:
    """Yield ``count`` records of ``events`` (forever if None), identical for identical inputs.

    Record ``i`` is sent at simulated time ``start + sum(1000 / rate_at(t))`` (so event time
    advances at the offered rate) and stamped with its producer's skewed clock. Per new event the rng
    draws, in order: its kind, its producer, its id, its delay (late or out of order only), then
    whatever ``events.make`` draws, then whatever ``events.follow_ups`` draws. Follow-ups are yielded
    when the simulated clock reaches their time (on top of ``count``; those still pending at the end
    have not happened yet and are not yielded).
    """
    if count is not None and count < 0:
        raise ConfigError(f"generator count={count} must be >= 0")
    reasons = events.reasons
    if config.malformed_rate > 0 and not reasons:
        raise ConfigError(
            f"generator malformed_rate={config.malformed_rate:g} but these sample events declare no malformations"
        )
    rng = random.Random(config.seed)
    run_memory: dict[str, Any] = {}
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

    pending: list[tuple[int, int, GeneratedRecord]] = []  # (send ms, order, follow-up): a heap
    made = 0
    sim_ms = 0.0  # simulated ms since start
    i = 0
    while count is None or i < count:
        now_ms = start_ms + int(sim_ms)
        while pending and pending[0][0] <= now_ms:
            follow_up = heapq.heappop(pending)[2]
            recent.append(follow_up)
            yield follow_up
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
                source=orig.source,
                scheduled_ms=now_ms,
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
            event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            delay = 0
            if kind == "out_of_order":
                delay = _draw_delay(rng, config)
            elif kind == "late":
                delay = config.late_delay_ms + _draw_delay(rng, config)
            event_time_ms = now_ms - delay + skew
            sent_ms = now_ms + skew
            context = EventContext(
                event_id=event_id,
                event_time=format_ts(event_time_ms),
                sent_time=format_ts(sent_ms),
                producer_id=producer_ids[p],
                seq_no=seq_no,
                config=config,
                run=run_memory,
            )
            key, payload = events.make(rng, context)
            if events.follow_ups is not None:
                for f in events.follow_ups(rng, context, payload):
                    sent = max(f.at_ms, sent_ms)
                    follow_up = GeneratedRecord(
                        key=f.key,
                        value=encode(f.payload),
                        timestamp_ms=sent,
                        kind="ok",
                        event_id=f.event_id,
                        producer_id=producer_ids[p],
                        seq_no=-1,
                        event_time_ms=f.at_ms,
                        source=f.source,
                        scheduled_ms=sent - skew,
                    )
                    made += 1
                    heapq.heappush(pending, (sent, made, follow_up))
            reason = None
            if kind == "malformed":
                reason = reasons[malformed_seen % len(reasons)]
                malformed_seen += 1
                value = events.malformations[reason](payload)
            else:
                value = encode(payload)
            record = GeneratedRecord(
                key=key,
                value=value,
                timestamp_ms=sent_ms,
                kind=kind,
                event_id=event_id,
                producer_id=producer_ids[p],
                seq_no=seq_no,
                event_time_ms=event_time_ms,
                malformed_reason=reason,
                scheduled_ms=now_ms,
            )
            if kind not in ("malformed", "lost"):
                recent.append(record)
            if kind != "lost":
                yield record
        sim_ms = _next_ms(config, sim_ms)
        i += 1


def expected_events(config: GeneratorConfig, count: int, events: SampleEvents) -> dict[str, GeneratedRecord]:
    """The distinct valid events of ``generate(config, count, events)``: what silver must end up holding."""
    out: dict[str, GeneratedRecord] = {}
    for record in generate(config, count, events):
        if record.kind in ("malformed", "duplicate") or record.event_id is None:
            continue
        out.setdefault(record.event_id, record)
    return out
