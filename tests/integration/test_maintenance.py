"""Table maintenance (tidewater.batch.maintenance) on real Delta tables on the local file system.

The bronze table is committed the way the stream commits it (executor-side Parquet files from
``write_data_files`` + one idempotent ``commit_files`` per micro-batch), so compaction meets the
same files, statistics and app transactions it meets in production. Spark is used only where a
Spark reader is the point: time travel through ``read_table`` and the Delta stream source.
A writer in another process is a real Python subprocess holding the table lock, ended by PID.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lock_helpers import held_elsewhere
from pipeline_helpers import BRONZE_SCHEMA
from tidewater.batch.maintenance import (
    AUDITS,
    LEDGER,
    MaintenanceError,
    ledger_lock,
    maintain_pipeline,
    maintain_table,
)
from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.lake.files import write_data_files
from tidewater.lake.locks import TableLockTimeoutError
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

RSVPS = get_pipeline("rsvps")
APP_ID = "tidewater/live/rsvps/bronze/test-stream"
T0 = dt.datetime(2026, 11, 20, 23, 59, 0, tzinfo=dt.UTC)  # offsets 0..59 on one day, the rest on the next
QUERY_TIMEOUT_S = 120


# ---- helpers -----------------------------------------------------------------------------------------


def bronze_rows(first: int, count: int) -> pa.RecordBatch:
    """Kafka records ``first .. first+count-1`` of partition 0, one per second of Kafka time."""
    offsets = list(range(first, first + count))
    stamps = [T0 + dt.timedelta(seconds=o) for o in offsets]
    return pa.RecordBatch.from_pydict(
        {
            "key": [f"k{o}".encode() for o in offsets],
            "value": [json.dumps({"event_id": f"e{o}"}).encode() for o in offsets],
            "topic": ["rsvps"] * count,
            "partition": [0] * count,
            "offset": offsets,
            "kafka_timestamp": stamps,
            "timestamp_type": [0] * count,
            "headers": [[("h", b"v")] for _ in offsets],
            "ingest_time": stamps,
            "ingest_date": [s.date() for s in stamps],
        },
        schema=BRONZE_SCHEMA,
    )


def make_bronze(layout: PipelineLayout, commits: int, rows_per_commit: int = 30, first_batch: int = 0) -> LakeTable:
    """Commit ``commits`` micro-batches to bronze as the stream does (one small file per batch here:
    batches 0 and 1 on the first ingest date, the others on the next), each carrying the app
    transaction (APP_ID, batch id)."""
    table = layout.table("bronze")
    table.ensure(BRONZE_SCHEMA, partition_by=("ingest_date",))
    for batch_id in range(first_batch, first_batch + commits):
        rows = bronze_rows(batch_id * rows_per_commit, rows_per_commit)
        actions = write_data_files(table.uri, [rows], schema=BRONZE_SCHEMA, partition_by=["ingest_date"])
        assert table.commit_files(actions, app_id=APP_ID, batch_id=batch_id).committed
    return table


def content(table: LakeTable, version: int | None = None) -> list[dict]:
    rows = pa.table(table.open(version=version).to_pyarrow_table()).to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def local_path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


def operations(table: LakeTable, after: int, upto: int) -> dict[int, list[dict]]:
    """Commit actions of versions after..upto, by version."""
    return {v: table.commit_actions(v) or [] for v in range(after + 1, upto + 1)}


def commit_info(actions: list[dict]) -> dict:
    return next(a["commitInfo"] for a in actions if "commitInfo" in a)


@pytest.fixture
def layout(settings: Settings) -> PipelineLayout:
    return PipelineLayout.of(settings, RSVPS)


# ---- compaction and checkpoint -----------------------------------------------------------------------


def test_compaction_keeps_rows_is_no_data_change_and_checkpoints(layout: PipelineLayout) -> None:
    """Many small micro-batch files become one per partition; the rows (every column), the stream's
    app transaction and time travel are unchanged; the OPTIMIZE commits carry dataChange=false and
    the run id; a checkpoint of the final version appears in _delta_log; a second run has nothing to do."""
    bronze = make_bronze(layout, commits=10)
    before_rows, before_version = content(bronze), bronze.version()
    assert len(bronze.files()) == 10

    result = maintain_table(layout, "bronze", retention_hours=168, run_id="maint-1")

    assert result.status == "maintained", result
    assert (result.files_before, result.files_after) == (10, 2)
    assert (result.partitions_compacted, result.files_compacted, result.files_written) == (2, 10, 2)
    assert result.files_removed_by_vacuum == 0  # compacted-away files are younger than 168 h
    assert content(bronze) == before_rows
    assert bronze.row_count() == 300
    assert bronze.committed_version(APP_ID) == 9, "compaction lost the stream's app transaction"
    assert content(bronze, version=before_version) == before_rows  # time travel still works

    commits = operations(bronze, before_version, result.version_after or 0)
    optimize = {v: a for v, a in commits.items() if commit_info(a)["operation"] == "OPTIMIZE"}
    assert len(optimize) == 2  # one per partition, each in its own lock hold
    for actions in optimize.values():
        assert commit_info(actions)["tidewater.maintenance_run"] == "maint-1"
        changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        assert changes and all(change["dataChange"] is False for change in changes)
    assert {h["operation"] for h in bronze.history(5)} >= {"OPTIMIZE"}

    log_dir = local_path(bronze.uri) / "_delta_log"
    assert result.checkpoint_version == bronze.version()
    assert (log_dir / f"{result.checkpoint_version:020d}.checkpoint.parquet").is_file()
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == result.checkpoint_version
    assert json.loads(result.to_json())["files_after"] == 2

    again = maintain_table(layout, "bronze", retention_hours=168, run_id="maint-2")
    assert (again.partitions_compacted, again.files_removed_by_vacuum) == (0, 0)
    assert again.version_after == again.version_before == result.version_after


def test_maintenance_deletes_expired_log_files(layout: PipelineLayout) -> None:
    """The writers leave expired log files (tidewater.lake.tables.POST_COMMIT_HOOKS); maintenance
    deletes those older than delta.logRetentionDuration and its new checkpoint, and reports the log's
    size before and after; the table and the stream's app transaction read as before."""
    layout.table("bronze").ensure(BRONZE_SCHEMA, partition_by=("ingest_date",))
    # Set first: this commit has delta-rs' default hooks, which would delete the expired files themselves.
    DeltaTable(layout.table_uri("bronze")).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds"}
    )
    bronze = make_bronze(layout, commits=25)
    log_dir = local_path(bronze.uri) / "_delta_log"
    before_rows = content(bronze)
    assert len(list(log_dir.glob("*.json"))) == bronze.version() + 1  # the commits deleted none

    result = maintain_table(layout, "bronze", retention_hours=168, run_id="maint-logs")

    remaining = sorted(int(p.name[:20]) for p in log_dir.glob("*.json"))
    assert remaining[0] > 0 and result.checkpoint_version is not None, remaining
    assert remaining[0] <= result.checkpoint_version  # what the newest checkpoint needs stays
    # every commit before the run, the checkpoint of version 19 and _last_checkpoint
    assert result.log_files_before == (result.version_before or 0) + 1 + 2
    assert result.log_files_after == len(list(log_dir.iterdir())) < result.log_files_before
    assert json.loads(result.to_json())["log_files_after"] == result.log_files_after
    assert content(bronze) == before_rows
    assert bronze.committed_version(APP_ID) == 24


# ---- vacuum ------------------------------------------------------------------------------------------


def test_vacuum_short_retention_removes_compacted_files_and_ends_time_travel(spark, layout: PipelineLayout) -> None:
    """Retention 0 is refused unless explicitly allowed (nothing changes); a dry run lists the
    compacted-away files and deletes nothing; the allowed run deletes exactly them. Afterwards time
    travel to a version made of those files fails naming a missing file, in delta-rs and in Spark,
    while the current version reads in full."""
    bronze = make_bronze(layout, commits=6)
    rows, first_version = content(bronze), bronze.version()
    compacted = maintain_table(layout, "bronze", retention_hours=168, run_id="compact")
    removed = {
        a["remove"]["path"]
        for actions in operations(bronze, first_version, compacted.version_after or 0).values()
        for a in actions
        if "remove" in a
    }
    assert len(removed) == compacted.files_compacted == 6

    version = bronze.version()
    with pytest.raises(ConfigError) as refused:
        maintain_table(layout, "bronze", retention_hours=0, run_id="too-short")
    assert "\n" not in str(refused.value)
    assert "vacuum retention 0 h is below the 168 h deletedFileRetentionDuration" in str(refused.value)
    assert bronze.version() == version

    dry = maintain_table(layout, "bronze", retention_hours=0, run_id="dry", dry_run=True, allow_short_retention=True)
    assert dry.status == "dry_run"
    assert set(dry.vacuum_files) == removed
    assert dry.vacuum_bytes > 0
    assert bronze.version() == version
    assert all((local_path(bronze.uri) / path).exists() for path in removed)

    done = maintain_table(layout, "bronze", retention_hours=0, run_id="vacuum", allow_short_retention=True)
    assert set(done.vacuum_files) == removed
    assert done.vacuum_bytes == dry.vacuum_bytes
    assert "explicitly allowed" in done.detail
    assert not any((local_path(bronze.uri) / path).exists() for path in removed)
    assert {h["operation"] for h in bronze.history(3)} >= {"VACUUM START", "VACUUM END"}

    with pytest.raises(FileNotFoundError, match=r"part-.*\.parquet"):
        DeltaTable(bronze.uri, version=first_version).to_pyarrow_table()
    with pytest.raises(Exception, match=r"(?i)(FILE_NOT_EXIST|does not exist|FileNotFound)"):
        read_table(spark, bronze.uri, version=first_version).count()
    assert content(bronze) == rows
    assert read_table(spark, bronze.uri).count() == len(rows)


# ---- the lock ----------------------------------------------------------------------------------------


def test_maintenance_waits_for_a_writer_in_another_process(layout: PipelineLayout) -> None:
    """While another process holds bronze's lock (a stream commit, a recompute), maintenance waits
    for it and then succeeds; with a short lock timeout it fails with the one-line
    TableLockTimeoutError naming the holder, and the table is unchanged."""
    bronze = make_bronze(layout, commits=4)
    lock_path = layout.lock("bronze").path

    with held_elsewhere(lock_path, "stream batch 41", 3.0):
        started = time.monotonic()
        result = maintain_table(layout, "bronze", retention_hours=168, run_id="waits")
        elapsed = time.monotonic() - started
    assert result.status == "maintained" and result.files_after == 2
    assert result.lock_wait_s >= 2.0, result.lock_wait_s
    assert elapsed >= 2.0

    make_bronze(layout, commits=2, first_batch=4)
    version = bronze.version()
    impatient = PipelineLayout.of(layout.settings.replace(table_lock_timeout_seconds=0.5), RSVPS)
    with (
        held_elsewhere(lock_path, "recompute 2026-11-21T10", 60) as holder,
        pytest.raises(TableLockTimeoutError) as caught,
    ):
        maintain_table(impatient, "bronze", retention_hours=168, run_id="gives-up")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"table live/rsvps/bronze has been locked by recompute 2026-11-21T10 (pid {holder.pid} ")
    assert "raise TIDEWATER_TABLE_LOCK_TIMEOUT_SECONDS" in message
    assert bronze.version() == version


# ---- the pipeline and its ledger ---------------------------------------------------------------------


def make_ledger(layout: PipelineLayout, commits: int) -> LakeTable:
    ledger = LakeTable(layout.ledger_uri())
    ledger.ensure(pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("change", pa.string())]))
    for i in range(commits):
        ledger.append_arrow(pa.table({"window_start": [T0 + dt.timedelta(minutes=i)], "change": [f"c{i}"]}))
    return ledger


def test_maintain_pipeline_covers_every_table_and_the_ledger(layout: PipelineLayout) -> None:
    """Every table of the pipeline plus the corrections ledger and the audit table, each under its own
    lock in the same _locks directory; tables that do not exist yet are skipped and say so; a short
    retention is refused before any table changes; a held ledger lock fails the ledger only, then the run."""
    settings = layout.settings
    bronze = make_bronze(layout, commits=3)
    ledger = make_ledger(layout, commits=4)
    audits = LakeTable(layout.audit_uri())
    audits.ensure(pa.schema([("audit_id", pa.string())]))
    for i in range(3):  # one append per audit run
        audits.append_arrow(pa.table({"audit_id": [f"a{i}"]}))
    lock = ledger_lock(layout)
    assert lock.path == layout.lock("bronze").path.parent / "corrections.lock"
    assert lock.table == "live/rsvps/corrections"

    version = bronze.version()
    with pytest.raises(ConfigError, match="below the 168 h deletedFileRetentionDuration"):
        maintain_pipeline(settings, "rsvps", retention_hours=1, run_id="short")
    assert bronze.version() == version

    results = {r.table: r for r in maintain_pipeline(settings, RSVPS, "live", run_id="nightly")}
    assert list(results) == [*layout.table_names, LEDGER, AUDITS]
    assert results["bronze"].status == results[LEDGER].status == results[AUDITS].status == "maintained"
    assert (results[LEDGER].files_before, results[LEDGER].files_after) == (4, 1)
    assert (results[AUDITS].files_before, results[AUDITS].files_after) == (3, 1) and audits.row_count() == 3
    assert ledger.row_count() == 4
    for name in ("silver", "quarantine", *(f"gold/{g.name}" for g in RSVPS.gold)):
        assert (results[name].status, results[name].detail) == ("skipped", "table does not exist yet")

    make_ledger(layout, commits=2)
    impatient = settings.replace(table_lock_timeout_seconds=0.3)
    with held_elsewhere(lock.path, "correction run 7", 60):
        outcome = {r.table: r for r in maintain_pipeline(impatient, RSVPS, run_id="n2", raise_on_failure=False)}
        with pytest.raises(MaintenanceError) as caught:
            maintain_pipeline(impatient, RSVPS, run_id="n3")
    assert outcome["bronze"].status == "maintained"
    assert outcome[LEDGER].status == "failed"
    assert outcome[LEDGER].detail.startswith("TableLockTimeoutError: table live/rsvps/corrections has been locked by")
    assert "\n" not in str(caught.value)
    assert f"failed for 1 of {len(results)} tables (corrections: TableLockTimeoutError" in str(caught.value)


# ---- the Delta stream source downstream --------------------------------------------------------------


def drain(spark, uri: str, checkpoint: Path) -> list[tuple[int, int]]:
    """One Trigger.AvailableNow run of the tidewater-delta stream source; the (partition, offset)
    of every row it delivered downstream."""
    seen: list[tuple[int, int]] = []

    def collect(frame, batch_id: int) -> None:
        seen.extend((r["partition"], r["offset"]) for r in frame.select("partition", "offset").collect())

    query = (
        spark.readStream.format("tidewater-delta")
        .load(uri)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "the stream did not finish in time"
    finally:
        if query.isActive:
            query.stop()
    return seen


def test_stream_reader_does_not_reread_compacted_rows(spark, layout: PipelineLayout, tmp_path: Path) -> None:
    """A Delta stream that already processed the table sees compaction (and vacuum) as nothing new:
    no row reaches downstream twice; rows committed afterwards arrive exactly once."""
    bronze = make_bronze(layout, commits=5)
    checkpoint = tmp_path / "downstream-checkpoint"
    first = drain(spark, bronze.uri, checkpoint)
    assert sorted(first) == [(0, o) for o in range(150)]

    result = maintain_table(layout, "bronze", retention_hours=0, run_id="m", allow_short_retention=True)
    assert result.files_compacted == 5 and result.files_removed_by_vacuum == 5
    assert drain(spark, bronze.uri, checkpoint) == []

    make_bronze(layout, commits=2, first_batch=5)
    later = drain(spark, bronze.uri, checkpoint)
    assert sorted(later) == [(0, o) for o in range(150, 210)]
    downstream = first + later
    assert len(downstream) == len(set(downstream)) == bronze.row_count() == 210
