"""The class-data archive in use (tidewater.class_data): ``./tw`` built it before the tests, and the
driver JVM of a session maps it, so Spark's classes came from it rather than from the jars."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from tidewater import class_data


def test_the_sessions_jvm_maps_the_archive_the_bootstrap_built(spark: SparkSession) -> None:
    path = class_data.archive_path()
    assert path is not None and path.is_file(), f"no class-data archive at {path}: see ./tw's warning about it"
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    mapped = {line.split()[-1] for line in Path(f"/proc/{jvm}/maps").read_text().splitlines() if ".jsa" in line}
    assert str(path) in mapped, mapped  # HotSpot maps an archive it uses, and silently skips one it cannot
