"""The per-micro-batch phase clock: nesting, adding up, per-thread batches, taken once."""

from __future__ import annotations

import threading
import time

from tidewater import phase_clock
from tidewater.lake.locks import holding
from tidewater.streaming.progress import summarize


def test_phases_nest_by_path_and_add_up() -> None:
    with phase_clock.batch("ns.p.bronze", 7):
        with phase_clock.phase("bronze"):
            with phase_clock.phase("write files"):
                time.sleep(0.02)
            with phase_clock.phase("commit"):
                pass
        for _ in range(2):
            with phase_clock.phase("silver append"):
                time.sleep(0.01)
    phases = phase_clock.take("ns.p.bronze", 7)
    assert phases is not None
    assert set(phases) == {"bronze", "bronze/write files", "bronze/commit", "silver append", "total"}
    assert phases["bronze/write files"] >= 20
    assert phases["bronze"] >= phases["bronze/write files"] + phases["bronze/commit"] - 0.2  # rounding
    assert phases["silver append"] >= 20  # both runs
    assert phases["total"] >= phases["bronze"] + phases["silver append"] - 0.2
    assert phase_clock.take("ns.p.bronze", 7) is None  # taken once


def test_a_batch_inside_a_batch_joins_it_and_phases_outside_one_record_nothing() -> None:
    with phase_clock.phase("outside"):
        pass
    outer, silver, inner, parse = (
        phase_clock.batch("outer", 1),
        phase_clock.phase("silver"),
        phase_clock.batch("inner", 1),
        phase_clock.phase("parse"),
    )
    with outer, silver, inner, parse:
        pass
    assert phase_clock.take("inner", 1) is None
    outer = phase_clock.take("outer", 1)
    assert outer is not None and "silver/parse" in outer and "outside" not in outer


def test_batches_on_other_threads_are_their_own() -> None:
    def run(query: str) -> None:
        with phase_clock.batch(query, 0), phase_clock.phase(f"only {query}"):
            time.sleep(0.01)

    threads = [threading.Thread(target=run, args=(q,)) for q in ("gold_a", "gold_b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(phase_clock.take("gold_a", 0) or {}) == {"only gold_a", "total"}
    assert set(phase_clock.take("gold_b", 0) or {}) == {"only gold_b", "total"}


def test_only_the_newest_untaken_batches_are_kept() -> None:
    for batch_id in range(phase_clock.KEPT_BATCHES + 10):
        with phase_clock.batch("never taken", batch_id):
            pass
    assert phase_clock.take("never taken", 0) is None
    assert phase_clock.take("never taken", phase_clock.KEPT_BATCHES + 9) is not None
    for batch_id in range(phase_clock.KEPT_BATCHES + 10):
        phase_clock.take("never taken", batch_id)


def test_lock_wait_is_a_phase_and_the_progress_record_carries_the_phases() -> None:
    with phase_clock.batch("q", 3), phase_clock.phase("silver"), holding(None, "no lock"):
        pass
    phases = phase_clock.take("q", 3)
    assert phases is not None and "silver/lock wait" not in phases  # no lock, no wait
    progress = {"name": "q", "batchId": 3, "durationMs": {"addBatch": 12, "triggerExecution": 15}}
    record = summarize(progress, 0, 0, phases)
    assert record["duration_ms"] == {"addBatch": 12, "triggerExecution": 15}
    assert record["phases_ms"]["silver"] == phases["silver"]


def test_a_carried_batch_times_another_threads_part_under_the_phase_it_was_carried_from() -> None:
    def commit(timed) -> None:
        with timed(), phase_clock.phase("commit"):
            time.sleep(0.02)

    with phase_clock.batch("ns.p.bronze", 3):
        with phase_clock.phase("bronze"):
            worker = threading.Thread(target=commit, args=(phase_clock.carry(),))
            worker.start()
        with phase_clock.phase("silver"):
            worker.join()
    phases = phase_clock.take("ns.p.bronze", 3)
    assert phases is not None and phases["bronze/commit"] >= 20
    assert "commit" not in phases and "silver/commit" not in phases

    # Carried from no batch, the other thread times nothing, and leaves no batch open behind it.
    seen: list[object] = []

    def outside(timed) -> None:
        with timed(), phase_clock.phase("commit"):
            pass
        seen.append(getattr(phase_clock._current, "phases", None))

    worker = threading.Thread(target=outside, args=(phase_clock.carry(),))
    worker.start()
    worker.join()
    assert seen == [None]


def test_a_jobs_phases_are_described_in_seconds_in_their_order() -> None:
    assert phase_clock.described({"silver": 34512.3, "silver/sort": 1690.0, "total": 43900.0}) == (
        "silver 34.5 s, silver/sort 1.7 s, total 43.9 s"
    )
