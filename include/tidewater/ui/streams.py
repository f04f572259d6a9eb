"""What the streams page shows: each pipeline's stream, its queries' last batch, its history as plots.

Everything comes from files the platform already writes, read-only: the supervisor's view of a stream
(:meth:`StreamControl.health`: state from the checkpoint leases and heartbeats, the driver's last
error, the crash-loop verdict) and its ``events.jsonl`` (starts, deaths, stalls, stops, with reasons),
and the progress listener's ``progress.jsonl`` (one record per micro-batch per query:
:mod:`tidewater.streaming.progress`), whose tail is turned into the plots' series. Audit pass rates
come from the audit tables (:func:`tidewater.ui.data.audit_pass_rate`). Nothing here starts or stops
anything: the page's buttons trigger the control DAG (see :mod:`tidewater.ui.app`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.orchestration.supervisor import StreamControl
from tidewater.pipelines import all_pipelines
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.progress import read_json_lines_tail, read_progress, retained_share
from tidewater.times import parse_time
from tidewater.ui import charts
from tidewater.ui.data import audit_pass_rate

Series = dict[str, list[charts.Point]]
# How much of progress.jsonl a page reads: ~4 MB an hour of plots (about an hour of one-second batches
# of a pipeline's queries), at most 32 MB; a longer window of a busy stream shows its latest part.
HISTORY_BYTES_PER_HOUR = 4 * 2**20
HISTORY_MAX_BYTES = 32 * 2**20
EVENTS_SHOWN = 12
# Supervisor events that explain why a stream started or ended.
LIFECYCLE_EVENTS = ("start", "died", "stalled", "stop", "failed", "resume", "desired", "restart")


@dataclass
class StreamView:
    pipeline: str
    namespace: str
    health: dict[str, Any]
    queries: list[dict[str, Any]]
    events: list[dict[str, Any]]
    restarts: int  # deaths and stalls in the shown events: what made the supervisor relaunch it
    plots: list[tuple[str, str, str, Series]] = field(default_factory=list)  # (key, title, unit, series)

    @property
    def has_history(self) -> bool:
        """Whether any plot has a point (a stream that never ran in the window gets a line, not empty plots)."""
        return any(points for _, _, _, series in self.plots for points in series.values())

    def charts(self) -> list[str]:
        """The plots as SVG (:func:`charts.line_chart`)."""
        return [
            charts.line_chart(title, series, unit=unit, chart_id=f"chart-{self.pipeline}-{key}")
            for key, title, unit, series in self.plots
        ]

    def to_dict(self) -> dict[str, Any]:
        """The JSON API's form: the plots as their series of [unix seconds, value]."""
        return {
            "pipeline": self.pipeline,
            "namespace": self.namespace,
            "health": self.health,
            "queries": self.queries,
            "events": self.events,
            "restarts": self.restarts,
            "plots": {
                key: {"title": title, "unit": unit, "series": {n: [list(p) for p in pts] for n, pts in series.items()}}
                for key, title, unit, series in self.plots
            },
        }


def stream_views(
    settings: Settings, namespace: str | None = None, *, hours: float = 1.0, audits: Sequence[Mapping[str, Any]] = ()
) -> list[StreamView]:
    """Every pipeline's stream in ``namespace``, with plots of its last ``hours``."""
    since = dt.datetime.now(dt.UTC).timestamp() - hours * 3600
    views = []
    for name, pipeline in sorted(all_pipelines(settings).items()):
        control = StreamControl(settings, name, namespace)
        health = control.health().to_dict()
        progress_dir = PipelineLayout.of(settings, pipeline, namespace).progress_dir()
        tail = min(HISTORY_MAX_BYTES, int(HISTORY_BYTES_PER_HOUR * max(hours, 1.0)))
        history = progress_history(progress_dir / "progress.jsonl", since=since, tail_bytes=tail)
        last = {q: read_progress(progress_dir / f"{q}.json") or {} for q in control.queries}
        queries = [{"query": q, **record, "partitions": partition_lag(record)} for q, record in last.items() if record]
        events = [e for e in control.events() if e.get("event") in LIFECYCLE_EVENTS][-EVENTS_SHOWN:]
        restarts = sum(1 for e in events if e.get("event") in ("died", "stalled"))
        of_pipeline = [a for a in audits if a.get("pipeline") == name]
        plots = chart_series(history, of_pipeline)
        views.append(StreamView(name, control.layout.namespace, health, queries, events[::-1], restarts, plots))
    return views


# Unread share of what the broker retains from which a partition is shown at risk: the oldest records
# it holds are next to be deleted, and a stream this far behind reads them last.
AT_RISK_SHARE = 0.8


def partition_lag(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per partition of a query's sources: records behind the broker's end, records the broker retains,
    the unread share of those and a verdict (``ok``, ``at risk`` of retention deleting unread records,
    ``lost``: records were deleted unread). Retention is unknown until the driver's first look."""
    retained = record.get("retained") or {}
    rows = []
    for part, behind in (record.get("lag") or {}).items():
        held = retained.get(part)
        share = None if held is None else retained_share(int(behind), int(held))
        verdict = "" if share is None else "lost" if share > 1 else "at risk" if share >= AT_RISK_SHARE else "ok"
        percent = "" if share is None else "all" if share == float("inf") else f"{share:.0%}"
        rows.append(
            {"partition": part, "behind": int(behind), "retained": held, "percent": percent, "verdict": verdict}
        )
    return rows


def progress_history(path: Path, *, since: float, tail_bytes: int = HISTORY_BYTES_PER_HOUR) -> list[dict[str, Any]]:
    """The records of ``progress.jsonl`` (its last ``tail_bytes``) for batches that started at or after ``since``."""
    records = read_json_lines_tail(path, tail_bytes)
    return [r for r in records if (when := batch_unix(r)) is not None and when >= since]


def batch_unix(record: Mapping[str, Any]) -> float | None:
    """When a progress record's batch started (unix seconds): Spark's timestamp, else the heartbeat."""
    stamp = record.get("batch_time")
    if isinstance(stamp, str):
        try:
            return parse_time(stamp, "batch_time").timestamp()
        except ConfigError:
            pass
    beat = record.get("heartbeat_unix")
    return float(beat) if isinstance(beat, int | float) else None


def _query(record: Mapping[str, Any]) -> str:
    return str(record.get("name") or "").rsplit(".", 1)[-1]


def _kafka_lag(record: Mapping[str, Any]) -> int | None:
    """Records behind the broker's end, summed over partitions (a Kafka source's lag keys are topic/partition;
    a Delta source's is its version count, not records, and is left out)."""
    lag = record.get("lag") or {}
    parts = [int(v) for k, v in lag.items() if "/" in str(k)]
    return sum(parts) if parts else None


def chart_series(
    history: Iterable[Mapping[str, Any]], audits: Sequence[Mapping[str, Any]] = ()
) -> list[tuple[str, str, str, Series]]:
    """(key, title, unit, series) of each plot, from progress records (and audit rows for the pass rate)."""
    rates: Series = {}
    lag: Series = {}
    duration: Series = {}
    per_minute: dict[str, dict[float, float]] = {}
    late: Series = {}
    state: Series = {}
    for record in history:
        when, query = batch_unix(record), _query(record)
        if when is None or not query:
            continue
        if query.startswith("bronze"):
            rates.setdefault(f"{query} input", []).append((when, float(record.get("input_rows_per_second") or 0)))
            rates.setdefault(f"{query} processed", []).append(
                (when, float(record.get("processed_rows_per_second") or 0))
            )
        behind = _kafka_lag(record)
        if behind is not None:
            lag.setdefault(query, []).append((when, float(behind)))
        if record.get("batch_duration_ms") is not None:
            duration.setdefault(query, []).append((when, float(record["batch_duration_ms"]) / 1000))
        minute = when - when % 60
        buckets = per_minute.setdefault(query, {})
        buckets[minute] = buckets.get(minute, 0.0) + float(record.get("num_input_rows") or 0)
        if query.startswith("gold_"):
            dropped = float(record.get("rows_dropped_by_watermark") or 0) + float(
                record.get("rows_held_ahead_of_clock") or 0
            )
            late.setdefault(query, []).append((when, dropped))
        if record.get("state_rows"):
            state.setdefault(query, []).append((when, float(record["state_rows"])))
    rows = {query: sorted(buckets.items()) for query, buckets in per_minute.items()}
    return [
        ("rates", "Input vs processing rate", "rows/s", rates),
        ("lag", "Kafka lag (records behind the broker's end)", "records", lag),
        ("duration", "Batch duration", "s", duration),
        ("rows", "Rows per minute, by query", "rows", rows),
        ("late", "Late rows (behind the watermark or ahead of the clock)", "rows", late),
        ("state", "State rows", "rows", state),
        ("audits", "Audit pass rate, per hour", "%", audit_pass_rate(audits)),
    ]
