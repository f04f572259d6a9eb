"""The fraud rules: one card's state machine, pure Python (no Spark, no I/O).

:func:`step` takes the card's state and its next payment and returns the new state and the alerts
that payment raises. The stream (a ``transformWithState`` processor) and the batch recompute
(``mapInArrow`` over the card's history) both fold it over the card's payments in event-time
order (:mod:`tidewater.keyed_state`), so both raise the same alerts.

Rules (each alert belongs to the payment that raises it):

* ``velocity``: more than ``VELOCITY_COUNT`` payments of the card within ``VELOCITY_WINDOW`` (raised
  by the payment that crosses the limit, again only after the count fell back to it);
* ``amount_spike``: the amount is more than ``SPIKE_FACTOR`` times the mean of the card's payments of
  the previous ``PROFILE_WINDOW`` (its running profile), given at least ``PROFILE_MIN_PAYMENTS`` of them;
* ``impossible_travel``: a payment of the card in another country less than ``TRAVEL_WINDOW`` before.

The state is the card's payments of the last ``HORIZON`` (the longest rule window), oldest first:
nothing older can change an alert, so the state is evicted as time moves on and a batch recompute
needs silver from ``HORIZON`` before the interval it rebuilds, no more. A card that stops paying is
forgotten ``HORIZON`` after its last payment (:func:`forget_at`): its next payment would have evicted
everything anyway, so the alerts are the same, and the stream holds state for the cards of the last
``HORIZON`` only, not for every card it ever saw.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from itertools import islice
from operator import itemgetter
from typing import Any

from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

VELOCITY_COUNT = 5
VELOCITY_WINDOW_MS = 10 * 60 * 1000
SPIKE_FACTOR = 5.0
PROFILE_WINDOW_MS = 24 * 60 * 60 * 1000
PROFILE_MIN_PAYMENTS = 3
TRAVEL_WINDOW_MS = 30 * 60 * 1000
HORIZON = "24 hours"
HORIZON_MS = max(VELOCITY_WINDOW_MS, PROFILE_WINDOW_MS, TRAVEL_WINDOW_MS)

RULES = ("velocity", "amount_spike", "impossible_travel")

# What the machine sees of a payment (silver columns; time as epoch ms).
EVENT_COLUMNS = ("payment_id", "card_id", "paid_at", "amount", "currency", "country", "merchant_id")

ALERT_SCHEMA = StructType(
    [
        StructField("alert_id", StringType()),
        StructField("card_id", StringType()),
        StructField("rule", StringType()),
        StructField("payment_id", StringType()),
        StructField("paid_at", TimestampType()),
        StructField("amount", DoubleType()),
        StructField("currency", StringType()),
        StructField("country", StringType()),
        StructField("merchant_id", StringType()),
        StructField("detail", StringType()),
    ]
)

State = dict[str, Any]
Payment = dict[str, Any]  # EVENT_COLUMNS, ``paid_at`` as epoch milliseconds


def step(state: State | None, payment: Payment) -> tuple[State, list[dict[str, Any]]]:
    """The card's state after ``payment``, and the alerts it raises (``paid_at`` left in epoch ms).

    Every rule looks back at most ``HORIZON`` (the velocity rule compares with the count at the
    previous payment, whose window lies within twice its own length, well inside it).

    ``recent`` is in time order (the fold feeds a card's payments in event-time order), so each window
    is found by bisection: a card paying thousands of times within the horizon (a compromised one, a
    bot) costs a logarithm per payment, not a pass over its whole history (400k bench payments took
    510 s to fold when every rule scanned the list)."""
    now = int(payment["paid_at"])
    recent = (state or {}).get("recent", [])
    recent = recent[_first_after(recent, now - HORIZON_MS) :]  # a copy: the state passed in stays as it was
    alerts: list[tuple[str, str]] = []

    in_window = 1 + len(recent) - _first_after(recent, now - VELOCITY_WINDOW_MS)
    if in_window > VELOCITY_COUNT:
        previous = recent[-1][0]  # there is one: the count includes it
        if len(recent) - _first_after(recent, previous - VELOCITY_WINDOW_MS) <= VELOCITY_COUNT:
            alerts.append(("velocity", f"{in_window} payments within {VELOCITY_WINDOW_MS // 60000} minutes"))

    first = _first_after(recent, now - PROFILE_WINDOW_MS)
    if len(recent) - first >= PROFILE_MIN_PAYMENTS:
        mean = sum(map(itemgetter(1), islice(recent, first, None))) / (len(recent) - first)
        if payment["amount"] > SPIKE_FACTOR * mean:
            alerts.append(
                ("amount_spike", f"{payment['amount']:.2f} vs a mean of {mean:.2f} over {len(recent) - first}")
            )

    for t, _, country in reversed(recent):  # the latest payment elsewhere within the window
        if t <= now - TRAVEL_WINDOW_MS:
            break
        if country != payment["country"]:
            alerts.append(
                ("impossible_travel", f"{country} -> {payment['country']} in {(now - t) / 60000:.1f} minutes")
            )
            break

    insort(recent, [now, float(payment["amount"]), payment["country"]], key=_time)
    return {"recent": recent}, [_alert(payment, rule, detail) for rule, detail in alerts]


def forget_at(state: State | None) -> int | None:
    """When the card's state can no longer change an alert: ``HORIZON`` after its last payment."""
    recent = (state or {}).get("recent")
    return recent[-1][0] + HORIZON_MS if recent else None


def forget(state: State, at: int) -> tuple[None, list[dict[str, Any]]]:
    """The card's state once :func:`forget_at` has passed: none (every payment it held is out of every window)."""
    return None, []


def _time(entry: list[Any]) -> int:
    return entry[0]


def _first_after(recent: list[list[Any]], after_ms: int) -> int:
    """Index of the first payment of ``recent`` (time order) later than ``after_ms``."""
    return bisect_right(recent, after_ms, key=_time)


def _alert(payment: Payment, rule: str, detail: str) -> dict[str, Any]:
    return {
        "alert_id": f"{payment['payment_id']}:{rule}",
        "card_id": payment["card_id"],
        "rule": rule,
        "payment_id": payment["payment_id"],
        "paid_at": payment["paid_at"],
        "amount": payment["amount"],
        "currency": payment["currency"],
        "country": payment["country"],
        "merchant_id": payment["merchant_id"],
        "detail": detail,
    }
