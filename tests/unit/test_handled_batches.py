"""``HandledBatches``: which batch a stream writer may take as not yet committed without opening the
table, on a real local Delta table (no Spark). Every answer is checked against the table's own."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tidewater.lake.tables import LakeTable
from tidewater.streaming.writers import HandledBatches

SCHEMA = pa.schema([("id", pa.int64())])


class CountingTable(LakeTable):
    """A LakeTable that counts how often it is asked whether it holds a batch."""

    asked = 0

    def already_committed(self, app_id: str, batch_id: int, table=None) -> bool:  # type: ignore[override]
        self.asked += 1
        return super().already_committed(app_id, batch_id, table)


def commit(table: CountingTable, batch_id: int, *, app_id: str = "q") -> None:
    """Commit a batch of one row; the commit's own look at the table is not counted."""
    asked = table.asked
    assert table.append_arrow(pa.table({"id": [batch_id]}, schema=SCHEMA), app_id=app_id, batch_id=batch_id).committed
    table.asked = asked


def test_the_batch_after_a_handled_one_is_not_asked_of_the_table(tmp_path: Path) -> None:
    table = CountingTable(str(tmp_path / "t"))
    table.ensure(SCHEMA)
    commit(table, 0)
    handled = HandledBatches("q")

    assert handled.holds(table, 0) and table.asked == 1  # the first batch after a start: the table says
    handled.handled([table], 0)
    assert not handled.holds(table, 1) and table.asked == 1  # Spark runs 1 only after 0: not opened
    assert not LakeTable(table.uri).already_committed("q", 1)  # and the table agrees
    commit(table, 1)
    handled.handled([table], 1)

    table.asked = 0
    assert handled.holds(table, 1) and table.asked == 1  # a re-run of the last batch: asked, and held
    assert not handled.holds(table, 3) and table.asked == 2  # a gap: asked


def test_after_a_failure_every_table_is_asked_again(tmp_path: Path) -> None:
    """A commit that raised may have landed: forget() makes the next batch look."""
    tables = [CountingTable(str(tmp_path / name)) for name in ("a", "b")]
    for table in tables:
        table.ensure(SCHEMA)
    handled = HandledBatches("q")
    handled.handled(tables, 4)
    commit(tables[0], 5)  # batch 5 landed in one table, then its writer failed
    handled.forget()

    assert handled.holds(tables[0], 5) and not handled.holds(tables[1], 5)
    assert [table.asked for table in tables] == [1, 1]


def test_another_app_ids_commits_do_not_count(tmp_path: Path) -> None:
    table = CountingTable(str(tmp_path / "t"))
    table.ensure(SCHEMA)
    commit(table, 9, app_id="recompute")
    assert not HandledBatches("q").holds(table, 9) and table.asked == 1
