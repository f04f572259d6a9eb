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

One kind of daemon stays cold: read planning's (:data:`ONE_CALL_WORKERS`). Each query plans each of
its sources' reads once, at its first micro-batch with data, in a worker Spark would keep idle in its pool
until a minute after its factory's last use; queries starting together leave several (four of ~37 MiB
PSS at the peak of an ads drain). Here each ends once it has answered (:func:`serve_one_call_each`), so
a warm daemon would share its pages with no one: it held ~94 MiB PSS alone, a cold one ~26. Measured
draining ads (1M events, interleaved, README): PSS at the peak 2.03 / 2.05 GB as Spark runs planners,
1.98 / 1.95 with one-call planners from a warm daemon, 1.98 / 1.97 from cold daemons; each planning
worker imports what it needs itself (~0.3-0.5 s, once per source of a query).
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
# Workers that end after one call, forked from a cold daemon. Lookup and creation run one after the other
# inside ``load()``: one idle worker of each, which the streaming job gives back once its queries started.
ONE_CALL_WORKERS = (READ_PLANNING,)


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
    daemon, which kills it) rather than reuse it. This sends the latter after a clean end; the next call
    forks a new worker. The daemon itself is stopped by the streaming job once every query has planned
    (:mod:`tidewater.streaming.startup_workers`)."""
    from pyspark.serializers import SpecialLengths, write_int
    from pyspark.sql.worker import utils

    def write_int_not_reusable(value: int, stream: object) -> None:
        write_int(SpecialLengths.END_OF_DATA_SECTION if value == SpecialLengths.END_OF_STREAM else value, stream)

    utils.write_int = write_int_not_reusable  # worker_run looks it up at its end: its workers fork after this


def at_daemon_start(argv: list[str]) -> None:
    """In a Spark Python daemon as its interpreter starts (``argv``: its command line): a daemon of
    :data:`ONE_CALL_WORKERS` stays cold and its workers serve one call each; any other is warmed up, or,
    if an import started a thread, run again cold (this never returns then)."""
    if argv[-1] in ONE_CALL_WORKERS:
        serve_one_call_each()
        return
    if switched_off(os.environ) or warm_up():
        return
    os.environ[SWITCH] = "false"  # the daemon started again (and its workers) stay cold
    os.execv(sys.executable, argv)
