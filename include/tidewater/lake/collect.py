"""A Spark DataFrame's rows on the driver as one Arrow table, without the driver's JVM holding them all.

``DataFrame.toArrow`` makes each task's whole output one result that the driver's JVM fetches and
holds until Python has read it. A large result, or a skewed one (one partition holding most rows),
must then fit the driver's heap at once: a pageviews hour of 1M events joins into 3.6M gold rows,
and ``toArrow`` of them failed a 2g driver (``OutOfMemoryError`` fetching a task's result).

:func:`to_arrow` numbers the rows and caches them once (memory, spilling to disk), then fetches them
in ranges of those numbers, at most ``piece_rows`` rows per Spark job. A range prunes the cached
column batches by their statistics, so each piece reads little beyond itself. Python ends up with the
whole table, which is what the caller asked for; the JVM holds one piece at a time.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

PIECE_ROWS = 500_000
ROW_ID = "_tidewater_row_id"
# monotonically_increasing_id(): the partition's index in the upper 31 bits, the row's in the lower 33.
PARTITION_SHIFT = 33


def to_arrow(df: DataFrame, *, piece_rows: int = PIECE_ROWS) -> pa.Table:
    """All rows of ``df`` as an Arrow table (Spark's types, in ``df``'s row order), fetched in pieces."""
    if piece_rows < 1:
        raise ValueError(f"piece_rows must be at least 1, not {piece_rows}")
    numbered = df.withColumn(ROW_ID, F.monotonically_increasing_id()).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        part = F.shiftright(ROW_ID, PARTITION_SHIFT).alias("part")
        counts = [(int(r["part"]), int(r["count"])) for r in numbered.groupBy(part).count().collect()]
        ranges = piece_ranges(counts, piece_rows)
        if len(ranges) <= 1:  # one piece (or none): a plain collect from the cache
            return numbered.drop(ROW_ID).toArrow()
        pieces = [
            numbered.where((F.col(ROW_ID) >= low) & (F.col(ROW_ID) < high)).drop(ROW_ID).toArrow()
            for low, high in ranges
        ]
        return pa.concat_tables(pieces)
    finally:
        numbered.unpersist()


def piece_ranges(counts: Iterable[tuple[int, int]], piece_rows: int) -> list[tuple[int, int]]:
    """``[low, high)`` ranges of row ids, in id order, each holding at most ``piece_rows`` rows.

    ``counts`` are (partition index, rows) pairs; partition ``p``'s rows have the ids
    ``p << 33`` to ``(p << 33) + rows - 1``. A range may span several partitions (no ids lie between them).
    """
    ranges: list[tuple[int, int]] = []
    low: int | None = None
    taken = 0
    end = 0
    for partition, rows in sorted(counts):
        first = partition << PARTITION_SHIFT
        index = 0
        while index < rows:
            if low is None:
                low = first + index
            step = min(rows - index, piece_rows - taken)
            index += step
            taken += step
            end = first + index
            if taken == piece_rows:
                ranges.append((low, end))
                low, taken = None, 0
    if low is not None:
        ranges.append((low, end))
    return ranges
