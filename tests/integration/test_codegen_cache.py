"""Spark keeps the code a stream reuses compiled while every micro-batch adds classes used only once."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from tidewater.streaming import progress

# One-off classes between two runs of the same plan: twice Spark's default cache (100 entries, four
# segments of 25), as a gold query's watermark predicates add them over a few minutes of triggers.
ONE_OFF_CLASSES = 200


def compile_on_the_driver(frame: DataFrame) -> None:
    """Generate and compile the frame's code without running a job (whole-stage codegen compiles
    its code on the driver before it builds the RDD)."""
    frame._jdf.queryExecution().executedPlan().execute()


def test_the_code_every_batch_reuses_is_not_compiled_again_after_many_one_off_classes(spark: SparkSession) -> None:
    """A literal in the code (a watermark) makes a class no later batch uses. With Spark's default
    cache such classes evicted the ones every batch reuses: ads compiled 6.4 classes per trigger."""
    reused = spark.range(10).selectExpr("id * 13 + 5 AS x").where("x % 3 = 1")
    assert len(reused.collect()) == 3  # compiled here, once
    before_one_off = progress.codegen_compiles()
    for watermark in range(ONE_OFF_CLASSES):
        compile_on_the_driver(spark.range(1).where(f"id <= {1_000_000 + watermark}L"))
    before = progress.codegen_compiles()
    assert isinstance(before, int) and isinstance(before_one_off, int)
    assert before - before_one_off >= ONE_OFF_CLASSES  # each watermark did compile a class of its own
    assert len(reused.collect()) == 3
    assert progress.codegen_compiles() == before  # the reused plan's code came from the cache
