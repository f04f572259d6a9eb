"""``tidewater generate``: the event generator on the command line.

:func:`add_arguments` and :func:`run` are wired into the top-level ``tidewater`` command; :func:`main`
runs the generator on its own (``python -m tidewater.generator.cli``). It produces the sample events
the pipeline named by ``--pipeline`` declares (default: rsvps) to that pipeline's topic. Every knob of
:class:`~tidewater.generator.events.GeneratorConfig` has a flag, so a demo or a load test is
reproducible from its command line alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

from tidewater.config import Settings
from tidewater.errors import ConfigError, TidewaterError, one_line
from tidewater.generator.events import (
    DELAY_DISTRIBUTIONS,
    GeneratorConfig,
    SampleEvents,
    format_ts,
    parse_ts,
    schedule_span_ms,
)
from tidewater.generator.producer import ProduceError, ProduceReport, ensure_topic, pipeline_topics, produce
from tidewater.pipelines import Pipeline, pipeline_option
from tidewater.times import parse_duration

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GeneratorConfig)}
NON_TTY_PROGRESS_EVERY_S = 5.0
_SHORT_KIND = {"ok": "ok", "duplicate": "dup", "out_of_order": "ooo", "late": "late", "malformed": "bad"}


def _skews(text: str) -> tuple[int, ...]:
    """``"0,-1500,3000"`` -> ``(0, -1500, 3000)``; empty means no skew."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of milliseconds") from None


def _start_time(text: str) -> int:
    """Epoch milliseconds or an ISO-8601 time."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return parse_ts(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch ms nor an ISO-8601 time") from None


def register(sub: argparse._SubParsersAction) -> None:
    generate = sub.add_parser("generate", help="produce a pipeline's sample events (default: rsvps)")
    add_arguments(generate)
    generate.set_defaults(func=lambda a, s: run(a, s))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for the pipeline and topic, the run length and every generator knob."""
    d = _DEFAULTS
    run = parser.add_argument_group("run")
    run.add_argument(
        "--pipeline", default="rsvps", help="the pipeline whose sample events to produce (default: %(default)s)"
    )
    run.add_argument(
        "--topic",
        default=None,
        help="Kafka topic (created if missing; default: the pipeline's, with TIDEWATER_KAFKA_TOPIC_PREFIX)",
    )
    run.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions when creating the topic (default: TIDEWATER_KAFKA_TOPIC_PARTITIONS)",
    )
    run.add_argument("--count", type=int, default=None, help="stop after this many records")
    run.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    run.add_argument(
        "--as-fast-as-possible",
        action="store_true",
        help="do not pace sends to --rate (event times still follow the simulated schedule; Kafka record "
        "timestamps are capped at the wall clock)",
    )

    gen = parser.add_argument_group("generator")
    gen.add_argument("--seed", type=int, default=d["seed"], help="random seed (default: %(default)s)")
    gen.add_argument("--rate", type=float, default=d["rate"], help="events per second (default: %(default)s)")
    gen.add_argument(
        "--producers",
        type=int,
        default=d["producers"],
        help="logical producers, each with its own seq_no (default: %(default)s)",
    )
    gen.add_argument("--venues", type=int, default=d["venues"], help="venue pool size, rsvps (default: %(default)s)")
    gen.add_argument("--members", type=int, default=d["members"], help="member pool size, rsvps (default: %(default)s)")
    gen.add_argument(
        "--start-time", type=_start_time, default=None, help="simulated start, epoch ms or ISO-8601 (default: now)"
    )
    gen.add_argument(
        "--burst-every",
        type=float,
        default=d["burst_every_s"],
        help="seconds between bursts, 0 = none (default: %(default)s)",
    )
    gen.add_argument("--burst-seconds", type=float, default=d["burst_seconds"], help="length of a burst")
    gen.add_argument(
        "--burst-multiplier",
        type=float,
        default=d["burst_multiplier"],
        help="rate multiplier during a burst (default: %(default)s)",
    )

    mess = parser.add_argument_group("imperfections (shares of all records)")
    mess.add_argument(
        "--duplicate-rate",
        type=float,
        default=d["duplicate_rate"],
        help="re-sends of earlier events (default: %(default)s)",
    )
    mess.add_argument(
        "--out-of-order",
        type=float,
        default=d["out_of_order_fraction"],
        help="events sent a little after they happened (default: %(default)s)",
    )
    mess.add_argument(
        "--late",
        type=float,
        default=d["late_fraction"],
        help="events sent far after they happened, beyond a watermark (default: %(default)s)",
    )
    mess.add_argument(
        "--delay-distribution",
        choices=DELAY_DISTRIBUTIONS,
        default=d["delay_distribution"],
        help="distribution of out-of-order delays (default: %(default)s)",
    )
    mess.add_argument(
        "--delay-mean-ms", type=int, default=d["delay_mean_ms"], help="mean out-of-order delay (default: %(default)s)"
    )
    mess.add_argument(
        "--out-of-order-max-ms",
        type=int,
        default=d["out_of_order_max_ms"],
        help="largest out-of-order delay (default: %(default)s)",
    )
    mess.add_argument(
        "--late-delay-ms",
        type=int,
        default=d["late_delay_ms"],
        help="minimum delay of late events (default: %(default)s)",
    )
    mess.add_argument(
        "--clock-skew-ms",
        type=_skews,
        default=d["clock_skew_ms"],
        help="per-producer clock skew, comma list, one per producer (e.g. 0,-1500,3000)",
    )
    mess.add_argument(
        "--malformed-rate",
        type=float,
        default=d["malformed_rate"],
        help="records that are not valid JSON or break the schema (default: %(default)s)",
    )
    mess.add_argument(
        "--loss-rate",
        type=float,
        default=d["loss_rate"],
        help="records lost before Kafka: their seq_no is skipped, the reconciliation audit reports the gap "
        "(default: %(default)s)",
    )


def config_from_args(args: argparse.Namespace) -> GeneratorConfig:
    """The :class:`GeneratorConfig` the flags describe (raises ConfigError if it is invalid)."""
    return GeneratorConfig(
        seed=args.seed,
        producers=args.producers,
        venues=args.venues,
        members=args.members,
        start_time_ms=args.start_time,
        rate=args.rate,
        burst_every_s=args.burst_every,
        burst_seconds=args.burst_seconds,
        burst_multiplier=args.burst_multiplier,
        duplicate_rate=args.duplicate_rate,
        out_of_order_fraction=args.out_of_order,
        late_fraction=args.late,
        delay_distribution=args.delay_distribution,
        delay_mean_ms=args.delay_mean_ms,
        out_of_order_max_ms=args.out_of_order_max_ms,
        late_delay_ms=args.late_delay_ms,
        clock_skew_ms=tuple(args.clock_skew_ms),
        malformed_rate=args.malformed_rate,
        loss_rate=args.loss_rate,
    )


def sample_events_of(pipeline: Pipeline) -> SampleEvents:
    """The pipeline's declared sample events; a pipeline without them is a usage error (one line)."""
    if pipeline.sample_events is None:
        raise ConfigError(
            f"--pipeline {pipeline.name}: the pipeline declares no sample events "
            "(add sample_events=SampleEvents(...) to its Pipeline)"
        )
    return pipeline.sample_events


def progress_line(report: ProduceReport) -> str:
    kinds = " ".join(f"{_SHORT_KIND.get(k, k)} {v:,}" for k, v in report.by_kind.items())
    return f"sent {report.sent:,}  {report.rate:,.0f}/s  {kinds}  errors {report.errors}"


class ProgressDisplay:
    """One line rewritten in place on a terminal; a plain line every few seconds otherwise (logs)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.width = 0
        self.last = 0.0

    def __call__(self, report: ProduceReport) -> None:
        line = progress_line(report)
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            now = time.monotonic()
            if now - self.last < NON_TTY_PROGRESS_EVERY_S:
                return
            self.last = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[dict[str, int]]:
    """Turn the first SIGINT/SIGTERM into ``stop`` (so the run flushes); a second one aborts."""
    received: dict[str, int] = {}
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        received["signal"] = signum
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def ahead_of_the_clock(pipeline: Pipeline, config: GeneratorConfig, count: int, now_ms: int) -> str | None:
    """One line when ``count`` events on ``config``'s schedule, all sent at ``now_ms``, would reach
    further ahead of their arrival than the pipeline's contract accepts (those are quarantined), with
    the ``--start-time`` that makes the schedule end at ``now_ms`` instead (a backlog of the past).

    Why: the schedule starts at the wall clock unless told otherwise and runs at ``--rate``; with
    --as-fast-as-possible a million events at 1,000/s land in minutes but span 16.7 minutes of event time.
    """
    tolerances = [(parse_duration(c.tolerance), c.tolerance) for s in pipeline.sources for c in s.arrival_checks]
    if not tolerances:
        return None
    tolerance, text = min(tolerances)
    accepted_ms = tolerance.total_seconds() * 1000
    start_ms = now_ms if config.start_time_ms is None else config.start_time_ms
    span_ms = schedule_span_ms(config, count)
    ahead_ms = start_ms + span_ms - now_ms
    if span_ms <= 0 or ahead_ms <= accepted_ms:
        return None
    share = min(1.0, (ahead_ms - accepted_ms) / span_ms)
    backlog_start = format_ts((now_ms - span_ms) // 1000 * 1000).replace(".000Z", "Z")
    return (
        f"generator: these {count:,} events span {span_ms / 60_000:.1f} minutes of event time, up to "
        f"{ahead_ms / 60_000:.1f} minutes ahead of the clock, and {pipeline.name} quarantines events more than "
        f"{text} ahead of their arrival: up to {share:.0%} of them will be; --start-time {backlog_start} "
        "makes them end now"
    )


def run(args: argparse.Namespace, settings: Settings, *, out: TextIO | None = None) -> int:
    """Ensure the topic, produce, show progress, print a summary.

    Returns 0, or 128 + signal number (130 for Ctrl-C) after a clean, flushed stop. Raises
    TidewaterError for bad flags, an unreachable broker or unacknowledged records.
    """
    out = out or sys.stdout
    if args.count is not None and args.count < 0:
        raise ConfigError(f"--count {args.count} must be >= 0")
    if args.duration is not None and args.duration < 0:
        raise ConfigError(f"--duration {args.duration} must be >= 0")
    pipeline = pipeline_option(args.pipeline)
    events = sample_events_of(pipeline)
    own_topic, follow_ups = pipeline_topics(settings, pipeline)
    topic = args.topic or own_topic
    config = config_from_args(args)
    if args.as_fast_as_possible and args.count:
        note = ahead_of_the_clock(pipeline, config, args.count, int(time.time() * 1000))
        if note:
            out.write(note + "\n")
    partitions = args.partitions or settings.kafka_topic_partitions
    stop = threading.Event()
    display = ProgressDisplay(out)
    with _stop_on_signals(stop) as received:
        for name in (topic, *follow_ups.values()):
            ensure_topic(settings, name, partitions)
        try:
            report = produce(
                settings,
                topic,
                config,
                count=args.count,
                duration_s=args.duration,
                progress=display,
                realtime=not args.as_fast_as_possible,
                stop=stop,
                events=events,
                topics=follow_ups,
            )
        except ProduceError as exc:
            display.finish()
            out.write(f"generator: {exc.report.summary()} to topic {topic}\n")
            raise
        display.finish()
    out.write(f"generator: {report.summary()} to topic {topic}\n")
    out.flush()
    if "signal" in received:
        return 128 + received["signal"]
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: settings from the environment, errors as one line on stderr."""
    parser = argparse.ArgumentParser(prog="tidewater generate", description="Produce a pipeline's sample events.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args, Settings.from_env())
    except TidewaterError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
