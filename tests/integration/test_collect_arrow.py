"""A DataFrame collected in pieces (:func:`tidewater.lake.collect.to_arrow`) holds the rows of one collect."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F

from tidewater.lake.collect import to_arrow


def sorted_rows(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def test_pieces_hold_every_row_once_with_the_schema_of_one_collect(spark) -> None:
    base = spark.range(0, 1000, numPartitions=4).select(
        "id",
        (F.col("id") % 3).cast("string").alias("k"),
        (F.lit(dt.datetime(2026, 11, 27, tzinfo=dt.UTC)) + F.expr("make_interval(0,0,0,0,0,0,id)")).alias("at"),
        F.create_map(F.lit("id"), F.col("id")).alias("tags"),  # a map is not hashable: left out of the hash
    )
    # skewed: one partition holds 700 rows, three hold 100
    frame = base.where("id < 700").coalesce(1).union(base.where("id >= 700").repartition(3)).localCheckpoint()
    whole = frame.toArrow()
    pieces = to_arrow(frame, piece_rows=37)
    assert pieces.schema == whole.schema
    assert pieces.num_rows == 1000
    assert sorted_rows(pieces) == sorted_rows(whole)


def test_a_frame_of_one_piece_keeps_its_order(spark) -> None:
    frame = spark.range(0, 50, numPartitions=3).orderBy(F.col("id").desc())
    assert to_arrow(frame, piece_rows=50).column("id").to_pylist() == list(range(49, -1, -1))


def test_an_empty_frame_keeps_its_schema(spark) -> None:
    empty = spark.range(10).where("id < 0").withColumn("name", F.lit("x"))
    table = to_arrow(empty, piece_rows=3)
    assert table.num_rows == 0
    assert table.column_names == ["id", "name"]


def test_a_piece_size_below_one_is_refused(spark) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        to_arrow(spark.range(3), piece_rows=0)
