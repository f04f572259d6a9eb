"""A DataFrame collected in pieces (:func:`tidewater.lake.collect.to_arrow`) is the DataFrame collected whole."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import functions as F

from tidewater.lake.collect import to_arrow


def test_pieces_give_the_rows_schema_and_order_of_one_collect(spark) -> None:
    base = spark.range(0, 1000, numPartitions=4).select(
        "id",
        (F.col("id") % 3).cast("string").alias("k"),
        (F.lit(dt.datetime(2026, 11, 27, tzinfo=dt.UTC)) + F.expr("make_interval(0,0,0,0,0,0,id)")).alias("at"),
    )
    # skewed: one partition holds 700 rows, three hold 100
    frame = base.where("id < 700").coalesce(1).union(base.where("id >= 700").repartition(3))
    whole = frame.toArrow()
    pieces = to_arrow(frame, piece_rows=37)
    assert pieces.schema == whole.schema
    assert pieces.num_rows == 1000
    assert pieces.to_pylist() == whole.to_pylist()


def test_an_empty_frame_keeps_its_schema(spark) -> None:
    empty = spark.range(10).where("id < 0").withColumn("name", F.lit("x"))
    table = to_arrow(empty, piece_rows=3)
    assert table.num_rows == 0
    assert table.column_names == ["id", "name"]
