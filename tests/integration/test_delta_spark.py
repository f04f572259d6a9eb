"""Spark <-> Delta through delta-rs, end to end: real local Spark, real Delta files, real moto S3.

Covers the batch reader (``read_table``: types, time travel, partition pruning), the Spark write
helpers with their (app_id, batch_id) idempotency, the ``tidewater-delta`` stream sink (including
a micro-batch that Spark re-executes after losing its checkpoint commit) and the Delta stream source.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType, TimestampType

from tidewater.errors import one_line
from tidewater.lake import writes
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable

pytestmark = pytest.mark.spark

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
    ]
)
SPARK_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("ts", TimestampType()),
        StructField("day", DateType()),
    ]
)
DAY1 = dt.date(2026, 11, 20)
DAY2 = dt.date(2026, 11, 21)
T0 = dt.datetime(2026, 11, 21, 10, 0, 0, tzinfo=dt.UTC)
QUERY_TIMEOUT_S = 120

Row = tuple[int, str, int, dt.date]


def expected(ids: list[int], day: dt.date = DAY1, name: str = "n") -> list[Row]:
    """Rows as :func:`content` returns them (ts as epoch micros, independent of time zones)."""
    return [(i, f"{name}{i}", int((T0 + dt.timedelta(seconds=i)).timestamp()) * 1_000_000, day) for i in ids]


def frame(spark: SparkSession, ids: list[int], day: dt.date = DAY1, name: str = "n") -> DataFrame:
    data = [(i, f"{name}{i}", T0 + dt.timedelta(seconds=i), day) for i in ids]
    return spark.createDataFrame(data, SPARK_SCHEMA)


def arrow(ids: list[int], day: dt.date = DAY1, name: str = "n") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"{name}{i}" for i in ids],
            "ts": pa.array([T0 + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "day": pa.array([day] * len(ids), pa.date32()),
        },
        schema=SCHEMA,
    )


def content(df: DataFrame) -> list[Row]:
    """A DataFrame's rows, sorted, with ts as epoch micros."""
    picked = df.select("id", "name", F.unix_micros("ts").alias("ts"), "day").collect()
    return sorted((r.id, r.name, r.ts, r.day) for r in picked)


def new_table(uri: str, *, partition_by: tuple[str, ...] = ("day",)) -> LakeTable:
    table = LakeTable(uri)
    table.ensure(SCHEMA, partition_by=partition_by)
    return table


def unique(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}-{uuid.uuid4().hex[:6]}").as_uri()


def finish(query: Any) -> None:
    """Wait for an availableNow query and re-raise its failure, if any."""
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish in time"
    finally:
        if query.isActive:
            query.stop()


def sink_stream(spark: SparkSession, source: str, target: str, checkpoint: Path, app_id: str) -> None:
    """Delta source -> tidewater-delta sink, one availableNow run."""
    query = (
        spark.readStream.format("tidewater-delta")
        .load(source)
        .writeStream.format("tidewater-delta")
        .option("appId", app_id)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(target)
    )
    finish(query)


def source_stream(spark: SparkSession, source: str, checkpoint: Path, **options: str) -> list[tuple[int, list[int]]]:
    """Run the Delta stream source once (availableNow); return (batch id, sorted ids) per non-empty batch."""
    batches: list[tuple[int, list[int]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        got = sorted(r.id for r in df.select("id").collect())
        if got:
            batches.append((batch_id, got))

    reader = spark.readStream.format("tidewater-delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(source)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    return batches


def flat(batches: list[tuple[int, list[int]]]) -> list[int]:
    return sorted(i for _, got in batches for i in got)


# ---- batch reads ------------------------------------------------------------------------------------


def test_read_table_round_trip_time_travel_and_pruning(spark: SparkSession, tmp_path: Path) -> None:
    """read_table = what was written (date partition column typed as date), old snapshots by version
    and by timestamp, and partition_filter reads only that partition's files."""
    table = new_table(unique(tmp_path, "read"))
    assert content(read_table(spark, table.uri)) == []  # empty table: empty frame with the schema
    v1 = writes.append(frame(spark, [1, 2], DAY1), table)
    time.sleep(0.05)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    writes.append(frame(spark, [3], DAY2), table)
    writes.overwrite_partitions(frame(spark, [4], DAY1), table, [("day", "=", "2026-11-20")])

    df = read_table(spark, table.uri)
    assert {f.name: f.dataType for f in df.schema.fields} == {f.name: f.dataType for f in SPARK_SCHEMA.fields}
    assert content(df) == expected([3], DAY2) + expected([4], DAY1)
    assert content(read_table(spark, table.uri, version=v1.version)) == expected([1, 2])
    assert content(read_table(spark, table.uri, timestamp=between)) == expected([1, 2])
    assert content(read_table(spark, table.uri, timestamp=between.isoformat())) == expected([1, 2])

    pruned = read_table(spark, table.uri, partition_filter={"day": ["2026-11-21"]})
    assert content(pruned) == expected([3], DAY2)
    assert pruned.inputFiles() and all("/day=2026-11-21/" in f for f in pruned.inputFiles())
    assert content(read_table(spark, table.uri, partition_filter={"day": ["1999-01-01"]})) == []


# ---- batch writes ---------------------------------------------------------------------------------------


def test_spark_writes_are_idempotent_per_batch_id(spark: SparkSession, tmp_path: Path) -> None:
    """append / overwrite_partitions / merge / replace_where from DataFrames; a repeated or older
    (app_id, batch_id) is skipped without writing."""
    table = new_table(unique(tmp_path, "writes"))

    first = writes.append(frame(spark, [1, 2], DAY1), table, app_id="job", batch_id=0)
    assert first.committed and first.rows == 2
    again = writes.append(frame(spark, [1, 2], DAY1), table, app_id="job", batch_id=0)
    assert not again.committed and again.version == first.version
    writes.append(frame(spark, [3, 4], DAY2), table, app_id="job", batch_id=1)
    assert content(read_table(spark, table.uri)) == expected([1, 2]) + expected([3, 4], DAY2)

    over = writes.overwrite_partitions(
        frame(spark, [5], DAY2, name="o"), table, [("day", "=", "2026-11-21")], app_id="job", batch_id=2
    )
    assert over.committed
    stale = writes.overwrite_partitions(
        frame(spark, [9], DAY2), table, [("day", "=", "2026-11-21")], app_id="job", batch_id=1
    )
    assert not stale.committed and stale.version == over.version
    assert content(read_table(spark, table.uri)) == expected([1, 2]) + expected([5], DAY2, "o")

    merged = writes.merge(
        frame(spark, [2, 6], DAY1, name="m").select("day", "ts", "name", "id"),
        table,
        keys=["id"],
        app_id="job",
        batch_id=3,
    )
    assert merged.committed
    assert not writes.merge(frame(spark, [7], DAY1), table, keys=["id"], app_id="job", batch_id=3).committed
    assert content(read_table(spark, table.uri)) == sorted(
        expected([1]) + expected([2, 6], DAY1, "m") + expected([5], DAY2, "o")
    )

    replaced = writes.replace_where(
        frame(spark, [8], DAY1, name="r"), table, "day = '2026-11-20'", app_id="job", batch_id=4
    )
    assert replaced.committed
    assert not writes.replace_where(
        frame(spark, [9], DAY1), table, "day = '2026-11-20'", app_id="job", batch_id=4
    ).committed
    assert content(read_table(spark, table.uri)) == expected([5], DAY2, "o") + expected([8], DAY1, "r")
    assert table.committed_version("job") == 4
    assert table.version() == replaced.version


# ---- the stream sink ---------------------------------------------------------------------------------------


def test_stream_sink_requires_app_id(spark: SparkSession, tmp_path: Path) -> None:
    """Without option appId the sink cannot make batches idempotent: the query fails with ConfigError."""
    source = new_table(unique(tmp_path, "src"))
    target = new_table(unique(tmp_path, "dst"))
    with pytest.raises(Exception) as info:  # raised at start() or by the query, depending on Spark's planner
        query = (
            spark.readStream.format("tidewater-delta")
            .load(source.uri)
            .writeStream.format("tidewater-delta")
            .option("checkpointLocation", str(tmp_path / "cp-no-app"))
            .trigger(availableNow=True)
            .start(target.uri)
        )
        finish(query)
    message = one_line(info.value)
    assert message.startswith("ConfigError:") and "appId" in message, message
    assert target.version() == 0


def test_stream_sink_and_reexecuted_micro_batch_is_a_noop(spark: SparkSession, tmp_path: Path) -> None:
    """The sink copies a Delta stream into a partitioned table. Spark re-runs a batch whose checkpoint
    commit is lost (same batch id, same offsets): the sink skips it, so the table keeps its version and
    has no duplicates; later input still flows."""
    source = new_table(unique(tmp_path, "src"))
    target = new_table(unique(tmp_path, "dst"))
    checkpoint = tmp_path / "cp-replay"
    writes.append(frame(spark, [1, 2], DAY1), source)
    writes.append(frame(spark, [3], DAY2), source)

    sink_stream(spark, source.uri, target.uri, checkpoint, "replay")
    want = expected([1, 2]) + expected([3], DAY2)
    assert content(read_table(spark, target.uri)) == want
    assert sorted(f.partition_values["day"] for f in target.files()) == ["2026-11-20", "2026-11-21"]
    assert target.committed_version("replay") == 0
    version = target.version()

    commits = checkpoint / "commits"
    assert sorted(p.name for p in commits.iterdir() if not p.name.startswith(".")) == ["0"]
    (commits / "0").unlink()  # as if the driver died between the Delta commit and Spark's checkpoint commit
    (commits / ".0.crc").unlink(missing_ok=True)

    sink_stream(spark, source.uri, target.uri, checkpoint, "replay")
    assert (commits / "0").exists(), "Spark did not re-execute batch 0"
    assert not (commits / "1").exists()
    assert target.version() == version
    assert content(read_table(spark, target.uri)) == want

    writes.append(frame(spark, [4], DAY2), source)
    sink_stream(spark, source.uri, target.uri, checkpoint, "replay")
    assert target.version() == version + 1 and target.committed_version("replay") == 1
    assert content(read_table(spark, target.uri)) == want + expected([4], DAY2)


# ---- the stream source ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", ["false", "true"])
def test_stream_source_is_incremental_across_restarts(spark: SparkSession, tmp_path: Path, prefetch: str) -> None:
    """First batch = the whole snapshot (even after a remove commit in history); a restart from the
    checkpoint reads only the rows appended since; startingVersion=latest skips existing data. The same
    with each micro-batch read ahead on the driver (``prefetch``, what TIDEWATER_GOLD_PREFETCH turns on for gold)."""
    source = new_table(unique(tmp_path, "src"))
    source.merge(arrow([1, 2]), keys=["id"])
    source.replace_where(arrow([1, 2, 3]), "day = '2026-11-20'")  # removes files: fine before the stream starts
    writes.append(frame(spark, [4], DAY2), source)

    checkpoint = tmp_path / "cp-incr"
    first = source_stream(spark, source.uri, checkpoint, prefetch=prefetch)
    assert len(first) == 1 and flat(first) == [1, 2, 3, 4]

    writes.append(frame(spark, [5, 6]), source)
    writes.append(frame(spark, [7], DAY2), source)
    again = source_stream(spark, source.uri, checkpoint, prefetch=prefetch)
    assert flat(again) == [5, 6, 7] and again[0][0] == 1

    latest_cp = tmp_path / "cp-latest"
    assert source_stream(spark, source.uri, latest_cp, startingVersion="latest", prefetch=prefetch) == []
    writes.append(frame(spark, [8]), source)
    assert flat(source_stream(spark, source.uri, latest_cp, startingVersion="latest", prefetch=prefetch)) == [8]


@pytest.mark.parametrize("prefetch", ["false", "true"])
def test_stream_source_bounds_micro_batches_in_rows(spark: SparkSession, tmp_path: Path, prefetch: str) -> None:
    """maxRowsPerTrigger (what gold's silver reads get: TIDEWATER_GOLD_MAX_ROWS_PER_TRIGGER) ends a
    micro-batch with the data file that brings it to the bound, from the log's row counts."""
    source = new_table(unique(tmp_path, "src"), partition_by=())
    for ids in ([1, 2], [3], [4, 5, 6], [7]):  # versions 1..4
        source.append_arrow(arrow(ids))
    batches = source_stream(
        spark, source.uri, tmp_path / "cp-rows", startingVersion="1", maxRowsPerTrigger="3", prefetch=prefetch
    )
    assert batches == [(0, [1, 2, 3]), (1, [4, 5, 6]), (2, [7])]


@pytest.mark.parametrize("prefetch", ["false", "true"])
def test_stream_source_change_commits_compaction_and_max_files(
    spark: SparkSession, tmp_path: Path, prefetch: str
) -> None:
    """maxFilesPerTrigger splits a backlog into batches; compaction (dataChange=false) re-emits nothing;
    a commit that removes data fails the stream with a one-line DeltaSourceError unless skipChangeCommits."""
    source = new_table(unique(tmp_path, "src"), partition_by=())
    for i in (1, 2, 3):  # versions 1..3, one file each
        writes.append(frame(spark, [i]), source)
    checkpoint = tmp_path / "cp-strict"
    batches = source_stream(
        spark, source.uri, checkpoint, startingVersion="1", maxFilesPerTrigger="1", prefetch=prefetch
    )
    assert batches == [(0, [1]), (1, [2]), (2, [3])]

    DeltaTable(source.uri).optimize.compact()  # version 4: dataChange=false
    assert source.version() == 4 and len(source.files()) == 1
    writes.append(frame(spark, [4]), source)  # version 5
    assert source_stream(spark, source.uri, checkpoint, maxFilesPerTrigger="1", prefetch=prefetch) == [(3, [4])]

    source.replace_where(arrow([4], name="r"), "id = 4")  # version 6 removes a file
    writes.append(frame(spark, [5]), source)  # version 7
    with pytest.raises(Exception) as info:
        source_stream(spark, source.uri, checkpoint, prefetch=prefetch)
    message = one_line(info.value)
    assert message.startswith("DeltaSourceError:") and "skipChangeCommits" in message, message
    assert "version 6" in message and "\n" not in message

    skipped = source_stream(
        spark, source.uri, tmp_path / "cp-skip", startingVersion="5", skipChangeCommits="true", prefetch=prefetch
    )
    assert flat(skipped) == [4, 5]  # the replace_where commit (a second id 4) is skipped, not emitted


def test_prefetched_stream_keeps_its_budget_and_replays_a_batch_it_lost(spark: SparkSession, tmp_path: Path) -> None:
    """``prefetchMaxBytes`` splits a new stream's snapshot file by file (Trigger.AvailableNow runs on until
    the end); a micro-batch that ran but whose checkpoint commit was lost is re-planned by a restarted
    query, which no longer holds its prefetch: Spark reads it from its offsets in a Python task, the same rows."""
    source = new_table(unique(tmp_path, "src"), partition_by=())
    for i in (1, 2, 3):
        writes.append(frame(spark, [i]), source)
    checkpoint = tmp_path / "cp-prefetch"
    batches = source_stream(spark, source.uri, checkpoint, prefetch="true", prefetchMaxBytes="1")
    assert [batch for batch, _ in batches] == [0, 1, 2] and flat(batches) == [1, 2, 3]

    commits = checkpoint / "commits"
    (commits / "2").unlink()  # as if the driver died after the batch, before Spark's checkpoint commit
    (commits / ".2.crc").unlink(missing_ok=True)
    again = source_stream(spark, source.uri, checkpoint, prefetch="true", prefetchMaxBytes="1")
    assert again == [batches[-1]] and (commits / "2").exists()


# ---- S3 (moto) --------------------------------------------------------------------------------------------------


def test_s3_round_trip(spark: SparkSession, s3_lake_uri: str, tmp_path: Path) -> None:
    """On s3:// (moto): LakeTable.ensure, writes.append and the stream sink write; read_table (python
    data source) and the Delta stream source read back the same content."""
    target = new_table(f"{s3_lake_uri}/events")
    writes.append(frame(spark, [1, 2], DAY1), target)

    source = new_table(unique(tmp_path, "src"))
    writes.append(frame(spark, [3], DAY2), source)
    sink_stream(spark, source.uri, target.uri, tmp_path / "cp-s3-sink", "to-s3")

    want = expected([1, 2]) + expected([3], DAY2)
    df = read_table(spark, target.uri)
    assert {f.name: f.dataType for f in df.schema.fields} == {f.name: f.dataType for f in SPARK_SCHEMA.fields}
    assert content(df) == want
    assert content(read_table(spark, target.uri, version=1)) == expected([1, 2])
    assert content(read_table(spark, target.uri, partition_filter={"day": ["2026-11-21"]})) == expected([3], DAY2)
    assert content(read_table(spark, target.uri, partition_filter={"day": ["1999-01-01"]})) == []  # no file: no rows
    assert flat(source_stream(spark, target.uri, tmp_path / "cp-s3-source")) == [1, 2, 3]
    assert from_arrow_schema(LakeTable.arrow_schema(target.open())) == df.schema


def test_partition_values_needing_escapes(spark: SparkSession, s3_lake_uri: str, tmp_path: Path) -> None:
    """String partition values with spaces, %, :, / round-trip through writes.append and read_table
    (Spark's Parquet reader on file://, the python data source on s3://), partition_filter included,
    and through the Delta stream source."""
    tags = ["a b%c:d/e", "50%25", "plain"]
    df = spark.createDataFrame([(i, tag) for i, tag in enumerate(tags)], "id long, tag string")
    schema = pa.schema([("id", pa.int64()), ("tag", pa.string())])
    for uri in (unique(tmp_path, "escaped"), f"{s3_lake_uri}/escaped"):
        table = LakeTable(uri)
        table.ensure(schema, partition_by=["tag"])
        writes.append(df, table)
        got = sorted((r.id, r.tag) for r in read_table(spark, uri).collect())
        assert got == list(enumerate(tags)), uri
        picked = read_table(spark, uri, partition_filter={"tag": ["a b%c:d/e"]}).collect()
        assert [(r.id, r.tag) for r in picked] == [(0, "a b%c:d/e")], uri
    assert flat(source_stream(spark, uri, tmp_path / "cp-escaped")) == [0, 1, 2]
