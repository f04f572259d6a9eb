"""Send generated records (a pipeline's sample events, RSVPs by default) to Kafka: topic creation,
pacing, delivery accounting, progress.

Delivery is ``acks=all`` with the idempotent producer, so broker-side retries never add
duplicates of their own: every duplicate in the topic is one the generator injected on purpose
and labelled. Nothing is dropped silently: each send is tracked to its acknowledgement, and
:func:`produce` raises if any record failed.

The Kafka record timestamp (CreateTime) is the record's simulated send time, but never later than
the wall clock when it is sent (:func:`kafka_timestamp`): an as-fast-as-possible run of a slow rate
simulates hours ahead, and a broker refuses records from the future (Apache Kafka 4.1: more than an
hour, ``log.message.timestamp.after.max.ms``). The payload keeps the simulated times, including
the clock-skew knob's future ones, which is what the pipeline's checks are about.

Topic creation is explicit (:func:`ensure_topic`, called by the CLI). :func:`produce` refuses a
missing topic because the embedded broker (and many real clusters) would otherwise auto-create
it with a default partition count on the producer's first metadata request.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka import errors as kerr
from kafka.admin import NewTopic

from tidewater.config import Settings
from tidewater.connectors.kafka_client import kafka_python_config
from tidewater.errors import BrokerUnreachableError, ConfigError, TidewaterError, TopicNotFoundError
from tidewater.generator.events import KINDS, GeneratedRecord, GeneratorConfig, SampleEvents, generate
from tidewater.pipelines.base import Pipeline

log = logging.getLogger(__name__)

LINGER_MS = 10
# Bigger batches than kafka-python's 16 KiB: ~40% more records/s on the embedded broker.
BATCH_BYTES = 256 * 1024
PROGRESS_INTERVAL_S = 0.5  # progress callbacks at most ~2x per second
PACING_SLACK_S = 0.001  # a paced record this close to its time goes now (a sleep costs about as much)
# A paced run further behind than this (a suspended laptop, not a busy host) resumes its schedule from
# now instead of sending everything the pause held back in one flood.
CATCH_UP_LIMIT_S = 5.0
# Errors that mean "this broker/cluster does not allow the idempotent producer".
_IDEMPOTENCE_REJECTED = (
    kerr.ClusterAuthorizationFailedError,
    kerr.UnsupportedVersionError,
    kerr.TransactionalIdAuthorizationFailedError,
)
# kafka-python 3 reports a dead bootstrap address as KafkaTimeoutError; 2.x raised NoBrokersAvailable.
_UNREACHABLE: tuple[type[Exception], ...] = tuple(
    getattr(kerr, name)
    for name in ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")
    if hasattr(kerr, name)
)


@dataclass
class ProduceReport:
    """Progress and outcome of :func:`produce`.

    ``sent`` counts records handed to the producer; once :func:`produce` returns without raising,
    every one of them was acknowledged by the broker.
    """

    sent: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    elapsed_s: float = 0.0
    rate: float = 0.0  # achieved records/s
    last_seq_no: dict[str, int] = field(default_factory=dict)  # highest seq_no sent per producer
    errors: int = 0

    def summary(self) -> str:
        kinds = " ".join(f"{k}={v}" for k, v in self.by_kind.items() if v)
        return f"sent {self.sent} records in {self.elapsed_s:.1f} s ({self.rate:,.0f}/s), errors {self.errors}" + (
            f"; {kinds}" if kinds else ""
        )


class ProduceError(TidewaterError):
    """Some records were not acknowledged; ``report`` tells how far the run got."""

    def __init__(self, message: str, report: ProduceReport) -> None:
        super().__init__(message)
        self.report = report


def kafka_timestamp(record: GeneratedRecord, now_ms: int) -> int:
    """The Kafka timestamp to send ``record`` with at wall-clock time ``now_ms``: its simulated send time,
    but never in the future (brokers refuse those; a past simulated start stays as it is)."""
    return min(record.timestamp_ms, now_ms)


def _brief(exc: BaseException) -> str:
    """A kafka-python error as a short single line (their messages embed whole requests)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(exc).__name__}: {text}" if text and type(exc).__name__ not in text else text or repr(exc)


def _client_config(settings: Settings) -> dict[str, Any]:
    return kafka_python_config(settings)  # one line if no servers; bootstrap fails as fast as a request


def _unreachable(settings: Settings, exc: BaseException) -> BrokerUnreachableError:
    return BrokerUnreachableError(
        f"no Kafka broker answered at {settings.kafka_bootstrap_servers} within "
        f"{settings.kafka_request_timeout_ms} ms ({type(exc).__name__}): start it or fix "
        "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS"
    )


def _admin(settings: Settings) -> KafkaAdminClient:
    config = _client_config(settings)
    try:
        return KafkaAdminClient(client_id="tidewater-generator-admin", **config)
    except _UNREACHABLE as exc:
        raise _unreachable(settings, exc) from exc


def pipeline_topics(settings: Settings, pipeline: Pipeline) -> tuple[str, dict[str, str]]:
    """(the topic of the pipeline's first source, its other sources' topics by source name): where
    :func:`produce` sends its sample events and the follow-ups they cause."""
    first, *others = pipeline.sources
    return settings.topic(first.topic), {s.name: settings.topic(s.topic) for s in others}


def ensure_topic(settings: Settings, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions unless it exists (idempotent, race-safe)."""
    if partitions < 1:
        raise ConfigError(f"topic {topic!r} needs at least 1 partition, got {partitions}")
    admin = _admin(settings)
    try:
        if topic in admin.list_topics():
            _warn_partition_mismatch(admin, topic, partitions)
            return
        try:
            # replication_factor=-1: the broker's default (1 on the embedded broker, 3 on a cluster).
            admin.create_topics([NewTopic(topic, partitions, -1)])
            log.info("created topic %s with %d partitions", topic, partitions)
        except kerr.TopicAlreadyExistsError:
            pass  # created concurrently: fine
        except kerr.KafkaError as exc:
            raise TidewaterError(f"cannot create topic {topic!r}: {_brief(exc)}") from exc
    except _UNREACHABLE as exc:
        raise _unreachable(settings, exc) from exc
    finally:
        admin.close()


def _warn_partition_mismatch(admin: KafkaAdminClient, topic: str, partitions: int) -> None:
    try:
        found = len(admin.describe_topics([topic])[0]["partitions"])
    except Exception:  # informational only
        return
    if found != partitions:
        log.warning("topic %s exists with %d partitions (asked for %d); keeping it", topic, found, partitions)


def _check_topic(settings: Settings, topic: str) -> None:
    admin = _admin(settings)
    try:
        topics = admin.list_topics()
    except _UNREACHABLE as exc:
        raise _unreachable(settings, exc) from exc
    finally:
        admin.close()
    if topic not in topics:
        raise TopicNotFoundError(
            f"topic {topic!r} does not exist at {settings.kafka_bootstrap_servers}: create it "
            "(`tidewater generate` does) before producing"
        )


def _make_producer(settings: Settings, idempotent: bool) -> KafkaProducer:
    config = _client_config(settings)
    timeout = settings.kafka_request_timeout_ms
    return KafkaProducer(
        client_id="tidewater-generator",
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=LINGER_MS,
        batch_size=BATCH_BYTES,
        compression_type=None,
        allow_auto_create_topics=False,
        max_block_ms=timeout,
        # Report a failed record within ~2 request timeouts, not kafka-python's 2 minutes.
        delivery_timeout_ms=2 * timeout + LINGER_MS,
        **config,
    )


def _open_producer(settings: Settings) -> tuple[KafkaProducer, bool]:
    """An idempotent producer, or a plain one (with a warning) if the broker refuses idempotence."""
    try:
        return _make_producer(settings, True), True
    except kerr.KafkaConfigurationError as exc:
        log.warning("broker does not allow the idempotent producer (%s): producing without it", _brief(exc))
    except _UNREACHABLE as exc:
        raise _unreachable(settings, exc) from exc
    try:
        return _make_producer(settings, False), False
    except _UNREACHABLE as exc:
        raise _unreachable(settings, exc) from exc


class _Delivery:
    """Counts acknowledgements and failures, normally on kafka-python's sender thread."""

    def __init__(self) -> None:
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        # Callbacks of futures that are already done run on the caller's thread instead.
        self._lock = threading.Lock()

    def ok(self, _metadata: Any) -> None:
        with self._lock:
            self.acked += 1

    def error(self, exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
            if self.first_error is None:
                self.first_error = exc


def produce(
    settings: Settings,
    topic: str,
    config: GeneratorConfig,
    *,
    count: int | None = None,
    duration_s: float | None = None,
    progress: Callable[[ProduceReport], None] | None = None,
    realtime: bool = True,
    stop: threading.Event | None = None,
    events: SampleEvents | None = None,
    topics: Mapping[str, str] | None = None,
) -> ProduceReport:
    """Generate and send records until ``count`` records, ``duration_s`` seconds or ``stop``.

    ``events`` are the sample events of the topic's pipeline (None: RSVPs); ``topics`` maps the
    pipeline's other sources to their topics, for the follow-up records the events cause (see
    :class:`tidewater.pipelines.samples.FollowUp`).

    ``realtime=True`` sends each record at its time on the simulated schedule (the configured rate,
    bursts included), which starts at the wall clock, so payload and Kafka times track real send
    times while the records stay exactly those of :func:`generate`; records a stall held back
    (a busy host) go at once, so the schedule does not drift behind the clock (after a pause of
    more than ``CATCH_UP_LIMIT_S`` the schedule resumes from the wall clock instead). ``realtime=False``
    sends as fast as possible (tests, benchmarks); Kafka timestamps are then capped at the wall
    clock (:func:`kafka_timestamp`).
    Raises :class:`ProduceError` if any record failed, TopicNotFoundError for a missing topic,
    BrokerUnreachableError if no broker answers within the request timeout.
    """
    if count is not None and count < 0:
        raise ConfigError(f"count={count} must be >= 0")
    if duration_s is not None and duration_s < 0:
        raise ConfigError(f"duration={duration_s} must be >= 0 seconds")
    stop = stop or threading.Event()
    topics = dict(topics or {})
    for name in {topic, *topics.values()}:
        _check_topic(settings, name)
    producer, idempotent = _open_producer(settings)
    if config.start_time_ms is None:
        # Read the clock once, connected, so the schedule and the pacing share one origin.
        config = dataclasses.replace(config, start_time_ms=int(time.time() * 1000))
    report = ProduceReport()
    delivery = _Delivery()
    send_error: BaseException | None = None
    started = time.monotonic()
    last_progress = started
    first_scheduled: int | None = None
    origin = started  # when the schedule's first record was due; moved on after a long pause

    def snapshot() -> ProduceReport:
        report.elapsed_s = time.monotonic() - started
        report.rate = report.sent / report.elapsed_s if report.elapsed_s > 0 else 0.0
        report.errors = delivery.failed + (1 if send_error else 0)
        return report

    try:
        for record in generate(config, count, events):
            now = time.monotonic()
            if stop.is_set() or (duration_s is not None and now - started >= duration_s):
                break
            if realtime:
                # Each record leaves when the wall clock has run as far from the start as the simulated
                # schedule has (bursts included); after a stall (a busy host) the backlog goes at once,
                # so the schedule, and with it every payload and Kafka time, stays on the wall clock.
                scheduled = record.timestamp_ms if record.scheduled_ms is None else record.scheduled_ms
                first_scheduled = scheduled if first_scheduled is None else first_scheduled
                due = origin + (scheduled - first_scheduled) / 1000
                if now - due > CATCH_UP_LIMIT_S:
                    origin, due = origin + (now - due), now
                if duration_s is not None and due >= started + duration_s:
                    break
                if due - now > PACING_SLACK_S and stop.wait(due - now):
                    break
            timestamp_ms = kafka_timestamp(record, int(time.time() * 1000))
            destination = topic if record.source is None else topics[record.source]
            try:
                future = producer.send(destination, key=record.key, value=record.value, timestamp_ms=timestamp_ms)
            except kerr.KafkaError as exc:
                send_error = exc  # e.g. metadata or buffer timeout: stop, flush what we have, report
                break
            if idempotent and report.sent == 0:
                # The first send is synchronous: it reveals a broker that rejects idempotence.
                try:
                    future.get(timeout=2 * settings.kafka_request_timeout_ms / 1000 + 1)
                except _IDEMPOTENCE_REJECTED as exc:
                    log.warning("broker rejected the idempotent producer (%s): producing without it", _brief(exc))
                    producer.close(timeout=5)
                    producer, idempotent = _make_producer(settings, False), False
                    future = producer.send(destination, key=record.key, value=record.value, timestamp_ms=timestamp_ms)
                except kerr.KafkaError:
                    pass  # counted by the errback below
            future.add_callback(delivery.ok)
            future.add_errback(delivery.error)
            report.sent += 1
            report.by_kind[record.kind] = report.by_kind.get(record.kind, 0) + 1
            if record.kind != "duplicate" and record.seq_no >= 0:
                prev = report.last_seq_no.get(record.producer_id, -1)
                report.last_seq_no[record.producer_id] = max(prev, record.seq_no)
            if progress is not None and now - last_progress >= PROGRESS_INTERVAL_S:
                last_progress = now
                progress(snapshot())
        try:
            producer.flush(timeout=2 * settings.kafka_request_timeout_ms / 1000 + 5)
        except kerr.KafkaTimeoutError as exc:
            send_error = send_error or exc
    finally:
        producer.close(timeout=5)

    snapshot()
    unacked = report.sent - delivery.acked - delivery.failed
    report.errors = delivery.failed + unacked + (1 if send_error else 0)
    if progress is not None:
        progress(report)
    if report.errors:
        cause = send_error or delivery.first_error
        hint = ""
        if isinstance(cause, kerr.InvalidTimestampError):
            hint = (
                "; the broker refuses record timestamps this far from its clock (log.message.timestamp."
                "before.max.ms / after.max.ms): use a later --start-time, or fix this machine's or the broker's clock"
            )
        raise ProduceError(
            f"{report.errors} record(s) to topic {topic!r} at {settings.kafka_bootstrap_servers} were not "
            f"acknowledged ({report.sent} sent): {_brief(cause) if cause else 'flush timed out'}{hint}",
            report,
        )
    return report
