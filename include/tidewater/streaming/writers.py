"""foreachBatch writers: one micro-batch -> one idempotent Delta commit per table.

Spark re-executes a micro-batch after a crash with the same batch id and the same input (its
offset log is written before the batch runs). Each commit carries ``(app_id, batch_id)``; a
table that already has it skips the write. Silver and quarantine are two tables written from
one batch: each is skipped or written on its own, so a crash between them heals on re-run.
Each commit is made holding the table's lock (:mod:`tidewater.lake.locks`), so a batch
recompute or correction of the same live table never interleaves with it.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from tidewater import dedup, faults, phase_clock, transforms
from tidewater.connectors.kafka_publish import BatchPublisher, rows_to_records
from tidewater.errors import TidewaterError, one_line
from tidewater.lake import writes
from tidewater.lake.compaction import StreamCompaction
from tidewater.lake.key_index import DEFAULT_MAX_KEYS, KeyIndex
from tidewater.lake.locks import WriterLock, holding
from tidewater.lake.tables import CommitResult, LakeTable
from tidewater.pipelines.base import STATUS_COLUMNS, GoldTable, Source

log = logging.getLogger(__name__)


class HandledBatches:
    """The last micro-batch this writer handled for each of its tables (committed it, or found it
    there, or had no rows for it), so that the next batch need not open a table to ask whether it
    holds it: 20-100 ms a source trigger at 2,000 events/s (three tables), more on a busy host.

    Why that answer is safe without asking: Spark runs batch N+1 of a query only once batch N has run
    to its end, and only this query commits under its app id (the checkpoint's lease,
    :mod:`tidewater.streaming.checkpoint`). So once this process handled N for a table, N+1 is not in
    it. Any other batch (the first after a start, one Spark re-runs after a failure) is asked of the
    table, and after a failed commit nothing is assumed (:meth:`forget`). The commit itself still
    checks the transaction on the snapshot it commits to (:meth:`LakeTable.append_arrow`,
    :meth:`LakeTable.merge`): this only spares the look before the work.
    """

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        self._last: dict[str, int] = {}

    def holds(self, table: LakeTable, batch_id: int) -> bool:
        """Whether ``table`` already holds ``batch_id`` under this writer's app id."""
        if self._last.get(table.uri) == batch_id - 1:
            return False
        return table.already_committed(self.app_id, batch_id)

    def handled(self, tables: Iterable[LakeTable], batch_id: int) -> None:
        """``tables`` hold ``batch_id`` now, or need nothing of it."""
        for table in tables:
            self._last[table.uri] = batch_id

    def forget(self) -> None:
        self._last.clear()


class SilverWriter:
    """Bronze rows -> silver (valid, one row per key) + quarantine (invalid, with the reason) + conflicts.

    Parsing and validation are the pipeline's pure Spark transforms; their results (one micro-batch:
    small) go to the driver. There (unless the source keeps every copy: at-least-once delivery, where
    valid rows are appended as they are) the batch's valid rows meet the silver rows that already hold
    their keys (:class:`~tidewater.lake.key_index.KeyIndex`, under silver's lock: only the silver files
    whose key hashes match are read), and :func:`tidewater.dedup.resolve`
    decides: silver gains the first copy of each new key (an append), a copy that differs from the
    kept one goes to ``conflicts`` with both versions, an identical copy is counted. Events behind a
    gold watermark are *kept* here: that is what lets the late-data correction use them.

    No record stops the query: if computing a batch fails for a reason in the data (a value some
    function cannot handle), :func:`isolate_poison` re-runs the batch in halves from a local copy,
    quarantines the records that fail on their own with the error, and goes on. A failure that every
    part shares (storage, broker, memory) is raised as before.
    """

    def __init__(
        self,
        source: Source,
        *,
        silver: LakeTable,
        quarantine: LakeTable,
        conflicts: LakeTable,
        app_id: str,
        query: str,
        locks: dict[str, WriterLock] | None = None,
        index_max_keys: int = DEFAULT_MAX_KEYS,
        compaction: StreamCompaction | None = None,
    ):
        self.source = source
        self.silver = silver
        self.silver_keys = KeyIndex(silver, source.key, max_keys=index_max_keys)
        self.quarantine = quarantine
        self.conflicts = conflicts
        self.app_id = app_id
        self.query = query  # the label of this step ("<namespace>.<pipeline>.silver") in logs and faults
        self.locks = locks or {}
        self.handled = HandledBatches(app_id)
        self.compaction = compaction or StreamCompaction(every=0)

    def __call__(
        self, bronze_batch: DataFrame, batch_id: int, *, before_commits: Callable[[], object] | None = None
    ) -> None:
        """``before_commits``: called once the batch is parsed, before any table of it is committed
        (:class:`BronzeSilverWriter` waits there for its bronze commit, which runs beside it)."""
        with phase_clock.batch(self.query, batch_id):
            self._write(lambda: self._parse(bronze_batch, batch_id), batch_id, before_commits)

    def write_outcomes(
        self,
        outcomes: tuple[pa.Table, pa.Table],
        batch_id: int,
        *,
        before_commits: Callable[[], object] | None = None,
    ) -> None:
        """Commit a batch already parsed: ``outcomes`` is (quarantine rows, valid rows incl. copies), as
        :meth:`Source.split_outcomes` divides them (:class:`BronzeSilverWriter`'s one Spark job)."""
        with phase_clock.batch(self.query, batch_id):
            self._write(lambda: outcomes, batch_id, before_commits)

    def _parse(self, bronze_batch: DataFrame, batch_id: int) -> tuple[pa.Table, pa.Table]:
        with phase_clock.phase("parse"):
            return isolate_poison(self.source, bronze_batch, self.query, batch_id)

    def _write(
        self,
        outcomes: Callable[[], tuple[pa.Table, pa.Table]],
        batch_id: int,
        before_commits: Callable[[], object] | None,
    ) -> None:
        tables = {"silver": self.silver, "quarantine": self.quarantine}
        if self.source.deduplicate:  # conflicts come from the key lookup
            tables["conflicts"] = self.conflicts
        with phase_clock.phase("already committed?"):
            done = {name: self.handled.holds(table, batch_id) for name, table in tables.items()}
        if all(done.values()):
            log.info("%s batch %s already committed: skipped", self.query, batch_id)
            self.handled.handled(tables.values(), batch_id)
            return
        rejected, valid = outcomes()
        if before_commits is not None:
            before_commits()
        try:
            self._commit(rejected, valid, batch_id, done)
        except BaseException:
            self.handled.forget()  # a commit may have landed, or not: the next batch asks the tables
            raise
        self.handled.handled(tables.values(), batch_id)
        faults.after_commit(self.query, batch_id)

    def _commit(self, rejected: pa.Table, valid: pa.Table, batch_id: int, done: dict[str, bool]) -> None:
        """Each table's commit of the batch, except those ``done`` says hold it; a table the batch has
        no rows for is not opened (an empty append commits nothing)."""
        meta = {"tidewater.query": self.query, "tidewater.batch_id": batch_id}
        label = f"{self.query} batch {batch_id}"
        if not done["quarantine"] and rejected.num_rows:
            with holding(self.locks.get("quarantine"), label):
                with phase_clock.phase("quarantine append"):
                    result = self.quarantine.append_arrow(
                        rejected, app_id=self.app_id, batch_id=batch_id, metadata=meta
                    )
                self.compaction.after_commit(self.quarantine, result)
        if not self.source.deduplicate:  # at-least-once: every valid copy, no key lookup
            if not done["silver"]:
                with holding(self.locks.get("silver"), label):
                    with phase_clock.phase("silver append"):
                        result = self.silver.append_arrow(valid, app_id=self.app_id, batch_id=batch_id, metadata=meta)
                    self.compaction.after_commit(self.silver, result)
        elif not (done["silver"] and done["conflicts"]):
            key = self.source.key
            with holding(self.locks.get("silver"), label):
                with phase_clock.phase("silver key lookup"):
                    existing = self.silver_keys.lookup(valid.column(key).combine_chunks())
                with phase_clock.phase("de-duplicate"):
                    resolution = dedup.resolve(
                        valid, existing, key=key, compared=self.source.compared_columns, at=dt.datetime.now(dt.UTC)
                    )
                if not done["conflicts"] and resolution.conflicts.num_rows:
                    with holding(self.locks.get("conflicts"), label):
                        with phase_clock.phase("conflicts append"):
                            result = self.conflicts.append_arrow(
                                resolution.conflicts, app_id=self.app_id, batch_id=batch_id, metadata=meta
                            )
                        self.compaction.after_commit(self.conflicts, result)
                if not done["silver"]:
                    with phase_clock.phase("silver append"):
                        result = self.silver.append_arrow(
                            resolution.fresh, app_id=self.app_id, batch_id=batch_id, metadata=meta
                        )
                    self.compaction.after_commit(self.silver, result)
            if resolution.duplicates or resolution.conflicts.num_rows:
                log.info(
                    "%s: %d re-sent copies dropped, %d conflicting copies recorded",
                    label,
                    resolution.duplicates,
                    resolution.conflicts.num_rows,
                )


# At most this many Spark jobs to isolate poison records in one batch; a failure that needs more is not
# about a few records (it is raised).
MAX_ISOLATION_JOBS = 256


def may_be_the_data(exc: Exception) -> bool:
    """Whether a failed batch may have failed for a record in it: not when the lake, a lock or the
    broker raised (a TidewaterError or an OSError)."""
    return not isinstance(exc, TidewaterError | OSError)


def isolate_poison(source: Source, bronze: DataFrame, query: str, batch_id: int) -> tuple[pa.Table, pa.Table]:
    """(quarantine rows, valid silver rows incl. copies) of a bronze batch, with records that break the
    computation itself quarantined with the error instead of failing the batch."""
    try:
        return _split(source, bronze)
    except Exception as exc:
        if not may_be_the_data(exc):
            raise
        first_error = exc
    log.warning("%s batch %s failed (%s): isolating the records that cause it", query, batch_id, one_line(first_error))
    try:
        local = bronze.toArrow()  # the batch as it is, so the halves below read nothing from outside
    except Exception:
        raise first_error from None
    spark = bronze.sparkSession
    schema = bronze.schema
    jobs = 0
    rejected: list[pa.Table] = []
    valid: list[pa.Table] = []
    poison: list[tuple[pa.Table, str]] = []
    pending = [local]
    while pending:
        part = pending.pop()
        jobs += 1
        if jobs > MAX_ISOLATION_JOBS:
            log.error("%s batch %s: the failure is not confined to a few records", query, batch_id)
            raise first_error
        try:
            q, v = _split(source, spark.createDataFrame(part, schema=schema))
        except Exception as exc:
            if part.num_rows == 1:
                poison.append((part, one_line(exc)))
                if len(poison) >= 3 and not valid:  # record after record fails, none passes: not the data
                    raise first_error from None
            else:
                half = part.num_rows // 2
                pending += [part.slice(half), part.slice(0, half)]
            continue
        rejected.append(q)
        valid.append(v)
    if not valid:  # every record failed on its own: that is the platform, not the data
        raise first_error
    if poison:
        log.warning("%s batch %s: %d record(s) quarantined as unprocessable", query, batch_id, len(poison))
    quarantine_schema = rejected[0].schema
    rejected += [_unprocessable(record, reason, quarantine_schema) for record, reason in poison]
    return pa.concat_tables(rejected), pa.concat_tables(valid)


def _split(source: Source, bronze: DataFrame) -> tuple[pa.Table, pa.Table]:
    with phase_clock.phase("plan"):  # the transforms' DataFrame, built per batch
        outcomes = source.outcomes(source.parse(bronze))
    with phase_clock.phase("rows to driver"):  # one Spark job: the parse and validation run here
        rows = outcomes.toArrow()
    with phase_clock.phase("split"):
        return source.split_outcomes(rows)


def _unprocessable(record: pa.Table, reason: str, schema: pa.Schema) -> pa.Table:
    """A quarantine row for a bronze record the source's transforms could not process."""
    row = record.to_pylist()[0]
    ingest = row.get("ingest_time")
    values = {
        "reason": f"record could not be processed: {reason}"[:1000],
        "raw_value": row.get("value"),
        "raw_key": row.get("key"),
        "kafka_topic": row.get("topic"),
        "kafka_partition": row.get("partition"),
        "kafka_offset": row.get("offset"),
        "kafka_timestamp": row.get("kafka_timestamp"),
        "ingest_time": ingest,
        "quarantine_date": ingest.date() if ingest is not None else None,
    }
    return pa.Table.from_pylist([{name: values.get(name) for name in schema.names}], schema=schema)


class BronzeSilverWriter:
    """Kafka records -> bronze, then silver + quarantine from those very bronze rows, in one micro-batch.

    The default streaming topology: silver is computed from bronze rows (never from Kafka directly)
    without waiting for another query to poll the bronze table, which saves a trigger cycle of
    latency and a second read of every record. Each table keeps its own idempotent commit.

    One Spark job per batch: the Kafka read and the parse, whose rows come to the driver as Arrow,
    each with its bronze columns beside its silver and quarantine ones
    (:meth:`~tidewater.pipelines.base.Source.outcomes_with_bronze`). There delta-rs writes the bronze
    rows (one file per ingest date, no Python worker writing Parquet) and silver takes the rest. Where
    the source checked each payload's strict contract as it read it (``payloadContract``), the parse
    runs in the JVM alone. rsvps at 2,000 events/s, 3 interleaved runs each: silver p95 1.89-1.99 s
    against 2.09-2.29 s with the Kafka read cached and parsed in a second job.

    The parse is part of the query's plan (:meth:`input_of`). A batch whose one job fails for a reason
    that may be in the data is written apart (:meth:`_write_apart`): the Kafka read again, its bronze
    columns only, cached, to bronze, then the parse over the cache, where :func:`isolate_poison` finds
    the records that cause the failure.

    The bronze commit runs on a thread of its own while silver's rows are divided (:class:`BronzeCommit`);
    silver waits for it before its key lookup and first commit, so the order of the commits, and with
    it every crash point between them, is what it was when they ran one after the other. Tried: the
    lookup and de-duplication before the wait, beside the bronze commit. On two cores they only
    shared them: ads at 1,000 events/s, two interleaved pairs, the wait went from 80-109 to 26-31 ms
    a trigger and the lookup from 50-76 to 102-121 ms, the silver phase unchanged (232-318 ms).
    """

    def __init__(
        self,
        *,
        bronze: LakeTable,
        silver: SilverWriter,
        app_id: str,
        query: str,
        lock: WriterLock | None = None,
    ):
        self.bronze = bronze
        self.silver = silver
        self.app_id = app_id
        self.query = query
        self.lock = lock
        self.compaction = silver.compaction  # one count per table, whichever writer commits it

    def input_of(self, kafka: DataFrame) -> DataFrame:
        """What the query hands this writer: each Kafka record with its bronze columns and its silver and
        quarantine ones (:meth:`~tidewater.pipelines.base.Source.outcomes_with_bronze`).

        Part of the streaming query's plan, so Spark analyses the parse once, when the query starts;
        applied to each micro-batch's DataFrame inside ``foreachBatch`` it was analysed anew every
        trigger (~120 ms on an idle host, ~310 ms under ads' load at 1,000 events/s, the seventeenth
        stop's profile)."""
        return self.silver.source.outcomes_with_bronze(transforms.to_bronze(kafka))

    def __call__(self, outcomes: DataFrame, batch_id: int) -> None:
        """``outcomes``: a micro-batch of :meth:`input_of`'s rows."""
        with phase_clock.batch(self.query, batch_id):
            self._write(outcomes, batch_id)

    def _write(self, outcomes: DataFrame, batch_id: int) -> None:
        source = self.silver.source
        try:
            with phase_clock.phase("read and parse"):  # the one Spark job; every table's rows to the driver
                rows = outcomes.toArrow()
        except Exception as exc:
            if not may_be_the_data(exc):
                raise
            log.warning("%s batch %s failed (%s): bronze and silver apart", self.query, batch_id, one_line(exc))
            # The bronze columns alone: Spark prunes the parse from that plan, so no record fails it there.
            self._write_apart(transforms.bronze_of(outcomes), batch_id)
            return
        with phase_clock.phase("bronze"):  # its commit's phases: bronze/lock wait, bronze/commit
            commit = BronzeCommit(self, transforms.split_bronze(rows), batch_id)
        try:
            with phase_clock.phase("silver"):
                with phase_clock.phase("split"):
                    outcomes = source.split_outcomes(rows)
                del rows
                self.silver.write_outcomes(outcomes, batch_id, before_commits=commit.wait)
        finally:
            commit.join()  # a failed silver commit too: no commit of this batch outlives its call
        commit.wait()

    def _write_apart(self, bronze: DataFrame, batch_id: int) -> None:
        """Bronze, then silver from those rows with the poison records isolated: two Spark jobs, the
        Kafka read's rows cached for the parse."""
        bronze_rows = bronze.persist()
        try:
            with phase_clock.phase("bronze"):
                with phase_clock.phase("read"):  # one Spark job: the Kafka read, its rows cached for silver
                    rows = bronze_rows.toArrow()
                commit = BronzeCommit(self, rows, batch_id)
            del rows
            try:
                with phase_clock.phase("silver"):
                    self.silver(bronze_rows, batch_id, before_commits=commit.wait)
            finally:
                commit.join()  # a failed parse too: no commit of this batch outlives its call
            commit.wait()
        finally:
            bronze_rows.unpersist()


class BronzeCommit:
    """A micro-batch's bronze commit (under the bronze lock), on a thread of its own: delta-rs writes
    while silver's rows are prepared, or parsed by Spark where the batch is written apart (rsvps, 100k
    records: ~0.2 s of a ~4.4 s trigger in which the query did nothing else). :meth:`wait` returns
    once it is done, raises what it raised, and passes the crash point after a fresh commit
    (:func:`tidewater.faults.after_commit`) once."""

    def __init__(self, writer: BronzeSilverWriter, rows: pa.Table, batch_id: int):
        self._writer = writer
        self._batch_id = batch_id
        self._timed = phase_clock.carry()  # its phases are bronze/lock wait and bronze/commit
        self._result: CommitResult | None = None
        self._error: BaseException | None = None
        self._passed_fault_point = False
        self._thread = threading.Thread(
            target=self._commit, args=(rows,), name=f"bronze commit {writer.query} {batch_id}", daemon=True
        )
        self._thread.start()

    def _commit(self, rows: pa.Table) -> None:
        writer, batch_id = self._writer, self._batch_id
        meta = {"tidewater.query": writer.query, "tidewater.batch_id": batch_id}
        try:
            label = f"{writer.query} batch {batch_id}"
            with self._timed(), holding(writer.lock, label):
                with phase_clock.phase("commit"):
                    self._result = writer.bronze.append_arrow(
                        rows, app_id=writer.app_id, batch_id=batch_id, metadata=meta
                    )
                writer.compaction.after_commit(writer.bronze, self._result)
        except BaseException as exc:  # raised where the batch waits for it
            self._error = exc

    def join(self) -> None:
        if self._thread.is_alive():
            with phase_clock.phase("bronze commit wait"):
                self._thread.join()

    def wait(self) -> CommitResult:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        if self._result.committed and not self._passed_fault_point:  # as in the stream sink: a fresh commit
            self._passed_fault_point = True
            faults.after_commit(self._writer.query, self._batch_id)
        return self._result


class GoldWriter:
    """Gold rows the stream emits -> MERGE on the table's keys: the windows a micro-batch updated
    (update mode), or the rows it closed (append mode; a batch recompute may have written a
    provisional copy of one already).

    A published table (``GoldTable.publish``) also sends the batch's rows to Kafka, after the Delta
    commit: the plan runs once (its rows collected), the MERGE is skipped if the table holds the batch,
    and the publisher skips a batch its topic already holds; so a crash at any point (before the
    Delta commit, between it and the Kafka transaction, after both but before Spark's checkpoint)
    ends with the batch's rows once in the table and once in the topic."""

    def __init__(
        self,
        gold: GoldTable,
        *,
        table: LakeTable,
        app_id: str,
        query: str,
        lock: WriterLock | None = None,
        publisher: BatchPublisher | None = None,
        compaction: StreamCompaction | None = None,
    ):
        self.gold = gold
        self.table = table
        self.app_id = app_id
        self.query = query
        self.lock = lock
        self.publisher = publisher
        self.handled = HandledBatches(app_id)
        self.compaction = compaction or StreamCompaction(every=0)

    def __call__(self, updates: DataFrame, batch_id: int) -> None:
        with phase_clock.batch(self.query, batch_id):
            self._write(updates, batch_id)

    def _merge_options(self, batch_id: int) -> dict[str, Any]:
        # A row the stream updates is provisional again; its correction count stays.
        return {
            "keys": self.gold.keys,
            "range_keys": self.gold.range_keys,
            "keep": ("revision",),
            "app_id": self.app_id,
            "batch_id": batch_id,
            "metadata": {"tidewater.query": self.query, "tidewater.batch_id": batch_id},
        }

    def _write(self, updates: DataFrame, batch_id: int) -> None:
        with phase_clock.phase("already committed?"):
            held = self.handled.holds(self.table, batch_id)
        if held and self.publisher is None:
            log.info("%s batch %s already committed: skipped", self.query, batch_id)
            writes.drain(updates)
            faults.after_commit(self.query, batch_id)
            return
        with phase_clock.phase("rows to driver"):  # one run of the plan: state commits once, whatever is skipped
            rows = updates.toArrow()
        self.commit_rows(rows, batch_id, held=held)

    def commit_rows(self, rows: pa.Table, batch_id: int, *, held: bool | None = None) -> None:
        """The batch's rows, already on the driver -> the MERGE (unless the table holds the batch), then
        the publication, each skipped where it is already done. ``held``: whether the table holds the
        batch, when the caller has just looked (only this query commits under its app id); None: look."""
        with holding(self.lock, f"{self.query} batch {batch_id}"):
            if held is None:
                held = self.handled.holds(self.table, batch_id)
            if not held:
                with phase_clock.phase("merge"):
                    try:
                        result = self.table.merge(rows, **self._merge_options(batch_id))
                    except BaseException:
                        self.handled.forget()  # the MERGE may have landed, or not: the next batch asks
                        raise
                self.compaction.after_commit(self.table, result)
            self.handled.handled([self.table], batch_id)
        faults.after_commit(self.query, batch_id)
        if self.publisher is None:
            return
        assert self.gold.publish is not None
        published = rows_to_records(rows.drop_columns(list(STATUS_COLUMNS)), key=self.gold.publish.key)
        with phase_clock.phase("publish"):
            self.publisher.publish(
                batch_id, published, before_commit=lambda: faults.before_publish_commit(self.query, batch_id)
            )
        faults.after_publish(self.query, batch_id)


class SharedGoldWriter:
    """The micro-batch of a query that writes several gold tables (a shared query, see
    :meth:`tidewater.pipelines.base.Pipeline.gold_queries`) -> each table's :class:`GoldWriter`.

    The plan runs once (its stateful operators commit their state once), its rows come to the driver,
    and each table takes the rows tagged with its name (:func:`tidewater.transforms.untagged`). Each
    table's commit carries the query's ``(app_id, batch_id)`` and is skipped on its own where the table
    holds it already, so a crash between two tables' commits heals when Spark re-runs the batch. A
    batch every table holds (and none publishes) only runs its plan, for the state.
    """

    def __init__(self, tables: list[GoldWriter], *, query: str):
        self.tables = tables
        self.query = query

    def __call__(self, tagged: DataFrame, batch_id: int) -> None:
        with phase_clock.batch(self.query, batch_id):
            self._write(tagged, batch_id)

    def _write(self, tagged: DataFrame, batch_id: int) -> None:
        with phase_clock.phase("already committed?"):  # one look per table, passed on to its commit
            held = [table.handled.holds(table.table, batch_id) for table in self.tables]
        if all(held) and all(table.publisher is None for table in self.tables):
            log.info("%s batch %s already committed: skipped", self.query, batch_id)
            writes.drain(tagged)
            for table in self.tables:
                table.handled.handled([table.table], batch_id)
            return
        with phase_clock.phase("rows to driver"):
            rows = tagged.toArrow()
        for table, table_held in zip(self.tables, held, strict=True):
            with phase_clock.phase(table.gold.name):
                table.commit_rows(transforms.untagged(rows, table.gold.name), batch_id, held=table_held)
