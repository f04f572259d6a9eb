"""Pieces of a collect (:func:`tidewater.lake.collect.piece_ranges`): every row in exactly one piece, none too big."""

from __future__ import annotations

from itertools import pairwise

import pytest

from tidewater.lake.collect import PARTITION_SHIFT, piece_ranges


def ids(counts: list[tuple[int, int]]) -> list[int]:
    return [(part << PARTITION_SHIFT) + i for part, rows in sorted(counts) for i in range(rows)]


@pytest.mark.parametrize(
    ("counts", "piece_rows"),
    [
        ([(0, 10)], 3),
        ([(0, 10)], 10),
        ([(0, 10)], 100),
        ([(1, 5), (0, 7), (3, 0), (4, 9)], 4),  # unsorted, an empty partition, a skewed one
        ([(0, 1), (1, 1), (2, 1)], 2),
        ([(0, 0)], 5),
        ([], 5),
    ],
)
def test_every_row_in_exactly_one_piece_of_at_most_piece_rows(counts: list[tuple[int, int]], piece_rows: int) -> None:
    ranges = piece_ranges(counts, piece_rows)
    all_ids = ids(counts)
    covered = [[row for row in all_ids if low <= row < high] for low, high in ranges]
    assert sorted(row for piece in covered for row in piece) == all_ids
    assert all(0 < len(piece) <= piece_rows for piece in covered)
    assert ranges == sorted(ranges)
    assert all(high <= next_low for (_, high), (next_low, _) in pairwise(ranges))


def test_fewest_pieces() -> None:
    # 23 rows over three partitions, 10 per piece: 3 pieces, the first two full
    ranges = piece_ranges([(0, 8), (1, 8), (2, 7)], 10)
    assert len(ranges) == 3
    sizes = [len([r for r in ids([(0, 8), (1, 8), (2, 7)]) if low <= r < high]) for low, high in ranges]
    assert sizes == [10, 10, 3]
