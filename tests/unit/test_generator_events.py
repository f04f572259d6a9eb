"""The event model: determinism and every injected imperfection, checked against its own labels.

Downstream tests trust ``GeneratedRecord.kind`` and :func:`expected_events` to know what silver
must hold, so these tests check the labels against the bytes, not against the generator's code.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter, defaultdict
from itertools import pairwise

import pytest

from tidewater.errors import ConfigError
from tidewater.generator import (
    MALFORMED_REASONS,
    RESPONSES,
    VISIBILITIES,
    GeneratorConfig,
    expected_events,
    format_ts,
    generate,
    parse_ts,
)
from tidewater.generator.cli import ahead_of_the_clock
from tidewater.generator.events import rate_at, schedule_span_ms
from tidewater.pipelines import get_pipeline

START = parse_ts("2026-11-21T10:00:00.000Z")
MESSY = GeneratorConfig(
    seed=7,
    start_time_ms=START,
    duplicate_rate=0.05,
    out_of_order_fraction=0.1,
    late_fraction=0.02,
    malformed_rate=0.03,
    clock_skew_ms=(0, -1500, 2500),
)
N = 20_000


@pytest.fixture(scope="module")
def messy() -> list:
    return list(generate(MESSY, N))


def _valid(value: bytes) -> dict | None:
    """The payload if it satisfies the RSVP contract, else None (the checks silver makes)."""
    try:
        doc = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    try:
        venue, member = doc["venue"], doc["member"]
        ok = (
            isinstance(doc["event_id"], str)
            and isinstance(doc["seq_no"], int)
            and isinstance(doc["producer_id"], str)
            and doc["response"] in RESPONSES
            and doc["visibility"] in VISIBILITIES
            and isinstance(venue["venue_id"], int)
            and isinstance(venue["venue_name"], str)
            and -90 <= venue["lat"] <= 90
            and -180 <= venue["lon"] <= 180
            and isinstance(member["member_id"], int)
            and isinstance(member["member_name"], str)
        )
        parse_ts(doc["event_time"])
        parse_ts(doc["sent_time"])
    except (KeyError, TypeError, ValueError):
        return None
    return doc if ok else None


def test_same_seed_same_bytes_and_different_seed_differs(messy: list) -> None:
    again = list(generate(MESSY, N))
    assert again == messy
    other = list(generate(dataclasses.replace(MESSY, seed=8), N))
    assert [r.value for r in other] != [r.value for r in messy]
    # A prefix is a prefix: generating fewer records gives the same first records.
    assert list(generate(MESSY, 100)) == messy[:100]


def test_payload_layout_and_keys(messy: list) -> None:
    record = next(r for r in messy if r.kind == "ok")
    doc = json.loads(record.value)
    assert list(doc) == [
        "event_id", "event_time", "sent_time", "producer_id", "seq_no",
        "visibility", "response", "venue", "member",
    ]  # fmt: skip
    assert set(doc["venue"]) == {"venue_id", "venue_name", "lat", "lon"}
    assert set(doc["member"]) == {"member_id", "member_name"}
    assert record.key == str(doc["venue"]["venue_id"]).encode()
    assert record.timestamp_ms == parse_ts(doc["sent_time"])
    assert record.event_time_ms == parse_ts(doc["event_time"])
    assert doc["event_time"].endswith("Z") and len(doc["event_time"]) == len("2026-11-21T10:00:00.123Z")
    # A venue id always carries the same name and place.
    venues: dict[int, tuple] = {}
    for r in messy:
        if r.kind != "malformed":
            v = json.loads(r.value)["venue"]
            assert venues.setdefault(v["venue_id"], (v["venue_name"], v["lat"], v["lon"])) == (
                v["venue_name"], v["lat"], v["lon"],
            )  # fmt: skip
    assert len(venues) > 50


def test_every_valid_record_is_valid_and_every_malformed_one_is_not(messy: list) -> None:
    reasons = Counter()
    for r in messy:
        if r.kind == "malformed":
            assert r.malformed_reason in MALFORMED_REASONS
            assert _valid(r.value) is None, r.malformed_reason
            assert r.key  # still keyed, so it lands in a partition like any record
            reasons[r.malformed_reason] += 1
        else:
            assert r.malformed_reason is None
            doc = _valid(r.value)
            assert doc is not None and doc["event_id"] == r.event_id and doc["seq_no"] == r.seq_no
    assert set(reasons) == set(MALFORMED_REASONS)  # the kinds are cycled through
    assert reasons.total() == pytest.approx(N * MESSY.malformed_rate, rel=0.2)


def test_seq_no_contiguous_per_producer_for_new_events(messy: list) -> None:
    seqs: dict[str, list[int]] = defaultdict(list)
    for r in messy:
        if r.kind != "duplicate":  # malformed records consume a seq_no too
            seqs[r.producer_id].append(r.seq_no)
    assert set(seqs) == {"producer-0", "producer-1", "producer-2"}
    for producer_id, values in seqs.items():
        assert values == list(range(len(values))), producer_id


def test_duplicates_are_identical_resends(messy: list) -> None:
    first: dict[str, bytes] = {}
    dups = 0
    for r in messy:
        if r.kind == "duplicate":
            dups += 1
            assert first[r.event_id] == r.value  # same bytes: same event_id, seq_no, event_time, sent_time
            assert r.timestamp_ms >= parse_ts(json.loads(r.value)["sent_time"])  # a later Kafka record
        elif r.kind != "malformed":
            assert r.event_id not in first  # new events never reuse an id
            first[r.event_id] = r.value
    assert dups == pytest.approx(N * MESSY.duplicate_rate, rel=0.15)


def test_late_and_out_of_order_delays(messy: list) -> None:
    late = [r for r in messy if r.kind == "late"]
    ooo = [r for r in messy if r.kind == "out_of_order"]
    ok = [r for r in messy if r.kind == "ok"]
    assert len(late) == pytest.approx(N * MESSY.late_fraction, rel=0.25)
    assert len(ooo) == pytest.approx(N * MESSY.out_of_order_fraction, rel=0.15)
    for r in late:
        assert (
            MESSY.late_delay_ms <= r.timestamp_ms - r.event_time_ms <= (MESSY.late_delay_ms + MESSY.out_of_order_max_ms)
        )
    delays = [r.timestamp_ms - r.event_time_ms for r in ooo]
    assert all(1 <= d <= MESSY.out_of_order_max_ms for d in delays)
    assert sum(delays) / len(delays) == pytest.approx(MESSY.delay_mean_ms, rel=0.2)  # exponential mean
    assert all(r.timestamp_ms == r.event_time_ms for r in ok)
    # Out-of-order for real: event times go backwards compared with the previous record.
    times = [r.event_time_ms for r in messy if r.kind != "malformed"]
    assert sum(b < a for a, b in pairwise(times)) > len(ooo) // 2


@pytest.mark.parametrize("distribution", ["uniform", "fixed"])
def test_other_delay_distributions(distribution: str) -> None:
    config = GeneratorConfig(
        start_time_ms=START, out_of_order_fraction=1.0, delay_distribution=distribution, delay_mean_ms=500
    )
    delays = [r.timestamp_ms - r.event_time_ms for r in generate(config, 2000)]
    if distribution == "fixed":
        assert set(delays) == {500}
    else:
        assert min(delays) >= 1 and max(delays) <= 1000
        assert sum(delays) / len(delays) == pytest.approx(500, rel=0.1)


def test_clock_skew_applied_per_producer() -> None:
    base = GeneratorConfig(start_time_ms=START, producers=3)
    skewed = GeneratorConfig(start_time_ms=START, producers=3, clock_skew_ms=(0, -1500, 2500))
    skews = {"producer-0": 0, "producer-1": -1500, "producer-2": 2500}
    for a, b in zip(generate(base, 3000), generate(skewed, 3000), strict=True):
        assert a.producer_id == b.producer_id and a.event_id == b.event_id
        assert b.timestamp_ms - a.timestamp_ms == skews[a.producer_id]
        assert b.event_time_ms - a.event_time_ms == skews[a.producer_id]
        doc = json.loads(b.value)
        assert parse_ts(doc["sent_time"]) == b.timestamp_ms


def test_event_time_follows_the_rate_and_bursts() -> None:
    steady = list(generate(GeneratorConfig(start_time_ms=START, rate=100), 1001))
    assert steady[0].event_time_ms == START
    assert steady[-1].event_time_ms == START + 10_000  # 1000 events at 100/s = 10 s
    bursty = GeneratorConfig(start_time_ms=START, rate=100, burst_every_s=10, burst_seconds=2, burst_multiplier=5)
    assert rate_at(bursty, 0.5) == 500 and rate_at(bursty, 5) == 100 and rate_at(bursty, 11) == 500
    per_second = Counter((r.timestamp_ms - START) // 1000 for r in generate(bursty, 3000))
    assert per_second[0] == pytest.approx(500, abs=2) and per_second[5] == pytest.approx(100, abs=2)
    assert per_second[10] == pytest.approx(500, abs=2)


def test_expected_events_are_the_distinct_valid_events(messy: list) -> None:
    expected = expected_events(MESSY, N)
    valid_ids = {r.event_id for r in messy if r.kind != "malformed"}
    assert set(expected) == valid_ids
    assert all(r.kind in ("ok", "out_of_order", "late") for r in expected.values())
    new_events = sum(1 for r in messy if r.kind not in ("duplicate", "malformed"))
    assert len(expected) == new_events


def test_start_time_defaults_to_now_read_once() -> None:
    import time

    before = int(time.time() * 1000)
    records = list(generate(GeneratorConfig(rate=1000), 10))
    assert before <= records[0].timestamp_ms <= int(time.time() * 1000)
    assert [r.timestamp_ms - records[0].timestamp_ms for r in records] == list(range(10))


def test_timestamp_helpers_round_trip() -> None:
    assert format_ts(START + 123) == "2026-11-21T10:00:00.123Z"
    assert parse_ts("2026-11-21T10:00:00.123+00:00") == START + 123
    assert parse_ts("2026-11-21T11:00:00.123+01:00") == START + 123
    for ms in (0, 1, 999, 1_000, START, START + 86_399_999, -1):
        assert parse_ts(format_ts(ms)) == ms


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"duplicate_rate": 1.5}, "duplicate_rate"),
        ({"malformed_rate": -0.1}, "malformed_rate"),
        ({"late_fraction": 0.6, "out_of_order_fraction": 0.6}, "add up to"),
        ({"rate": 0}, "rate"),
        ({"producers": 0}, "producers"),
        ({"clock_skew_ms": (1, 2)}, "clock_skew_ms"),
        ({"delay_distribution": "normal"}, "delay_distribution"),
        ({"burst_every_s": 10, "burst_seconds": 0}, "burst_seconds"),
        ({"burst_multiplier": 0}, "burst_multiplier"),
        ({"delay_mean_ms": 0}, "delay_mean_ms"),
        ({"late_delay_ms": -5}, "late_delay_ms"),
    ],
)
def test_config_validation_errors_are_one_line(changes: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        GeneratorConfig(**changes)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_negative_count_rejected() -> None:
    with pytest.raises(ConfigError):
        list(generate(GeneratorConfig(), -1))


class _Acknowledged:
    """A send future that is already acknowledged."""

    def get(self, timeout: float | None = None) -> None:
        return None

    def add_callback(self, callback) -> None:
        callback(None)

    def add_errback(self, errback) -> None:
        pass


class _RecordingProducer:
    """Stands in for KafkaProducer: records each send's Kafka timestamp and the wall clock after it."""

    def __init__(self) -> None:
        self.sends: list[tuple[int, int, bytes]] = []

    def send(self, topic: str, *, key: bytes, value: bytes, timestamp_ms: int) -> _Acknowledged:
        self.sends.append((timestamp_ms, int(time.time() * 1000), value))
        return _Acknowledged()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


def test_kafka_timestamps_never_run_ahead_of_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 9 item 9: `generate --count 5 --rate 0.0005 --as-fast-as-possible` simulates records
    2,000 s apart from now; Kafka 4.1 refused those more than an hour ahead. The Kafka timestamp is
    capped at the send time; the payload keeps the simulated (future) times."""
    from tidewater.config import Settings
    from tidewater.generator import producer as producer_module

    fake = _RecordingProducer()
    monkeypatch.setattr(producer_module, "_check_topic", lambda settings, topic: None)
    monkeypatch.setattr(producer_module, "_open_producer", lambda settings: (fake, False))
    began = int(time.time() * 1000)
    config = GeneratorConfig(rate=0.0005, clock_skew_ms=(0, 0, 3_600_000))  # start: now
    report = producer_module.produce(
        Settings(kafka_bootstrap_servers="127.0.0.1:1"), "t", config, count=5, realtime=False
    )

    assert report.sent == 5 and report.errors == 0 and len(fake.sends) == 5
    for timestamp_ms, wall_after_ms, _ in fake.sends:
        assert began <= timestamp_ms <= wall_after_ms
    sent_times = [parse_ts(json.loads(value)["sent_time"]) for _, _, value in fake.sends]
    assert max(sent_times) - began >= 4 * 2_000_000 - 1  # the payload still runs ahead, as simulated
    generated = list(generate(dataclasses.replace(config, start_time_ms=sent_times[0]), 5))
    assert [v for _, _, v in fake.sends] == [r.value for r in generated]  # records unchanged otherwise


def _paced_run_with_a_stall(monkeypatch: pytest.MonkeyPatch, stall_s: float) -> tuple[_RecordingProducer, float, int]:
    """200 records paced at 200/s through a fake producer that stalls ``stall_s`` before its 21st send:
    (the producer with its sends, the run's seconds, records sent)."""
    from tidewater.config import Settings
    from tidewater.generator import producer as producer_module

    class Stalling(_RecordingProducer):
        def send(self, topic: str, *, key: bytes, value: bytes, timestamp_ms: int) -> _Acknowledged:
            if len(self.sends) == 20:
                time.sleep(stall_s)
            return super().send(topic, key=key, value=value, timestamp_ms=timestamp_ms)

    fake = Stalling()
    monkeypatch.setattr(producer_module, "_check_topic", lambda settings, topic: None)
    monkeypatch.setattr(producer_module, "_open_producer", lambda settings: (fake, False))
    began = time.monotonic()
    report = producer_module.produce(
        Settings(kafka_bootstrap_servers="127.0.0.1:1"), "t", GeneratorConfig(rate=200), count=200, realtime=True
    )
    return fake, time.monotonic() - began, report.sent


def test_a_paced_run_catches_up_after_a_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled producer (a busy host) sends what it held back at once instead of drifting behind
    the clock: before, a 50 ms token bucket lost every stall for good, so the simulated (and Kafka)
    times fell further behind the real sends, ~0.3 s a minute at 2,000/s on a busy 2-core host."""
    fake, elapsed, sent = _paced_run_with_a_stall(monkeypatch, 0.3)

    assert sent == 200 and len(fake.sends) == 200
    assert 0.95 <= elapsed <= 1.6  # 200 at 200/s: ~1 s, the 0.3 s stall caught up
    lags = [sent_ms - stamp for stamp, sent_ms, _ in fake.sends]
    assert min(lags) >= 0  # never stamped after its send
    assert max(lags[:20]) < 150 and max(lags[-50:]) < 150  # on the clock before the stall and after it
    assert max(lags) >= 250  # the records the stall held back: sent late, stamped when they were due


def test_a_paced_run_resumes_after_a_long_pause_instead_of_flooding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past CATCH_UP_LIMIT_S behind (a suspended laptop), the schedule resumes from the wall clock: the
    records after the pause keep their pace instead of going out at once."""
    from tidewater.generator import producer as producer_module

    monkeypatch.setattr(producer_module, "CATCH_UP_LIMIT_S", 0.1)
    fake, elapsed, sent = _paced_run_with_a_stall(monkeypatch, 0.4)

    assert sent == 200
    assert elapsed >= 1.3  # ~1 s of schedule + the 0.4 s pause, not caught up
    after = [sent_ms for _, sent_ms, _ in fake.sends[22:]]
    assert after[-1] - after[0] >= 800  # the 178 records after the pause still at ~200/s (885 ms)


def test_kafka_timestamp_keeps_a_past_simulated_time() -> None:
    from tidewater.generator.producer import kafka_timestamp

    record = next(generate(GeneratorConfig(start_time_ms=START), 1))
    now = START + 10_000
    assert kafka_timestamp(record, now) == record.timestamp_ms  # a replayed past stays reproducible
    assert kafka_timestamp(dataclasses.replace(record, timestamp_ms=now + 1), now) == now


def test_a_broker_refusing_timestamps_is_reported_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka import errors as kerr

    from tidewater.config import Settings
    from tidewater.errors import one_line
    from tidewater.generator import producer as producer_module

    class Refused(_Acknowledged):
        def add_callback(self, callback) -> None:
            pass

        def add_errback(self, errback) -> None:
            errback(kerr.InvalidTimestampError())

    class RefusingProducer(_RecordingProducer):
        def send(self, topic: str, *, key: bytes, value: bytes, timestamp_ms: int) -> _Acknowledged:
            super().send(topic, key=key, value=value, timestamp_ms=timestamp_ms)
            return Refused()

    monkeypatch.setattr(producer_module, "_check_topic", lambda settings, topic: None)
    monkeypatch.setattr(producer_module, "_open_producer", lambda settings: (RefusingProducer(), False))
    with pytest.raises(producer_module.ProduceError) as info:
        producer_module.produce(Settings(kafka_bootstrap_servers="127.0.0.1:1"), "t", MESSY, count=3, realtime=False)
    line = one_line(info.value)
    assert line.startswith("ProduceError: 3 record(s) to topic 't'") and "\n" not in line
    assert "InvalidTimestampError" in line and "log.message.timestamp" in line and "--start-time" in line


@pytest.mark.parametrize("bursts", [{}, {"burst_every_s": 2.0, "burst_seconds": 0.5, "burst_multiplier": 4.0}])
def test_schedule_span_is_how_far_generate_moves_its_clock(bursts: dict[str, float]) -> None:
    config = GeneratorConfig(seed=3, rate=250, start_time_ms=1_000_000, **bursts)
    records = list(generate(config, 2_001))
    assert records[-1].scheduled_ms - records[0].scheduled_ms == schedule_span_ms(config, 2_001)
    assert schedule_span_ms(config, 1) == schedule_span_ms(config, 0) == 0


def test_a_fast_run_whose_events_would_be_quarantined_as_future_says_so_and_how_to_end_them_now() -> None:
    """A million events at the default 1,000/s sent at once from now span 16.7 minutes of event time:
    rsvps quarantines what is more than 5 minutes ahead of its arrival. The note names the share and the
    --start-time that ends the schedule now; with it, or for a run that stays within 5 minutes, no note."""
    rsvps = get_pipeline("rsvps")
    now_ms = parse_ts("2026-11-30T13:00:00.400Z")
    note = ahead_of_the_clock(rsvps, GeneratorConfig(), 1_000_000, now_ms)
    assert note is not None and "\n" not in note
    assert "16.7 minutes" in note and "more than 5 minutes ahead" in note and "up to 70%" in note, note
    suggested = note.rsplit("--start-time ", 1)[1].split()[0]
    assert suggested == "2026-11-30T12:43:20Z"
    backlog = GeneratorConfig(start_time_ms=parse_ts(suggested))
    assert ahead_of_the_clock(rsvps, backlog, 1_000_000, now_ms) is None
    assert ahead_of_the_clock(rsvps, GeneratorConfig(), 300_000, now_ms) is None  # 5 minutes: accepted
    assert ahead_of_the_clock(rsvps, GeneratorConfig(start_time_ms=now_ms), 400_000, now_ms) is not None
