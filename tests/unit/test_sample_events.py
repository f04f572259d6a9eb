"""The generic sample-event core with another pipeline's declaration (the test-only toy's meter readings).

The fault machinery (kinds and their shares, seq_no gaps from loss, malformations in turn, what
silver must hold) must not depend on the RSVP payload; and ``tidewater generate --pipeline`` and the
platform must find each pipeline's sample events through the registry.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidewater.config import Settings
from tidewater.errors import ConfigError, one_line
from tidewater.generator import cli as generator_cli
from tidewater.pipelines import Pipeline, all_pipelines, get_pipeline
from tidewater.pipelines.samples import (
    GeneratedRecord,
    GeneratorConfig,
    SampleEvents,
    expected_events,
    generate,
    parse_ts,
)

TOY_MODULE = Path(__file__).resolve().parents[1] / "toy_pipeline" / "toy.py"
START = parse_ts("2026-11-21T10:00:00.000Z")
MESSY = GeneratorConfig(
    seed=3,
    start_time_ms=START,
    duplicate_rate=0.05,
    out_of_order_fraction=0.1,
    late_fraction=0.04,
    malformed_rate=0.04,
    loss_rate=0.05,
    clock_skew_ms=(0, 800, -1200),
)
N = 20_000
# A pipeline module without sample events, registered from a file like the toy.
BARE_MODULE = """
import dataclasses
from tidewater.pipelines.rsvps import PIPELINE as RSVPS

PIPELINE = dataclasses.replace(
    RSVPS, name="bare", sources=(dataclasses.replace(RSVPS.source(), topic="bare"),), sample_events=None
)
"""


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The toy and a pipeline without sample events registered (TIDEWATER_PIPELINE_MODULES) for the module."""
    bare = tmp_path_factory.mktemp("bare") / "bare.py"
    bare.write_text(BARE_MODULE)
    modules = f"{TOY_MODULE},{bare}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIDEWATER_PIPELINE_MODULES", modules)
        yield modules


@pytest.fixture(scope="module")
def toy(registered: str) -> Pipeline:
    return get_pipeline("toy")


@pytest.fixture(scope="module")
def events(toy: Pipeline) -> SampleEvents:
    assert toy.sample_events is not None
    return toy.sample_events


@pytest.fixture(scope="module")
def messy(events: SampleEvents) -> list[GeneratedRecord]:
    return list(generate(MESSY, N, events))


def _lost_per_producer(records: list[GeneratedRecord]) -> dict[str, int]:
    """Gaps in each producer's sequence numbers (duplicates re-use theirs, so they are left out)."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r.kind != "duplicate":
            seqs[r.producer_id].append(r.seq_no)
    gaps = {}
    for producer_id, values in seqs.items():
        assert values == sorted(set(values)), f"{producer_id}: seq_no not increasing"
        gaps[producer_id] = values[-1] + 1 - len(values)
    return gaps


def test_deterministic_for_a_seed(messy: list[GeneratedRecord], events: SampleEvents) -> None:
    assert list(generate(MESSY, N, events)) == messy
    first = list(generate(MESSY, 100, events))  # 100 records, lost ones included: a prefix of the rest
    assert 80 < len(first) < 100 and first == messy[: len(first)]
    other = list(generate(dataclasses.replace(MESSY, seed=4), 1000, events))
    assert [r.value for r in other] != [r.value for r in messy[:1000]]


def test_valid_records_follow_the_toy_declaration(messy: list[GeneratedRecord]) -> None:
    valid = [r for r in messy if r.kind != "malformed"]
    assert valid
    for r in valid:
        doc = json.loads(r.value)
        assert list(doc) == ["reading_id", "read_at", "meter", "kwh"]
        assert doc["reading_id"] == r.event_id and parse_ts(doc["read_at"]) == r.event_time_ms
        assert doc["meter"] in {"m-0", "m-1", "m-2", "m-3"} and r.key == doc["meter"].encode()
        assert 0 <= doc["kwh"] <= 5
    assert {r.key for r in valid} == {b"m-0", b"m-1", b"m-2", b"m-3"}


def test_every_kind_appears_with_its_share(messy: list[GeneratedRecord]) -> None:
    kinds = Counter(r.kind for r in messy)
    lost = sum(_lost_per_producer(messy).values())
    assert kinds["duplicate"] == pytest.approx(N * MESSY.duplicate_rate, rel=0.15)
    assert kinds["out_of_order"] == pytest.approx(N * MESSY.out_of_order_fraction, rel=0.15)
    assert kinds["late"] == pytest.approx(N * MESSY.late_fraction, rel=0.2)
    assert kinds["malformed"] == pytest.approx(N * MESSY.malformed_rate, rel=0.2)
    assert lost == pytest.approx(N * MESSY.loss_rate, rel=0.2)
    assert "lost" not in kinds  # never yielded: only the gaps show them
    assert kinds.total() + lost == N  # count counts the lost records too
    for r in messy:  # late and out-of-order by their delay; the rest sent when they happened
        delay = r.timestamp_ms - r.event_time_ms
        if r.kind == "late":
            assert MESSY.late_delay_ms <= delay <= MESSY.late_delay_ms + MESSY.out_of_order_max_ms
        elif r.kind == "out_of_order":
            assert 1 <= delay <= MESSY.out_of_order_max_ms
        elif r.kind in ("ok", "malformed"):
            assert delay == 0


def test_lost_records_leave_seq_gaps_and_nothing_else_does(events: SampleEvents) -> None:
    lossless = list(generate(dataclasses.replace(MESSY, loss_rate=0.0), 5000, events))
    assert set(_lost_per_producer(lossless).values()) == {0}
    lossy = list(generate(dataclasses.replace(MESSY, loss_rate=0.2), 5000, events))
    gaps = _lost_per_producer(lossy)
    assert set(gaps) == {"producer-0", "producer-1", "producer-2"} and all(g > 0 for g in gaps.values())


def test_malformations_are_used_in_turn(messy: list[GeneratedRecord], events: SampleEvents) -> None:
    malformed = [r for r in messy if r.kind == "malformed"]
    reasons = [r.malformed_reason for r in malformed]
    assert events.reasons == ("negative_kwh", "truncated_json")
    assert reasons == [events.reasons[i % 2] for i in range(len(reasons))]
    for r in malformed:
        if r.malformed_reason == "negative_kwh":
            assert json.loads(r.value)["kwh"] == -1.0
        else:
            with pytest.raises(ValueError):
                json.loads(r.value)
        assert r.key  # still keyed: it lands in a partition like any record
    assert all(r.malformed_reason is None for r in messy if r.kind != "malformed")


def test_expected_events_exclude_malformed_and_duplicates(messy: list[GeneratedRecord], events: SampleEvents) -> None:
    expected = expected_events(MESSY, N, events)
    new_valid = [r for r in messy if r.kind in ("ok", "out_of_order", "late")]
    assert list(expected) == [r.event_id for r in new_valid]
    assert not {r.event_id for r in messy if r.kind == "malformed"} & set(expected)
    assert all(r.kind != "duplicate" for r in expected.values())


def test_declaration_errors_are_one_line(events: SampleEvents) -> None:
    with pytest.raises(ConfigError) as info:
        SampleEvents(make=None)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    bare = SampleEvents(make=events.make)
    assert len(list(generate(GeneratorConfig(start_time_ms=START, duplicate_rate=0.5), 100, bare))) == 100
    with pytest.raises(ConfigError) as info:
        list(generate(GeneratorConfig(start_time_ms=START, malformed_rate=0.1), 10, bare))
    assert "declare no malformations" in str(info.value) and "\n" not in str(info.value)


# ---- the command and the platform find each pipeline's sample events --------------------------------


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    generator_cli.add_arguments(parser)
    return parser.parse_args(["--count", "5", "--as-fast-as-possible", *flags])


def test_cli_unknown_pipeline_is_one_line(registered: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert generator_cli.main(["--pipeline", "nope", "--count", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "--pipeline: unknown pipeline 'nope'" in err and "rsvps" in err and "toy" in err


def test_cli_pipeline_without_sample_events_is_one_line(registered: str) -> None:
    with pytest.raises(ConfigError) as info:
        generator_cli.run(_args("--pipeline", "bare"), Settings(kafka_bootstrap_servers="127.0.0.1:1"))
    line = one_line(info.value)
    assert "--pipeline bare" in line and "no sample events" in line and "\n" not in line


def test_cli_produces_the_pipelines_events_to_its_topic(
    registered: str, events: SampleEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidewater.generator.producer import ProduceReport

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(generator_cli, "ensure_topic", lambda settings, topic, partitions: None)

    def fake_produce(settings: Settings, topic: str, config: GeneratorConfig, **kwargs: Any) -> ProduceReport:
        calls.append({"topic": topic, **kwargs})
        return ProduceReport()

    monkeypatch.setattr(generator_cli, "produce", fake_produce)
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", kafka_topic_prefix="x-")
    for flags, topic, wanted in (
        (("--pipeline", "toy"), "x-toy-readings", events),
        ((), "x-rsvps", get_pipeline("rsvps").sample_events),
        (("--pipeline", "toy", "--topic", "mine"), "mine", events),
    ):
        out = io.StringIO()
        assert generator_cli.run(_args(*flags), settings, out=out) == 0
        assert calls[-1]["topic"] == topic and calls[-1]["events"] is wanted
        assert out.getvalue().splitlines()[-1].endswith(f"to topic {topic}")


def test_platform_feeds_every_pipeline_with_sample_events(
    registered: str, events: SampleEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidewater.generator import producer
    from tidewater.orchestration.platform import start_generator

    sent: dict[str, tuple[float, SampleEvents]] = {}
    lock = threading.Lock()

    topics: dict[str, dict[str, str]] = {}

    def fake_produce(settings: Settings, topic: str, config: GeneratorConfig, **kwargs: Any) -> None:
        with lock:
            sent[topic] = (config.rate, kwargs["events"])
            topics[topic] = kwargs["topics"]

    monkeypatch.setattr(producer, "produce", fake_produce)
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", kafka_topic_prefix="p-", pipeline_modules=registered)
    generators = start_generator(settings, rate=40, seed=1, stop=threading.Event())
    generators.join(timeout=10)
    packaged = {name: p for name, p in all_pipelines(Settings(pipelines="")).items() if p.sample_events is not None}
    assert generators.pipelines == sorted([*packaged, "toy"])  # not "bare": it declares none
    assert generators.error is None
    # Each pipeline at the full rate, on its first source's topic; the records its events cause (an ad's
    # clicks, a machine's changes) go to the topics of its other sources.
    assert sent == {
        **{settings.topic(p.sources[0].topic): (40, p.sample_events) for p in packaged.values()},
        "p-toy-readings": (40, events),
    }
    assert topics == {
        **{
            settings.topic(p.sources[0].topic): {s.name: settings.topic(s.topic) for s in p.sources[1:]}
            for p in packaged.values()
        },
        "p-toy-readings": {},
    }
    assert topics["p-ad-impressions"] == {"clicks": "p-ad-clicks"}
