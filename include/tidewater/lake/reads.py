"""Delta tables into Spark DataFrames, at the current version or by time travel.

On file:// the snapshot's file list goes to Spark's own Parquet reader (fast, column pruning,
predicate push-down), with ``basePath`` so Hive-style partition directories become columns; the
Delta log decides which files are live, never a directory listing (old versions stay on disk).
Elsewhere (s3://, where the JVM has no S3 file system without hadoop-aws) the ``tidewater-delta``
Python data source reads the same file list with pyarrow.
"""

from __future__ import annotations

import datetime as dt
import json
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from tidewater.lake.storage import is_s3
from tidewater.lake.tables import DataFile, LakeTable


def read_table(
    spark: SparkSession,
    uri: str,
    *,
    version: int | None = None,
    timestamp: dt.datetime | str | None = None,
    partition_filter: dict[str, list[str]] | None = None,
) -> DataFrame:
    """The table as a DataFrame; ``partition_filter`` ({column: [values]}) prunes whole files."""
    table = LakeTable(uri)
    if is_s3(uri):
        reader = spark.read.format("tidewater-delta")
        if partition_filter:
            reader = reader.option("partitionFilter", json.dumps(partition_filter))
        if version is not None:
            reader = reader.option("versionAsOf", str(version))
        if timestamp is not None:
            reader = reader.option("timestampAsOf", _iso(timestamp))
        return reader.load(uri)
    snapshot = table.open(version=version, timestamp=timestamp)
    schema = from_arrow_schema(LakeTable.arrow_schema(snapshot))
    # DataFile.uri is a URI (the log's percent-encoded path); Hadoop paths are literal strings.
    files = [unquote(f.uri) for f in select_files(table.files(version=int(snapshot.version())), partition_filter)]
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", unquote(table.uri)).parquet(*files)


def select_files(files: list[DataFile], partition_filter: dict[str, list[str]] | None) -> list[DataFile]:
    if not partition_filter:
        return files
    wanted = {column: set(values) for column, values in partition_filter.items()}
    return [f for f in files if all(f.partition_values.get(c) in v for c, v in wanted.items())]


def _iso(value: dt.datetime | str) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else value
