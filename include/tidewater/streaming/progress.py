"""Heartbeat and progress of running queries, written where supervisors and people can read them.

A StreamingQueryListener writes, per query, ``<state>/progress/<namespace>/<pipeline>/<query>.json``
(atomically replaced after every batch: last batch time, input and processing rates, rows, lag
per Kafka partition, state rows, rows dropped behind the watermark and their running total, and where
the batch's time went: Spark's ``durationMs`` and the writer's phases, :mod:`tidewater.phase_clock`; how
many classes Spark's code generator has compiled in the JVM so far) and appends the same record to
``progress.jsonl`` beside it. Late events are counted, never silently
lost: they stay in silver, and the counters say that a gold query could not use some. (Spark
counts those drops at the state store, after partial aggregation, so for an aggregate the figure
is in partial-aggregate rows, at most the number of events; recomputing the window from silver
gives the exact difference.)
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener

from tidewater import phase_clock
from tidewater.json_files import write_json
from tidewater.streaming.retention import RetentionWatch

log = logging.getLogger(__name__)


def summarize(
    progress: dict[str, Any],
    late_total: int,
    held_total: int = 0,
    phases: dict[str, float] | None = None,
    retained: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The fields a supervisor needs, from Spark's progress JSON (and the writer's ``phases`` of the batch,
    and the first offset the broker retains of each partition, :mod:`tidewater.streaming.retention`)."""
    lag: dict[str, int] = {}
    holds: dict[str, int] = {}
    for source in progress.get("sources", []):
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for key, value in latest.items():
            if key in end:
                lag[key] = max(0, value - end[key])
                if retained and key in retained:
                    holds[key] = max(0, value - int(retained[key]))
    state = progress.get("stateOperators", [])
    dropped = sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in state)
    # Events held out of a gold query for running ahead of the clock (tidewater.transforms.watermark_safe).
    # A query over several sources observes one metric per input (held_ahead_of_clock_<source>).
    observed = progress.get("observedMetrics") or {}
    held = sum(int((v or {}).get("rows") or 0) for k, v in observed.items() if k.startswith("held_ahead_of_clock"))
    return {
        "name": progress.get("name"),
        "id": progress.get("id"),
        "run_id": progress.get("runId"),
        "batch_id": progress.get("batchId"),
        "batch_time": progress.get("timestamp"),
        "heartbeat_unix": time.time(),
        "pid": os.getpid(),
        "num_input_rows": progress.get("numInputRows", 0),
        "input_rows_per_second": progress.get("inputRowsPerSecond", 0.0),
        "processed_rows_per_second": progress.get("processedRowsPerSecond", 0.0),
        "batch_duration_ms": progress.get("durationMs", {}).get("triggerExecution"),
        "watermark": progress.get("eventTime", {}).get("watermark"),
        "state_rows": sum(int(op.get("numRowsTotal", 0)) for op in state),
        # State size: in memory, and on disk for RocksDB (its SST files, what a checkpoint uploads).
        "state_memory_bytes": sum(int(op.get("memoryUsedBytes", 0)) for op in state),
        "state_files_bytes": sum(
            int((op.get("customMetrics") or {}).get("rocksdbTotalSSTFilesSize", 0)) for op in state
        ),
        "state_commit_ms": sum(int(op.get("commitTimeMs", 0)) for op in state),
        "rows_dropped_by_watermark": dropped,
        "rows_dropped_by_watermark_total": late_total + dropped,
        "rows_held_ahead_of_clock": held,
        "rows_held_ahead_of_clock_total": held_total + held,
        "lag": lag,
        # Per Kafka partition: the records the broker still holds (its end minus the first offset it
        # retains, a minute old at most); lag against it is retained_share. Empty before the first look.
        "retained": holds,
        # Where the trigger's time went: Spark's parts of it, and the writer's phases inside addBatch.
        "duration_ms": progress.get("durationMs") or {},
        "phases_ms": phases or {},
    }


def _offsets(value: Any) -> dict[str, int]:
    """Flatten Kafka offsets {topic: {partition: n}} or Delta {"version": v} into {key: int}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    flat: dict[str, int] = {}
    for key, inner in value.items():
        if isinstance(inner, dict):
            for part, offset in inner.items():
                if isinstance(offset, int):
                    flat[f"{key}/{part}"] = offset
        elif isinstance(inner, int):
            flat[key] = inner
    return flat


# (SparkContext, the JVM's histogram of code-generation compiles): looked up once (see codegen_compiles).
_compile_histogram: tuple[Any, Any] | None = None


def codegen_compiles() -> int | None:
    """How many classes Spark's code generator has compiled in this driver's JVM so far, every query's
    (None without a running SparkContext). A plan that changes every micro-batch (a literal Spark
    writes into the code, such as a ``current_timestamp()``) compiles on every trigger: the count
    grows with the triggers instead of levelling off once the queries have run a few.

    The histogram is looked up once per context: py4j resolves ``jvm.org.apache...`` one package at a
    time, each a class lookup that misses and so reads every jar of the classpath. Done on every
    progress event (a JFR recording of ads at 300 events/s: the listener thread used ~17% of a core,
    88% of its samples in those lookups)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return None
    global _compile_histogram
    try:
        if _compile_histogram is None or _compile_histogram[0] is not context:
            metrics = context._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
            _compile_histogram = (context, metrics.METRIC_COMPILATION_TIME())
        return int(_compile_histogram[1].getCount())
    except Exception as exc:  # a diagnostic: never fails a batch's progress record
        log.debug("codegen metrics unavailable: %s", exc)
        return None


def retained_share(lag: int, retained: int) -> float | None:
    """The unread share of what the broker retains of a partition: 0 caught up, 1 the oldest record it
    holds is unread (the next deletion loses records); above 1, records were deleted unread. None when
    the partition holds nothing and nothing is unread."""
    if retained <= 0:
        return None if lag <= 0 else float("inf")
    return lag / retained


class ProgressFromJson(JStreamingQueryListener):
    """The JVM's side of a listener that gets each progress event from the progress's JSON: two py4j
    calls per event.

    PySpark's own (``QueryProgressEvent.fromJObject``) reads the progress field by field over py4j,
    each Java map through an iterator that ends in a ``NoSuchElementException``. PySpark converts each
    such exception with ~80 more py4j calls, among them 14 ``isInstanceOf`` checks that each resolve
    py4j's ``TypeUtil`` a package at a time: class lookups that miss and read every jar. A stateful
    query's event took ~590 py4j calls, and a JFR recording of ads' job at 300 events/s had 16% of the
    JVM's samples in those lookups. The listener is handed the parsed JSON (``on_progress_json``), not
    PySpark's progress object built from it, which the recorder turned back into JSON to read."""

    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.on_progress_json(json.loads(jevent.progress().json()))


class ProgressFromJsonListener(StreamingQueryListener):
    """A listener whose events reach it through :class:`ProgressFromJson`: ``on_progress_json``."""

    _jvm_side: Any = None

    @property
    def _jlistener(self) -> Any:
        """What ``spark.streams.addListener`` registers in the JVM: :class:`ProgressFromJson`, not
        PySpark's wrapper (~590 py4j calls per progress event)."""
        if self._jvm_side is None:
            from pyspark import SparkContext

            jvm = SparkContext._jvm
            assert jvm is not None, "the listener is registered on a running SparkContext"
            self._jvm_side = jvm.PythonStreamingQueryListenerWrapper(ProgressFromJson(self))
        return self._jvm_side

    def onQueryProgress(self, event: Any) -> None:
        self.on_progress_json(json.loads(event.progress.json))

    def on_progress_json(self, progress: dict[str, Any]) -> None:
        raise NotImplementedError


class ProgressRecorder(ProgressFromJsonListener):
    def __init__(self, directory: Path, retention: RetentionWatch | None = None, *, prefix: str = "") -> None:
        """``prefix``: the start of the names of the queries this recorder follows (a session may run
        several pipelines' queries, each pipeline with a recorder of its own; see tidewater.streaming.host)."""
        self.directory = directory
        self.prefix = prefix
        self.retention = retention
        self.directory.mkdir(parents=True, exist_ok=True)
        self._late_totals: dict[str, int] = {}
        self._held_totals: dict[str, int] = {}
        self._names: dict[str, str] = {}

    def path_for(self, name: str) -> Path:
        return self.directory / f"{name.rsplit('.', 1)[-1]}.json"

    def onQueryStarted(self, event: Any) -> None:
        if event.name and event.name.startswith(self.prefix):
            self._names[str(event.id)] = event.name
            previous = read_progress(self.path_for(event.name))
            self._late_totals[event.name] = int((previous or {}).get("rows_dropped_by_watermark_total", 0))
            self._held_totals[event.name] = int((previous or {}).get("rows_held_ahead_of_clock_total", 0))

    def on_progress_json(self, progress: dict[str, Any]) -> None:
        """Record one micro-batch's progress (Spark's JSON, parsed) of a query this recorder follows."""
        name = progress.get("name")
        if not name or not name.startswith(self.prefix):
            return
        phases = phase_clock.take(name, int(progress.get("batchId", -1)))
        retained = self.retention.snapshot()[0] if self.retention else None
        record = summarize(progress, self._late_totals.get(name, 0), self._held_totals.get(name, 0), phases, retained)
        record["codegen_compiles_total"] = codegen_compiles()
        self._late_totals[name] = record["rows_dropped_by_watermark_total"]
        self._held_totals[name] = record["rows_held_ahead_of_clock_total"]
        if record["rows_held_ahead_of_clock"]:
            log.warning(
                "%s: %d events ahead of the clock held out of the stream (kept in silver; the batch recompute "
                "and the late-data correction count them)",
                name,
                record["rows_held_ahead_of_clock"],
            )
        if record["rows_dropped_by_watermark"]:
            log.warning(
                "%s: %d rows arrived behind the watermark (kept in silver; the late-data correction recomputes "
                "their windows)",
                name,
                record["rows_dropped_by_watermark"],
            )
        write_json(self.path_for(name), record)
        with open(self.directory / "progress.jsonl", "a") as history:
            history.write(json.dumps(record) + "\n")

    def onQueryIdle(self, event: Any) -> None:
        """An idle query is alive: refresh its heartbeat (the progress file's mtime)."""
        name = self._names.get(str(event.id))
        if name and self.path_for(name).exists():
            os.utime(self.path_for(name))

    def onQueryTerminated(self, event: Any) -> None:
        name = self._names.get(str(event.id))
        if name and event.exception:
            log.error("query %s failed: %s", name, str(event.exception).splitlines()[0])


class ProgressRouter(ProgressFromJsonListener):
    """A session's one listener for every pipeline it runs (the stream host runs several): each event
    crosses py4j and is parsed once, then goes to the recorder whose prefix starts its query's name.
    A listener per pipeline had every pipeline's event cross and be parsed by each of them."""

    def __init__(self) -> None:
        self._recorders: tuple[ProgressRecorder, ...] = ()  # replaced whole: the listener thread reads it
        self._by_id: dict[str, ProgressRecorder] = {}

    def add(self, recorder: ProgressRecorder) -> None:
        self._recorders = (*self._recorders, recorder)

    def remove(self, recorder: ProgressRecorder) -> bool:
        """Stop routing to ``recorder``; whether no recorder is left."""
        self._recorders = tuple(r for r in self._recorders if r is not recorder)
        return not self._recorders

    def _route(self, name: str | None) -> ProgressRecorder | None:
        if not name:
            return None
        return next((r for r in self._recorders if name.startswith(r.prefix)), None)

    def onQueryStarted(self, event: Any) -> None:
        recorder = self._route(event.name)
        if recorder is not None:
            self._by_id[str(event.id)] = recorder
            recorder.onQueryStarted(event)

    def on_progress_json(self, progress: dict[str, Any]) -> None:
        recorder = self._route(progress.get("name"))
        if recorder is not None:
            recorder.on_progress_json(progress)

    def onQueryIdle(self, event: Any) -> None:
        recorder = self._by_id.get(str(event.id))
        if recorder is not None:
            recorder.onQueryIdle(event)

    def onQueryTerminated(self, event: Any) -> None:
        recorder = self._by_id.pop(str(event.id), None)
        if recorder is not None:
            recorder.onQueryTerminated(event)


_routers: weakref.WeakKeyDictionary[SparkSession, ProgressRouter] = weakref.WeakKeyDictionary()
_routers_lock = threading.Lock()


def follow_progress(spark: SparkSession, recorder: ProgressRecorder) -> None:
    """Record the progress of ``recorder``'s queries in ``spark``, through the session's one router
    (registered with the session by the first recorder)."""
    with _routers_lock:
        router = _routers.get(spark)
        if router is None:
            router = _routers[spark] = ProgressRouter()
            spark.streams.addListener(router)
        router.add(recorder)


def unfollow_progress(spark: SparkSession, recorder: ProgressRecorder) -> None:
    """Stop recording ``recorder``'s queries; the router leaves the session with its last recorder."""
    with _routers_lock:
        router = _routers.get(spark)
        if router is not None and router.remove(recorder):
            del _routers[spark]
            spark.streams.removeListener(router)


def read_progress(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_json_lines_tail(path: Path, max_bytes: int) -> list[dict[str, Any]]:
    """The JSON objects of the last ``max_bytes`` of a JSON-lines file, oldest first (a history that only
    grows: ``progress.jsonl``, the supervisor's ``events.jsonl``). A torn or cut line is skipped; a
    missing file is empty."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - max_bytes))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    if size > max_bytes:
        lines = lines[1:]  # probably cut in the middle
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
