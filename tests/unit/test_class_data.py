"""The class-data archive's name, options and check (tidewater.class_data), on a fake JDK and Spark;
the real JVM only where a JVM's verdict is the point (a truncated archive)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tidewater import class_data


@pytest.fixture
def installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A fake JAVA_HOME and SPARK_HOME, and an empty archive folder."""
    java_home, spark_home = tmp_path / "jdk", tmp_path / "spark"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("#!/bin/sh\n")
    (spark_home / "jars").mkdir(parents=True)
    for jar in ("spark-core.jar", "spark-sql.jar"):
        (spark_home / "jars" / jar).write_bytes(b"PK" + jar.encode())
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    monkeypatch.setattr(class_data, "ARCHIVE_DIR", tmp_path / "class-data")
    return java_home, spark_home


def test_the_archive_is_named_after_the_jvm_and_the_jars(installs: tuple[Path, Path]) -> None:
    java_home, spark_home = installs
    first = class_data.archive_path()
    assert first is not None and first.parent == class_data.ARCHIVE_DIR and first.suffix == ".jsa"
    assert class_data.archive_path() == first  # stable
    (spark_home / "jars" / "spark-sql.jar").write_bytes(b"PK another build")
    second = class_data.archive_path()
    assert second != first  # a changed jar: another archive
    os.utime(java_home / "bin" / "java", ns=(1, 1))
    assert class_data.archive_path() not in (first, second)  # another JVM: another archive


def test_no_archive_no_options_and_no_java_or_spark_no_archive(
    installs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert class_data.java_options() == []
    path = class_data.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert class_data.java_options() == [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    monkeypatch.setenv("SPARK_HOME", str(installs[1] / "missing"))
    assert class_data.archive_path() is None and class_data.java_options() == []
    monkeypatch.setenv("JAVA_HOME", str(installs[0] / "missing"))
    assert class_data.archive_path() is None


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM")
def test_a_truncated_archive_is_refused_before_any_jvm_maps_it(tmp_path: Path) -> None:
    """A JVM aborts on a truncated archive (measured: JDK 17), so build() renames one into place only
    after a JVM started on it. A small real archive (``java -version``'s classes), whole and cut short."""
    java = Path(shutil.which("java") or "java")
    whole = tmp_path / "whole.jsa"
    subprocess.run([str(java), f"-XX:ArchiveClassesAtExit={whole}", *class_data.QUIET, "-version"], check=True)
    assert class_data.usable(whole, java)
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(whole.read_bytes()[:1000])
    assert not class_data.usable(truncated, java)
    assert class_data.usable(tmp_path / "missing.jsa", java)  # a missing one is only ignored (warning off)
