"""Spark's classes loaded once per install: a HotSpot class-data archive (AppCDS) that Spark's JVMs map.

A cold Spark driver spends seconds loading, parsing and verifying the same classes every time it
starts, and on 2 cores every tidewater process pays it: the streaming job (and each restart after a
crash), every Airflow batch and audit task, every CLI recompute. HotSpot can write the classes a run
loaded to an archive at exit (``-XX:ArchiveClassesAtExit``, a dynamic archive on top of the JDK's
own) and map it in later JVMs (``-XX:SharedArchiveFile``). Measured here (a cold session and a few
small jobs, JDK 17, Spark 4.2): 16.4-17.4 s without, 10.3-12.2 s with; ~30 MB more RSS in that small
session, ~0.05 GB more PSS in a draining stream (README, Benchmarks, twelfth stop). On a cluster the
executors of every job map it too (``spark.executor.extraJavaOptions``, :func:`tidewater.spark.session_conf`:
an application's first two jobs 7.8 -> 5.5 s on our standalone master), and so do the standalone master
and worker (4.3 s to start against 6.5 s); a node without the file runs them as without it.

The archive is built once per install by ``python -m tidewater.class_data`` (``scripts/bootstrap.sh``
runs it on every ``./tw``; quick when the archive is there): it spark-submits a small workload
(``spark_jobs/class_data.py``) that dumps to a private file, checks that a JVM starts on that file,
and only then renames it into place, because a truncated archive crashes the JVM that maps it.

An archive is only valid for the JVM and the jars it was written with, so its name is a hash of
both (:func:`archive_path`): a JDK or Spark upgrade, or a reinstall, names another file, which the
next bootstrap builds. HotSpot checks the same itself and, if anything still differs, runs without
the archive (its warning is switched off: it would be printed by every JVM). No archive, no change:
:func:`java_options` is then empty.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tidewater.errors import ConfigError
from tidewater.paths import spark_job
from tidewater.processes import spark_child_env

ARCHIVE_DIR = Path(sys.prefix) / "share" / "tidewater" / "class-data"
# Quiet when the archive cannot be used (another JDK, changed jars): the JVM runs as without it.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def spark_home() -> Path | None:
    """The Spark whose jars the driver loads: ``SPARK_HOME``, else the installed pyspark's."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def java_binary() -> Path | None:
    """The ``java`` spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    if os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        return candidate if candidate.exists() else None
    found = shutil.which("java")
    return Path(found) if found else None


def archive_path() -> Path | None:
    """Where the archive for this JVM and these Spark jars lives (None: no Java or no Spark found)."""
    java, home = java_binary(), spark_home()
    if java is None or home is None or not (home / "jars").is_dir():
        return None
    digest = hashlib.sha256()
    real_java = java.resolve()
    for path in (
        real_java,
        real_java.parent.parent / "lib" / "server" / "libjvm.so",
        *sorted((home / "jars").glob("*.jar")),
    ):
        try:
            stat = path.stat()
        except OSError:
            continue
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return ARCHIVE_DIR / f"spark-{digest.hexdigest()[:16]}.jsa"


def java_options() -> list[str]:
    """The driver JVM options that map the archive; empty when there is none for this JVM and Spark."""
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", *QUIET]


def usable(path: Path, java: Path) -> bool:
    """Whether a JVM starts on the archive ``path`` (a truncated one makes it abort; its crash report
    and core go to a folder of its own, not the caller's)."""
    with tempfile.TemporaryDirectory(prefix="tidewater-class-data-check-") as scratch:
        check = subprocess.run(
            [
                str(java),
                f"-XX:SharedArchiveFile={path}",
                *QUIET,
                f"-XX:ErrorFile={scratch}/hs_err.log",
                "-XX:-CreateCoredumpOnCrash",
                "-version",
            ],
            capture_output=True,
            timeout=60,
            check=False,
            cwd=scratch,
        )
    return check.returncode == 0


def build(*, timeout_s: float = 600) -> Path | None:
    """Write the archive for this JVM and Spark if it is missing; its path (None: not possible here).

    Raises RuntimeError with the workload's last lines when the workload fails."""
    path, java = archive_path(), java_binary()
    if path is None or java is None:
        return None
    if path.is_file():
        return path
    failed = path.with_suffix(".failed")  # one failure per install, not one per ./tw
    if failed.is_file():
        raise RuntimeError(f"building it failed before, see {failed} (delete that file to try again)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    workload = spark_job("class_data")
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--driver-java-options",
        " ".join([f"-XX:ArchiveClassesAtExit={partial}", *QUIET]),
        str(workload),
    ]
    began = time.monotonic()
    try:
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, **spark_child_env()},  # ./tw's bootstrap runs before its Spark environment is set
        )
        if run.returncode != 0 or not partial.is_file():
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-15:])
            raise RuntimeError(f"the class-data workload exited {run.returncode}:\n{tail}")
        if not usable(partial, java):
            raise RuntimeError(f"a JVM does not start on the archive it wrote ({partial})")
        partial.replace(path)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        failed.write_text(f"{exc}\n")
        raise
    finally:
        partial.unlink(missing_ok=True)
    for old in path.parent.glob("spark-*"):  # archives of an earlier JDK or Spark (~190 MB each)
        if old != path:
            old.unlink(missing_ok=True)
    print(
        f"tidewater: Spark's classes archived for faster JVM starts in {time.monotonic() - began:.0f} s: {path}",
        file=sys.stderr,
    )
    return path


if __name__ == "__main__":
    try:
        build()
    except (RuntimeError, OSError, subprocess.SubprocessError, ConfigError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"tidewater: JVMs start without a class-data archive ({first})", file=sys.stderr)
