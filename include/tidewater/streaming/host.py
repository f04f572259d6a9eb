"""The stream host: one streaming job running the queries of every supervised pipeline.

Each pipeline's stream is otherwise a Spark job of its own: a JVM with its own Python driver and
workers, ~1.1-1.5 GB PSS running. Five pipelines on one 2-core host held 9.3 GB with Airflow, where
the platform's target is 4 GB. With ``TIDEWATER_STREAM_HOST=true`` the supervisors start each
pipeline's queries in one shared job instead (``tidewater stream-host``, launched by the first
supervisor that needs it): one JVM, one Python driver, one pool of Python workers, one session.

What stays per pipeline is everything the supervisor, the exactly-once writers and the tests rely
on: its checkpoints and their leases (claimed by the host's pid), its stop requests (a stop stops that
pipeline's queries only and releases its leases), its progress files, its crash-loop accounting, and
its ``driver.log``, where the host writes its lines about that pipeline (started, stopped, the
one-line error of a failed query). A query that fails stops its pipeline's queries alone: the
supervisor sees the pipeline dead and asks the host to start it again. What is shared is what dies
together: a kill of the host (or its JVM running out of memory) ends every pipeline, and each one's
supervisor restarts it in the next host from its checkpoints, as after any kill.

The protocol between supervisors and the host (start requests, the host's lease, the launch lock) is
in :mod:`tidewater.streaming.host_requests`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pyspark.sql import SparkSession

from tidewater.config import Settings
from tidewater.errors import one_line
from tidewater.pipelines import all_pipelines, get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.spark import stream_master
from tidewater.streaming.host_requests import HostFiles, StartRequest
from tidewater.streaming.runner import PipelineStreams
from tidewater.streaming.startup_workers import READ_PLANNING, SOURCE_CREATION, SOURCE_LOOKUP, StartupWorkers
from tidewater.streaming.stop_request import StopRequestWatch

log = logging.getLogger(__name__)

LOOP_SECONDS = 1.0


# The source queries the host's master counts at most (:func:`host_master`).
HOST_SOURCE_QUERIES = 2


def host_master(settings: Settings) -> str:
    """The host's master: :func:`tidewater.spark.stream_master` for every deployed pipeline's source
    queries together, counting at most :data:`HOST_SOURCE_QUERIES` of them: on ``local[2]`` with the
    auto rule, ``local[3]``, as for one pipeline of two sources. More slots start more Python workers,
    and the host held more and started slower (``./tw bench platform``, five pipelines, 2026-12-01, one
    run each: the host's PSS peak 3,328 MiB on ``local[8]`` (the rule uncapped), 3,009 on ``local[4]``,
    2,472 on ``local[3]`` with the runners' fork server; every source's silver rows after 140, 81, 87 s)."""
    pipelines = all_pipelines(settings).values()
    sources = sum(PipelineLayout.of(settings, p).source_queries for p in pipelines)
    return stream_master(settings, min(sources, HOST_SOURCE_QUERIES))


@dataclass
class Hosted:
    streams: PipelineStreams
    request: StartRequest
    stops: StopRequestWatch


class StreamHost:
    """Start, watch and stop pipelines' queries in one session, on the supervisors' requests."""

    def __init__(self, settings: Settings, namespace: str, stop: threading.Event) -> None:
        # The host gives Spark's start-up workers back for all its pipelines at once (_give_back).
        self.settings = dataclasses.replace(settings, release_startup_workers=False)
        self.release_startup_workers = settings.release_startup_workers
        self.namespace = namespace
        self.files = HostFiles(settings.state_dir, namespace)
        self.stop = stop
        self.hosted: dict[str, Hosted] = {}
        self._workers: StartupWorkers | None = None
        self._planning_pending = False
        self._lease: IO[str] | None = None

    def run(self, spark: SparkSession) -> None:
        """Serve start and stop requests until a signal, or until nothing is hosted and nothing is pending."""
        self._lease = self.files.take_lease()
        if self.release_startup_workers:
            self._workers = StartupWorkers(spark)
        began, served = time.monotonic(), False
        try:
            while not self.stop.is_set():
                for name in list(self.hosted):
                    self._watch(name)
                started = [self._start(spark, request) for request in self.files.pending()]
                served = served or any(started)
                self._give_back_startup_workers(started_now=bool(started))
                idle_long = served or time.monotonic() - began > self.settings.stream_startup_seconds
                if not self.hosted and idle_long and self._leave():
                    break
                self.stop.wait(LOOP_SECONDS)
        finally:
            for name in list(self.hosted):
                self._end(name, "tidewater: the stream host is stopping")
            self._let_go()

    def fail_pending(self, line: str) -> None:
        """The host cannot serve: say so in the log of each pipeline waiting for it (its supervisor reads
        the line when it finds the pipeline dead, and launches another host)."""
        for request in self.files.pending():
            self._say(request, line)

    # ---- one pipeline ---------------------------------------------------------------------------

    def _start(self, spark: SparkSession, request: StartRequest) -> bool:
        """Start the requested pipeline's queries; a failure goes to its log, in one line."""
        if request.pipeline in self.hosted:  # a supervisor that did not see it running: it runs
            self.files.taken(request)
            return False
        streams = None
        try:
            streams = PipelineStreams(
                self.settings, get_pipeline(request.pipeline), namespace=self.namespace, launched_at=request.at
            )
            streams.preflight()  # its checkpoints' leases, held by this process from now on
            stops = StopRequestWatch(streams.layout.stop_request(), launched_at=request.at)
            self.hosted[request.pipeline] = Hosted(streams, request, stops)
            queries = ", ".join(tier.query for tier in streams.tiers)
            self._say(request, f"tidewater: streaming {request.pipeline} ({queries}) in the stream host")
            streams.prepare(spark)
            streams.start_all(self.settings.trigger_seconds, self.stop)
        except Exception as exc:
            self._say(request, f"tidewater: {one_line(exc)}")
            log.debug("details", exc_info=True)
            if request.pipeline in self.hosted:
                self._end(request.pipeline, None)
            elif streams is not None:
                streams.close()
        finally:
            self.files.taken(request)
        self._planning_pending = True
        return True

    def _watch(self, name: str) -> None:
        """Stop a pipeline asked to stop; end one whose query failed, its error in its log."""
        hosted = self.hosted[name]
        request = hosted.stops.poll()
        if request is not None:
            self._end(name, f"tidewater: {request.describe()}")
            return
        try:
            hosted.streams.check_queries()
        except Exception as exc:
            self._end(name, f"tidewater: {one_line(exc)}")

    def _end(self, name: str, line: str | None) -> None:
        hosted = self.hosted.pop(name)
        if line is not None:
            self._say(hosted.request, line)
        try:
            hosted.streams.close()  # stops its queries, releases its leases
        except Exception as exc:  # the others run on
            self._say(hosted.request, f"tidewater: stopping {name}: {one_line(exc)}")

    def _say(self, request: StartRequest, line: str) -> None:
        """One line in the pipeline's log (what its supervisor reads) and in the host's."""
        print(f"{request.pipeline}: {line}", flush=True)
        try:
            with open(Path(request.log), "a", encoding="utf-8") as out:
                out.write(line + "\n")
        except OSError as exc:
            log.warning("cannot write to %s: %s", request.log, exc)

    # ---- the host -------------------------------------------------------------------------------

    def _give_back_startup_workers(self, *, started_now: bool) -> None:
        """Spark's start-up Python workers (:mod:`tidewater.streaming.startup_workers`), for every
        hosted pipeline at once: the source lookup and creation workers run only inside a query's
        start, which only this thread calls, so they are idle here; a read planner only once every
        hosted pipeline's queries have read from each of their sources."""
        if self._workers is None:
            return
        if started_now:
            self._workers.release([SOURCE_LOOKUP, SOURCE_CREATION])
        if self._planning_pending and all(h.streams.reads_planned() for h in self.hosted.values()):
            self._workers.release([READ_PLANNING])
            self._planning_pending = False

    def _leave(self) -> bool:
        """Leave when nothing is hosted and nothing pending, decided under the launch lock so that no
        supervisor requests a start from a host on its way out."""
        with self.files.launch_lock():
            if self.files.pending():
                return False
            self._let_go()
            self.files.record_leaving()
        print("tidewater: the stream host hosts no pipeline: leaving", flush=True)
        return True

    def _let_go(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None
