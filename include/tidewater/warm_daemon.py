"""Spark's Python daemons, warm: what their workers import, imported once by the daemon before it forks.

Spark forks each Python worker (UDFs, Arrow maps, Python data sources' reads and plans, state
processors) from a daemon of the worker's kind (``python -m pyspark.daemon <worker module>``), which
imports pyspark alone; each forked worker then imports pyarrow, pandas, deltalake, confluent-kafka,
msgspec and tidewater's connectors itself. A task worker of ads at 2,000 events/s held 88 MiB of
private memory, ~50 of it those imports, three of them on ``local[3]``.

With ``spark.python.daemon.module=tidewater.warm_daemon`` (every tidewater session,
:func:`tidewater.spark.session_conf`) the daemon imports :data:`PRELOAD` first, then runs pyspark's
daemon unchanged: its workers share those modules' pages copy-on-write with it and with each other.

pyspark's daemon imports the worker module only after each fork because some imports start threads,
and a forked child has only the thread that forked: a lock another thread held stays held. Here pyarrow
and deltalake each start a jemalloc background thread, and numpy an OpenBLAS pool; the daemon turns
those off for itself before importing (so do its workers, which inherit the allocators' state: jemalloc
then returns freed pages as it allocates, not on a thread of its own), and checks that it still runs one
thread. If an import started one anyway, it runs pyspark's own daemon instead (``exec``), cold, as
without this module. ``TIDEWATER_WARM_DAEMON=false`` in the environment does that too.
"""

from __future__ import annotations

import os
import sys

SWITCH = "TIDEWATER_WARM_DAEMON"  # "false": pyspark's daemon as Spark starts it
MODULE = "tidewater.warm_daemon"
DAEMON_MODULES = ("pyspark.daemon", MODULE)  # what a Spark Python daemon's command line runs (``-m``)
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
        except ImportError:
            continue
    gc.collect()
    gc.freeze()  # the imports' objects stay out of the collector, so its passes leave their pages shared
    return threads() == 1


def main() -> None:
    if not switched_off(os.environ) and not warm_up():
        # sys.argv[1:]: the worker module Spark names; pyspark's daemon reads it from sys.argv[1]
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
