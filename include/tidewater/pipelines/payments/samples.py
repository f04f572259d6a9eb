"""Sample payments: cards of a seeded pool paying merchants, with the patterns the fraud rules look for.

Ordinary cards pay now and then, in their home country, amounts around the card's own typical spend.
Mixed in: a few compromised cards per 5-minute block that pay in rapid
bursts from changing countries (velocity and impossible-travel alerts), and rare payments far above
a card's usual amount (amount spikes). Keyed by card id, so a card's payments stay in one partition.
"""

from __future__ import annotations

import hashlib
import random

from tidewater.pipelines.samples import (
    EventContext,
    Payload,
    SampleEvents,
    drop_field,
    parse_ts,
    set_field,
    truncated_json,
)

COUNTRIES = ("DE", "FR", "NL", "GB", "US", "ES", "IT", "PL", "SE", "BR")
CURRENCY = {"GB": "GBP", "US": "USD", "PL": "PLN", "SE": "SEK", "BR": "BRL"}  # the rest pay in EUR
CURRENCIES = ("EUR", "GBP", "USD", "PLN", "SEK", "BRL")
COMPROMISED_SHARE = 0.03  # of all payments: bursts of compromised cards
COMPROMISED_PER_BLOCK = 2
BLOCK_MS = 5 * 60 * 1000
SPIKE_SHARE = 0.004
COMPROMISED_SPIKE_SHARE = 0.08
SPIKE_FACTOR = 25.0


def card_id(seed: int, index: int) -> str:
    """The card at ``index`` of a seed's pool, derived from the two rather than looked up: a pool is
    :func:`cards_for` cards, 120M at the 100k events/s a benchmark's backlog is generated at, which
    held as a tuple of ids took a producer process to 10.7 GB (the host's OOM killer ended it)."""
    return f"card-{hashlib.blake2b(f'{seed}:cards:{index}'.encode(), digest_size=6).hexdigest()}"


def cards_for(config_members: int, rate: float) -> int:
    """How many cards pay: at least ``members``, and enough that an ordinary card pays about once in 20
    minutes at the offered rate (more would make every card a velocity alert)."""
    return max(config_members, int(rate * 1200))


def _card_traits(card: str) -> tuple[str, float]:
    """A card's home country and typical amount, fixed by its id."""
    rng = random.Random(card)
    return rng.choice(COUNTRIES), round(rng.uniform(8.0, 120.0), 2)


def sample_payment(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid payment (cards: :func:`cards_for`; ``venues`` of the generator config: merchants)."""
    seed, cards = context.config.seed, cards_for(context.config.members, context.config.rate)
    block = parse_ts(context.event_time) // BLOCK_MS
    if rng.random() < COMPROMISED_SHARE:
        card = card_id(seed, (block * 7919 + rng.randrange(COMPROMISED_PER_BLOCK)) % cards)
        _, typical = _card_traits(card)
        country = rng.choice(COUNTRIES)
        spike = rng.random() < COMPROMISED_SPIKE_SHARE  # small test payments, then a big one
    else:
        card = card_id(seed, rng.randrange(cards))
        home, typical = _card_traits(card)
        country = home
        spike = rng.random() < SPIKE_SHARE
    amount = typical * rng.lognormvariate(0.0, 0.35)
    if spike:
        amount *= SPIKE_FACTOR
    payload = {
        "payment_id": context.event_id,
        "paid_at": context.event_time,
        "card_id": card,
        "merchant_id": f"m-{rng.randrange(max(1, context.config.venues)):05d}",
        "amount": round(amount, 2),
        "currency": CURRENCY.get(country, "EUR"),
        "country": country,
    }
    return card.encode("utf-8"), payload


SAMPLE_EVENTS = SampleEvents(
    make=sample_payment,
    malformations={
        "truncated_json": truncated_json,
        "missing_card": drop_field("card_id"),
        "negative_amount": set_field("amount", -5.0),
        "bad_currency": set_field("currency", "DOGE"),
    },
)
