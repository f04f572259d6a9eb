"""Spark's Python daemons, warm: what their workers import, imported once by the daemon before it forks.

Spark forks each Python worker (UDFs, Arrow maps, Python data sources' reads and plans, state
processors) from a daemon of the worker's kind (``python -m pyspark.daemon <worker module>``), which
imports pyspark alone; each forked worker then imports pyarrow, pandas, deltalake, confluent-kafka,
msgspec and tidewater's connectors itself. A task worker of ads at 2,000 events/s held 88 MiB of
private memory, ~50 of it those imports, three of them on ``local[3]``.

Every daemon Spark starts imports :data:`PRELOAD` first (:func:`at_daemon_start`, called as its
interpreter starts by :mod:`tidewater.worker_start`), then runs pyspark's daemon unchanged: its workers
share those modules' pages copy-on-write with it and with each other. (Spark's
``spark.python.daemon.module`` would name a daemon module of our own, but only for task workers: the
daemons of the Python data sources' lookup, creation and read planning run ``pyspark.daemon`` whatever
it says.)

pyspark's daemon imports the worker module only after each fork because some imports start threads,
and a forked child has only the thread that forked: a lock another thread held stays held. Here pyarrow
and deltalake each start a jemalloc background thread, and numpy an OpenBLAS pool; the daemon turns
those off for itself before importing (so do its workers, which inherit the allocators' state: jemalloc
then returns freed pages as it allocates, not on a thread of its own), and checks that it still runs one
thread. If an import started one anyway, the daemon starts again (``exec``) cold, as without this
module. ``TIDEWATER_WARM_DAEMON=false`` in the environment keeps every daemon cold.

The workers that start Python data-source queries (:data:`STARTUP_WORKER_MODULES`: source lookup,
creation, read planning) each serve one call: :func:`serve_one_call_each`. Spark would keep each idle in
its pool until a minute after its factory's last use, and the read planning of several queries starting
together leaves several: four of ~37 MiB PSS each at the peak of an ads drain.
"""

from __future__ import annotations

import os
import sys

SWITCH = "TIDEWATER_WARM_DAEMON"  # "false": pyspark's daemon as Spark starts it
# What a Spark Python worker of a tidewater job imports (its task workers map each of these).
PRELOAD = (
    "pyspark.worker",
    "pyarrow",
    "pandas",
    "deltalake",
    "confluent_kafka",
    "kafka",
    "msgspec",
    "tidewater.connectors.kafka_source",
    "tidewater.connectors.delta",
)
# Threads the imports would start, off: jemalloc's background threads (pyarrow's and deltalake's
# allocators, each under its own prefix) and OpenBLAS's pool (numpy).
SINGLE_THREADED_IMPORTS = {
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "_RJEM_MALLOC_CONF": "background_thread:false",
    "OPENBLAS_NUM_THREADS": "1",
}


# Spark's workers that start Python data-source queries: one finds the registered sources, one creates a
# source at ``load()``, one plans a source's read at its query's first micro-batch with data.
SOURCE_LOOKUP = "pyspark.sql.worker.lookup_data_sources"
SOURCE_CREATION = "pyspark.sql.worker.create_data_source"
READ_PLANNING = "pyspark.sql.worker.plan_data_source_read"
STARTUP_WORKER_MODULES = (SOURCE_LOOKUP, SOURCE_CREATION, READ_PLANNING)


def switched_off(environ: os._Environ[str] | dict[str, str]) -> bool:
    return environ.get(SWITCH, "").strip().lower() in ("false", "0", "no", "off")


def threads() -> int:
    """Threads of this process (the kernel's count: C libraries' threads included)."""
    return len(os.listdir("/proc/self/task"))


def warm_up(modules: tuple[str, ...] = PRELOAD) -> bool:
    """Import ``modules`` with :data:`SINGLE_THREADED_IMPORTS` set (unless the environment sets them)
    and freeze what they made; whether this process still runs a single thread, so it may fork. The
    runners' fork server (:mod:`tidewater.runner_forkserver`) warms up this way too."""
    import gc
    import importlib

    for name, value in SINGLE_THREADED_IMPORTS.items():
        os.environ.setdefault(name, value)
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # one that fails to import is left to the workers to import (and report)
            continue
    gc.collect()
    gc.freeze()  # the imports' objects stay out of the collector, so its passes leave their pages shared
    return threads() == 1


def serve_one_call_each() -> None:
    """Make this daemon's workers ask the JVM not to reuse them once they have answered.

    A planner worker (pyspark's ``sql.worker.utils.worker_run``) ends by echoing the JVM's end of stream,
    upon which the JVM puts the worker in its pool of idle workers; it answers "end of data section"
    instead when its stream did not end cleanly, upon which the JVM destroys the worker (it tells the
    daemon, which kills it) rather than reuse it. This sends the latter after a clean end. The next call
    forks a new worker from the daemon, which costs milliseconds; the daemons themselves are stopped by
    the streaming job (:mod:`tidewater.streaming.startup_workers`)."""
    from pyspark.serializers import SpecialLengths, write_int
    from pyspark.sql.worker import utils

    def write_int_not_reusable(value: int, stream: object) -> None:
        write_int(SpecialLengths.END_OF_DATA_SECTION if value == SpecialLengths.END_OF_STREAM else value, stream)

    utils.write_int = write_int_not_reusable  # worker_run looks it up at its end: its workers fork after this


def at_daemon_start(argv: list[str]) -> None:
    """In a Spark Python daemon as its interpreter starts (``argv``: its command line): make start-up
    workers serve one call each, and warm it up, or, if an import started a thread, run it again cold
    (this never returns then)."""
    if argv[-1] in STARTUP_WORKER_MODULES:
        serve_one_call_each()
    if switched_off(os.environ) or warm_up():
        return
    os.environ[SWITCH] = "false"  # the daemon started again (and its workers) stay cold
    os.execv(sys.executable, argv)
