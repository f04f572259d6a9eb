"""What every Spark process tidewater starts inherits: the venv's interpreter, loopback, Arrow's allocator."""

from __future__ import annotations

import os
import subprocess
import sys

from tidewater.processes import ARROW_MEMORY_POOL, spark_child_env


def test_a_spark_child_runs_the_venv_s_python_on_loopback_and_the_operator_s_choices_win() -> None:
    env = spark_child_env({})
    assert env == {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "ARROW_DEFAULT_MEMORY_POOL": ARROW_MEMORY_POOL,
    }
    chosen = {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "SPARK_LOCAL_IP": "127.0.0.2"}
    assert spark_child_env(chosen).items() >= chosen.items()


def test_pyarrow_takes_its_allocator_from_that_environment() -> None:
    """Arrow reads the variable as it loads; a name it did not know would leave its default in place
    (with a warning) and the setting would do nothing, so a child process must report it."""
    printed = subprocess.run(
        [sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
        env={**os.environ, **spark_child_env({})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert printed.stdout.strip() == ARROW_MEMORY_POOL == "system"
