"""Executor-side data files and driver-side Delta commits on real local Delta tables (no Spark).

Table content is read back with delta-rs' own reader (``DeltaTable.to_pyarrow_table``), an
independent check of what our add actions and commits put into the log.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, Transaction

from tidewater.errors import LakePathError, one_line
from tidewater.lake.files import HIVE_NULL, MAX_STRING_STAT, file_stats, write_data_files
from tidewater.lake.tables import LakeTable

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
    ]
)
DAY1 = dt.date(2026, 11, 20)
DAY2 = dt.date(2026, 11, 21)
T0 = dt.datetime(2026, 11, 21, 10, 0, 0, tzinfo=dt.UTC)


def make_batch(ids: list[int], day: dt.date | None = DAY1, name: str = "n") -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{name}{i}" for i in ids], pa.string()),
            "ts": pa.array([T0 + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "day": pa.array([day] * len(ids), pa.date32()),
        },
        schema=SCHEMA,
    )


def rows(uri: str, version: int | None = None) -> list[dict[str, Any]]:
    """The snapshot's rows through delta-rs' reader, sorted by id."""
    table = DeltaTable(uri, version=version).to_pyarrow_table()
    return sorted(table.select(SCHEMA.names).to_pylist(), key=lambda r: r["id"])


def ids(uri: str, version: int | None = None) -> list[int]:
    return [r["id"] for r in rows(uri, version)]


@pytest.fixture
def table(lake_uri: str) -> LakeTable:
    """An empty table partitioned by day."""
    lake = LakeTable(f"{lake_uri}/events")
    lake.ensure(SCHEMA, partition_by=["day"])
    return lake


def append(lake: LakeTable, batch: pa.RecordBatch, **kwargs: Any):
    return lake.commit_files(write_data_files(lake.uri, [batch], schema=SCHEMA, partition_by=["day"]), **kwargs)


# ---- write_data_files / file_stats ---------------------------------------------------------------


def test_unpartitioned_files_hold_all_columns_and_exact_stats(lake_uri: str) -> None:
    """Without partitions: one file at the table root with every column and right numRecords/nullCount."""
    batch = pa.record_batch(
        {
            "id": pa.array([3, 1, None, 7], pa.int64()),
            "name": pa.array(["b", None, None, "a"]),
            "ts": pa.array([T0, None, T0, T0], pa.timestamp("us", tz="UTC")),
            "day": pa.array([DAY1, DAY2, DAY1, None], pa.date32()),
        },
        schema=SCHEMA,
    )
    root = Path(lake_uri.removeprefix("file://")) / "plain"
    actions = write_data_files(f"{lake_uri}/plain", [batch, batch.slice(0, 0)], schema=SCHEMA)

    assert len(actions) == 1
    action = actions[0]
    assert "/" not in action["path"] and action["path"].endswith(".snappy.parquet")
    assert action["partition_values"] == {}
    path = root / action["path"]
    assert action["size"] == path.stat().st_size
    assert pq.read_table(path).to_pylist() == pa.Table.from_batches([batch]).to_pylist()
    stats = json.loads(action["stats"])
    assert stats["numRecords"] == 4
    assert stats["nullCount"] == {"id": 1, "name": 2, "ts": 1, "day": 1}
    assert stats["minValues"]["id"] == 1 and stats["maxValues"]["id"] == 7
    assert stats["minValues"]["name"] == "a" and stats["maxValues"]["name"] == "b"
    assert stats["minValues"]["day"] == "2026-11-20" and stats["maxValues"]["day"] == "2026-11-21"


def test_partitioned_files_land_under_hive_dirs_without_partition_columns(lake_uri: str) -> None:
    """Files go to day=<value> (and the Hive null dir); the partition column lives only in the add action."""
    uri = f"{lake_uri}/parted"
    root = Path(uri.removeprefix("file://"))
    batches = [make_batch([1, 2], DAY1), make_batch([3], DAY2), make_batch([4], None), make_batch([5], DAY1)]
    actions = write_data_files(uri, batches, schema=SCHEMA, partition_by=["day"])

    by_day = {a["partition_values"]["day"]: a for a in actions}
    assert len(actions) == 3  # buffered per partition value: day1's two batches make one file
    assert set(by_day) == {"2026-11-20", "2026-11-21", None}
    assert by_day["2026-11-20"]["path"].startswith("day=2026-11-20/")
    assert by_day["2026-11-21"]["path"].startswith("day=2026-11-21/")
    assert by_day[None]["path"].startswith(f"day={HIVE_NULL}/")
    for action in actions:
        data = pq.read_table(root / action["path"])
        assert data.column_names == ["id", "name", "ts"]
    day1 = pq.read_table(root / by_day["2026-11-20"]["path"])
    assert sorted(day1["id"].to_pylist()) == [1, 2, 5]
    assert json.loads(by_day["2026-11-20"]["stats"])["numRecords"] == 3
    assert "day" not in json.loads(by_day["2026-11-20"]["stats"])["nullCount"]


def test_partition_values_needing_escapes_make_a_readable_table(lake_uri: str) -> None:
    """Values with spaces, %, :, / (and timestamps) get Spark-escaped directory names, one level per
    column, and a log path any Delta reader (here delta-rs) resolves to the file."""
    schema = pa.schema([("id", pa.int64()), ("tag", pa.string()), ("at", pa.timestamp("us", tz="UTC"))])
    lake = LakeTable(f"{lake_uri}/escaped")
    lake.ensure(schema, partition_by=["tag", "at"])
    tags = ["a b%c:d/e", "50%25", "plain", None]
    batch = pa.record_batch(
        {
            "id": pa.array(range(4), pa.int64()),
            "tag": tags,
            "at": pa.array([T0] * 4, pa.timestamp("us", tz="UTC")),
        },
        schema=schema,
    )
    actions = write_data_files(lake.uri, [batch], schema=schema, partition_by=["tag", "at"])
    paths = {a["partition_values"]["tag"]: a["path"] for a in actions}
    assert paths["a b%c:d/e"].startswith("tag=a b%25c%3Ad%2Fe/at=2026-11-21 10%3A00%3A00.000000/")
    assert paths["50%25"].startswith("tag=50%2525/")
    assert {a["partition_values"]["at"] for a in actions} == {"2026-11-21 10:00:00.000000"}
    root = Path(lake.uri.removeprefix("file://"))
    assert all((root / p).is_file() and p.count("/") == 2 for p in paths.values())
    lake.commit_files(actions)
    got = DeltaTable(lake.uri).to_pyarrow_table().sort_by("id").to_pylist()
    assert [(r["id"], r["tag"], r["at"]) for r in got] == [(i, t, T0) for i, t in enumerate(tags)]
    assert sorted((f.partition_values["tag"] or "") for f in lake.files()) == sorted((t or "") for t in tags)


def test_max_rows_per_file_splits(lake_uri: str) -> None:
    """A partition with more rows than max_rows_per_file becomes several files, each with its own stats."""
    actions = write_data_files(f"{lake_uri}/split", [make_batch(list(range(10)))], schema=SCHEMA, max_rows_per_file=4)
    assert [json.loads(a["stats"])["numRecords"] for a in actions] == [4, 4, 2]


def test_timestamp_bounds_are_widened_to_whole_ms() -> None:
    """min is floored, max is ceiled to the millisecond, so the bounds always contain the data."""
    lo = dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=dt.UTC)
    hi = dt.datetime(2026, 11, 21, 10, 0, 5, 999001, tzinfo=dt.UTC)
    table = pa.table({"ts": pa.array([hi, lo, None], pa.timestamp("us", tz="UTC"))})
    stats = json.loads(file_stats(table))
    assert stats["minValues"]["ts"] == "2026-11-21T10:00:00.123Z"
    assert stats["maxValues"]["ts"] == "2026-11-21T10:00:06.000Z"
    assert stats["nullCount"]["ts"] == 1

    def parse(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

    assert parse(stats["minValues"]["ts"]) <= lo and parse(stats["maxValues"]["ts"]) >= hi

    exact = dt.datetime(2026, 11, 21, 10, 0, 0, 250000, tzinfo=dt.UTC)  # already whole ms: unchanged
    stats = json.loads(file_stats(pa.table({"ts": pa.array([exact], pa.timestamp("us", tz="UTC"))})))
    assert stats["minValues"]["ts"] == stats["maxValues"]["ts"] == "2026-11-21T10:00:00.250Z"

    before_epoch = dt.datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=dt.UTC)
    stats = json.loads(file_stats(pa.table({"ts": pa.array([before_epoch], pa.timestamp("us", tz="UTC"))})))
    assert stats["minValues"]["ts"] == "1969-12-31T23:59:59.999Z"
    assert stats["maxValues"]["ts"] == "1970-01-01T00:00:00.000Z"


def test_long_strings_get_no_bounds_and_all_null_columns_get_none() -> None:
    """A string longer than MAX_STRING_STAT would need truncated (unsafe) bounds: none are written."""
    long = "z" * (MAX_STRING_STAT + 1)
    table = pa.table(
        {
            "short": pa.array(["b", "a"]),
            "long": pa.array(["a", long]),
            "empty": pa.array([None, None], pa.int64()),
        }
    )
    stats = json.loads(file_stats(table))
    assert stats["minValues"] == {"short": "a"} and stats["maxValues"] == {"short": "b"}
    assert stats["nullCount"] == {"short": 0, "long": 0, "empty": 2}
    edge = "y" * MAX_STRING_STAT  # exactly at the limit still has bounds
    assert json.loads(file_stats(pa.table({"s": [edge]})))["maxValues"] == {"s": edge}


# ---- LakeTable: commits, idempotency ----------------------------------------------------------------


def test_commit_files_appends_and_reads_back(table: LakeTable) -> None:
    """Committed files are the snapshot: rows, partition values, row count from stats."""
    result = append(table, make_batch([1, 2], DAY1))
    assert result.committed and result.version == 1 and result.files == 1 and result.rows == 2
    append(table, make_batch([3], DAY2))
    assert ids(table.uri) == [1, 2, 3]
    assert rows(table.uri)[2]["day"] == DAY2
    assert sorted(f.partition_values["day"] for f in table.files()) == ["2026-11-20", "2026-11-21"]
    assert table.row_count() == 3
    assert table.version() == 2


def test_commit_files_skips_same_and_older_batch_ids(table: LakeTable) -> None:
    """(app_id, batch_id) already recorded -> no commit; older -> no commit; newer -> commits."""
    first = append(table, make_batch([1]), app_id="q1", batch_id=5)
    assert first.committed and table.committed_version("q1") == 5

    replay = append(table, make_batch([1]), app_id="q1", batch_id=5)
    assert replay == type(replay)(False, first.version)
    older = append(table, make_batch([2]), app_id="q1", batch_id=3)
    assert not older.committed and older.version == first.version
    assert table.version() == first.version
    assert table.committed_version("q1") == 5  # delta-rs would have moved it back to 3 (see below)
    assert ids(table.uri) == [1]

    other_app = append(table, make_batch([7]), app_id="q2", batch_id=0)
    assert other_app.committed  # ids are per app
    newer = append(table, make_batch([3]), app_id="q1", batch_id=6)
    assert newer.committed and newer.version == first.version + 2
    assert table.committed_version("q1") == 6 and table.committed_version("q2") == 0
    assert ids(table.uri) == [1, 3, 7]
    txns = [a["txn"] for a in table.commit_actions(newer.version) or [] if "txn" in a]
    assert [(t["appId"], t["version"]) for t in txns] == [("q1", 6)]


def test_delta_rs_alone_moves_txn_version_backwards(table: LakeTable) -> None:
    """Why the check is ours: delta-rs itself records an older batch id over a newer one."""
    append(table, make_batch([1]), app_id="q", batch_id=5)
    raw = table.open()
    action = write_data_files(table.uri, [make_batch([2])], schema=SCHEMA, partition_by=["day"])[0]
    raw.create_write_transaction(
        [
            AddAction(
                path=action["path"],
                size=action["size"],
                partition_values=action["partition_values"],
                modification_time=action["modification_time"],
                data_change=True,
                stats=action["stats"],
            )
        ],
        mode="append",
        schema=raw.schema(),
        partition_by=["day"],
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="q", version=3)]),
    )
    assert table.committed_version("q") == 3


def test_empty_append_commits_nothing(table: LakeTable) -> None:
    """No files and mode append: no empty commit."""
    result = table.commit_files([], app_id="q", batch_id=0)
    assert not result.committed and table.version() == 0


def test_overwrite_with_partition_filters_replaces_exactly_that_partition(table: LakeTable) -> None:
    """mode=overwrite + partition_filters swaps one day and leaves the others alone."""
    append(table, make_batch([1, 2], DAY1))
    append(table, make_batch([10, 11], DAY2))
    staged = write_data_files(table.uri, [make_batch([20], DAY2, name="new")], schema=SCHEMA, partition_by=["day"])
    result = table.commit_files(
        staged, mode="overwrite", partition_filters=[("day", "=", "2026-11-21")], app_id="recompute", batch_id=1
    )
    assert result.committed
    got = rows(table.uri)
    assert [r["id"] for r in got] == [1, 2, 20]
    assert got[2]["name"] == "new20" and got[2]["day"] == DAY2
    assert ids(table.uri, version=2) == [1, 2, 10, 11]  # the old snapshot is still there
    removes = [a["remove"] for a in table.commit_actions(result.version) or [] if "remove" in a]
    assert len(removes) == 1 and removes[0]["path"].startswith("day=2026-11-21/")
    again = table.commit_files(
        staged, mode="overwrite", partition_filters=[("day", "=", "2026-11-21")], app_id="recompute", batch_id=1
    )
    assert not again.committed and table.version() == result.version


def test_append_arrow_commits_once_and_reports_its_version(table: LakeTable) -> None:
    """The version a driver-side append reports is the one the log ends at; a replay is skipped."""
    source = pa.Table.from_batches([make_batch([1, 2])])
    first = table.append_arrow(source, app_id="a", batch_id=0)
    assert first.committed and first.rows == 2 and first.version == DeltaTable(table.uri).version() == 1
    assert table.append_arrow(source, app_id="a", batch_id=0) == type(first)(False, 1)
    assert not table.append_arrow(source.slice(0, 0), app_id="a", batch_id=1).committed  # nothing to commit
    assert ids(table.uri) == [1, 2]


def test_merge_upserts(table: LakeTable) -> None:
    """merge on id: matched rows are updated, new ones inserted; a replayed batch id is skipped."""
    append(table, make_batch([1, 2, 3]))
    source = pa.Table.from_batches([make_batch([2, 4], name="upd")])
    result = table.merge(source, keys=["id"], app_id="m", batch_id=0)
    assert result.committed and result.rows == 2
    assert result.version == DeltaTable(table.uri).version() == 2  # the version the log ends at now
    assert [(r["id"], r["name"]) for r in rows(table.uri)] == [(1, "n1"), (2, "upd2"), (3, "n3"), (4, "upd4")]
    replay = table.merge(source, keys=["id"], app_id="m", batch_id=0)
    assert not replay.committed and replay.version == result.version


def test_merge_insert_only(table: LakeTable) -> None:
    """update=False: existing keys keep their values, only new keys are inserted."""
    append(table, make_batch([1, 2]))
    source = pa.Table.from_batches([make_batch([2, 3], name="upd")])
    # a source with columns in another order is aligned to the table schema
    source = source.select(["name", "id", "day", "ts"])
    result = table.merge(source, keys=["id"], update=False)
    assert result.committed
    assert [(r["id"], r["name"]) for r in rows(table.uri)] == [(1, "n1"), (2, "n2"), (3, "upd3")]


def test_merge_deletes_keys_in_the_same_commit(table: LakeTable) -> None:
    """delete=: rows with those keys go, the upsert still applies, one commit; no helper column is left."""
    append(table, make_batch([1, 2, 3]))
    before = table.version()
    source = pa.Table.from_batches([make_batch([2, 4], name="upd")])
    result = table.merge(source, keys=["id"], delete=pa.table({"id": pa.array([3, 9], pa.int64())}))
    assert result.committed and result.version == before + 1
    assert [(r["id"], r["name"]) for r in rows(table.uri)] == [(1, "n1"), (2, "upd2"), (4, "upd4")]
    assert DeltaTable(table.uri).schema().to_arrow().names == source.schema.names


def test_merge_reads_only_the_files_its_range_keys_reach(lake_uri: str) -> None:
    """range_keys: the source's least..greatest of a key bounds the target side, so the merge skips
    the files outside (delta-rs prunes none on the equality alone), with the same result."""
    results = {}
    for bounded in (False, True):
        lake = LakeTable(f"{lake_uri}/gold-{bounded}")
        lake.ensure(SCHEMA)
        for first in (0, 100, 200):  # three files, ts 100 seconds apart
            lake.append_arrow(pa.Table.from_batches([make_batch([first, first + 1])]))
        # updates at the range's two ends, an insert between: the files of ts 0-1 cannot match
        source = pa.Table.from_batches([make_batch([101, 150, 200], name="upd")])
        result = lake.merge(source, keys=["ts", "id"], range_keys=["ts"] if bounded else ())
        results[bounded] = [(r["id"], r["name"]) for r in rows(lake.uri)]
        assert result.files_read == (2 if bounded else 3)
    assert results[True] == results[False]
    assert {(101, "upd101"), (150, "upd150"), (200, "upd200")} <= set(results[True]) and len(results[True]) == 7


def test_a_range_key_must_be_a_merge_key(table: LakeTable) -> None:
    with pytest.raises(ValueError, match="must be among the merge keys"):
        table.merge(pa.Table.from_batches([make_batch([1])]), keys=["id"], range_keys=["ts"])


def test_replace_where(table: LakeTable) -> None:
    """Rows matching the predicate are replaced atomically; other rows stay."""
    append(table, make_batch([1, 2], DAY1))
    append(table, make_batch([3, 4], DAY2))
    source = pa.Table.from_batches([make_batch([30], DAY2, name="r")])
    result = table.replace_where(source, "day = '2026-11-21'", app_id="rw", batch_id=7)
    assert result.committed and table.committed_version("rw") == 7
    assert result.version == DeltaTable(table.uri).version() == 3
    assert [(r["id"], r["name"]) for r in rows(table.uri)] == [(1, "n1"), (2, "n2"), (30, "r30")]
    assert not table.replace_where(source, "day = '2026-11-21'", app_id="rw", batch_id=7).committed


def test_files_time_travel_by_version_and_timestamp(table: LakeTable) -> None:
    """files() at an older version / timestamp is that snapshot's file list, not a directory listing."""
    append(table, make_batch([1]))
    time.sleep(0.05)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    append(table, make_batch([2], DAY2))
    assert len(table.files()) == 2
    assert len(table.files(version=0)) == 0
    old = table.files(version=1)
    assert [f.partition_values for f in old] == [{"day": "2026-11-20"}]
    assert old[0].num_records == 1 and old[0].uri.startswith(table.uri + "/day=2026-11-20/")
    assert table.files(timestamp=between) == old
    assert table.files(timestamp=between.isoformat()) == old
    assert table.open(timestamp=between).version() == 1


def test_commit_actions(table: LakeTable) -> None:
    """The raw actions of one commit, or None for a version that does not exist."""
    append(table, make_batch([1, 2]), app_id="a", batch_id=0, metadata={"tidewater.query": "q"})
    actions = table.commit_actions(1)
    assert actions is not None
    kinds = [next(iter(a)) for a in actions]
    assert kinds.count("add") == 1 and "commitInfo" in kinds and "txn" in kinds
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info.get("tidewater.query") == "q"
    assert table.commit_actions(0) is not None
    assert table.commit_actions(2) is None


# ---- LakeTable: paths and schemas ---------------------------------------------------------------------


def test_ensure_is_idempotent_and_rejects_another_schema(table: LakeTable) -> None:
    """ensure() on an existing table keeps it; a schema with columns the table lacks is a one-line error."""
    assert table.ensure(SCHEMA, partition_by=["day"]).version() == 0
    other = pa.schema([("id", pa.int64()), ("venue", pa.string())])
    with pytest.raises(LakePathError) as info:
        table.ensure(other)
    message = one_line(info.value)
    assert message.startswith("LakePathError:") and "venue" in message and "\n" not in message


def test_unwritable_lake_path_is_one_line_lake_path_error(tmp_path: Path) -> None:
    """A lake root under a regular file (a path nobody can create) -> LakePathError, one line."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    for uri in (f"{blocker.as_uri()}/lake/events", blocker.as_uri()):
        with pytest.raises(LakePathError) as info:
            LakeTable(uri).ensure(SCHEMA)
        message = one_line(info.value)
        assert message.startswith("LakePathError: cannot create table") and "\n" not in message, message


def test_open_missing_table_is_one_line_lake_path_error(tmp_path: Path) -> None:
    """Reading a table that is not there (or under a regular file) says so in one line."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for uri in ((tmp_path / "nothing").as_uri(), f"{blocker.as_uri()}/t", blocker.as_uri()):
        with pytest.raises(LakePathError) as info:
            LakeTable(uri).open()
        assert "\n" not in one_line(info.value)
    assert not LakeTable((tmp_path / "nothing").as_uri()).exists()
