"""The Delta stream source's positions, on real Delta files (delta-rs, no Spark): where each reader stops,
that the prefetching reader keeps within its byte budget even inside a version, that a micro-batch re-read
from its offsets is the one first read, and that either reader resumes from the other's offsets."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.datasource import ReadAllAvailable

from tidewater.connectors.delta import DeltaPrefetchingStreamReader, DeltaStreamReader, StreamPosition, read_files
from tidewater.lake.tables import LakeTable

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
