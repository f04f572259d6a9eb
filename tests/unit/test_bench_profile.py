"""The benchmark's profile report: each phase under its parent, whichever thread timed it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_stream import tree_order


def test_a_phase_timed_on_another_thread_is_listed_under_its_parent() -> None:
    ran = ["bronze", "bronze/read", "silver", "silver/already committed?", "bronze/commit", "silver/parse"]
    assert tree_order(ran) == [
        "bronze",
        "bronze/read",
        "bronze/commit",
        "silver",
        "silver/already committed?",
        "silver/parse",
    ]
    # Phases of one thread keep the order they ran in; a child whose parent was not timed comes last.
    assert tree_order(["b", "a", "a/x", "c/y"]) == ["b", "a", "a/x", "c/y"]
