"""A gold query over two inputs waits for the slower one: no input running ahead makes another's events late.

ads' click-through rate counts a union of impressions and clicks in 5-minute windows. Its two
silver tables are written by two source queries that drain at their own pace (a backlog of clicks is
a tenth of the impressions'), so the gold query can see clicks of 10:30 before impressions of 10:05.
With one watermark over the union those impressions were behind it and dropped as late (a fresh-
clone suite once found a window with 56 impressions of 81). Each input is now watermarked on its own
before the union (:func:`tidewater.transforms.watermarked_union`): Spark's watermark is the slowest
input's. Real Spark, the real Delta stream source and the runner's own input frames
(:func:`tidewater.streaming.runner.gold_inputs`); the silver rows are written with delta-rs in the
order that used to lose events. And a gold input reads a silver backlog in bounded slices.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from tidewater.config import Settings
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.runner import gold_inputs

ADS = get_pipeline("ads")
DAY = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)


def at(hhmm: str) -> dt.datetime:
    hours, minutes = hhmm.split(":")
    return DAY.replace(hour=int(hours), minute=int(minutes))


def silver_rows(layout: PipelineLayout, source: str, times: list[dt.datetime], campaign: str) -> pa.Table:
    """Silver rows of ``source`` with the columns gold reads set, the rest null."""
    spec = ADS.source(source)
    schema = LakeTable.arrow_schema(layout.source_table(spec, "silver").open())
    ingest = dt.datetime.now(dt.UTC)  # events long before their arrival: never held as ahead of the clock
    n = len(times)
    ids = [f"{source}-{uuid.uuid4().hex}" for _ in times]
    values: dict[str, list[Any]] = {
        spec.key: ids,
        spec.event_time: times,
        "campaign_id": [campaign] * n,
        "ingest_time": [ingest] * n,
        "impression_id": ids if source == "impressions" else [f"never-shown-{i}" for i in ids],
    }
    columns = [pa.array(values.get(f.name, [None] * n), type=f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def with_silver(spark: SparkSession, settings: Settings, name: str) -> PipelineLayout:
    """``name``'s layout with its (empty) silver tables."""
    pipeline = get_pipeline(name)
    layout = PipelineLayout.of(settings, pipeline)
    schemas = pipeline.schemas(spark)
    for source in pipeline.sources:
        table = pipeline.table_of(source, "silver")
        layout.table(table).ensure(schemas[table], partition_by=pipeline.partitioning(table))
    return layout


def test_clicks_running_ahead_do_not_make_impressions_late(spark, tmp_path):
    layout = with_silver(spark, Settings(state_dir=str(tmp_path / "state")), "ads")
    gold = ADS.gold_table("ctr_per_campaign")
    clicks, impressions = (layout.source_table(ADS.source(name), "silver") for name in ("clicks", "impressions"))
    emitted: list[dict[str, Any]] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        emitted.extend(row.asDict() for row in batch.collect())

    gold_query = layout.gold_query_of(gold.name)
    query = (
        gold_query.rows(gold_inputs(spark, layout, gold_query))
        .writeStream.outputMode(gold.output_mode)
        .foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        # The clicks' query is 25 minutes ahead; the impressions' has written nothing yet.
        clicks.append_arrow(silver_rows(layout, "clicks", [at("10:30"), at("10:31")], "c1"))
        query.processAllAvailable()
        impressions.append_arrow(silver_rows(layout, "impressions", [at("10:05")] * 3 + [at("10:06")], "c1"))
        query.processAllAvailable()
        # Then both move on, far enough to close the 10:05 window on either input.
        impressions.append_arrow(silver_rows(layout, "impressions", [at("10:40")], "c1"))
        clicks.append_arrow(silver_rows(layout, "clicks", [at("10:41")], "c1"))
        query.processAllAvailable()
    finally:
        query.stop()

    latest = {(r["window_start"], r["campaign_id"]): r for r in emitted}  # update mode: the last is the row
    naive = {key: row for (start, campaign), row in latest.items() for key in [(start.replace(tzinfo=None), campaign)]}
    early = naive[(at("10:05").replace(tzinfo=None), "c1")]
    assert (early["impressions"], early["clicks"]) == (4, 0), early
    ahead = naive[(at("10:30").replace(tzinfo=None), "c1")]
    assert (ahead["impressions"], ahead["clicks"]) == (0, 2), ahead


def test_a_gold_query_reads_a_silver_backlog_in_slices(spark, tmp_path):
    """TIDEWATER_GOLD_MAX_ROWS_PER_TRIGGER bounds each gold micro-batch's silver rows (the Delta source's
    soft ``maxRowsPerTrigger``: a micro-batch ends with the file that reaches it), so a query catching
    up on a backlog never holds all of it at once."""
    layout = with_silver(spark, Settings(state_dir=str(tmp_path / "state"), gold_max_rows_per_trigger=3), "ads")
    impressions = layout.source_table(ADS.source("impressions"), "silver")
    for minute in ("10:01", "10:02", "10:03"):  # a backlog of three commits of two rows each
        impressions.append_arrow(silver_rows(layout, "impressions", [at(minute)] * 2, "c1"))
    sizes: list[int] = []
    gold_query = layout.gold_query_of(ADS.gold_table("ctr_per_campaign").name)
    query = (
        gold_inputs(spark, layout, gold_query)["impressions"]
        .writeStream.foreachBatch(lambda batch, _id: sizes.append(batch.count()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    assert sizes == [4, 2]  # two files reach the bound of 3, the third is the next micro-batch
