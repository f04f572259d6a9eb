"""Keyed-state benchmark: does a state machine's state stay bounded over days of event time, and at what cost?

Runs payments' fraud rules (:data:`tidewater.pipelines.payments.FRAUD_RULES`, through
:func:`tidewater.keyed_state.keyed_state_machine`: ``transformWithState``, RocksDB, event-time timers)
on a stream of synthetic payments, one micro-batch per hour of event time (a Parquet file source, a
no-op sink, local[2]). Each hour's payments come from a window of cards that moves on by ``--new-cards``
an hour, so a card pays for about three hours and then never again: the case of a real card
population, where cards come and go. The generator's own pool does not show it (at 2,000 events/s
each of its 2.4M cards pays every 20 minutes).

``--machine forgetting`` (the pipeline's own: a card is forgotten a day after its last payment, found
by each bucket's hourly pass over its states) or ``remembering`` (the same rules without the
deadline: the map keeps every card it saw). Prints, every 6 hours of event time, the micro-batch's
time and the state rows; at the end, the cards in state (read back with Spark's state data source)
and the median micro-batch time of the first day and of the rest.

    .venv/bin/python benchmarks/bench_state_horizon.py [--hours 60] [--payments-per-hour 4000]
        [--new-cards 2000] [--machine forgetting|remembering]

The Spark session and its files are stopped and removed also when it fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from tidewater.config import Settings
from tidewater.keyed_state import keyed_state_machine, stream_states
from tidewater.pipelines.payments import FRAUD_RULES, PAYLOAD, WATERMARK
from tidewater.spark import build_session

HOUR_MS = 3_600_000
T0_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def write_hours(folder: Path, *, hours: int, per_hour: int, new_cards: int, seed: int = 7) -> None:
    """One Parquet file per hour of event time; hour ``i``'s cards are ``[i * new_cards, (i + 3) * new_cards)``."""
    rng = random.Random(seed)
    for hour in range(hours):
        rows = []
        for j in range(per_hour):
            at = T0_MS + hour * HOUR_MS + rng.randrange(HOUR_MS)
            rows.append(
                {
                    "payment_id": f"p{hour}-{j}",
                    "paid_at": dt.datetime.fromtimestamp(at / 1000, dt.UTC),
                    "card_id": f"card-{hour * new_cards + rng.randrange(3 * new_cards):09d}",
                    "merchant_id": f"m{rng.randrange(500)}",
                    "amount": round(rng.uniform(5, 150), 2),
                    "currency": "EUR",
                    "country": rng.choice(("DE", "FR", "NL")),
                }
            )
        pq.write_table(
            pa.Table.from_pylist(rows, schema=to_arrow_schema(PAYLOAD, timezone="UTC")),
            folder / f"hour-{hour:04d}.parquet",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=int, default=60, help="hours of event time, one micro-batch each")
    parser.add_argument("--payments-per-hour", type=int, default=4000)
    parser.add_argument("--new-cards", type=int, default=2000, help="how far the window of paying cards moves an hour")
    parser.add_argument("--machine", choices=("forgetting", "remembering"), default="forgetting")
    args = parser.parse_args(argv)
    if args.hours < 30:
        parser.error("--hours must be at least 30: a card is forgotten a day after its last payment")
    machine = (
        FRAUD_RULES
        if args.machine == "forgetting"
        else dataclasses.replace(FRAUD_RULES, deadline=None, on_deadline=None)
    )

    work = Path(tempfile.mkdtemp(prefix="tw-state-horizon-"))
    spark = None
    try:
        (work / "in").mkdir()
        write_hours(work / "in", hours=args.hours, per_hour=args.payments_per_hour, new_cards=args.new_cards)
        spark = build_session(Settings(state_dir=str(work / "state")), "bench-state-horizon", streaming=True)
        payments = spark.readStream.schema(PAYLOAD).option("maxFilesPerTrigger", 1).parquet(str(work / "in"))
        alerts = keyed_state_machine(payments, machine=machine, key="card_id", watermark=WATERMARK)
        checkpoint = str(work / "checkpoint")
        started = time.monotonic()
        query = (
            alerts.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.monotonic() - started
        batches = [
            (p["durationMs"].get("addBatch", 0), p["stateOperators"][0]["numRowsTotal"])
            for p in query.recentProgress
            if p["numInputRows"] > 0
        ]
        print(
            f"{args.machine}: {args.hours} h of event time, {args.payments_per_hour:,} payments an hour, "
            f"the paying cards' window moving {args.new_cards:,} an hour; {platform.platform()}"
        )
        for hour in range(0, len(batches), 6):
            print(f"  hour {hour:3d}: micro-batch {batches[hour][0]:,} ms, state rows {batches[hour][1]:,}")
        cards = len(stream_states(spark, checkpoint))
        first_day = [ms for ms, _ in batches[:24]]
        later = [ms for ms, _ in batches[24:]]
        summary = {
            "machine": args.machine,
            "hours": len(batches),
            "cards_in_state": cards,
            "state_rows_last": batches[-1][1],
            "micro_batch_ms_median_first_day": statistics.median(first_day),
            "micro_batch_ms_median_after": statistics.median(later),
            "elapsed_s": round(elapsed, 1),
        }
        print(
            f"  cards in state at the end: {cards:,} (state rows {batches[-1][1]:,}); micro-batch median "
            f"{summary['micro_batch_ms_median_first_day']:,} ms in the first day, "
            f"{summary['micro_batch_ms_median_after']:,} ms after; {elapsed:.1f} s in all"
        )
        print(json.dumps(summary))
        return 0
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
