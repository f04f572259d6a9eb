"""What every Spark process tidewater starts inherits: the venv's interpreter, loopback, Arrow's allocator,
large blocks given back as they are freed."""

from __future__ import annotations

import os
import subprocess
import sys

from tidewater.processes import ARROW_MEMORY_POOL, MALLOC_MMAP_THRESHOLD, spark_child_env


def test_a_spark_child_runs_the_venv_s_python_on_loopback_and_the_operator_s_choices_win() -> None:
    env = spark_child_env({})
    assert env == {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "ARROW_DEFAULT_MEMORY_POOL": ARROW_MEMORY_POOL,
        "MALLOC_MMAP_THRESHOLD_": MALLOC_MMAP_THRESHOLD,
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


# In a child: allocate a large block, free it, allocate it again; how many blocks have pages of their own
# (glibc's mallinfo2().hblks) more than before, after each step.
LARGE_BLOCK_AGAIN = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
size = 8 << 20
before = libc.mallinfo2().hblks
block = libc.malloc(size)
first = libc.mallinfo2().hblks - before
libc.free(block)
block = libc.malloc(size)
print(first, libc.mallinfo2().hblks - before)
"""


def test_a_large_block_freed_and_taken_again_is_given_back_each_time() -> None:
    """glibc's default raises its threshold to a freed large block's size, so the next one comes from
    its heap and stays there once freed; with the child environment's threshold it never does."""

    def blocks(env: dict[str, str]) -> list[int]:
        ran = subprocess.run(
            [sys.executable, "-c", LARGE_BLOCK_AGAIN], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        return [int(n) for n in ran.stdout.split()]

    default = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert blocks(default) == [1, 0]  # the second 8 MiB block: from the heap
    assert blocks({**default, **spark_child_env({})}) == [1, 1]  # pages of its own again


def test_airflows_own_processes_keep_glibcs_default_and_the_spark_jobs_they_start_do_not(tmp_path) -> None:
    """Measured for Spark's processes only: Airflow's components run without it, and a job a task
    starts (its environment Airflow's) still gets it from spark_child_env."""
    from tidewater.config import Settings
    from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets

    settings = Settings(state_dir=str(tmp_path))
    airflow = airflow_environment(settings, ensure_secrets(settings))
    assert "MALLOC_MMAP_THRESHOLD_" not in airflow
    assert airflow["ARROW_DEFAULT_MEMORY_POOL"] == ARROW_MEMORY_POOL
    assert spark_child_env(airflow)["MALLOC_MMAP_THRESHOLD_"] == MALLOC_MMAP_THRESHOLD
