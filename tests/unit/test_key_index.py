"""The stream's de-duplication index of silver keys (tidewater.lake.key_index) against the full scan
it replaces (LakeTable.lookup): same rows, whatever files were added, compacted away or left out for
the bound, while reading each file's key column once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tidewater.lake import key_index
from tidewater.lake.key_index import KeyIndex, key_hashes
from tidewater.lake.tables import LakeTable

SCHEMA = pa.schema([("event_id", pa.string()), ("n", pa.int64()), ("day", pa.string())])


def batch(first: int, count: int, day: str = "2026-11-26") -> pa.Table:
    ids = [f"e{i}" for i in range(first, first + count)]
    return pa.table({"event_id": ids, "n": list(range(first, first + count)), "day": [day] * count}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path: Path) -> LakeTable:
    table = LakeTable(f"file://{tmp_path}/silver")
    table.ensure(SCHEMA, partition_by=["day"])
    return table


def same_rows(index: KeyIndex, table: LakeTable, keys: list[str]) -> list[dict]:
    """The index's answer, after checking it equals the full scan's."""
    wanted = pa.array(keys)
    got = index.lookup(wanted).sort_by("event_id")
    expected = table.lookup("event_id", wanted).sort_by("event_id").select(got.column_names)
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()
    return got.to_pylist()


def test_it_answers_as_the_full_scan_reading_each_file_once(table: LakeTable, monkeypatch) -> None:
    monkeypatch.setattr(key_index, "MERGE_AT", 4)  # several merges of recent files in this test
    index = KeyIndex(table, "event_id")
    for i in range(11):
        table.append_arrow(batch(i * 10, 10, day=f"2026-11-{20 + i % 3}"))
        found = same_rows(index, table, [f"e{i * 10}", f"e{i * 10 + 9}", "e3", "missing", f"e{i * 10 + 10}"])
        assert {row["event_id"] for row in found} == {f"e{i * 10}", f"e{i * 10 + 9}", "e3"}
        assert index.files_read == i + 1  # one new file per append, read once
    assert index.keys_held == 110
    assert same_rows(index, table, ["e55"]) == [{"event_id": "e55", "n": 55, "day": "2026-11-22"}]
    assert index.lookup(pa.array([], pa.string())).num_rows == 0
    assert index.lookup(pa.array(["e1", None])).column("event_id").to_pylist() == ["e1"]
    narrow = index.lookup(pa.array(["e1"]), columns=["event_id"])
    assert narrow.column_names == ["event_id"]


def test_files_that_leave_the_table_leave_the_index(table: LakeTable, monkeypatch) -> None:
    """An overwrite (a recompute of a day) removes files: their keys stop matching, the new file's match."""
    monkeypatch.setattr(key_index, "MERGE_AT", 2)
    index = KeyIndex(table, "event_id")
    for i in range(6):
        table.append_arrow(batch(i * 5, 5, day="2026-11-20" if i < 3 else "2026-11-21"))
        same_rows(index, table, ["e0"])
    table.replace_where(batch(100, 3, day="2026-11-20"), "day = '2026-11-20'")
    assert same_rows(index, table, ["e0", "e14", "e15", "e101"]) == [
        {"event_id": "e101", "n": 101, "day": "2026-11-20"},
        {"event_id": "e15", "n": 15, "day": "2026-11-21"},
    ]
    assert index.keys_held == 3 + 15


def test_past_its_bound_the_oldest_files_are_scanned(table: LakeTable) -> None:
    index = KeyIndex(table, "event_id", max_keys=25)
    for i in range(5):
        table.append_arrow(batch(i * 10, 10))
        same_rows(index, table, ["e0", f"e{i * 10 + 5}"])
        assert index.keys_held <= 25
    assert index.keys_held == 20  # the two newest files; the three oldest are read at each lookup
    assert same_rows(index, table, ["e0", "e25", "e49", "x"]) and index.files_read == 5
    assert KeyIndex(table, "event_id", max_keys=0).lookup(pa.array(["e7"])).column("n").to_pylist() == [7]


def test_equal_keys_hash_equally_whatever_their_arrow_type() -> None:
    text = ["a", "bb", "ccc"]
    hashes = key_hashes(pa.array(text))
    assert (key_hashes(pa.array(text, pa.large_string())) == hashes).all()
    assert (key_hashes(pa.array(text, pa.string_view())) == hashes).all()
    assert (key_hashes(pa.array([1, 2, 3], pa.int32())) == key_hashes(pa.array([1, 2, 3], pa.int64()))).all()
    assert len(key_hashes(pa.array(["a", None]))) == 1
    assert len(set(key_hashes(pa.array([f"k{i}" for i in range(10_000)])).tolist())) == 10_000


def test_a_key_hashes_the_same_in_any_array_that_holds_it() -> None:
    """The index compares hashes taken from different arrays (a file's keys, a batch's): the hash of a
    value cannot depend on its neighbours' widths, its array's offset or chunks."""
    uuids = [f"{i:08x}-b45e-41f0-b139-d32c93cd59bf" for i in range(1000)]  # one width: the reshaped path
    odd = ["", "a", "é" * 9, "x" * 100, "12345678", "123456789", "a\x00"]
    one_width = key_hashes(pa.array(uuids))
    mixed = key_hashes(pa.array(odd + uuids))
    assert (mixed[len(odd) :] == one_width).all()
    assert (key_hashes(pa.array(odd + uuids).slice(len(odd) + 10, 5)) == one_width[10:15]).all()
    assert (key_hashes(pa.chunked_array([uuids[:3], odd, uuids[3:6]]))[:3] == one_width[:3]).all()
    assert len(set(mixed.tolist())) == len(odd) + len(uuids)  # trailing NULs and lengths tell apart
    assert key_hashes(pa.array([], pa.string())).shape == (0,)


def test_sorted_lookups_agree_with_sets() -> None:
    rng = np.random.default_rng(5)
    for size, other in [(0, 5), (3, 1000), (1000, 3), (500, 500)]:
        probe = key_index.sorted_unique(rng.integers(0, 2_000, size).astype(np.uint64))
        held = np.sort(rng.integers(0, 2_000, other).astype(np.uint64))  # repeats: one hash in several files
        assert (probe == np.unique(probe)).all()
        assert key_index._any_in(probe, np.unique(held)) == bool(set(probe.tolist()) & set(held.tolist()))
        lo, hi = key_index._matching(held, probe)
        found = sorted(v for start, stop in zip(lo, hi, strict=True) for v in held[start:stop].tolist())
        assert found == sorted(v for v in held.tolist() if v in set(probe.tolist()))


def test_keys_of_many_widths_are_hashed_in_bounded_parts(monkeypatch) -> None:
    """Mixed widths gather each value's bytes through an index 8x their size: in parts, not at once."""
    values = pa.array([f"k{i}" + "x" * (i % 50) for i in range(3_000)])
    whole = key_hashes(values)
    monkeypatch.setattr(key_index, "GATHER_BYTES", 64)
    assert (key_hashes(values) == whole).all()
    assert len(set(whole.tolist())) == 3_000
