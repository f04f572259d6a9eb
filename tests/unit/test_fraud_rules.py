"""The fraud rules as a pure state machine, and the fold the stream and the batch share (no Spark)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from tidewater.keyed_state import fold
from tidewater.pipelines.payments import FRAUD_RULES, fraud

MINUTE = 60_000
T0 = 1_795_000_000_000


def payment(i: int, at_ms: int, *, amount: float = 20.0, country: str = "DE", card: str = "c-1") -> dict:
    return {
        "payment_id": f"p-{i:04d}",
        "card_id": card,
        "paid_at": at_ms,
        "amount": amount,
        "currency": "EUR",
        "country": country,
        "merchant_id": "m-1",
    }


def alerts(events: list[dict]) -> list[tuple[str, str]]:
    return [(a["payment_id"], a["rule"]) for a in fold(FRAUD_RULES, None, events)[1]]


def test_velocity_is_raised_by_the_payment_that_crosses_the_limit_and_again_only_after_it_fell_back():
    burst = [payment(i, T0 + i * 30_000) for i in range(8)]  # 8 payments, 30 s apart
    assert alerts(burst) == [("p-0005", "velocity")]  # the 6th within 10 minutes, once
    later = [payment(100 + i, T0 + 30 * MINUTE + i * 30_000) for i in range(6)]  # after a quiet spell
    assert alerts(burst + later) == [("p-0005", "velocity"), ("p-0105", "velocity")]


def test_an_amount_spike_needs_a_profile_of_three_payments():
    small = [payment(i, T0 + i * 2 * MINUTE, amount=10.0) for i in range(2)]
    assert alerts([*small, payment(9, T0 + 10 * MINUTE, amount=500.0)]) == []  # two: no profile yet
    three = [payment(i, T0 + i * 2 * MINUTE, amount=10.0) for i in range(3)]
    assert alerts([*three, payment(9, T0 + 10 * MINUTE, amount=500.0)]) == [("p-0009", "amount_spike")]
    assert alerts([*three, payment(9, T0 + 10 * MINUTE, amount=49.0)]) == []  # under 5x the mean


def test_impossible_travel_is_another_country_within_thirty_minutes():
    home = payment(0, T0)
    assert alerts([home, payment(1, T0 + 29 * MINUTE, country="BR")]) == [("p-0001", "impossible_travel")]
    assert alerts([home, payment(1, T0 + 31 * MINUTE, country="BR")]) == []
    assert alerts([home, payment(1, T0 + 5 * MINUTE, country="DE")]) == []


def random_history(seed: int, n: int = 300) -> list[dict]:
    rng = random.Random(seed)
    at = T0
    out = []
    for i in range(n):
        at += int(rng.expovariate(1 / (3 * MINUTE)))
        spike = rng.random() < 0.05
        out.append(payment(i, at, amount=rng.uniform(5, 50) * (20 if spike else 1), country=rng.choice("AB")))
    return out


def test_folding_in_chunks_in_any_arrival_order_gives_the_same_alerts_and_state():
    """What the stream does (events folded as the watermark passes them, in pieces) equals one batch fold."""
    events = random_history(1)
    state, whole = fold(FRAUD_RULES, None, events)
    rng = random.Random(2)
    chunked_state, chunked = None, []
    i = 0
    while i < len(events):
        size = rng.randint(1, 20)
        piece = events[i : i + size]
        rng.shuffle(piece)  # arrival order within a piece does not matter: the fold sorts by time
        chunked_state = json.loads(json.dumps(chunked_state))  # the state goes through JSON in the stream
        chunked_state, out = fold(FRAUD_RULES, chunked_state, piece)
        chunked += out
        i += size
    assert chunked == whole and chunked_state == state and whole


def test_nothing_older_than_the_horizon_changes_an_alert():
    """Why a batch rebuild of an interval may start its read a horizon before it."""
    events = random_history(3, n=600)
    cut = events[len(events) // 2]["paid_at"]
    full = [a for a in fold(FRAUD_RULES, None, events)[1] if a["paid_at"] >= cut]
    recent = [e for e in events if e["paid_at"] >= cut - fraud.HORIZON_MS]
    truncated = [a for a in fold(FRAUD_RULES, None, recent)[1] if a["paid_at"] >= cut]
    assert truncated == full and full


def test_ties_in_time_are_broken_by_payment_id():
    a, b = payment(2, T0, country="A"), payment(1, T0, country="B")
    assert fold(FRAUD_RULES, None, [a, b]) == fold(FRAUD_RULES, None, [b, a])


def test_an_event_the_rules_fail_on_is_skipped_not_fatal():
    broken = {**payment(1, T0 + MINUTE), "amount": None}  # silver never holds one; a machine must survive it
    events = [payment(0, T0), broken, payment(2, T0 + 2 * MINUTE, country="BR")]
    state, outputs = fold(FRAUD_RULES, None, events)
    assert [a["payment_id"] for a in outputs] == ["p-0002"] and len(state["recent"]) == 2


def reference_step(state: dict | None, p: dict) -> tuple[dict, list[tuple[str, str]]]:
    """The rules as the module docstring states them, one pass over the card's history each: the spec
    the bisecting :func:`fraud.step` must match alert for alert."""
    now = p["paid_at"]
    recent = [e for e in (state or {}).get("recent", []) if e[0] > now - fraud.HORIZON_MS]
    found = []
    in_window = 1 + sum(1 for e in recent if e[0] > now - fraud.VELOCITY_WINDOW_MS)
    if in_window > fraud.VELOCITY_COUNT:
        before = sum(1 for e in recent if e[0] > recent[-1][0] - fraud.VELOCITY_WINDOW_MS)
        if before <= fraud.VELOCITY_COUNT:
            found.append((p["payment_id"], "velocity"))
    profile = [e[1] for e in recent if e[0] > now - fraud.PROFILE_WINDOW_MS]
    if len(profile) >= fraud.PROFILE_MIN_PAYMENTS and p["amount"] > fraud.SPIKE_FACTOR * sum(profile) / len(profile):
        found.append((p["payment_id"], "amount_spike"))
    if any(e[0] > now - fraud.TRAVEL_WINDOW_MS and e[2] != p["country"] for e in recent):
        found.append((p["payment_id"], "impossible_travel"))
    return {"recent": [*recent, [now, float(p["amount"]), p["country"]]]}, found


def test_the_bisecting_rules_raise_what_the_plain_definition_does() -> None:
    """Random card histories, hot bursts (hundreds of payments in minutes) included, in time order."""
    rng = random.Random(13)
    for trial in range(40):
        at, state, spec = T0, None, None
        burst = trial % 4 == 0
        for i in range(400 if burst else 60):
            at += rng.randrange(0, 20_000) if burst else rng.randrange(0, 6 * 60 * MINUTE)
            p = payment(i, at, amount=rng.choice([5.0, 20.0, 21.5, 400.0]), country=rng.choice(["DE", "DE", "FR"]))
            previous, before = state, json.dumps(state)
            state, raised = fraud.step(previous, p)
            spec, expected = reference_step(spec, p)
            assert [(a["payment_id"], a["rule"]) for a in raised] == expected, (trial, i)
            assert state == spec
            assert json.dumps(previous) == before  # the state passed in is left as it was


def test_a_card_quiet_for_the_horizon_is_forgotten_and_its_alerts_do_not_change():
    """Why the stream may drop a card's state a horizon after its last payment (``fraud.forget_at``)."""
    remembering = replace(FRAUD_RULES, deadline=None, on_deadline=None)
    events = random_history(5, n=300)
    spread = [{**e, "paid_at": e["paid_at"] + (i // 40) * 2 * fraud.HORIZON_MS} for i, e in enumerate(events)]
    state, forgetful = fold(FRAUD_RULES, None, spread)
    assert forgetful == fold(remembering, None, spread)[1] and forgetful
    last = max(e["paid_at"] for e in spread)
    assert (
        fold(FRAUD_RULES, state, [], until_ms=last + fraud.HORIZON_MS)[0] == state
    )  # not yet: the deadline is not passed
    assert fold(FRAUD_RULES, state, [], until_ms=last + fraud.HORIZON_MS + 1)[0] is None
