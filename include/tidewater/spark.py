"""The SparkSession every tidewater job uses, built from :class:`~tidewater.config.Settings`.

Local by default (``local[2]``), bound to 127.0.0.1, UTC session time zone (event times are
UTC end to end), RocksDB state store (state that survives restarts without holding it all on the
JVM heap), and the tidewater data sources registered.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from tidewater.config import Settings
from tidewater.processes import spark_child_env

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def prepare_environment(settings: Settings) -> None:
    """Environment the JVM and Python workers inherit: the venv interpreter, loopback, our settings."""
    os.environ.update(spark_child_env())
    os.environ.update(settings.to_env())


def build_session(settings: Settings, app_name: str = "tidewater") -> SparkSession:
    prepare_environment(settings)
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "false")  # small batches: planning cost beats AQE gains
        .config("spark.python.worker.reuse", "true")
        # Planner/lookup workers are needed at query start only: let idle ones go (memory).
        .config("spark.python.worker.idleTimeoutSeconds", "60")
        .config("spark.python.worker.killOnIdleTimeout", "true")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_data_sources(spark)
    return spark


def register_data_sources(spark: SparkSession) -> None:
    from tidewater.connectors.delta import DeltaDataSource
    from tidewater.connectors.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(DeltaDataSource)
