"""Stream-stream joins on Spark's join state format 4 (see :data:`tidewater.spark.JOIN_STATE_FORMAT`).

Format 4 is behind a Spark flag in 4.2, so what the platform relies on is tested here on a real join
(:func:`tidewater.transforms.bounded_join`, as ads' gold uses it): a new checkpoint gets format 4,
its state survives a restart (a click matches an impression of the run before), a left row nobody
matched comes out once the watermark passes its bound, and a checkpoint started on format 2 (before
the platform chose 4) goes on in format 2 with its state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from tidewater.spark import JOIN_STATE_FORMAT, JOIN_STATE_FORMAT_KEY
from tidewater.transforms import bounded_join

IMPRESSION_DDL = "impression_id STRING, shown_at TIMESTAMP"
CLICK_DDL = "click_id STRING, clicked_impression_id STRING, clicked_at TIMESTAMP"


@pytest.fixture
def join_format(spark: SparkSession) -> Iterator[None]:
    """Leaves the shared session's join format as the platform set it."""
    yield
    spark.conf.set(JOIN_STATE_FORMAT_KEY, JOIN_STATE_FORMAT[JOIN_STATE_FORMAT_KEY])


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _joined(spark: SparkSession, root: Path) -> DataFrame:
    shown = spark.readStream.schema(IMPRESSION_DDL).json(str(root / "impressions"))
    clicked = spark.readStream.schema(CLICK_DDL).json(str(root / "clicks"))
    return bounded_join(
        shown,
        clicked,
        left_time="shown_at",
        right_time="clicked_at",
        key=("impression_id", "clicked_impression_id"),
        bound="10 minutes",
        watermark="2 minutes",
    ).select("impression_id", "click_id")


def _run(spark: SparkSession, root: Path) -> set[tuple[str, str | None]]:
    """One availableNow run of the join from the checkpoint under ``root``: the rows it emitted."""
    out: list[tuple[str, str | None]] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        out.extend((row.impression_id, row.click_id) for row in batch.collect())

    query = (
        _joined(spark, root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    return set(out)


def _checkpoint_format(root: Path) -> str:
    offsets = [p for p in (root / "checkpoint" / "offsets").iterdir() if p.name.isdigit()]
    newest = max(offsets, key=lambda p: int(p.name))
    return json.loads(newest.read_text().splitlines()[1])["conf"][JOIN_STATE_FORMAT_KEY]


def _impression(impression_id: str, minute: int) -> dict:
    return {"impression_id": impression_id, "shown_at": f"2026-11-29T10:{minute:02d}:00Z"}


def _click(click_id: str, impression_id: str, minute: int) -> dict:
    at = f"2026-11-29T10:{minute:02d}:01Z"
    return {"click_id": click_id, "clicked_impression_id": impression_id, "clicked_at": at}


def _first_then_second_run(spark: SparkSession, root: Path) -> tuple[set, set]:
    _write(root / "impressions", "a", [_impression("i1", 0), _impression("i2", 0)])
    _write(root / "clicks", "a", [_click("c0", "nobody", 0)])
    first = _run(spark, root)
    spark.conf.set(
        JOIN_STATE_FORMAT_KEY, JOIN_STATE_FORMAT[JOIN_STATE_FORMAT_KEY]
    )  # the platform's format from here on
    # i1 is clicked in the second run; i2 never. Events 20 minutes on move the watermark past i2's bound.
    _write(root / "clicks", "b", [_click("c1", "i1", 3), _click("c9", "x", 20)])
    _write(root / "impressions", "b", [_impression("i9", 20)])
    second = _run(spark, root)
    return first, second


def test_a_new_checkpoint_joins_on_format_4_and_its_state_survives_a_restart(spark, tmp_path, join_format):
    first, second = _first_then_second_run(spark, tmp_path)
    assert _checkpoint_format(tmp_path) == "4"
    assert first == set()  # nothing matched yet, nothing closed
    second |= _run(spark, tmp_path)  # the watermark the second run reached, applied
    assert ("i1", "c1") in second  # the impression came from the state the first run left
    assert ("i2", None) in second  # unclicked, emitted once the watermark passed its bound
    assert not {row for row in second if row[0] == "i1" and row[1] is None}  # a clicked one never as unclicked


def test_a_checkpoint_started_on_format_2_goes_on_in_format_2_with_its_state(spark, tmp_path, join_format):
    spark.conf.set(JOIN_STATE_FORMAT_KEY, "2")
    first, second = _first_then_second_run(spark, tmp_path)
    second |= _run(spark, tmp_path)
    assert _checkpoint_format(tmp_path) == "2"
    assert first == set()
    assert {("i1", "c1"), ("i2", None)} <= second
