"""Run a pipeline's streaming queries: Kafka -> bronze -> silver (+ quarantine) -> gold.

Bronze and silver are written by one query: each micro-batch of Kafka records is committed to
bronze, and silver (+ quarantine) is computed from those bronze rows in the same batch, which
saves a trigger cycle of latency and a second read of every record. With
``TIDEWATER_SILVER_QUERY=true`` silver is instead its own query polling the bronze table (fully
decoupled tiers). Gold queries always read silver's Delta stream. Every query has its own
checkpoint; silver is always computed from bronze rows, so a replay from bronze reproduces silver
and gold without Kafka. Two ways to run:

* :meth:`PipelineStreams.run_forever`: all queries at once on a processing-time trigger (the
  long-running job), until a stop is requested or a query fails (then all stop, and the error is
  raised; a query whose Python worker missed Spark's connect-back window is restarted alone). A stop
  is requested by SIGTERM/SIGINT (the ``stop`` event) on this host, or from any host by a stop request
  file beside the checkpoints that the monitoring loop polls every couple of seconds
  (:mod:`tidewater.streaming.stop_request`; one written before this driver's launch is stale and
  ignored). Both take the same path: the queries stop cleanly, and the caller releases the leases.
* :meth:`PipelineStreams.run_available_now`: tier by tier with Trigger.AvailableNow, each tier
  finishing before the next starts, so one run processes everything that was in Kafka at its
  start all the way to gold ("batch is a bounded stream").
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from tidewater import json_columns, transforms
from tidewater.config import Settings
from tidewater.connectors.kafka_client import kafka_python_config, topic_partitions
from tidewater.connectors.kafka_publish import BatchPublisher
from tidewater.connectors.kafka_source import source_options
from tidewater.errors import TidewaterError, one_line
from tidewater.generator.producer import ensure_topic
from tidewater.lake.compaction import StreamCompaction
from tidewater.lake.lock_options import lock_options
from tidewater.lake.tables import LakeTable, check_lake_root
from tidewater.pipelines.base import Delivery, GoldQuery, GoldTable, Pipeline, Source
from tidewater.pipelines.layout import PipelineLayout
from tidewater.spark import GOLD_POOL, SOURCES_POOL
from tidewater.streaming.checkpoint import Checkpoint, claim, state_layout_hint
from tidewater.streaming.progress import ProgressRecorder, follow_progress, unfollow_progress
from tidewater.streaming.retention import RetentionWatch
from tidewater.streaming.start_gate import STATUS_FILE, StartGate, gate_path
from tidewater.streaming.startup_workers import READ_PLANNING, STARTUP_WORKER_MODULES, ReadSources, StartupWorkers
from tidewater.streaming.stop_request import StopRequest, StopRequestWatch
from tidewater.streaming.writers import BronzeSilverWriter, GoldWriter, SharedGoldWriter, SilverWriter

log = logging.getLogger(__name__)

# Spark's error when a Python worker did not connect back within its fixed 10 s, and how often the job
# restarts one query for it before failing as a whole (the supervisor then restarts the job). Rare since
# workers connect back at interpreter start (tidewater.worker_start); kept for a worker it cannot help.
WORKER_TIMEOUT = "Python worker failed to connect back"
WORKER_RESTART = "restarting the query from its checkpoint"  # in the job's log, once per such restart
MAX_WORKER_RESTARTS = 5
AWAIT_SECONDS = 0.5  # how often an available-now run looks for start-up workers to give back


class StreamFailedError(TidewaterError):
    """A streaming query stopped with an error."""


@dataclass(frozen=True)
class Tier:
    query: str  # "bronze", "silver" or "gold_<name>" ("bronze_<source>" ... with several sources)
    source: str
    target: str
    feeds: str | None = None  # the pipeline source a bronze/silver tier is of (None: a gold tier)
    gold: GoldQuery | None = None  # what a gold tier writes (one table, or several sharing the query)


def gold_inputs(spark: SparkSession, layout: PipelineLayout, query: GoldQuery) -> dict[str, DataFrame]:
    """The silver stream of each input of the gold ``query``, by source name, as its tables' builds
    take them: appends only, and watermark-safe (an event ahead of the clock cannot make on-time events
    late). Each input is read once, whatever number of the query's tables it feeds, at most
    ``TIDEWATER_GOLD_MAX_ROWS_PER_TRIGGER`` rows a micro-batch (a query catching up on a backlog holds
    a slice of it at a time).

    ``build`` sets the watermarks (Spark disallows a second one on a watermarked column). A build that
    combines event inputs watermarks each before combining them (:func:`tidewater.transforms.watermarked_union`).

    With ``TIDEWATER_GOLD_PREFETCH`` a gold query over one silver reads each micro-batch ahead on the
    driver (the Delta source's ``prefetch``): no Python task per trigger beside the sources' (rsvps,
    2,000 events/s: silver p95 1.83-1.92 s against 1.99-2.06 s), but a drain of a backlog loses a
    quarter of its rate (18,904 against 25,581 events/s; prefetched rows go through Spark's block
    manager), so it is off by default. One over two silvers never prefetches: prefetching both
    cost ads and vending ~0.3 GB more PSS, with no latency gain beyond the runs' spread.
    """
    inputs = query.inputs
    prefetch = layout.settings.gold_prefetch and len(inputs) == 1
    return {
        # Batch recomputes overwrite silver intervals; the stream follows appends only.
        source.name: transforms.watermark_safe(
            spark.readStream.format("tidewater-delta")
            .option("skipChangeCommits", "true")
            .option("prefetch", str(prefetch).lower())
            .option("maxRowsPerTrigger", str(layout.settings.gold_max_rows_per_trigger))
            .load(layout.source_table(source, "silver").uri),
            source.event_time,
            source.max_event_lead,
            # one observed metric per input: Spark needs their names unique within a query
            metric=transforms.HELD_METRIC if len(inputs) == 1 else f"{transforms.HELD_METRIC}_{source.name}",
        )
        for source in inputs
    }


class PipelineStreams:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        *,
        namespace: str | None = None,
        launched_at: float | None = None,
    ):
        self.spark: SparkSession | None = None
        self.settings = settings
        self.pipeline = pipeline
        self.layout = PipelineLayout.of(settings, pipeline, namespace)
        # When this driver was launched (unix seconds; its launcher's word, else now): stop requests
        # written before then were meant for an earlier driver.
        self.launched_at = time.time() if launched_at is None else launched_at
        self.checkpoints: dict[str, Checkpoint] = {}
        self.queries: dict[str, StreamingQuery] = {}
        self._started: dict[str, tuple[Tier, dict[str, Any]]] = {}  # query -> how it was started
        self._restarts: dict[str, int] = {}
        self._publishers: list[BatchPublisher] = []
        self._listener: ProgressRecorder | None = None
        self._retention: RetentionWatch | None = None
        # Spark's start-up Python workers, given back once no query needs them (see _give_back_startup_workers).
        self._startup_workers: StartupWorkers | None = None
        self._startup_pending: set[str] = set()
        self._unplanned: dict[str, ReadSources] = {}  # queries not yet known to have planned every source's read
        self._triggered: set[str] = set()  # queries known to have run a trigger (see _started_up)

    # ---- set-up -----------------------------------------------------------------------------------

    @property
    def tiers(self) -> list[Tier]:
        """Every query, lowest tier first: each source's bronze (and silver), then each gold table."""
        uri, pipeline = self.layout.table_uri, self.pipeline
        tiers = []
        for source in pipeline.sources:
            bronze = uri(pipeline.table_of(source, "bronze"))
            tiers.append(Tier(pipeline.query_of(source, "bronze"), f"kafka:{self.topic(source)}", bronze, source.name))
            if self.settings.silver_query:
                silver = uri(pipeline.table_of(source, "silver"))
                tiers.append(Tier(pipeline.query_of(source, "silver"), bronze, silver, source.name))
        for query in self.layout.gold_queries:
            inputs = ",".join(uri(pipeline.table_of(s, "silver")) for s in query.inputs)
            targets = ",".join(uri(f"gold/{table.name}") for table in query.tables)
            tiers.append(Tier(query.name, inputs, targets, gold=query))
        return tiers

    def topic(self, source: Source) -> str:
        return self.settings.topic(source.topic)

    def preflight(self) -> None:
        """Everything that can be checked before Spark starts, each failing in one line: Kafka reachable,
        topic present, lake root writable, checkpoints sane and not in use (their leases are taken here)."""
        for source in self.pipeline.sources:
            topic_partitions(self.settings, self.topic(source))
        check_lake_root(self.settings.lake_uri)
        for tier in self.tiers:
            self._claim(tier)

    def ensure_tables(self) -> None:
        assert self.spark is not None
        schemas = self.pipeline.schemas(self.spark)
        for name in self.layout.table_names:
            LakeTable(self.layout.table_uri(name)).ensure(
                schemas[name],
                partition_by=self.pipeline.partitioning(name),
                description=f"{self.pipeline.name} {name}",
            )

    def prepare(self, spark: SparkSession) -> None:
        if not self.checkpoints:
            self.preflight()
        self.spark = spark
        self.ensure_tables()
        if self.settings.release_startup_workers and self._startup_workers is None:
            self._startup_workers = StartupWorkers(spark)
        if self._listener is None:
            topics = [self.topic(source) for source in self.pipeline.sources]
            self._retention = RetentionWatch(self.settings, topics).start()
            self._listener = ProgressRecorder(self.layout.progress_dir(), self._retention, prefix=self.query_name(""))
            follow_progress(self.spark, self._listener)

    def _claim(self, tier: Tier) -> Checkpoint:
        if tier.query not in self.checkpoints:
            self.checkpoints[tier.query] = claim(
                self.layout.checkpoint(tier.query),
                pipeline=self.pipeline.name,
                namespace=self.layout.namespace,
                query=tier.query,
                source=tier.source,
                target=tier.target,
                lease=self.layout.checkpoint_lease(tier.query),
            )
        return self.checkpoints[tier.query]

    def query_name(self, query: str) -> str:
        return f"{self.layout.namespace}.{self.pipeline.name}.{query}"

    # ---- the queries ------------------------------------------------------------------------------

    def start(self, tier: Tier, trigger: dict[str, Any]) -> StreamingQuery:
        assert self.spark is not None, "call prepare(spark) first"
        checkpoint = self._claim(tier)
        name = self.query_name(tier.query)

        if tier.feeds is None:
            writer = self._gold_writer(tier, checkpoint, name)
        else:
            writer = self._source_writer(tier, checkpoint, name, self.pipeline.source(tier.feeds))
        # The query's jobs run in its pool (see tidewater.spark.SOURCES_POOL); it keeps the property it starts with.
        pool = GOLD_POOL if tier.feeds is None else SOURCES_POOL
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
        # A query copies the session's SQL conf when it starts; a restart takes its checkpoint's instead.
        settings = self.settings
        partitions = settings.gold_shuffle_partitions if tier.feeds is None else settings.spark_shuffle_partitions
        self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        query = writer.queryName(name).option("checkpointLocation", str(checkpoint.path)).trigger(**trigger).start()
        self._follow(tier, trigger, query)
        log.info("started %s (%s -> %s)", name, tier.source, tier.target)
        return query

    def _follow(self, tier: Tier, trigger: dict[str, Any], query: StreamingQuery) -> None:
        """Note a query just started: to restart it, and for the start-up workers its start used."""
        self.queries[tier.query] = query
        self._started[tier.query] = (tier, trigger)
        self._startup_pending.update(STARTUP_WORKER_MODULES)
        self._unplanned[tier.query] = ReadSources()

    def _source_writer(self, tier: Tier, checkpoint: Checkpoint, name: str, source: Source) -> DataStreamWriter:
        """Kafka -> bronze (and silver, unless silver is its own query), or bronze -> silver."""
        assert self.spark is not None
        pipeline, layout = self.pipeline, self.layout

        def silver_writer() -> SilverWriter:
            tables = {tier: pipeline.table_of(source, tier) for tier in ("silver", "quarantine", "conflicts")}
            return SilverWriter(
                source,
                silver=layout.table(tables["silver"]),
                quarantine=layout.table(tables["quarantine"]),
                conflicts=layout.table(tables["conflicts"]),
                app_id=checkpoint.app_id,
                query=self.query_name(pipeline.query_of(source, "silver")),
                locks={t: layout.lock(table) for t, table in tables.items()},
                index_max_keys=self.settings.dedup_index_max_keys,
                compaction=self.compaction(name),
            )

        bronze_lock = layout.lock(pipeline.table_of(source, "bronze"))
        if tier.query == pipeline.query_of(source, "silver"):
            bronze = (
                self.spark.readStream.format("tidewater-delta")
                .option("maxRowsPerTrigger", str(self.settings.max_offsets_per_trigger))  # as from Kafka
                .load(tier.source)
            )
            return bronze.writeStream.foreachBatch(silver_writer())
        options = source_options(self.settings, self.topic(source))
        offsets_log = checkpoint.path / "offsets"
        resuming = offsets_log.is_dir() and any(offsets_log.iterdir())
        if pipeline.delivery is Delivery.AT_MOST_ONCE and resuming:  # never re-reads: see Delivery
            options["resumeFrom"] = "latest"
        if source.strict_json and not self.settings.silver_query:  # checked as read: see BronzeSilverWriter
            options["payloadContract"] = source.payload_schema.json()
            if json_columns.typable(options["payloadContract"]):  # typed as read: see json_columns
                options["payloadParsed"] = "true"
        kafka = self.spark.readStream.format("tidewater-kafka").options(**options).load()
        if self.settings.silver_query:  # decoupled tiers: silver polls the bronze table itself
            return (
                transforms.to_bronze(kafka)
                .writeStream.format("tidewater-delta")
                .option("appId", checkpoint.app_id)
                .option("queryName", name)
                .option("path", tier.target)
                .options(**lock_options(bronze_lock))
            )
        writer = BronzeSilverWriter(
            bronze=LakeTable(tier.target),
            silver=silver_writer(),
            app_id=checkpoint.app_id,
            query=name,
            lock=bronze_lock,
        )
        return writer.input_of(kafka).writeStream.foreachBatch(writer)

    def _gold_writer(self, tier: Tier, checkpoint: Checkpoint, name: str) -> DataStreamWriter:
        """Silver of the query's inputs (see :func:`gold_inputs`) -> the kind's output mode -> MERGE into
        each table the query writes."""
        assert self.spark is not None and tier.gold is not None
        query = tier.gold
        compaction = self.compaction(name)
        writers = [
            GoldWriter(
                gold,
                table=self.layout.table(f"gold/{gold.name}"),
                app_id=checkpoint.app_id,
                query=name,
                lock=self.layout.lock(f"gold/{gold.name}"),
                publisher=self._publisher(gold, checkpoint.app_id),
                compaction=compaction,
            )
            for gold in query.tables
        ]
        rows = query.rows(gold_inputs(self.spark, self.layout, query))
        # the tables of a shared query are all append-mode (Pipeline.gold_queries)
        mode = query.tables[0].output_mode
        batch_writer = SharedGoldWriter(writers, query=name) if query.shared else writers[0]
        return rows.writeStream.outputMode(mode).foreachBatch(batch_writer)

    def compaction(self, query: str) -> StreamCompaction:
        """A query's compaction of the tables it commits to (off with TIDEWATER_STREAM_COMPACTION_FILES=0)."""
        return StreamCompaction(
            every=self.settings.stream_compaction_files,
            target_size=self.settings.stream_compaction_target_bytes,
            query=query,
        )

    def _publisher(self, gold: GoldTable, app_id: str) -> BatchPublisher | None:
        """The Kafka publisher of a published gold table (its topics created if missing). Its
        transactional id is the query's app id: a restarted job fences the one it replaces."""
        if gold.publish is None:
            return None
        topic = self.settings.topic(gold.publish.topic)
        control = self.settings.topic(gold.publish.control_topic)
        ensure_topic(self.settings, topic, self.settings.kafka_topic_partitions)
        ensure_topic(self.settings, control, 1)
        publisher = BatchPublisher(
            kafka_python_config(self.settings),
            topic=topic,
            control_topic=control,
            transactional_id=f"tidewater.{app_id}",
            app_id=app_id,
        )
        self._publishers.append(publisher)
        return publisher

    def run_available_now(self, spark: SparkSession, *, give_back_startup_workers: bool = False) -> None:
        """Process everything available now, tier by tier (each tier finishing before the next starts),
        then return.

        ``give_back_startup_workers``: give back Spark's start-up Python workers as a long-running job
        does (:meth:`_follow_start_up`), for a process that runs once and exits (``tidewater stream
        --available-now``). A drain of rsvps' 1M events held ~180 MiB of them idle to its end; given
        back, its PSS peak was 2,199 / 2,280 MiB against 2,367 / 2,437 (two interleaved pairs). Each
        later query's start makes Spark start them again (~0.7 s a daemon), so a session that runs
        many small available-now runs keeps them: ``test_rsvps_pipeline.py`` took 95-97 s with them
        given back, 73-74 s without.

        Tried: every gold query at once (gold reads silver alone). rsvps, 1M events, two interleaved
        pairs: its gold took 18.6 / 21.2 s after silver's last commit against 24.6 / 25.4 s one after
        the other, but the drain's PSS peak (in gold) was 2,237 / 2,424 MiB against 2,199 / 2,280."""
        self.prepare(spark)
        for tier in self.tiers:
            query = self.start(tier, {"availableNow": True})
            while True:
                try:
                    if query.awaitTermination(AWAIT_SECONDS):
                        break
                except Exception as exc:
                    detail = one_line(exc) + state_layout_hint(str(exc))
                    raise StreamFailedError(f"{self.query_name(tier.query)} failed: {detail}") from exc
                if give_back_startup_workers:
                    self._follow_start_up()
            self._unplanned.pop(tier.query, None)  # a query that ended plans no more reads

    def run_forever(
        self, spark: SparkSession, stop: threading.Event, *, trigger_seconds: float | None = None
    ) -> StopRequest | None:
        """Run every tier concurrently until ``stop`` is set (a signal), a fresh stop request appears (it
        sets ``stop`` too, and is returned), or a query fails (see :meth:`check_queries`). A request
        already there when the queries would start (sent while the driver was starting) starts none."""
        self.prepare(spark)
        seconds = trigger_seconds if trigger_seconds is not None else self.settings.trigger_seconds
        requests = StopRequestWatch(self.layout.stop_request(), launched_at=self.launched_at)
        gate = self.start_gate()
        try:
            requested = self._stop_requested(requests, stop)
            while gate is not None and not stop.is_set() and not gate.wait(1.0):
                requested = self._stop_requested(requests, stop)
            if not stop.is_set():
                self.start_all(seconds, stop)
            while not stop.is_set():
                self.check_queries()
                self._follow_start_up(gate)
                requested = self._stop_requested(requests, stop)
                if requested is None:
                    stop.wait(1.0)
        finally:
            if gate is not None:
                gate.release("the job is stopping")
            self.stop()
        return requested

    def start_all(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Start every tier on its processing-time trigger (``seconds``: the sources' default), lowest
        first; none more once ``stop`` is set."""
        for tier in self.tiers:
            if stop is not None and stop.is_set():
                break
            self.start(tier, {"processingTime": f"{self.trigger_seconds(tier, seconds)} seconds"})

    def reads_planned(self) -> bool:
        """Has every running query read rows from each of its sources (so Spark planned every read),
        with no query waiting for a restart? Then no query of this pipeline needs a read planner."""
        for name, sources in list(self._unplanned.items()):
            query = self.queries.get(name)
            if query is None or (query.isActive and sources.add(query.lastProgress)):
                del self._unplanned[name]
        return not self._unplanned and not self._restarts

    def trigger_seconds(self, tier: Tier, default: float) -> float:
        """How often ``tier`` runs a micro-batch: what its source or its gold tables declare
        (``trigger_interval``), else a gold query on the gold trigger and a source's queries on
        ``default`` (the job's trigger)."""
        if tier.gold is not None:
            declared = tier.gold.trigger_seconds
            return self.settings.gold_trigger_seconds if declared is None else declared
        assert tier.feeds is not None
        declared = self.pipeline.source(tier.feeds).trigger_seconds
        return default if declared is None else declared

    def start_gate(self) -> StartGate | None:
        """The host's start gate (:mod:`tidewater.streaming.start_gate`); None when turned off."""
        limit = self.settings.stream_start_gate_seconds
        if limit <= 0:
            return None
        holder = f"{self.layout.namespace}.{self.pipeline.name}"
        status = self.layout.progress_dir() / STATUS_FILE
        return StartGate(gate_path(self.settings.state_dir), limit_s=limit, holder=holder, status_file=status)

    def _started_up(self) -> bool:
        """This job's start is over for the start gate: every query has run a trigger and every query
        over Kafka has read rows, so their Python workers are up, and no query waits for a restart.
        A gold query's first read of silver comes later, and costs one planner, not a job's start."""
        if self._restarts:
            return False
        for name, query in self.queries.items():
            if name not in self._triggered:
                if query.lastProgress is None:
                    return False
                self._triggered.add(name)
        return not any(tier.feeds is not None and tier.query in self._unplanned for tier in self.tiers)

    def _follow_start_up(self, gate: StartGate | None = None) -> None:
        """Once a second: note which queries have read rows from each of their sources (their reads
        are planned, the last start-up work), give back the start-up workers no query needs any more,
        and pass the start gate on once this job's start is over (:meth:`_started_up`)."""
        # Only while something waits on it: a query over a quiet source may read nothing for hours.
        if (self._startup_workers is not None and self._startup_pending) or (gate is not None and gate.held):
            self.reads_planned()  # lastProgress: one record per look (recentProgress: a py4j call per record)
        self._give_back_startup_workers()
        if gate is not None and gate.held:
            if self._started_up():
                gate.release("every query has run a trigger, and every query over Kafka has read from it")
            elif gate.overdue():
                gate.release(f"held for {gate.limit_s:.0f} s, the longest a job may")

    def _give_back_startup_workers(self) -> None:
        """Stop Spark's idle start-up Python workers (:mod:`tidewater.streaming.startup_workers`) as soon as
        no query can be using one: source lookup and creation run inside ``start()``, which only this
        thread calls, so they are idle here; read planning runs at a source's first micro-batch with
        data, so it waits until every running query has read rows from each of its sources. Nothing is
        given back while a restarted query has not run a batch yet: on a host so busy that queries
        miss Spark's connect-back window, their restarts reuse the idle workers instead of starting
        new daemons, which would load the host more."""
        if self._startup_workers is None or not self._startup_pending or self._restarts:
            return
        ready = self._startup_pending - ({READ_PLANNING} if self._unplanned else set())
        if ready:
            self._startup_workers.release(ready)
            self._startup_pending -= ready

    def _stop_requested(self, requests: StopRequestWatch, stop: threading.Event) -> StopRequest | None:
        """Poll the stop request (one ``stat`` every couple of seconds); a fresh one sets ``stop`` and is
        announced in one line of the driver's output."""
        request = requests.poll()
        if request is not None and not stop.is_set():
            print(f"tidewater: {request.describe()}", flush=True)
            log.info("stop request %s from %s: stopping the queries", request.id, request.host)
            stop.set()
        return request

    def check_queries(self) -> None:
        """Raise for a query that stopped, unless its Python worker merely missed Spark's connect-back
        window (a busy host, not the data): that query alone is restarted from its checkpoint, at most
        ``MAX_WORKER_RESTARTS`` times in a row (each a little later), instead of the whole job (whose
        restart costs a JVM and more load)."""
        for query_name, query in list(self.queries.items()):
            if query.isActive:
                if query_name in self._restarts and query.lastProgress is not None:
                    del self._restarts[query_name]  # it ran a batch again: the budget is for consecutive misses
                continue
            error = query.exception()
            detail = one_line(error) + state_layout_hint(str(error)) if error else "stopped unexpectedly"
            restarts = self._restarts.get(query_name, 0)
            if error is not None and WORKER_TIMEOUT in str(error) and restarts < MAX_WORKER_RESTARTS:
                self._restarts[query_name] = restarts + 1
                log.warning(
                    "%s: %s; %s (%d of %d)",
                    self.query_name(query_name),
                    detail,
                    WORKER_RESTART,
                    restarts + 1,
                    MAX_WORKER_RESTARTS,
                )
                time.sleep(2.0 * (restarts + 1))  # let the host catch up a little more each time
                self.start(*self._started[query_name])
                continue
            raise StreamFailedError(f"{self.query_name(query_name)} failed: {detail}")

    def stop(self) -> None:
        for query in self.queries.values():
            try:
                query.stop()
            except Exception as exc:  # stopping must not mask the original error
                log.warning("stopping %s: %s", query.name, one_line(exc))
        self.queries.clear()
        for publisher in self._publishers:
            publisher.close()
        self._publishers.clear()

    def close(self) -> None:
        self.stop()
        if self._listener is not None and self.spark is not None:
            unfollow_progress(self.spark, self._listener)
            self._listener = None
        if self._retention is not None:
            self._retention.stop()
            self._retention = None
        for checkpoint in self.checkpoints.values():
            checkpoint.release()
        self.checkpoints.clear()
