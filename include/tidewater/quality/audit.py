"""One audit run: validate an interval's layers, reconcile its records, record and publish the results.

Called by ``tidewater audit run`` (spark_jobs/audit.py) from the DAGs after each scheduled
interval, backfill, replay and correction. Every suite's result becomes a row of the pipeline's
audit table (:mod:`tidewater.quality.audit_log`), all sharing the run's ``audit_id`` and its Data
Docs report; the run then fails (:class:`AuditFailedError`) if any suite failed, naming the failed
expectations, so the Airflow task turns red with the reason in its log.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tidewater import phase_clock
from tidewater.batch.interval import Interval
from tidewater.config import Settings
from tidewater.errors import ConfigError, TidewaterError
from tidewater.lake.tables import LakeTable
from tidewater.pipelines.base import Pipeline, Source
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality import frames as fr
from tidewater.quality import reports, suites
from tidewater.quality.audit_log import AUDIT_SCHEMA, AuditRow, to_arrow
from tidewater.quality.parity import check_parity
from tidewater.quality.reconcile import Reconciliation, reconcile
from tidewater.quality.validate import SuiteOutcome, SuiteRunner
from tidewater.times import iso

log = logging.getLogger(__name__)

GOLD = "gold"
PARITY = "parity"  # each gold table's closed rows of the interval == the batch recompute (quality.parity)
CHECKS = (suites.BRONZE, suites.RECORDS, suites.SILVER, suites.RECONCILIATION, GOLD, PARITY)
TRIGGERS = ("scheduled", "backfill", "replay", "correction", "manual")


class AuditFailedError(TidewaterError):
    """A suite or reconciliation of the audited interval failed (details in the audit table and report)."""


@dataclass(frozen=True, kw_only=True)
class AuditRequest:
    pipeline: Pipeline
    interval: Interval
    checks: tuple[str, ...] = CHECKS
    namespace: str | None = None
    trigger: str = "manual"
    dag_id: str = ""
    dag_run_id: str = ""
    task_id: str = ""

    def __post_init__(self) -> None:
        unknown = [c for c in self.checks if c not in CHECKS]
        if unknown or not self.checks:
            raise ConfigError(f"audit checks {unknown or '(none)'} are not among {', '.join(CHECKS)}")
        if self.trigger not in TRIGGERS:
            raise ConfigError(f"audit trigger {self.trigger!r} is not one of {', '.join(TRIGGERS)}")

    @property
    def needs_bronze(self) -> bool:
        return bool({suites.BRONZE, suites.RECORDS, suites.RECONCILIATION} & set(self.checks))


@dataclass(frozen=True)
class AuditResult:
    audit_id: str
    pipeline: str
    namespace: str
    interval: Interval
    rows: list[AuditRow]
    report_path: str
    report_uri: str
    seconds: float
    # Where those seconds went, per phase (tidewater.phase_clock): ``records``, ``reconciliation/silver``, ...
    phases_ms: dict[str, float] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.rows)

    @property
    def blocking_failures(self) -> list[AuditRow]:
        return [r for r in self.rows if not r.success and r.blocking]

    def to_dict(self) -> dict[str, Any]:
        return {
            "audit_id": self.audit_id,
            "pipeline": self.pipeline,
            "namespace": self.namespace,
            "interval": [iso(self.interval.start), iso(self.interval.end)],
            "success": self.success,
            "blocking_failed": [r.suite for r in self.blocking_failures],
            "suites": {
                r.suite: {"success": r.success, "rows": r.rows, "failures": list(r.failures)} for r in self.rows
            },
            "report": self.report_uri,
            "seconds": self.seconds,
            "phases_ms": self.phases_ms,
        }

    def summary(self) -> str:
        failed = [r for r in self.rows if not r.success]
        where = f"{self.pipeline} [{iso(self.interval.start)}, {iso(self.interval.end)})"
        if not failed:
            return f"audit of {where}: {len(self.rows)} suites passed; report {self.report_uri}"
        parts = "; ".join(f"{r.suite} failed: {' | '.join(r.failures[:3])}" for r in failed)
        held = " (blocks gold)" if self.blocking_failures else ""
        return f"audit of {where}{held}: {parts}; report {self.report_uri}"


def run_audit(spark: SparkSession, settings: Settings, request: AuditRequest) -> AuditResult:
    """Validate, reconcile and compare the interval (see the module docstring), each suite a phase."""
    clock = f"audit {request.pipeline.name} {request.dag_run_id or 'manual'}"
    began = time.monotonic()
    with phase_clock.batch(clock, 0):
        result = _run_audit(spark, settings, request)
    phases = phase_clock.take(clock, 0) or {}
    result = dataclasses.replace(result, seconds=round(time.monotonic() - began, 3), phases_ms=phases)
    log.info("%s", result.summary())
    log.info("%s: %s", clock, phase_clock.described(phases))
    return result


def _run_audit(spark: SparkSession, settings: Settings, request: AuditRequest) -> AuditResult:
    pipeline = request.pipeline
    layout = PipelineLayout.of(settings, pipeline, request.namespace)
    if request.needs_bronze:
        for source in pipeline.sources:
            bronze = pipeline.table_of(source, suites.BRONZE)
            if not layout.table(bronze).exists():
                raise ConfigError(f"nothing to audit: no bronze table at {layout.table_uri(bronze)} yet")
    now = dt.datetime.now(dt.UTC)
    audit_id = reports.report_id(
        request.dag_id or "manual", request.task_id, request.dag_run_id, now.strftime("%Y%m%dT%H%M%S%fZ")
    )
    wanted = set(request.checks)
    frames = fr.read_interval(
        spark,
        layout,
        request.interval,
        bronze=request.needs_bronze,
        silver=suites.SILVER in wanted,
        gold=bool({GOLD, PARITY} & wanted),
    )
    outcomes: list[tuple[str, SuiteOutcome, bool]] = []  # (layer, outcome, blocks gold)
    reconciliations: list[tuple[Source, Reconciliation]] = []
    # Gold and parity failures block when any source's declaration lists them.
    blocking = {b for source in pipeline.sources for b in source.quality.blocking_suites}
    try:
        with tempfile.TemporaryDirectory(prefix="tidewater-docs-") as docs:
            with phase_clock.phase("great expectations context"):
                runner = SuiteRunner(Path(docs), run_name=request.dag_run_id or audit_id)
            for source in pipeline.sources:
                own = frames.sources[source.name]
                layer_frames = {suites.BRONZE: own.bronze, suites.RECORDS: own.records, suites.SILVER: own.silver}
                for base_layer, frame in layer_frames.items():
                    if base_layer not in wanted:
                        continue
                    layer = pipeline.table_of(source, base_layer)
                    params = _row_bounds(source, request.interval) if base_layer == suites.SILVER else {}
                    with phase_clock.phase(layer):
                        suite = suites.load_suite(pipeline, layer)
                        outcome = runner.validate(suite, frame, layer=layer, parameters=params)
                        outcome = _with_rows(outcome, frame.count())
                    outcomes.append((layer, outcome, base_layer in source.quality.blocking_suites))
                if suites.RECONCILIATION in wanted:
                    with phase_clock.phase(pipeline.table_of(source, suites.RECONCILIATION)):
                        reconciliations.append((source, reconcile(spark, layout, own, request.interval)))
            if GOLD in wanted:
                for name, frame in sorted(frames.gold.items()):
                    with phase_clock.phase(name):
                        outcome = runner.validate(suites.load_suite(pipeline, name), frame, layer=name)
                        outcomes.append((name, _with_rows(outcome, frame.count()), name in blocking))
            with phase_clock.phase(PARITY):
                parities = check_parity(spark, layout, request.interval, frames.gold) if PARITY in wanted else []
            summary = {o.suite: (o.success, o.failures) for _, o, _ in outcomes}
            for source, reconciliation in reconciliations:
                summary[reconciliation_suite(pipeline, source)] = (reconciliation.success, reconciliation.failures)
            for parity in parities:
                summary[parity_suite(pipeline, parity.table)] = (parity.success, parity.failures)
            title = f"{pipeline.name} audit of [{iso(request.interval.start)}, {iso(request.interval.end)})"
            with phase_clock.phase("report"):
                reports.write_index(Path(docs), f"{title} {request.dag_id} {request.dag_run_id}".strip(), summary)
                report_path = reports.publish(Path(docs), layout, audit_id)
    finally:
        frames.unpersist()
    base = {
        "audit_id": audit_id,
        "pipeline": pipeline.name,
        "namespace": layout.namespace,
        "interval_start": request.interval.start,
        "interval_end": request.interval.end,
        "trigger": request.trigger,
        "dag_id": request.dag_id,
        "dag_run_id": request.dag_run_id,
        "task_id": request.task_id,
        "report_path": report_path,
        "audited_at": now,
    }
    rows = [
        AuditRow(
            **base,
            suite=o.suite,
            table_name=layer,
            success=o.success,
            rows=o.rows,
            expectations=o.expectations,
            failed_expectations=len(o.failures),
            failures=o.failures,
            counts={"unexpected": o.unexpected},
            blocking=blocks,
        )
        for layer, o, blocks in outcomes
    ]
    rows += [
        AuditRow(
            **base,
            suite=reconciliation_suite(pipeline, source),
            table_name=pipeline.table_of(source, suites.BRONZE),
            success=reconciliation.success,
            rows=int(reconciliation.counts["bronze_rows"]),
            expectations=reconciliation.checks,
            failed_expectations=len(reconciliation.failures),
            failures=reconciliation.failures,
            counts=reconciliation.counts,
            blocking=suites.RECONCILIATION in source.quality.blocking_suites,
        )
        for source, reconciliation in reconciliations
    ]
    rows += [
        AuditRow(
            **base,
            suite=parity_suite(pipeline, parity.table),
            table_name=parity.table,
            success=parity.success,
            rows=parity.compared,
            expectations=1,
            failed_expectations=len(parity.failures),
            failures=parity.failures,
            counts=parity.counts,
            blocking=PARITY in blocking,
        )
        for parity in parities
    ]
    table = LakeTable(layout.audit_uri())
    with phase_clock.phase("audit table"), layout.audit_lock().hold(f"audit {audit_id}"):
        table.ensure(AUDIT_SCHEMA, description="tidewater data-quality and reconciliation audit results")
        table.append_arrow(
            to_arrow(rows), metadata={"tidewater.audit_id": audit_id, "tidewater.run_id": request.dag_run_id}
        )
    return AuditResult(
        audit_id=audit_id,
        pipeline=pipeline.name,
        namespace=layout.namespace,
        interval=request.interval,
        rows=rows,
        report_path=report_path,
        report_uri=f"{settings.lake_uri.rstrip('/')}/{report_path}",
        seconds=0.0,  # set by run_audit, around this
    )


def parity_suite(pipeline: Pipeline, table: str) -> str:
    """``rsvps.parity.gold.venue_response_counts``: the audit table's name of one table's parity check."""
    return suites.suite_name(pipeline, f"{PARITY}/{table}")


def reconciliation_suite(pipeline: Pipeline, source: Source) -> str:
    """``rsvps.reconciliation`` (one source) or ``ads.clicks.reconciliation``: one source's reconciliation."""
    return suites.suite_name(pipeline, pipeline.table_of(source, suites.RECONCILIATION))


def _row_bounds(source: Source, interval: Interval) -> dict[str, Any]:
    """Row-count bounds of the silver suite for this interval's length (declared per hour)."""
    hours = (interval.end - interval.start).total_seconds() / 3600
    low, high = source.quality.rows_per_hour
    params: dict[str, Any] = {}
    if low is not None:
        params[suites.MIN_ROWS] = math.floor(low * hours)
    if high is not None:
        params[suites.MAX_ROWS] = math.ceil(high * hours)
    return params


def _with_rows(outcome: SuiteOutcome, rows: int) -> SuiteOutcome:
    return SuiteOutcome(
        layer=outcome.layer,
        suite=outcome.suite,
        success=outcome.success,
        rows=rows,
        expectations=outcome.expectations,
        failures=outcome.failures,
        unexpected=outcome.unexpected,
    )
