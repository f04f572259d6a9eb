"""Batch is a bounded stream: rebuild silver and gold for an event-time interval with the stream's own transforms.

Two entry points share one core (:func:`rebuild`):

* :func:`recompute_interval`: what the scheduled batch DAG runs for its data interval. Bronze of
  the namespace -> ``silver_from_bronze`` -> silver rows of ``[start, end)`` replace exactly that
  interval of silver; then every gold table's windows starting in ``[start, end)`` are recomputed
  from silver and replaced.
* :func:`replay`: the same for a range, optionally restricted to some entities, from bronze or
  straight from Kafka, into the live namespace or a sandbox namespace.

Only silver and gold are written. Bronze is the record of what arrived and only the stream writes
it; quarantine is not recomputed either (its rows are a log of rejected records, keyed by when they
arrived rather than by event time, so an event-time interval does not select them).

Idempotent: every write is a replace of exactly the selected rows, the transforms are
deterministic (the first copy of an event is the one with the lowest Kafka partition and offset,
and lineage comes from bronze), and unchanged gold rows keep their status and revision, so a rerun
over the same bronze writes the same rows. Gold values never change silently: a final row whose
measures change is recorded in the corrections ledger and its revision grows (see
:mod:`tidewater.batch.gold_diff`).

Beside a running stream (live target): each table's lock (:mod:`tidewater.lake.locks`) is held from
the read of its input until its commit, so no stream commit falls in between. The gold queries
skip silver commits that remove data (``skipChangeCommits``), so they never see our silver replace;
gold of the interval is rewritten by this job instead. One consequence: an event of a bronze batch
whose silver MERGE was waiting for our lock is written by our replace and not re-inserted by that
MERGE, so the gold *stream* never counts it; if its window is still open, a later stream update of
that window is short by it until the late-data correction (:mod:`tidewater.batch.correction`)
reconciles the closed window with silver.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from tidewater import phase_clock
from tidewater.batch import sources
from tidewater.batch.gold_diff import reconcile_recompute
from tidewater.batch.interval import Interval
from tidewater.batch.lateness import late_events_of
from tidewater.batch.ledger import Ledger, entries_for
from tidewater.batch.predicates import Selection, coerce_entities
from tidewater.batch.requests import BRONZE, KAFKA, SANDBOX, ReplayRequest
from tidewater.batch.result import BatchResult, TableOutcome
from tidewater.batch.targets import check_run_id, commit_metadata, ensure_tables
from tidewater.batch.windows import gold_closed_before, interval_gold
from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.lake.collect import to_arrow
from tidewater.lake.reads import read_table
from tidewater.pipelines.base import GoldTable, Pipeline, Source
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import iso, parse_duration

log = logging.getLogger(__name__)

SILVER, GOLD = "silver", "gold"
LAYERS = (SILVER, GOLD)


@dataclass(frozen=True)
class Rebuild:
    """One bounded rebuild: what to read, what to write, and how to label it."""

    pipeline: Pipeline
    interval: Interval
    run_id: str
    mode: str  # "recompute" | "replay"
    source: str  # BRONZE | KAFKA (tidewater.batch.requests)
    source_layout: PipelineLayout  # whose bronze (or whose settings' Kafka) is read
    target: PipelineLayout  # where silver and gold are written
    sandbox: bool
    entities: tuple[Any, ...] = ()
    # Which layers to write: the batch DAG rebuilds silver, audits it, and only then publishes gold.
    layers: tuple[str, ...] = LAYERS

    @property
    def entity_column(self) -> str | None:
        return self.pipeline.entity_column if self.entities else None

    @property
    def source_label(self) -> str:
        if self.source == KAFKA:
            settings = self.source_layout.settings
            return "kafka:" + ",".join(settings.topic(s.topic) for s in self.pipeline.sources)
        return f"bronze:{self.source_layout.namespace}"

    @property
    def purpose(self) -> str:
        return f"batch {self.mode} {self.interval} run {self.run_id}"


def recompute_interval(
    spark: SparkSession,
    settings: Settings,
    pipeline: Pipeline,
    start: str | dt.datetime,
    end: str | dt.datetime,
    *,
    run_id: str,
    namespace: str | None = None,
    layers: Sequence[str] = LAYERS,
) -> BatchResult:
    """Rebuild silver and/or gold of ``[start, end)`` in ``namespace`` (default: the settings' one) from its
    bronze; gold alone is recomputed from the silver table (after an audit passed it)."""
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown or not layers:
        raise ConfigError(f"layers {unknown or '(none)'} are not among {', '.join(LAYERS)}")
    layout = PipelineLayout.of(settings, pipeline, namespace)
    plan = Rebuild(
        pipeline=pipeline,
        interval=Interval.parse(start, end),
        run_id=check_run_id(run_id),
        mode="recompute",
        source=BRONZE,
        source_layout=layout,
        target=layout,
        sandbox=False,
        layers=tuple(layers),
    )
    return rebuild(spark, plan)


def replay(
    spark: SparkSession,
    settings: Settings,
    pipeline: Pipeline,
    start: str | dt.datetime,
    end: str | dt.datetime,
    *,
    run_id: str,
    source: str = BRONZE,
    target: str = SANDBOX,
    sandbox_namespace: str | None = None,
    namespace: str | None = None,
    entities: Sequence[Any] = (),
) -> BatchResult:
    """Rebuild silver and gold of ``[start, end)`` (only ``entities`` of ``pipeline.entity_column`` if given)
    from ``namespace``'s bronze or from Kafka, into ``namespace`` (``target="live"``) or into the
    sandbox namespace ``sandbox_namespace`` (``target="sandbox"``: tables created there; no live
    table or lock is touched). The arguments are checked as the replay DAG checks its params
    (:meth:`ReplayRequest.parse`)."""
    request = ReplayRequest.parse(
        settings,
        pipeline,
        start=start,
        end=end,
        source=source,
        target=target,
        sandbox_namespace=sandbox_namespace,
        entities=list(entities),
        namespace=namespace,
    )
    return run_replay(spark, settings, pipeline, request, run_id=run_id, namespace=namespace)


def run_replay(
    spark: SparkSession,
    settings: Settings,
    pipeline: Pipeline,
    request: ReplayRequest,
    *,
    run_id: str,
    namespace: str | None = None,
) -> BatchResult:
    """Run a checked request (see :func:`replay`); ``namespace`` is the one read (default: the settings')."""
    values: tuple[Any, ...] = ()
    if request.entities and pipeline.entity_column:
        first_silver = pipeline.table_of(pipeline.sources[0], "silver")
        kind = pipeline.schemas(spark)[first_silver].field(pipeline.entity_column).type
        values = coerce_entities(list(request.entities), pipeline.entity_column, kind)
    source_layout = PipelineLayout.of(settings, pipeline, namespace)
    plan = Rebuild(
        pipeline=pipeline,
        interval=request.interval,
        run_id=check_run_id(run_id),
        mode="replay",
        source=request.source,
        source_layout=source_layout,
        target=PipelineLayout.of(settings, pipeline, request.written_namespace(source_layout.namespace)),
        sandbox=request.target == SANDBOX,
        entities=values,
    )
    return rebuild(spark, plan)


def rebuild(spark: SparkSession, plan: Rebuild) -> BatchResult:
    """Silver of the interval for each source, then each gold table; see the module docstring."""
    began = time.monotonic()
    pipeline, target = plan.pipeline, plan.target
    writes_silver, writes_gold = SILVER in plan.layers, GOLD in plan.layers
    silver_tables = tuple(pipeline.table_of(s, SILVER) for s in pipeline.sources) if writes_silver else ()
    gold_tables = tuple(f"gold/{g.name}" for g in pipeline.gold) if writes_gold else ()
    ensure_tables(spark, target, (*silver_tables, *gold_tables))
    meta = commit_metadata(
        run_id=plan.run_id,
        mode=plan.mode,
        interval=plan.interval,
        source=plan.source_label,
        entities=plan.entities,
    )
    tables: dict[str, TableOutcome] = {}
    fed: dict[str, DataFrame] = {}  # each source's silver rows as the source yields them (sandbox gold reads these)
    clock = f"{plan.mode} {pipeline.name} {plan.run_id}"
    try:
        with phase_clock.batch(clock, 0):
            closed, ledger_entries, ledger_version = _rebuild_tables(spark, plan, meta, tables, fed)
    finally:
        for frame in fed.values():
            frame.unpersist()
    phases = phase_clock.take(clock, 0) or {}
    log.info("%s: %s", clock, phase_clock.described(phases))
    return _result(plan, tables, closed, ledger_entries, ledger_version, began, phases)


def _rebuild_tables(
    spark: SparkSession,
    plan: Rebuild,
    meta: dict[str, str],
    tables: dict[str, TableOutcome],
    fed: dict[str, DataFrame],
) -> tuple[dt.datetime | None, int, int | None]:
    """The work of :func:`rebuild`, each table a phase: fills ``tables`` and ``fed``; (closed before,
    ledger entries, ledger version)."""
    pipeline, target = plan.pipeline, plan.target
    closed = None
    if SILVER in plan.layers:
        for source in pipeline.sources:
            name = pipeline.table_of(source, SILVER)
            with phase_clock.phase(name):
                tables[name], fed[source.name] = _rebuild_silver(spark, plan, source, meta)
    if GOLD not in plan.layers:
        return closed, 0, None
    # What Spark's watermarks would follow: the latest event time the target or the source has seen.
    with phase_clock.phase("event time highs"):
        highs = sources.silver_highs(spark, target)
        for source_name, frame in fed.items():
            seen = (highs[source_name], sources.max_of(frame, pipeline.source(source_name).event_time))
            highs[source_name] = max((h for h in seen if h is not None), default=None)
    ledger = Ledger(target.ledger_uri(), lock=target.ledger_lock())
    at = dt.datetime.now(dt.UTC)
    ledger_entries, ledger_version = 0, None
    for gold in pipeline.gold:
        inputs = pipeline.inputs(gold)
        gold_closed, high = gold_closed_before(inputs, highs)
        closed = min((c for c in (closed, gold_closed) if c is not None), default=None)
        with phase_clock.phase(f"gold/{gold.name}"):
            outcome, version = _rebuild_gold(spark, plan, gold, fed, gold_closed, high, ledger, meta, at)
        tables[f"gold/{gold.name}"] = outcome
        ledger_entries += outcome.ledger_entries
        ledger_version = version if version is not None else ledger_version
    return closed, ledger_entries, ledger_version


def _rebuild_silver(
    spark: SparkSession, plan: Rebuild, source: Source, meta: dict[str, str]
) -> tuple[TableOutcome, DataFrame]:
    """Replace ``source``'s silver rows of the interval; (outcome, the source's silver rows, persisted)."""
    pipeline, target = plan.pipeline, plan.target
    name = pipeline.table_of(source, SILVER)
    selection = Selection(source.event_time, plan.interval, plan.entity_column, plan.entities)
    # The silver lock is held from before the source is read until the replace commits: a stream
    # micro-batch that committed silver in between would hold rows of a bronze batch we did not
    # read, and our replace of the interval would silently drop them. Holding it, the stream's
    # silver MERGE waits and then inserts into our result (its insert-only MERGE adds only events
    # we did not write), so no event is lost either way.
    with target.lock(name).hold(plan.purpose):
        held = _held_in_silver(spark, plan, source)
        rows = _source_silver(spark, plan, source, held).persist(StorageLevel.MEMORY_AND_DISK)
        fresh = rows.where(selection.column())
        if held is not None:  # a key silver holds with an event time outside the interval stays there
            outside = held.where(~Selection(source.event_time, plan.interval).column())
            fresh = fresh.join(outside.select(source.key), on=source.key, how="left_anti")
        with phase_clock.phase("rows to driver"):  # bronze read, parse, de-duplication (in to_arrow's count)
            arrow = to_arrow(fresh)
        with phase_clock.phase("sort"):  # file layout by date and time: in Arrow, no Spark range shuffle
            order = (source.partition_column, source.event_time, source.key)
            arrow = arrow.sort_by([(column, "ascending") for column in order])
        with phase_clock.phase("replace"):
            result = target.table(name).replace_where(arrow, selection.sql(), metadata=meta)
    return TableOutcome.of(result), rows


def _result(
    plan: Rebuild,
    tables: dict[str, TableOutcome],
    closed: dt.datetime | None,
    ledger_entries: int,
    ledger_version: int | None,
    began: float,
    phases: dict[str, float] | None = None,
) -> BatchResult:
    return BatchResult(
        mode=plan.mode,
        pipeline=plan.pipeline.name,
        run_id=plan.run_id,
        namespace=plan.target.namespace,
        interval=plan.interval,
        source=plan.source_label,
        entities=plan.entities,
        closed_before=None if closed is None else iso(closed),
        tables=tables,
        ledger_entries=ledger_entries,
        ledger_version=ledger_version,
        seconds=round(time.monotonic() - began, 3),
        phases_ms=phases or {},
    )


def _source_silver(spark: SparkSession, plan: Rebuild, source: Source, held: DataFrame | None) -> DataFrame:
    """Every silver row of ``source`` from ``start - clock skew - the widest gold feed margin`` on (not
    yet cut to the interval): a sandbox feeds its gold from these rows, and a session starting in the
    interval is only told apart from one that started earlier by the events before it. A source some
    gold table reads whole (its ``history``: a changelog) is read from its first record."""
    pipeline = plan.pipeline
    margin = max((g.feed_margins()[0] for g in pipeline.gold), default=dt.timedelta(0))
    since: dt.datetime | None = plan.interval.start - parse_duration(source.clock_skew_tolerance) - margin
    if any(source.name in g.history for g in pipeline.gold):
        since = None
    if plan.source == KAFKA:
        bronze = sources.kafka_since(spark, plan.source_layout.settings, source, since)
    else:
        bronze = sources.bronze_since(spark, plan.source_layout.source_table(source, "bronze"), since)
    return source.silver_from_bronze(bronze, kept=held)


def _held_in_silver(spark: SparkSession, plan: Rebuild, source: Source) -> DataFrame | None:
    """Key, Kafka lineage and event time of every row ``source``'s silver holds (of the source's namespace).

    Silver keeps one row per key, the first copy the stream processed (:mod:`tidewater.dedup`); a
    later copy with another event time is a conflict, not a second row. A rebuild keeps those
    choices: the copy silver holds wins (:func:`tidewater.transforms.first_per_key`), and a key silver
    holds outside the interval is not re-added from a copy inside it.
    """
    silver = plan.source_layout.source_table(source, SILVER)
    if not silver.exists():
        return None
    columns = (source.key, "kafka_topic", "kafka_partition", "kafka_offset", source.event_time)
    return read_table(spark, silver.uri).select(*columns)


def _rebuild_gold(
    spark: SparkSession,
    plan: Rebuild,
    gold: GoldTable,
    fed: dict[str, DataFrame],
    closed: dt.datetime | None,
    high: dt.datetime | None,
    ledger: Ledger,
    meta: dict[str, str],
    at: dt.datetime,
) -> tuple[TableOutcome, int | None]:
    """Replace the rows starting in the interval; record changes of final rows first."""
    pipeline, target = plan.pipeline, plan.target
    name = f"gold/{gold.name}"
    table = target.table(name)
    windows = Selection(gold.span[0], plan.interval, plan.entity_column, plan.entities)
    inputs = pipeline.inputs(gold)
    read = sources.input_reader(
        spark, target, gold, entity_column=plan.entity_column, entities=plan.entities, closed=closed
    )
    if plan.sandbox:  # the sandbox's silver holds only the interval: feed gold from the source itself

        def read(feed: Interval) -> tuple[DataFrame, ...]:
            assert all(s.name in fed for s in inputs), "a sandbox rebuild writes silver and gold together"
            selections = {s.name: Selection(s.event_time, feed, plan.entity_column, plan.entities) for s in inputs}
            return tuple(
                sources.history_until(fed[s.name].where(selections[s.name].entity_filter()), s, closed)
                if s.name in gold.history
                else fed[s.name].where(selections[s.name].column())
                for s in inputs
            )

    # Held from the silver read until the commit, so no stream commit to this gold table falls between
    # the rows we compare against and the rows we replace.
    with target.lock(name).hold(plan.purpose):
        rows, events = interval_gold(gold, read, windows, closed, high=high)
        with phase_clock.phase("rows to driver"):  # silver read and the windows' aggregation
            new = to_arrow(rows)
        with phase_clock.phase("reconcile"):
            old = sources.gold_for(table, windows)
            reconciled = reconcile_recompute(old, new, gold.keys, span=gold.span)
        entries = []
        version = None
        if reconciled.changes:
            late = late_events_of(spark, pipeline, gold, events, reconciled.changes)
            entries = entries_for(name, reconciled.changes, late, run_id=plan.run_id, mode=plan.mode, at=at)
            recorded = ledger.record(spark, entries, metadata=meta)
            version = None if recorded is None else recorded.version
        with phase_clock.phase("replace"):
            result = table.replace_where(reconciled.rows, windows.sql(), metadata=meta)
    return TableOutcome.of(result, ledger_entries=len(entries)), version
