"""``tidewater batch ...``: the commands spark_jobs/batch.py runs (placeholder, being written)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``batch`` command and its sub-commands to the ``tidewater`` parser."""
