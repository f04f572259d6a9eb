"""The collection tier: each pipeline's seeded sample events (RSVPs by default) and their Kafka producer.

:mod:`.events` is pure (no I/O) so tests and pipelines can recompute exactly what was sent; the
events themselves are declared by each pipeline (``Pipeline.sample_events``, see
:mod:`tidewater.pipelines.samples`);
:mod:`.producer` does the Kafka I/O and is imported lazily, so importing the event model does
not pull in the Kafka client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidewater.generator.events import (
    MALFORMED_REASONS,
    RESPONSES,
    VISIBILITIES,
    GeneratedRecord,
    GeneratorConfig,
    expected_events,
    format_ts,
    generate,
    parse_ts,
)

if TYPE_CHECKING:
    from tidewater.generator.producer import ProduceError, ProduceReport, ensure_topic, produce

__all__ = [
    "MALFORMED_REASONS",
    "RESPONSES",
    "VISIBILITIES",
    "GeneratedRecord",
    "GeneratorConfig",
    "ProduceError",
    "ProduceReport",
    "ensure_topic",
    "expected_events",
    "format_ts",
    "generate",
    "parse_ts",
    "produce",
]

_LAZY = {"ProduceError", "ProduceReport", "ensure_topic", "produce"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from tidewater.generator import producer

        return getattr(producer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
