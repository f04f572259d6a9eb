"""The Delta stream source's positions, on real Delta files (delta-rs, no Spark): where each reader stops,
that the prefetching reader keeps within its byte budget even inside a version, that both hold a row
bound (``maxRowsPerTrigger``), that a micro-batch re-read from its offsets is the one first read, and
that either reader resumes from the other's offsets."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from tidewater.connectors.delta import DeltaPrefetchingStreamReader, DeltaStreamReader, StreamPosition, read_files
from tidewater.errors import ConfigError
from tidewater.lake.tables import LakeTable, num_records_of

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32())])
DAY1, DAY2 = dt.date(2026, 11, 20), dt.date(2026, 11, 21)


def rows(ids: list[int], day: dt.date = DAY1) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "day": pa.array([day] * len(ids), pa.date32())}, schema=SCHEMA)


def ids(batches) -> list[int]:
    return sorted(i for batch in batches for i in batch.column("id").to_pylist())


@pytest.fixture
def table(tmp_path: Path) -> LakeTable:
    lake = LakeTable((tmp_path / "src").as_uri())
    lake.ensure(SCHEMA, partition_by=["day"])
    lake.append_arrow(rows([1, 2]))  # version 1: one file
    lake.append_arrow(pa.concat_tables([rows([3]), rows([4], DAY2)]))  # version 2: a file per day
    lake.append_arrow(rows([5]))  # version 3
    return lake


def readers(lake: LakeTable, max_bytes: int, **options: str) -> tuple[DeltaStreamReader, DeltaPrefetchingStreamReader]:
    follower = DeltaStreamReader(lake, LakeTable.arrow_schema(lake.open()), options)
    return follower, DeltaPrefetchingStreamReader(follower, max_bytes=max_bytes)


def drain(reader: DeltaPrefetchingStreamReader, start: dict) -> list[tuple[dict, dict, list[int]]]:
    """Read until the stream stands still: (start, end, ids) per micro-batch, each checked against its re-read."""
    out = []
    while True:
        batches, end = reader.read(start)
        got = ids(list(batches))
        if end == start:
            assert got == []
            return out
        assert ids(list(reader.readBetweenOffsets(start, end))) == got  # a restart re-plans the same rows
        out.append((start, end, got))
        start = end


def test_position_offsets_round_trip() -> None:
    for position in (StreamPosition(-1), StreamPosition(7), StreamPosition(7, 2), StreamPosition(7, 2, True)):
        assert StreamPosition.of(position.offset()) == position
    assert StreamPosition(7).offset() == {"version": 7}  # the form every earlier checkpoint holds
    assert StreamPosition(7, 2).offset() == {"version": 7, "file": 2}


def test_a_byte_budget_splits_the_snapshot_and_a_version_file_by_file(table: LakeTable) -> None:
    _, prefetching = readers(table, max_bytes=1)  # smaller than any file: one file per micro-batch
    first = drain(prefetching, prefetching.initialOffset())
    assert len(first) == 4 and all(len(got) in (1, 2) for _, _, got in first)  # the snapshot's 4 files
    assert sorted(i for _, _, got in first for i in got) == [1, 2, 3, 4, 5]
    assert [end for _, end, _ in first] == [
        {"version": 3, "file": 1, "snapshot": True},
        {"version": 3, "file": 2, "snapshot": True},
        {"version": 3, "file": 3, "snapshot": True},
        {"version": 3},
    ]

    table.append_arrow(pa.concat_tables([rows([6]), rows([7], DAY2)]))  # version 4: two files
    later = drain(prefetching, {"version": 3})
    assert [end for _, end, _ in later] == [{"version": 4, "file": 1}, {"version": 4}]
    assert sorted(i for _, _, got in later for i in got) == [6, 7]


def test_a_budget_that_fits_reads_everything_at_once(table: LakeTable) -> None:
    _, prefetching = readers(table, max_bytes=32 * 1024 * 1024)
    assert drain(prefetching, {"version": -1}) == [({"version": -1}, {"version": 3}, [1, 2, 3, 4, 5])]
    assert drain(prefetching, {"version": 1}) == [({"version": 1}, {"version": 3}, [3, 4, 5])]


def test_max_files_per_trigger_holds_for_the_prefetching_reader(table: LakeTable) -> None:
    _, prefetching = readers(table, max_bytes=32 * 1024 * 1024, maxFilesPerTrigger="2")
    batches = drain(prefetching, {"version": 0})  # version 1's file and one of version 2's, then the rest
    assert [end for _, end, _ in batches] == [{"version": 2, "file": 1}, {"version": 3}]
    assert [len(got) for _, _, got in batches] == [3, 2] and sorted(i for _, _, got in batches for i in got) == [
        1,
        2,
        3,
        4,
        5,
    ]


def test_commits_without_data_move_the_position_on(table: LakeTable) -> None:
    DeltaTable(table.uri).optimize.compact()  # version 4: dataChange=false
    follower, prefetching = readers(table, max_bytes=1)
    assert drain(prefetching, {"version": 3}) == [({"version": 3}, {"version": 4}, [])]
    assert follower.files_between({"version": 3}, {"version": 4}) == []


def test_the_executor_reader_resumes_from_a_prefetched_position(table: LakeTable) -> None:
    follower, prefetching = readers(table, max_bytes=1)
    _, middle = prefetching.read({"version": 1})
    assert middle == {"version": 2, "file": 1}
    assert follower.latestOffset(middle, ReadAllAvailable()) == {"version": 3}
    rest = [f for part in follower.partitions(middle, {"version": 3}) for f in part.files]
    taken = follower.files_between({"version": 1}, middle)
    assert len(taken) == 1 and len(rest) == 2 and not {f.uri for f in taken} & {f.uri for f in rest}
    assert ids(read_files(taken + rest, follower.schema)) == [3, 4, 5]


def follow(reader: DeltaStreamReader, start: dict, limit: ReadLimit) -> list[tuple[dict, list[int]]]:
    """Micro-batches as Spark plans them with the non-prefetching reader: (end, ids) each."""
    out = []
    while (end := reader.latestOffset(start, limit)) != start:
        out.append((end, ids(read_files(reader.files_between(start, end), reader.schema))))
        start = end
    return out


def test_a_row_bound_ends_a_micro_batch_with_the_file_that_reaches_it(table: LakeTable) -> None:
    follower, _ = readers(table, max_bytes=1, maxRowsPerTrigger="2")
    assert follower.getDefaultReadLimit() == ReadMaxRows(2)
    # version 1's file holds 2 rows; version 2's two files 1 each; version 3's 1
    assert follow(follower, {"version": 0}, ReadMaxRows(2)) == [
        ({"version": 1}, [1, 2]),
        ({"version": 2}, [3, 4]),
        ({"version": 3}, [5]),
    ]
    by_one = follow(follower, {"version": 0}, ReadMaxRows(1))  # inside version 2 too
    assert [end for end, _ in by_one] == [{"version": 1}, {"version": 2, "file": 1}, {"version": 2}, {"version": 3}]
    assert sorted(i for _, got in by_one for i in got) == [1, 2, 3, 4, 5]
    # Trigger.Once asks for everything: the bound does not hold it back
    assert follower.latestOffset({"version": 0}, ReadAllAvailable()) == {"version": 3}


def test_a_row_bound_splits_a_new_streams_snapshot(table: LakeTable) -> None:
    follower, _ = readers(table, max_bytes=1, maxRowsPerTrigger="3")
    batches = follow(follower, follower.initialOffset(), ReadMaxRows(3))
    assert len(batches) >= 2 and all(end.get("snapshot") for end, _ in batches[:-1])
    assert batches[-1][0] == {"version": 3}
    assert all(len(got) >= 3 for _, got in batches[:-1])  # each ends once it holds the bound
    assert sorted(i for _, got in batches for i in got) == [1, 2, 3, 4, 5]


def test_the_prefetching_reader_holds_the_row_bound(table: LakeTable) -> None:
    _, prefetching = readers(table, max_bytes=32 * 1024 * 1024, maxRowsPerTrigger="2")
    assert [(end, got) for _, end, got in drain(prefetching, {"version": 0})] == [
        ({"version": 1}, [1, 2]),
        ({"version": 2}, [3, 4]),
        ({"version": 3}, [5]),
    ]


def test_a_file_whose_rows_the_log_does_not_count_is_a_micro_batch_of_its_own(table: LakeTable) -> None:
    follower, _ = readers(table, max_bytes=1, maxRowsPerTrigger="1000")
    uncounted = [dataclasses.replace(f, num_records=None) for f in follower._added(2)]
    follower._added = lambda version: uncounted if version == 2 else DeltaStreamReader._added(follower, version)  # type: ignore[method-assign]
    assert [end for end, _ in follow(follower, {"version": 1}, ReadMaxRows(1000))] == [
        {"version": 2, "file": 1},
        {"version": 2},
        {"version": 3},
    ]


def test_bounds_must_be_whole_numbers_of_at_least_one(table: LakeTable) -> None:
    for bad in ("0", "-5", "many", "1.5"):
        with pytest.raises(ConfigError, match=f"maxRowsPerTrigger={bad!r} must be a whole number"):
            readers(table, max_bytes=1, maxRowsPerTrigger=bad)
    with pytest.raises(ConfigError, match="maxFilesPerTrigger='0'"):
        readers(table, max_bytes=1, maxFilesPerTrigger="0")


def test_num_records_of_reads_the_statistics_or_nothing() -> None:
    assert num_records_of('{"numRecords": 7, "minValues": {}}') == 7
    assert num_records_of(None) is None and num_records_of("") is None
    assert num_records_of("not json") is None and num_records_of("[1]") is None
    assert num_records_of('{"numRecords": "7"}') is None
