"""``StreamCompaction``: a stream writer's compaction of the tables it commits to, on real local Delta
tables (delta-rs, no Spark). Checked against the table's own log: the rows, the app transaction, what
each commit says it changed."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from tidewater.lake.compaction import StreamCompaction, compaction_plan
from tidewater.lake.tables import CommitResult, LakeTable

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32())])
TODAY, YESTERDAY = dt.date(2026, 11, 28), dt.date(2026, 11, 27)


def rows(first: int, count: int, day: dt.date) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(first, first + count), pa.int64()), "day": pa.array([day] * count, pa.date32())},
        schema=SCHEMA,
    )


@pytest.fixture
def table(tmp_path: Path) -> LakeTable:
    lake = LakeTable((tmp_path / "t").as_uri())
    lake.ensure(SCHEMA, partition_by=["day"])
    return lake


def commit(table: LakeTable, compaction: StreamCompaction, batch_id: int, day: dt.date = TODAY):
    """A micro-batch's append of 10 rows, then the writer's call, as the stream writers make them."""
    result = table.append_arrow(rows(batch_id * 10, 10, day), app_id="q", batch_id=batch_id)
    assert result.committed
    return compaction.after_commit(table, result)


def ids(table: LakeTable) -> list[int]:
    return sorted(table.open().to_pyarrow_table().column("id").to_pylist())


def live_files(table: LakeTable, day: dt.date) -> int:
    return sum(f.partition_values["day"] == day.isoformat() for f in table.files())


def test_every_nth_commit_compacts_the_partitions_that_gathered_small_files(table: LakeTable) -> None:
    compaction = StreamCompaction(every=5, query="q", stagger=False)
    rounds = [commit(table, compaction, batch_id) for batch_id in range(1, 5)]
    assert rounds == [None] * 4 and live_files(table, TODAY) == 4  # not due yet: the table is not even opened
    version = table.version()

    done = commit(table, compaction, 5)

    assert done is not None and (done.partitions, done.files_removed, done.files_added) == (1, 5, 1)
    assert live_files(table, TODAY) == 1
    assert ids(table) == list(range(10, 60))  # every row once
    assert table.committed_version("q") == 5  # the app transaction the stream resumes from
    assert table.version() == version + 2  # the batch's commit, then the compaction's
    actions = table.commit_actions(table.version())
    assert actions is not None
    changes = [action[kind] for action in actions for kind in ("add", "remove") if kind in action]
    assert len(changes) == 6 and all(change["dataChange"] is False for change in changes)  # streams skip it
    info = next(action["commitInfo"] for action in actions if "commitInfo" in action)
    assert info["operation"] == "OPTIMIZE" and info["tidewater.step"] == "compact"


def test_a_partition_with_fewer_small_files_than_every_is_left_alone(table: LakeTable) -> None:
    compaction = StreamCompaction(every=4, query="q", stagger=False)
    commit(table, compaction, 1, YESTERDAY)  # a late event's partition: one file
    rounds = [commit(table, compaction, batch_id) for batch_id in range(2, 5)]
    assert rounds[-1] is not None and rounds[-1].partitions == 0  # round 1: today 3 small files, yesterday 1
    assert (live_files(table, TODAY), live_files(table, YESTERDAY)) == (3, 1)

    rounds = [commit(table, compaction, batch_id) for batch_id in range(5, 9)]
    assert rounds[-1] is not None and (rounds[-1].partitions, rounds[-1].files_removed) == (1, 7)
    assert (live_files(table, TODAY), live_files(table, YESTERDAY)) == (1, 1)
    assert ids(table) == list(range(10, 90))


def test_files_at_the_target_size_are_not_rewritten(table: LakeTable) -> None:
    compaction = StreamCompaction(every=3, target_size=1 << 20, query="q", stagger=False)
    big = table.append_arrow(rows(1_000_000, 400_000, TODAY), app_id="q", batch_id=1)  # > 1 MiB of Parquet
    (large,) = table.files()
    assert large.size >= 1 << 20 and compaction.after_commit(table, big) is None
    for batch_id in range(2, 6):
        commit(table, compaction, batch_id)
    done = commit(table, compaction, 6)  # the second round: 5 small files, 1 full one

    assert done is not None and (done.files_removed, done.files_added) == (5, 1)
    assert large.uri in {f.uri for f in table.files()}  # the full file stays as it was
    assert compaction_plan(table.open(), 1 << 20) == []


def test_off_and_skipped_commits_do_nothing(table: LakeTable) -> None:
    off = StreamCompaction(every=0)
    for batch_id in range(1, 4):
        assert commit(table, off, batch_id) is None
    assert live_files(table, TODAY) == 3

    counting = StreamCompaction(every=2, query="q", stagger=False)
    skipped = CommitResult(False, table.version())  # a replayed batch the table held: no commit, no count
    assert counting.after_commit(table, skipped) is None and counting.after_commit(table, skipped) is None
    assert live_files(table, TODAY) == 3
    assert commit(table, counting, 4) is None
    assert commit(table, counting, 5) is not None and live_files(table, TODAY) == 1


def test_a_failed_round_is_logged_and_the_writer_goes_on(
    table: LakeTable, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    compaction = StreamCompaction(every=2, query="q", stagger=False)
    doomed = LakeTable((tmp_path / "doomed").as_uri())
    doomed.ensure(SCHEMA, partition_by=["day"])
    commit(doomed, compaction, 1)
    result = doomed.append_arrow(rows(20, 10, TODAY), app_id="q", batch_id=2)
    shutil.rmtree(tmp_path / "doomed")  # gone between its commit and its round: what a lost mount looks like

    with caplog.at_level(logging.WARNING, logger="tidewater.lake.compaction"):
        assert compaction.after_commit(doomed, result) is None  # the batch's commit stands: nothing raised
    assert "q: compaction of" in caplog.text and "left to the next round" in caplog.text

    commit(table, compaction, 1)
    assert commit(table, compaction, 2) is not None and live_files(table, TODAY) == 1


def test_tables_take_their_first_rounds_at_commits_of_their_own(tmp_path: Path) -> None:
    # A fixed folder: the first round is a hash of the URI, and 4 tables of a random folder share one of
    # 100 rounds about once in 17 runs (a temporary folder of a pytest worker did: [55, 17, 17, 41]).
    compaction = StreamCompaction(every=100, query="q")
    names = ("bronze", "silver", "quarantine", "conflicts")
    tables = [LakeTable(f"file:///tidewater/lake/live/q/{name}") for name in names]
    firsts = [compaction.commits_to_first_round(table) for table in tables]
    assert firsts == [65, 11, 66, 98], firsts  # crc32 of each URI, mod 100, plus 1: stable across runs
    assert firsts == [StreamCompaction(every=100).commits_to_first_round(table) for table in tables]  # per URI
    assert StreamCompaction(every=100, stagger=False).commits_to_first_round(tables[0]) == 100
    assert StreamCompaction(every=0).commits_to_first_round(tables[0]) == 0

    silver = LakeTable((tmp_path / "silver").as_uri())
    silver.ensure(SCHEMA, partition_by=["day"])
    compaction = StreamCompaction(every=4, query="q")
    first = compaction.commits_to_first_round(silver)
    rounds = [commit(silver, compaction, batch_id) for batch_id in range(1, first + 9)]
    due = [batch_id for batch_id, done in enumerate(rounds, start=1) if done is not None]
    assert due == [first, first + 4, first + 8]  # then every 4 commits


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="every >= 0"):
        StreamCompaction(every=-1)
    with pytest.raises(ValueError, match="target_size > 0"):
        StreamCompaction(every=1, target_size=0)
