"""Give back the Python processes Spark starts only to start Python data-source queries.

To start a query on a Python data source, the driver's JVM runs three kinds of Python worker, each
forked from a daemon of its own kind (:data:`STARTUP_WORKER_MODULES`): one finds the registered
sources, one creates the source when ``load()`` is called, one plans the source's read at its first
micro-batch with data (``PythonMicroBatchStream.readInfo`` is lazy, so once per source of a query).
Spark would keep each worker idle in its pool until a fixed 60 s after its last use
(``PythonWorkerFactory``; not configurable): measured with rsvps (three queries planning together),
~300 MiB PSS of idle workers in the job's first minute. Read planning's workers now end once they
have answered (:func:`tidewater.warm_daemon.serve_one_call_each`); lookup's and creation's stay idle
(one of each: they run one after the other inside ``load()``), and Spark keeps the three daemons for
the job's life (~94 MiB with rsvps).

:class:`StartupWorkers` stops those factories' daemons through Spark's own
``PythonWorkerFactory.stopDaemon`` (it closes the idle workers, ends the daemon and forgets it), so
a query started later makes Spark start a new daemon as it did the first time: nothing is lost
but that start-up's cost again. It must not run while a worker is in use, or the query using it
fails (the supervisor would restart the job). The streaming runner guarantees that: it releases the
lookup and creation workers from its own thread after ``start()`` returned (they run inside
``load()``), and the planning workers once every source of every running query has read rows (so
its read was planned), and it starts queries from that same thread.

Spark keeps the factories in a private field, so this reads it by reflection. On a Spark whose
internals differ the release logs one warning and the job runs on as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from tidewater.errors import one_line
from tidewater.warm_daemon import READ_PLANNING, SOURCE_CREATION, SOURCE_LOOKUP, STARTUP_WORKER_MODULES

log = logging.getLogger(__name__)

__all__ = [
    "READ_PLANNING",
    "SOURCE_CREATION",
    "SOURCE_LOOKUP",
    "STARTUP_WORKER_MODULES",
    "ReadSources",
    "StartupWorkers",
]


class ReadSources:
    """Which sources of one query run have read rows, from its progress records (Spark's JSON) as they
    come: once each has, each source's read has been planned, and the query needs no planner."""

    def __init__(self) -> None:
        self.count = 0
        self.read: set[int] = set()

    def add(self, record: Mapping[str, Any] | None) -> bool:
        """Take one progress record (None: no batch yet); whether every source has now read rows."""
        sources = (record or {}).get("sources") or []
        self.count = max(self.count, len(sources))
        self.read.update(i for i, source in enumerate(sources) if int(source.get("numInputRows") or 0) > 0)
        return self.complete

    @property
    def complete(self) -> bool:
        return self.count > 0 and len(self.read) == self.count


class StartupWorkers:
    """The driver JVM's start-up worker factories, released on demand (see the module's docstring)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._broken = False

    def release(self, modules: Iterable[str]) -> list[int]:
        """Stop the daemons (and their idle workers) of these worker modules; the daemons' PIDs that
        were stopped. Only call it while no worker of these modules is in use."""
        wanted = set(modules)
        if self._broken or not wanted:
            return []
        try:
            stopped = self._release(wanted)
        except Exception as exc:  # Spark's internals, not ours: never fail the job for memory
            self._broken = True
            log.warning("cannot give back Spark's start-up Python workers on this Spark: %s", one_line(exc))
            return []
        if stopped:
            kinds = ", ".join(sorted(module.rsplit(".", 1)[-1] for module in wanted))
            log.info("gave back Spark's idle start-up Python workers (%s): daemons %s", kinds, stopped)
        return stopped

    def _release(self, wanted: set[str]) -> list[int]:
        spark = self._spark
        jvm = spark._jvm  # type: ignore[attr-defined]
        gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
        no_types = gateway.new_array(jvm.java.lang.Class, 0)
        no_args = gateway.new_array(jvm.java.lang.Object, 0)
        env = jvm.org.apache.spark.SparkEnv.get()
        field = env.getClass().getDeclaredField("pythonWorkers")
        field.setAccessible(True)
        factory_class = jvm.java.lang.Class.forName("org.apache.spark.api.python.PythonWorkerFactory")
        daemon_field = factory_class.getDeclaredField("daemon")
        daemon_field.setAccessible(True)
        stop_daemon = factory_class.getDeclaredMethod("stopDaemon", no_types)
        stop_daemon.setAccessible(True)
        stopped = []
        entries = field.get(env).iterator()
        factories = []
        while entries.hasNext():  # collect first: stopping does not change the map, but be plain about it
            entry = entries.next()
            if entry._1().workerModule() in wanted:
                factories.append(entry._2())
        for factory in factories:
            daemon = daemon_field.get(factory)
            if daemon is None:  # never started, or given back already
                continue
            pid = int(daemon.pid())
            stop_daemon.invoke(factory, no_args)
            stopped.append(pid)
        return stopped
