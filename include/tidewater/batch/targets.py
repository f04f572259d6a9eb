"""Where a bounded job writes: the live namespace or a sandbox, its tables, and what each commit says.

A sandbox is just another namespace: its own tables, ledger and locks under
``<lake>/<sandbox>/<pipeline>`` and ``<checkpoints>/<sandbox>/<pipeline>/_locks``, so nothing a
sandbox job does can touch a live table or block a live writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession

from tidewater.batch.interval import Interval
from tidewater.errors import ConfigError
from tidewater.pipelines.layout import PipelineLayout
from tidewater.times import iso


def ensure_tables(spark: SparkSession, layout: PipelineLayout, names: Sequence[str]) -> None:
    """Create the tables a job writes if they are missing, with the pipeline's schemas and the
    partitioning the stream uses (see ``PipelineStreams.ensure_tables``); check them if present."""
    pipeline = layout.pipeline
    schemas = pipeline.schemas(spark)
    for name in names:
        layout.table(name).ensure(
            schemas[name], partition_by=pipeline.partitioning(name), description=f"{pipeline.name} {name}"
        )


def commit_metadata(
    *, run_id: str, mode: str, interval: Interval, source: str, entities: Sequence[Any] = ()
) -> dict[str, str]:
    """Recorded in every commit of the job, so a table's history says which run changed what and why."""
    meta = {
        "tidewater.run_id": run_id,
        "tidewater.mode": mode,
        "tidewater.interval_start": iso(interval.start),
        "tidewater.interval_end": iso(interval.end),
        "tidewater.source": source,
    }
    if entities:
        meta["tidewater.entities"] = ",".join(str(e) for e in entities)
    return meta


def check_run_id(run_id: str) -> str:
    """The run id labels every commit and ledger entry, and makes a retried run's ledger entries idempotent."""
    if not run_id or not run_id.strip():
        raise ConfigError("a batch run needs a run id (--run-id): it labels every commit and ledger entry")
    return run_id.strip()
