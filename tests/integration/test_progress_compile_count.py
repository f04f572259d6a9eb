"""The compile count each progress record carries, read cheaply enough to be read on every event."""

from __future__ import annotations

from pyspark.sql import SparkSession

from tidewater.streaming import progress


def test_the_progress_records_compile_count_is_read_without_resolving_the_class_each_time(spark: SparkSession) -> None:
    """``codegen_compiles`` looks Spark's histogram up once per context: py4j resolves ``jvm.org.apache...``
    a package at a time, each a class lookup that misses and reads every jar, which on every progress
    event took ~15% of a core of a streaming job."""
    before = progress.codegen_compiles()
    held = progress._compile_histogram
    spark.range(5).selectExpr("id * 7 AS x").collect()  # a new plan: compiles at least one class
    after = progress.codegen_compiles()
    assert isinstance(before, int) and isinstance(after, int) and after > before
    assert held is not None and held[0] is spark.sparkContext
    assert progress._compile_histogram is held  # the same JVM object, not looked up again
