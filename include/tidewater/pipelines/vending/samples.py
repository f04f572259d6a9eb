"""Sample vending telemetry and machine changes.

Machines of a seeded pool send a reading now and then: sales since the last reading, the cabinet's
temperature (a few machines run warm: out-of-range alerts) and the stock level; now and then a
machine is down for 20 minutes (silent machines). Each machine's first
reading in a run is preceded by its installation (a change: location, model, operator); now and then
a reading is followed by a change: the machine is moved, or its operator changes. A share of those
changes are recorded late, effective a while before they are sent (a relocation the operator enters
after the fact): the readings in between belong to the new location, which only the late-data
correction can tell. Keyed by machine id, so a machine's records stay in order in one partition.
"""

from __future__ import annotations

import random
import uuid
from functools import lru_cache

from tidewater.pipelines.samples import (
    EventContext,
    FollowUp,
    Payload,
    SampleEvents,
    drop_field,
    format_ts,
    parse_ts,
    set_field,
    truncated_json,
)

LOCATIONS = (
    "berlin-hbf",
    "berlin-alexanderplatz",
    "hamburg-dammtor",
    "munich-marienplatz",
    "cologne-dom",
    "frankfurt-airport",
    "leipzig-hbf",
    "dresden-neustadt",
)
MODELS = ("snackmaster-3", "coolbox-200", "brewtower-x")
OPERATORS = ("north-vend", "citysnacks", "railfood")
MOVE_RATE = 0.004  # of readings: a change of the machine follows
LATE_CHANGE_SHARE = 0.25  # of those changes: effective up to half an hour before they are sent
WARM_SHARE = 0.03  # of machines: run warm
OUTAGE_BLOCK_MS = 20 * 60_000
OUTAGE_SHARE = 0.06  # of a machine's 20-minute blocks: it is down (silent)


@lru_cache(maxsize=8)
def machine_pool(seed: int, size: int) -> tuple[str, ...]:
    rng = random.Random(f"{seed}:machines")
    return tuple(f"vm-{rng.getrandbits(32):08x}" for _ in range(size))


def machines_for(config_members: int) -> int:
    return max(20, config_members)


def in_outage(machine: str, at_ms: int) -> bool:
    """Whether a machine is down (sends nothing) at ``at_ms``: a few 20-minute blocks per machine."""
    return random.Random(f"{machine}:{at_ms // OUTAGE_BLOCK_MS}").random() < OUTAGE_SHARE


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def sample_reading(rng: random.Random, context: EventContext) -> tuple[bytes, Payload]:
    """One valid reading of a machine of the pool."""
    machines = machine_pool(context.config.seed, machines_for(context.config.members))
    at_ms = parse_ts(context.event_time)
    first = rng.randrange(len(machines))
    machine = next(  # a machine in an outage sends nothing: the next one sends instead
        (m for i in range(len(machines)) if not in_outage(m := machines[(first + i) % len(machines)], at_ms)),
        machines[first],
    )
    warm = random.Random(machine).random() < WARM_SHARE
    sales = rng.choice((0, 0, 0, 1, 1, 2, 3))
    payload = {
        "reading_id": context.event_id,
        "machine_id": machine,
        "read_at": context.event_time,
        "sales_count": sales,
        "sales_amount": round(sum(rng.choice((1.5, 2.0, 2.5, 3.2)) for _ in range(sales)), 2),
        "temperature_c": round(rng.gauss(12.5 if warm else 5.0, 1.2), 1),
        "stock_level": rng.randrange(0, 101),
    }
    return machine.encode("utf-8"), payload


def _change(rng: random.Random, machine: str, at_ms: int, effective_ms: int, **attributes: str) -> FollowUp:
    change_id = _uuid(rng)
    payload = {"change_id": change_id, "machine_id": machine, "changed_at": format_ts(effective_ms), **attributes}
    return FollowUp(source="machines", event_id=change_id, key=machine.encode("utf-8"), payload=payload, at_ms=at_ms)


def changes_after(rng: random.Random, context: EventContext, reading: Payload) -> list[FollowUp]:
    """The machine's installation before its first reading of the run; now and then a move or a new
    operator after a reading, some of them effective well before they are sent."""
    machine = reading["machine_id"]
    read_ms = parse_ts(context.event_time)
    out = []
    installed = context.run.setdefault("installed", set())  # once per machine and run of the generator
    if machine not in installed:
        installed.add(machine)
        traits = random.Random(f"{machine}:install")
        out.append(
            _change(
                rng,
                machine,
                read_ms,
                read_ms - 1,
                location=traits.choice(LOCATIONS),
                model=traits.choice(MODELS),
                operator=traits.choice(OPERATORS),
            )
        )
    if rng.random() < MOVE_RATE:
        sent = read_ms + rng.randrange(1_000, 60_000)
        effective = sent - rng.randrange(10 * 60_000, 30 * 60_000) if rng.random() < LATE_CHANGE_SHARE else sent
        traits = random.Random(f"{machine}:install")
        out.append(
            _change(
                rng,
                machine,
                sent,
                effective,
                location=rng.choice(LOCATIONS),
                model=traits.choice(MODELS),
                operator=rng.choice(OPERATORS),
            )
        )
    return out


SAMPLE_EVENTS = SampleEvents(
    make=sample_reading,
    malformations={
        "truncated_json": truncated_json,
        "missing_machine": drop_field("machine_id"),
        "sensor_fault": set_field("temperature_c", 999.0),
        "bad_read_at": set_field("read_at", "yesterday"),
    },
    follow_ups=changes_after,
)
