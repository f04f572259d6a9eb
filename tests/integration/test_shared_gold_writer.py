"""One query, several gold tables: the tagged micro-batch is split back into each table's rows, and
each table's commit is skipped or made on its own, so a crash between two tables heals on re-run.

Real Spark (the suite's session) and real Delta tables; the micro-batches are batch DataFrames, as
foreachBatch hands them over.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import functions as F

from tidewater import transforms
from tidewater.lake.tables import LakeTable
from tidewater.pipelines.base import Projection
from tidewater.streaming.writers import GoldWriter, SharedGoldWriter

T0 = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.UTC)


def projection(name: str, key: str) -> Projection:
    return Projection(name=name, description=name, keys=(key,), build=lambda silver: silver, time_column="at")


def frames(spark):
    views = spark.createDataFrame(
        [("v1", T0, "/pricing"), ("v2", T0 + dt.timedelta(minutes=1), "/docs")],
        "view_id string, at timestamp, page string",
    )
    signups = spark.createDataFrame([("s1", T0, 3)], "signup_id string, at timestamp, plan int")
    status = {"status": F.lit("provisional"), "revision": F.lit(0).cast("int")}
    return {"views": views.withColumns(status), "signups": signups.withColumns(status)}


def test_a_tagged_union_splits_back_into_each_outputs_own_rows(spark):
    outputs = frames(spark)
    rows = transforms.tagged_union(outputs).toArrow()
    assert rows.num_rows == 3
    for name, frame in outputs.items():
        own = transforms.untagged(rows, name)
        assert own.schema.names == frame.columns
        assert own.to_pylist() == frame.toArrow().to_pylist()
    empty = transforms.untagged(rows.slice(0, 0), "signups")
    assert empty.num_rows == 0 and empty.schema.names == ["signup_id", "at", "plan", "status", "revision"]


def test_each_table_commits_once_and_a_table_missing_a_batch_gets_it_on_re_run(spark, tmp_path):
    outputs = frames(spark)
    tables = {name: LakeTable(str(tmp_path / name)) for name in outputs}
    for name, frame in outputs.items():
        tables[name].ensure(pa.schema([f.with_nullable(True) for f in frame.toArrow().schema]))
    writers = [
        GoldWriter(projection("views", "view_id"), table=tables["views"], app_id="app", query="q"),
        GoldWriter(projection("signups", "signup_id"), table=tables["signups"], app_id="app", query="q"),
    ]
    shared = SharedGoldWriter(writers, query="q")
    tagged = transforms.tagged_union(outputs)

    shared(tagged, 0)
    assert sorted(r["view_id"] for r in tables["views"].open().to_pyarrow_table().to_pylist()) == ["v1", "v2"]
    assert [r["plan"] for r in tables["signups"].open().to_pyarrow_table().to_pylist()] == [3]
    versions = {name: table.version() for name, table in tables.items()}
    shared(tagged, 0)  # Spark re-runs a batch after a crash: every table holds it, nothing is written
    assert {name: table.version() for name, table in tables.items()} == versions

    # A crash after the views' commit of batch 1, before the signups': the re-run writes signups only.
    writers[0].commit_rows(transforms.untagged(tagged.toArrow(), "views"), 1)
    views_version = tables["views"].version()
    shared(tagged, 1)
    assert tables["views"].version() == views_version
    assert tables["signups"].version() == versions["signups"] + 1
    assert tables["signups"].already_committed("app", 1)
    assert tables["signups"].open().to_pyarrow_table().num_rows == 1  # merged on its key, not appended twice
