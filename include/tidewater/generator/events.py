"""The event model the generator sends: the generic core, with Meetup RSVPs as the default events.

The core (timing, rate and bursts, clock skew, the fault kinds, :func:`generate`) is
:mod:`tidewater.pipelines.samples`, beside the declarations, so that each pipeline can declare its
own :class:`~tidewater.pipelines.samples.SampleEvents`; the RSVP payload is declared in
:mod:`tidewater.pipelines.rsvps`. This module keeps the names existing code imports from here, and
:func:`generate` / :func:`expected_events` without ``events`` mean the RSVP sample events.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidewater.pipelines import rsvps
from tidewater.pipelines.samples import (
    DELAY_DISTRIBUTIONS,
    DUPLICATE_WINDOW,
    KINDS,
    EventContext,
    GeneratedRecord,
    GeneratorConfig,
    SampleEvents,
    format_ts,
    parse_ts,
    rate_at,
    schedule_span_ms,
)
from tidewater.pipelines.samples import expected_events as _expected_events
from tidewater.pipelines.samples import generate as _generate

__all__ = [
    "DELAY_DISTRIBUTIONS",
    "DUPLICATE_WINDOW",
    "KINDS",
    "MALFORMED_REASONS",
    "RESPONSES",
    "RSVP_EVENTS",
    "VISIBILITIES",
    "EventContext",
    "GeneratedRecord",
    "GeneratorConfig",
    "SampleEvents",
    "expected_events",
    "format_ts",
    "generate",
    "parse_ts",
    "rate_at",
    "schedule_span_ms",
]

RSVP_EVENTS = rsvps.SAMPLE_EVENTS
RESPONSES = rsvps.RESPONSES
VISIBILITIES = rsvps.VISIBILITIES
# The ways a malformed RSVP is broken, in the order they are used.
MALFORMED_REASONS = RSVP_EVENTS.reasons


def generate(
    config: GeneratorConfig, count: int | None, events: SampleEvents | None = None
) -> Iterator[GeneratedRecord]:
    """:func:`tidewater.pipelines.samples.generate`; ``events`` None: RSVPs."""
    return _generate(config, count, events or RSVP_EVENTS)


def expected_events(
    config: GeneratorConfig, count: int, events: SampleEvents | None = None
) -> dict[str, GeneratedRecord]:
    """:func:`tidewater.pipelines.samples.expected_events`; ``events`` None: RSVPs."""
    return _expected_events(config, count, events or RSVP_EVENTS)
