"""Stream/batch parity of one interval: every gold row published as final equals what the batch computes.

"Batch is a bounded stream" is a promise about results: for a finished range, the gold rows the
platform declares final (a recompute or a correction reconciled them with silver) must be what the
pipeline's own transform gives over silver. This check recomputes, in memory, the rows of each gold
table that start in the interval, exactly as the batch recompute would
(:func:`tidewater.batch.windows.interval_gold`, feed widened for sessions), and compares every
published final row with its recomputed twin, measure by measure. A final row the batch does not
have, or has with another value, fails the check, and the failure names the rows. An interval with
no final row yet has nothing to compare: its batch rows are not computed (``batch_rows`` null).

Provisional rows are left out on purpose: they are the stream's view, which late events may still
change until the next correction; comparing them would fail every audit that runs while late data
is pending. Nothing is written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater.batch import sources
from tidewater.batch.gold_diff import index_rows, measure_columns
from tidewater.batch.interval import Interval
from tidewater.batch.predicates import Selection
from tidewater.batch.windows import gold_closed_before, interval_gold
from tidewater.lake.collect import to_arrow
from tidewater.pipelines.base import FINAL, WINDOW_SPAN
from tidewater.pipelines.layout import PipelineLayout

SHOWN = 5  # differing rows named in a failure; the count says how many there are


@dataclass(frozen=True)
class Parity:
    table: str  # gold/<name>
    compared: int  # published final rows compared
    counts: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return not self.failures


def check_parity(
    spark: SparkSession, layout: PipelineLayout, interval: Interval, live: Mapping[str, DataFrame]
) -> list[Parity]:
    """One :class:`Parity` per gold table of ``live`` ("gold/<name>" -> its rows starting in the interval)."""
    pipeline = layout.pipeline
    highs = sources.silver_highs(spark, layout)
    out = []
    for name, frame in sorted(live.items()):
        gold = pipeline.gold_table(name.removeprefix("gold/"))
        closed, high = gold_closed_before(pipeline.inputs(gold), highs)
        if closed is None:
            out.append(Parity(name, 0, {"closed_before": None}))
            continue
        published = to_arrow(frame.where(F.col("status") == FINAL))
        if published.num_rows == 0:  # nothing final yet: the batch's rows would be compared with nothing
            counts = {"closed_before": closed.isoformat(), "final_rows": 0, "batch_rows": None, "differing_rows": 0}
            out.append(Parity(name, 0, counts))
            continue
        read = sources.input_reader(spark, layout, gold, closed=closed)
        rows, _ = interval_gold(gold, read, Selection(gold.span[0], interval), closed, high=high)
        out.append(compare(name, published, to_arrow(rows), gold.keys, span=gold.span, closed=closed))
    return out


def compare(
    table: str,
    published: pa.Table,
    batch: pa.Table,
    keys: Sequence[str],
    *,
    span: Sequence[str] = WINDOW_SPAN,
    closed: dt.datetime | None = None,
) -> Parity:
    """Each ``published`` (final) row against its ``batch`` twin, key by key (pure: unit-tested without
    Spark); batch rows with no published final twin are the stream's or the next correction's."""
    measures = measure_columns(batch.column_names, keys, span)
    ours, theirs = index_rows(published, keys), index_rows(batch, keys)
    differ = []
    for key in sorted(ours, key=repr):
        live_values = {m: ours[key].get(m) for m in measures}
        batch_values = None if key not in theirs else {m: theirs[key].get(m) for m in measures}
        if live_values != batch_values:
            differ.append((key, live_values, batch_values))
    counts = {
        "closed_before": None if closed is None else closed.isoformat(),
        "final_rows": len(ours),
        "batch_rows": len(theirs),
        "differing_rows": len(differ),
    }
    failures = []
    if differ:
        named = "; ".join(_describe(keys, *d) for d in differ[:SHOWN])
        more = f" (and {len(differ) - SHOWN} more)" if len(differ) > SHOWN else ""
        failures.append(f"{table}: {len(differ)} final rows differ from the batch recompute: {named}{more}")
    return Parity(table, len(ours), counts, failures)


def _describe(keys: Sequence[str], key: tuple[Any, ...], live: dict, batch: dict | None) -> str:
    where = ", ".join(f"{k}={_text(v)}" for k, v in zip(keys, key, strict=True))
    if batch is None:
        return f"({where}) published {_values(live)}, the batch has no such row"
    changed = {m: (live[m], batch[m]) for m in live if live[m] != batch[m]}
    return f"({where}) " + ", ".join(f"{m} published {_text(a)} vs batch {_text(b)}" for m, (a, b) in changed.items())


def _values(values: dict | None) -> str:
    return "{" + ", ".join(f"{k}={_text(v)}" for k, v in (values or {}).items()) + "}"


def _text(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else repr(value)
