"""Late-data correction: bring closed gold windows in line with silver, and say so in the ledger.

The stream drops events that arrive behind its watermark from gold, but silver keeps them. For the
windows of ``[start, end)`` that are closed (``window_end <= latest silver event time - watermark
delay``) this recomputes gold from silver with the pipeline's own transform and compares it with
the published rows. A row is affected when its measures differ or when it is missing (a window
that only late events fed); affected rows are upserted as ``final`` with ``revision + 1`` and one
ledger entry each. Closed rows that already agree only have their status set to ``final``. For a
kind whose rows merge (sessions: a late event between two sessions of a key bridges them), a
published row of the interval that the recompute no longer has at all (closed or not) is deleted,
with a ledger entry whose new value is null. A rerun finds nothing to change: no gold commit, no ledger entry.
"""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tidewater.batch import sources
from tidewater.batch.gold_diff import plan_correction
from tidewater.batch.interval import Interval
from tidewater.batch.lateness import late_events_of
from tidewater.batch.ledger import Ledger, entries_for
from tidewater.batch.predicates import Selection
from tidewater.batch.result import BatchResult, TableOutcome
from tidewater.batch.targets import check_run_id, commit_metadata, ensure_tables
from tidewater.batch.windows import gold_closed_before, interval_gold
from tidewater.config import Settings
from tidewater.lake.collect import to_arrow
from tidewater.lake.tables import CommitResult
from tidewater.pipelines.base import FINAL, GoldTable, Pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import iso

MODE = "correction"


def correct_late_data(
    spark: SparkSession,
    settings: Settings,
    pipeline: Pipeline,
    start: str | dt.datetime,
    end: str | dt.datetime,
    *,
    run_id: str,
    namespace: str | None = None,
) -> BatchResult:
    """Correct the closed gold windows starting in ``[start, end)`` of ``namespace`` from its silver."""
    began = time.monotonic()
    interval = Interval.parse(start, end)
    run_id = check_run_id(run_id)
    layout = PipelineLayout.of(settings, pipeline, namespace)
    for source in pipeline.sources:
        layout.source_table(source, "silver").open()  # no silver, nothing to correct from: one line
    highs = sources.silver_highs(spark, layout)
    ensure_tables(spark, layout, [f"gold/{g.name}" for g in pipeline.gold])
    closed = None
    meta = commit_metadata(run_id=run_id, mode=MODE, interval=interval, source=f"silver:{layout.namespace}")
    ledger = Ledger(layout.ledger_uri(), lock=layout.ledger_lock())
    at = dt.datetime.now(dt.UTC)
    tables: dict[str, TableOutcome] = {}
    ledger_version = None
    for gold in pipeline.gold:
        gold_closed, high = gold_closed_before(pipeline.inputs(gold), highs)
        closed = min((c for c in (closed, gold_closed) if c is not None), default=None)
        outcome, version = _correct_gold(spark, layout, gold, interval, gold_closed, high, ledger, meta, run_id, at)
        tables[f"gold/{gold.name}"] = outcome
        ledger_version = version if version is not None else ledger_version
    return BatchResult(
        mode=MODE,
        pipeline=pipeline.name,
        run_id=run_id,
        namespace=layout.namespace,
        interval=interval,
        source=f"silver:{layout.namespace}",
        closed_before=None if closed is None else iso(closed),
        tables=tables,
        ledger_entries=sum(t.ledger_entries for t in tables.values()),
        ledger_version=ledger_version,
        seconds=round(time.monotonic() - began, 3),
    )


def _correct_gold(
    spark: SparkSession,
    layout: PipelineLayout,
    gold: GoldTable,
    interval: Interval,
    closed: dt.datetime | None,
    high: dt.datetime | None,
    ledger: Ledger,
    meta: dict[str, str],
    run_id: str,
    at: dt.datetime,
) -> tuple[TableOutcome, int | None]:
    pipeline = layout.pipeline
    name = f"gold/{gold.name}"
    table = layout.table(name)
    if closed is None:  # silver is empty: no window is closed
        return TableOutcome.of(CommitResult(False, table.version())), None
    windows = Selection(gold.span[0], interval)
    read = sources.input_reader(spark, layout, gold, closed=closed)

    # Held from the silver read until the commit: a stream commit to this table in between would make
    # our comparison stale and our upsert overwrite it.
    with layout.lock(name).hold(f"batch {MODE} {interval} run {run_id}"):
        rows, events = interval_gold(gold, read, windows, closed, high=high)  # materialized: cheap to filter
        new = to_arrow(rows.where(F.col("status") == FINAL))
        # A kind whose rows merge (sessions) loses a published row that silver no longer supports.
        supported = to_arrow(rows.select(*gold.keys)) if gold.rows_merge else None
        old = sources.gold_for(table, windows)
        plan = plan_correction(old, new, gold.keys, supported=supported, span=gold.span)
        if plan.rows.num_rows == 0 and not plan.removed:
            return TableOutcome.of(CommitResult(False, table.version())), None
        version = None
        entries = []
        if plan.changes:
            late = late_events_of(spark, pipeline, gold, events, plan.changes)
            entries = entries_for(name, plan.changes, late, run_id=run_id, mode=MODE, at=at)
            recorded = ledger.record(spark, entries, metadata=meta)
            version = None if recorded is None else recorded.version
        removed = pa.Table.from_pylist(
            [dict(zip(gold.keys, key, strict=True)) for key in plan.removed], schema=new.select(gold.keys).schema
        )
        result = table.merge(plan.rows, keys=gold.keys, metadata=meta, target_filter=windows.sql("t"), delete=removed)
    return TableOutcome.of(result, ledger_entries=len(entries), finalized=plan.finalized), version
