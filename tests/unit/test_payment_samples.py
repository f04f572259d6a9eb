"""Payments' sample events: cards drawn from a pool that grows with the offered rate (no Spark, no broker)."""

from __future__ import annotations

import json
import re
import tracemalloc

from tidewater.pipelines.payments.samples import SAMPLE_EVENTS, card_id, cards_for
from tidewater.pipelines.samples import GeneratorConfig, generate

T0 = 1_795_000_000_000


def test_a_card_id_is_fixed_by_seed_and_index() -> None:
    assert card_id(42, 7) == card_id(42, 7)
    assert len({card_id(42, 7), card_id(42, 8), card_id(43, 7)}) == 3
    assert re.fullmatch(r"card-[0-9a-f]{12}", card_id(42, 7))


def test_a_high_rate_draws_from_a_pool_it_never_builds() -> None:
    """At 100k events/s (a benchmark's backlog) the pool is 120M cards; payments draw from all of it
    without a list of them: the tuple of ids it once was took a producer process to 10.7 GB."""
    config = GeneratorConfig(seed=5, rate=100_000, start_time_ms=T0)
    assert cards_for(config.members, config.rate) == 120_000_000
    tracemalloc.start()
    try:
        records = list(generate(config, 2_000, SAMPLE_EVENTS))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cards = [json.loads(r.value)["card_id"] for r in records]
    # ordinary cards of a 120M pool hardly ever pay twice; a compromised card pays in bursts (3%)
    assert len(set(cards)) > 0.9 * len(cards)
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB to generate 2,000 payments"
