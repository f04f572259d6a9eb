"""A fire-and-forget meter feed: the toy readings, at-most-once (test-only).

Bronze and silver only; declared outside the package (``TIDEWATER_PIPELINE_MODULES``) like the toy it
derives from.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "toy_pipeline"))

import toy

from tidewater.pipelines.base import Delivery

PIPELINE = dataclasses.replace(
    toy.PIPELINE,
    name="meters_at_most_once",
    description="Meter readings, at-most-once (a test-only pipeline)",
    delivery=Delivery.AT_MOST_ONCE,
    sources=(dataclasses.replace(toy.PIPELINE.source(), topic="meters-at-most-once"),),
    gold=(),
)
