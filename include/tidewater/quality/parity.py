"""Stream/batch parity of one interval: the published gold rows equal what the batch computes from silver.

"Batch is a bounded stream" is a promise about results: for a finished range, every gold row the
platform publishes (by the stream, a recompute or a correction) must be what the pipeline's own
transform gives over silver. This check recomputes, in memory, the rows of each gold table that
start in the interval and are closed (behind the watermark silver's latest event implies: no stream
can still change them), exactly as the batch recompute would (:func:`tidewater.batch.windows.interval_gold`,
feed widened for sessions), and compares them with the live rows, key by key, measure by measure.
A row missing on either side or with another value fails the check, and the failure names the rows.

After a recompute or a correction the two must agree; a difference means the lake holds a result no
run of the transforms explains (a stream update that overwrote a corrected window, a lost commit).
Nothing is written.
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
from tidewater.batch.windows import closed_before, interval_gold
from tidewater.pipelines.base import FINAL, WINDOW_SPAN
from tidewater.pipelines.layout import PipelineLayout

SHOWN = 5  # differing rows named in a failure; the count says how many there are


@dataclass(frozen=True)
class Parity:
    table: str  # gold/<name>
    compared: int  # closed rows on either side
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
    silver = layout.table("silver")
    high = sources.max_event_time(spark, silver, pipeline.event_time) if silver.exists() else None
    closed = closed_before(high, pipeline.watermark)

    def read(feed: Interval) -> DataFrame:
        return sources.silver_for(spark, silver, pipeline, Selection(pipeline.event_time, feed))

    out = []
    for name, frame in sorted(live.items()):
        gold = pipeline.gold_table(name.removeprefix("gold/"))
        if closed is None:
            out.append(Parity(name, 0, {"closed_before": None}))
            continue
        rows, _ = interval_gold(gold, read, Selection(gold.span[0], interval), closed, high=high)
        batch = rows.where(F.col("status") == FINAL).toArrow()
        published = frame.where(F.col(gold.span[1]) <= F.lit(closed)).toArrow()
        out.append(compare(name, published, batch, gold.keys, span=gold.span, closed=closed))
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
    """Key-by-key comparison of the measures (pure: unit-tested without Spark)."""
    measures = measure_columns(batch.column_names, keys, span)
    ours, theirs = index_rows(published, keys), index_rows(batch, keys)
    differ = []
    for key in sorted(set(ours) | set(theirs), key=repr):
        live_row, batch_row = ours.get(key), theirs.get(key)
        live_values = None if live_row is None else {m: live_row.get(m) for m in measures}
        batch_values = None if batch_row is None else {m: batch_row.get(m) for m in measures}
        if live_values != batch_values:
            differ.append((key, live_values, batch_values))
    counts = {
        "closed_before": None if closed is None else closed.isoformat(),
        "published_rows": len(ours),
        "batch_rows": len(theirs),
        "differing_rows": len(differ),
    }
    failures = []
    if differ:
        named = "; ".join(_describe(keys, *d) for d in differ[:SHOWN])
        more = f" (and {len(differ) - SHOWN} more)" if len(differ) > SHOWN else ""
        failures.append(f"{table}: {len(differ)} closed rows differ from the batch recompute: {named}{more}")
    return Parity(table, len(set(ours) | set(theirs)), counts, failures)


def _describe(keys: Sequence[str], key: tuple[Any, ...], live: dict | None, batch: dict | None) -> str:
    where = ", ".join(f"{k}={_text(v)}" for k, v in zip(keys, key, strict=True))
    if live is None:
        return f"({where}) missing from the table, batch has {_values(batch)}"
    if batch is None:
        return f"({where}) published {_values(live)}, the batch has no such row"
    changed = {m: (live[m], batch[m]) for m in live if live[m] != batch[m]}
    return f"({where}) " + ", ".join(f"{m} published {_text(a)} vs batch {_text(b)}" for m, (a, b) in changed.items())


def _values(values: dict | None) -> str:
    return "{" + ", ".join(f"{k}={_text(v)}" for k, v in (values or {}).items()) + "}"


def _text(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else repr(value)
