"""Streaming benchmark: throughput Kafka -> silver, end-to-end latency, memory, and where the time goes.

Runs the real streaming job of each pipeline (spark-submit spark_jobs/stream.py: every query of the
pipeline: bronze+silver per source and every gold table) against the embedded broker, on the local
file system, ``--runs`` times (3 by default: one run is not a figure on a shared 2-core host), and
prints for each pipeline the median and the spread (min-max) of:

1. sustained records/s from Kafka to silver (+ quarantine) while draining a backlog of 1M (``--backlog``)
   of the pipeline's sample events in micro-batches of the deployment's ``TIDEWATER_MAX_OFFSETS_PER_TRIGGER``
   (200k by default; ``--drain-batch`` sets another), the rate taken between 20% and 90% of the backlog
   (start-up and the last batch not counted), and the peak RSS meanwhile. The job is started for
   the drain: its JVM compiles Spark's hot code as it goes (rsvps: the C2 compiler threads took 9.5,
   5.7 and 3.5 s of CPU in three 20 s windows of a 2M drain), which a 400k backlog, three measured
   micro-batches, mostly measured;
2. end-to-end latency at a fixed offered rate with a 1-second trigger: for every event, the time of the
   silver Delta commit that made it visible minus its Kafka timestamp (p50, p95), and per gold table the
   commit of the first gold micro-batch that read it (p95); events of the first ``--warmup-seconds``
   are produced but not counted (JIT and Python worker start-up); and the peak RSS at that rate.
3. the batch path over the drained backlog: its hour's silver and gold recomputed from bronze by
   ``tidewater batch recompute`` (the batch DAG's job), events/s in the job (its result line's seconds)
   and with Spark's start-up, and its peak RSS (the default backlog is the issue's hour of 1M events);
   then the audit of that hour (``tidewater audit run``: the batch DAG's audit tasks, every check),
   timed the same way, with the suites that failed named (``--skip-audit`` leaves it out).

Peak RSS is the job's whole process tree (JVM + Python driver + Python workers), summed; beside it the
peak PSS, the same tree with each page its forked Python workers share counted once. At the offered
rate, also the PSS peak once Spark's start-up workers have exited (a minute after the queries planned
their reads: the default 90 s measured reaches past it). ``--profile`` also
writes where each micro-batch's time goes, per phase (:mod:`tidewater.phase_clock`), to
``benchmarks/PROFILE.md``.

    ./tw bench                                  # every pipeline, 3 runs each
    ./tw bench --pipelines rsvps --runs 1 --profile
    ./tw bench --backlog 400000 --rate 2000 --latency-seconds 60
    ./tw bench --cluster    # on the cluster profile (tidewater.orchestration.cluster): Spark standalone
                            # master and worker, the lake on the S3 server, the broker's log on it,
                            # locks and leases in PostgreSQL

On the cluster profile the executors run under the Spark worker, not in the job's process tree: their
memory is reported apart (the worker's process tree minus what it held before the job).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from multiprocessing import Process
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from jvm_profile import FlightRecordingError, Window, allocation_line, gc_line, merged, recording_options, render
from jvm_profile import summarize as summarize_recording

from tidewater.broker import EmbeddedBroker
from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaPythonClient, kafka_python_config
from tidewater.generator.events import GeneratorConfig
from tidewater.generator.producer import ensure_topic, pipeline_topics, produce
from tidewater.lake.storage import filesystem
from tidewater.lake.tables import LakeTable
from tidewater.orchestration.assets import job_result
from tidewater.pipelines import all_pipelines, get_pipeline
from tidewater.pipelines.base import Pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import Terminated, exit_on_sigterm, spark_child_env, stat_fields, stop_process_group
from tidewater.runner_forkserver import WAITER_SCRIPT
from tidewater.streaming.jobs import job_master, launch_stream_job
from tidewater.streaming.startup_workers import READ_PLANNING, SOURCE_CREATION, SOURCE_LOOKUP, STARTUP_WORKER_MODULES
from tidewater.times import parse_time


def session_parents(sid: int) -> dict[int, int]:
    """pid -> parent pid of each process of session ``sid``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = stat_fields(f"/proc/{entry}/stat")
            if int(fields[3]) == sid:  # fields 4 and 6 of stat: parent pid, session id
                parents[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def spawning(argv: list[str], parent_argv: list[str]) -> bool:
    """A JVM's child that still has the JVM's command line: Java starts a process (each Python worker
    and daemon) by a child that shares the JVM's memory until it runs the new program. A sample that
    lands then would count the JVM twice (seen: a 1.15 GB "second JVM" at a PSS peak)."""
    return bool(argv) and os.path.basename(argv[0]) == "java" and argv == parent_argv


def session_rss_bytes(sid: int) -> int:
    """Summed resident memory of every process in session ``sid`` (see :func:`rss_bytes`)."""
    return rss_bytes(session_roles(sid))


def rss_bytes(pids: Iterable[int]) -> int:
    """Summed resident memory of ``pids``. A page that forked processes share (Spark's Python workers
    are forks of one daemon) counts once per process: an upper bound."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


# Spark starts one Python daemon per worker module and forks that module's workers from it.
WORKER_ROLES = {
    "pyspark.worker": "task worker",
    READ_PLANNING: "read-planning worker",
    SOURCE_CREATION: "source-creation worker",
    SOURCE_LOOKUP: "source-lookup worker",
    "pyspark.sql.worker.python_streaming_sink_runner": "streaming-sink runner",
}


def process_role(argv: list[str], parent_argv: list[str]) -> str:
    """What a process of a streaming job's tree is, from its command line and its parent's: a forked
    Python worker has its daemon's command line, so the parent tells a daemon from its workers."""
    if not argv:
        return "other"
    program = os.path.basename(argv[0])
    if program == "java":
        return "JVM"
    if argv[1:] == ["-c", WAITER_SCRIPT]:  # a runner's process waiting for its fork, as a shell
        return "streaming-source runner"
    if "-m" in argv[:-1]:
        module, *arguments = argv[argv.index("-m") + 1 :]
        if module == "pyspark.daemon":
            worker_module = arguments[0] if arguments else "pyspark.worker"
            if parent_argv == argv:
                return WORKER_ROLES.get(worker_module, f"{worker_module} worker")
            return "Python daemon"
        if module.endswith("python_streaming_source_runner"):
            return "streaming-source runner"  # or, with the fork server, the process waiting for its fork
        if module == "tidewater.runner_forkserver":  # tidewater.runner_forkserver: the server and its forks
            return "streaming-source runner (forked)" if parent_argv == argv else "runner fork server"
        return module
    if any(arg.endswith(("spark_jobs/stream.py", "spark_jobs/stream_host.py")) for arg in argv):
        return "Python driver"
    return program


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def session_roles(sid: int) -> dict[int, str]:
    """pid -> role (see :func:`process_role`) of each process of session ``sid``, less a JVM's child
    caught between its fork and its exec (see :func:`spawning`)."""
    roles = {}
    for pid, parent in session_parents(sid).items():
        argv, parent_argv = _argv(pid), _argv(parent)
        if not spawning(argv, parent_argv):
            roles[pid] = process_role(argv, parent_argv)
    return roles


def session_pss_by_role(roles: dict[int, str]) -> list[tuple[str, int]]:
    """(role, PSS bytes) of each process of :func:`session_roles`. PSS splits each shared page between
    the processes sharing it, so the sum is the memory the session really holds."""
    out = []
    for pid, role in roles.items():
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                pss = next((int(line.split()[1]) * 1024 for line in handle if line.startswith("Pss:")), 0)
        except (OSError, IndexError, ValueError):
            continue
        out.append((role, pss))
    return out


def keep_roles(known: dict[int, str], seen: dict[int, str]) -> dict[int, str]:
    """``seen`` with each process that reads as "other" given the role it was ``known`` by: a sample that
    cannot read a process's command line (an exiting one has none) reads it as "other", and a 600 s run
    of ads reported all of the JVM's CPU as "other". ``known`` gains every role read."""
    for pid, role in seen.items():
        if role == "other" and pid in known:
            seen[pid] = known[pid]
        else:
            known[pid] = role
    return seen


def by_role(processes: list[tuple[str, int]]) -> dict[str, list[float]]:
    """role -> [processes, MiB], largest first."""
    roles: dict[str, list[float]] = {}
    for role, pss in processes:
        entry = roles.setdefault(role, [0, 0.0])
        entry[0] += 1
        entry[1] += pss / 2**20
    return dict(sorted(roles.items(), key=lambda item: -item[1][1]))


# Processes Spark starts for a Python data source while queries start (finding, creating and planning
# their reads). Planners end after their call (tidewater.warm_daemon); Spark ends the others a minute
# after their last use (PythonWorkerFactory's fixed idle timeout) and keeps the daemons; the job stops
# both sooner (tidewater.streaming.startup_workers, TIDEWATER_RELEASE_STARTUP_WORKERS).
STARTUP_ROLES = frozenset(WORKER_ROLES[module] for module in STARTUP_WORKER_MODULES)


class MemorySampler(threading.Thread):
    """Peak RSS (and PSS) of the job's session and, on a cluster, of the worker's (less its ``worker_base``).

    ``steady_pss`` is the PSS peak once Spark's start-up workers (:data:`STARTUP_ROLES`) have been seen
    and have exited: what a job that has run a while holds (0 if the run ended before they did).
    ``minute_peaks``: the PSS peak of each minute since the sampler started, to see whether a long run's
    memory levels off or keeps growing with a state that does (ads' join grows for 12 minutes)."""

    def __init__(self, sid: int, worker_sid: int | None = None, *, broker_pid: int | None = None) -> None:
        super().__init__(daemon=True)
        self.sid = sid
        self.broker_pid = broker_pid
        self.cpu = CpuWindow()
        self.worker_sid = worker_sid
        self.worker_base = session_rss_bytes(worker_sid) if worker_sid else 0
        self.peak = 0
        self.peak_pss = 0
        self.peak_roles: dict[str, list[float]] = {}  # where the PSS was at its peak (see by_role)
        self.steady_pss = 0
        self.started = time.monotonic()
        self.minute_peaks: list[int] = []
        self._startup_seen = False
        self._roles: dict[int, str] = {}  # every role read so far (see keep_roles)
        self.executor_peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            roles = keep_roles(self._roles, session_roles(self.sid))  # one scan of /proc for RSS, PSS and CPU
            self.peak = max(self.peak, rss_bytes(roles))
            self.observe(session_pss_by_role(roles))
            if self.broker_pid:
                roles[self.broker_pid] = "embedded broker"
            self.cpu.sample(time.time(), {pid: (role, cpu_seconds(pid)) for pid, role in roles.items()})
            if self.worker_sid:
                self.executor_peak = max(self.executor_peak, session_rss_bytes(self.worker_sid) - self.worker_base)

    def observe(self, processes: list[tuple[str, int]], *, at: float | None = None) -> None:
        """One sample of (role, PSS bytes) per process, taken at ``at`` (monotonic s; None: now): the peaks so far."""
        pss = sum(size for _, size in processes)
        minute = int(((time.monotonic() if at is None else at) - self.started) // 60)
        if minute >= len(self.minute_peaks):
            self.minute_peaks += [0] * (minute + 1 - len(self.minute_peaks))
        self.minute_peaks[minute] = max(self.minute_peaks[minute], pss)
        if pss > self.peak_pss:
            self.peak_pss, self.peak_roles = pss, by_role(processes)
        starting = any(role in STARTUP_ROLES for role, _ in processes)
        self._startup_seen |= starting
        if self._startup_seen and not starting:
            self.steady_pss = max(self.steady_pss, pss)


class CpuWindow:
    """CPU each process role used between ``start`` and ``end`` (epoch s; set them when known), from
    samples of every process's CPU seconds: a process first seen inside the window was born there and
    counts from 0; one seen before counts from its first sample inside. Each process is counted under the
    role of its last sample in the window (:class:`MemorySampler` gives it the roles of :func:`keep_roles`)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None
        self._before: set[int] = set()
        self._first: dict[int, float] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._span: list[float] = []

    def sample(self, now: float, processes: dict[int, tuple[str, float | None]]) -> None:
        if self.start is None or now < self.start:
            self._before.update(processes)
            return
        if self.end is not None and now > self.end:
            return
        self._span = [self._span[0] if self._span else now, now]
        for pid, (role, used) in processes.items():
            if used is None:
                continue
            self._first.setdefault(pid, used if pid in self._before else 0.0)
            self._last[pid] = (role, used)

    def seconds(self) -> float:
        return self._span[1] - self._span[0] if len(self._span) == 2 else 0.0

    def by_role(self) -> dict[str, list[float]]:
        """role -> [processes, CPU seconds], the busiest first."""
        roles: dict[str, list[float]] = {}
        for pid, (role, used) in self._last.items():
            entry = roles.setdefault(role, [0, 0.0])
            entry[0] += 1
            entry[1] += round(used - self._first[pid], 2)
        return dict(sorted(roles.items(), key=lambda item: -item[1][1]))


WORKER_SID: int | None = None  # the cluster profile's Spark worker, whose process tree holds the executors


# ---- what a pipeline's job wrote ------------------------------------------------------------------


def processed_rows(settings: Settings, pipeline: Pipeline) -> int:
    """Rows of every source's silver and quarantine: the records the job has taken past bronze."""
    layout = PipelineLayout.of(settings, pipeline)
    total = 0
    for source in pipeline.sources:
        for tier in ("silver", "quarantine"):
            table = layout.source_table(source, tier)
            total += table.row_count() if table.exists() else 0
    return total


def produced_records(settings: Settings, pipeline: Pipeline) -> int:
    """Records in all of the pipeline's topics (a source's events and the follow-ups they cause)."""
    client = KafkaPythonClient(kafka_python_config(settings), stall_timeout_s=15)
    try:
        total = 0
        for source in pipeline.sources:
            topic = settings.topic(source.topic)
            total += sum(client.end_offsets(topic, client.partitions(topic)).values())
        return total
    finally:
        client.close()


def _produce_share(settings: Settings, name: str, seed: int, count: int, start_ms: int) -> None:
    pipeline = get_pipeline(name)
    topic, follow_ups = pipeline_topics(settings, pipeline)
    config = GeneratorConfig(seed=seed, start_time_ms=start_ms, rate=100_000, producers=1)
    produce(settings, topic, config, count=count, realtime=False, events=pipeline.sample_events, topics=follow_ups)


def create_topics(settings: Settings, pipeline: Pipeline) -> None:
    for source in pipeline.sources:
        ensure_topic(settings, settings.topic(source.topic), 4)


def preload(settings: Settings, pipeline: Pipeline, events: int, processes: int = 2) -> tuple[float, int]:
    """Fill the pipeline's topics with ``events`` sample events (plus their follow-ups) from several
    producer processes; returns the seconds taken and the events' first time (ms; an hour ago)."""
    started = time.monotonic()
    share = events // processes
    start_ms = int(time.time() * 1000) - 3_600_000
    workers = [
        Process(target=_produce_share, args=(settings, pipeline.name, 1000 + i, share, start_ms + i))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"producer process failed with exit code {worker.exitcode}")
    return time.monotonic() - started, start_ms


def phase_settings(base: Settings, pipeline: Pipeline, phase: str, run: int, work: Path) -> Settings:
    """A state folder, a lake and topics of their own per pipeline, phase and run."""
    label = f"{pipeline.name}-{phase}-{run}"
    lake = f"{base.lake_root.rstrip('/')}/{label}" if base.lake_root else ""  # on a cluster: under the S3 root
    return base.replace(state_dir=str(work / label), lake_root=lake, kafka_topic_prefix=f"{label}-")


# Every drain before --drain-batch was in micro-batches of this many records (results without the field).
OLD_DRAIN_BATCH = 100_000


def drain_batches(throughput: list[dict[str, Any]]) -> list[int]:
    """The micro-batch sizes these drains ran in (a result from before the field: :data:`OLD_DRAIN_BATCH`)."""
    return sorted({t.get("drain_batch", OLD_DRAIN_BATCH) for t in throughput})


def batch_label(count: int) -> str:
    """``200k-record`` (a whole number of thousands) or ``12,345-record``: the profile's drain title."""
    return f"{count // 1000:,}k-record" if count % 1000 == 0 else f"{count:,}-record"


def measure_throughput(
    base: Settings,
    pipeline: Pipeline,
    backlog: int,
    run: int,
    work: Path,
    *,
    drain_batch: int,
    jvm_profile: bool = False,
) -> dict[str, Any]:
    """Drain ``backlog`` in micro-batches of ``drain_batch`` records. The rate is the slope between 20%
    and 90% of the backlog (:func:`drain_rate`): the first batch, on a cold JVM, is not counted.
    ``jvm_profile``: record the job's JVM over that same stretch (:mod:`jvm_profile`)."""
    settings = phase_settings(base, pipeline, "throughput", run, work).replace(max_offsets_per_trigger=drain_batch)
    recording = work / f"{pipeline.name}-drain-{run}.jfr"
    unrecorded: str | None = None
    if jvm_profile:
        recording.unlink(missing_ok=True)
        try:
            options = f"{settings.stream_java_options} {recording_options(recording)}"
            settings = settings.replace(stream_java_options=options)
        except FlightRecordingError as exc:
            unrecorded = str(exc)
    create_topics(settings, pipeline)
    produce_s, events_from_ms = preload(settings, pipeline, backlog)
    records = produced_records(settings, pipeline)
    print(f"    backlog of {records:,} records produced in {produce_s:.1f} s", flush=True)
    log_path = work / f"{pipeline.name}-throughput-{run}.log"
    job = launch_stream_job(settings, pipeline.name, log_path)
    sampler = MemorySampler(job.pid, WORKER_SID)
    sampler.start()
    samples: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            if job.poll() is not None:
                raise SystemExit(f"streaming job died: see {log_path}")
            rows = processed_rows(settings, pipeline)
            samples.append((time.monotonic(), rows))
            # The CPU of the same stretch the rate is measured over (drain_rate: 20% to 90% of the backlog).
            if sampler.cpu.start is None and rows >= DRAIN_MEASURED[0] * records:
                sampler.cpu.start = time.time()
            if sampler.cpu.end is None and rows >= DRAIN_MEASURED[1] * records:
                sampler.cpu.end = time.time()
            if rows >= records:
                break
            time.sleep(0.5)
    finally:
        sampler.stopped.set()
        stop_process_group(job, timeout_s=30)
    progress = PipelineLayout.of(settings, pipeline).progress_dir() / "progress.jsonl"
    jvm: dict[str, Any] = {}
    if jvm_profile:
        jvm = {"jvm_profile_problem": unrecorded} if unrecorded else jvm_figures(recording, sampler.cpu)
    return jvm | {
        "events_per_s": drain_rate(samples, records),
        "cpu_by_role": sampler.cpu.by_role(),
        "cpu_seconds": sampler.cpu.seconds(),
        "peak_rss_gb": sampler.peak / 2**30,
        "peak_pss_gb": sampler.peak_pss / 2**30,
        "peak_pss_by_role": sampler.peak_roles,
        "executor_peak_rss_gb": sampler.executor_peak / 2**30,
        "progress": str(progress),
        "compiles_per_trigger": compiles_per_trigger([progress]),
        "records": records,
        "drain_batch": drain_batch,
        "events_from_ms": events_from_ms,
    }


def jvm_figures(recording: Path, cpu: CpuWindow) -> dict[str, Any]:
    """The drain's flight recording over its measured stretch (``jvm_profile``), or why there is none
    (``jvm_profile_problem``): never a failed run."""
    if cpu.start is None:
        return {"jvm_profile_problem": "the drain did not reach its measured stretch"}
    try:
        return {"jvm_profile": summarize_recording(recording, Window(cpu.start, cpu.end or time.time()))}
    except FlightRecordingError as exc:
        return {"jvm_profile_problem": str(exc)}


def backlog_hour(pipeline: Pipeline, drained: dict[str, Any]) -> list[str]:
    """A batch job's arguments for the hour the drained backlog's events fall in (two hours when they
    begin in its last five minutes)."""
    first = dt.datetime.fromtimestamp(drained["events_from_ms"] / 1000, dt.UTC)
    start = first.replace(minute=0, second=0, microsecond=0)
    end = start + dt.timedelta(hours=1 if first + dt.timedelta(minutes=5) < start + dt.timedelta(hours=1) else 2)
    return ["--pipeline", pipeline.name, "--start", start.isoformat(), "--end", end.isoformat()]


def measure_recompute(
    base: Settings, pipeline: Pipeline, run: int, work: Path, drained: dict[str, Any]
) -> dict[str, Any]:
    """The batch path over the drained backlog: silver and gold of its hour recomputed from bronze by
    ``tidewater batch recompute`` (the batch DAG's job, local Spark), in the job (the result line's
    ``seconds``: reading bronze to the last gold commit) and as a whole process (with Spark's start-up)."""
    command = ["batch", "recompute", *backlog_hour(pipeline, drained), "--run-id", f"bench-{run}"]
    return measure_batch_job(base, pipeline, run, work, drained, "recompute", command)


def measure_audit(base: Settings, pipeline: Pipeline, run: int, work: Path, drained: dict[str, Any]) -> dict[str, Any]:
    """The audit of the recomputed hour by ``tidewater audit run`` (the batch DAG's two audit tasks in one
    job: every suite, the reconciliation and the parity check), timed as the recompute is. A suite that
    fails still gives a figure (its names are kept): the audit's exit code says only that one failed."""
    command = ["audit", "run", *backlog_hour(pipeline, drained)]
    return measure_batch_job(base, pipeline, run, work, drained, "audit", command, failing_ok=True)


def measure_batch_job(
    base: Settings,
    pipeline: Pipeline,
    run: int,
    work: Path,
    drained: dict[str, Any],
    kind: str,
    arguments: list[str],
    *,
    failing_ok: bool = False,
) -> dict[str, Any]:
    """A ``tidewater`` batch job over the drained backlog's tables: events/s in the job (its result
    line's ``seconds``) and with Spark's start, peak RSS and PSS, and its phases."""
    settings = phase_settings(base, pipeline, "throughput", run, work)
    log_path = work / f"{pipeline.name}-{kind}-{run}.log"
    began = time.monotonic()
    with open(log_path, "wb") as log:
        job = subprocess.Popen(
            [str(Path(sys.executable).with_name("tidewater")), *arguments],
            env={**os.environ, **settings.to_env(), **spark_child_env()},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sampler = MemorySampler(job.pid, WORKER_SID)
    sampler.start()
    try:
        code = job.wait(timeout=1800)
    finally:
        sampler.stopped.set()
        stop_process_group(job, timeout_s=10)
    wall = time.monotonic() - began
    result = job_result(log_path.read_text(errors="replace").splitlines())
    if result is None or (code != 0 and not failing_ok):
        raise SystemExit(f"{kind} exited {code}: see {log_path}")
    records = int(drained["records"])
    figures = {
        "events_per_s": records / max(float(result["seconds"]), 1e-9),
        "wall_events_per_s": records / wall,
        "records": records,
        "seconds": float(result["seconds"]),
        "wall_seconds": wall,
        "peak_rss_gb": sampler.peak / 2**30,
        "peak_pss_gb": sampler.peak_pss / 2**30,
        "peak_pss_by_role": sampler.peak_roles,
        "phases_s": {name: round(ms / 1000, 1) for name, ms in (result.get("phases_ms") or {}).items()},
    }
    if "suites" in result:
        figures["failed_suites"] = sorted(name for name, suite in result["suites"].items() if not suite["success"])
    return figures


# The stretch of a drain its rate (and its CPU) is measured over, as fractions of the backlog.
DRAIN_MEASURED = (0.2, 0.9)


def drain_rate(samples: list[tuple[float, int]], total: int) -> float:
    """Rows per second between 20% and 90% of ``total`` (start-up and the last batch not counted)."""
    lo = next((t, r) for t, r in samples if r >= DRAIN_MEASURED[0] * total)
    hi = next(((t, r) for t, r in samples if r >= DRAIN_MEASURED[1] * total), samples[-1])
    return (hi[1] - lo[1]) / max(hi[0] - lo[0], 1e-9)


def measure_latency(
    base: Settings,
    pipeline: Pipeline,
    rate: float,
    seconds: float,
    warmup: float,
    run: int,
    work: Path,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    settings = phase_settings(base, pipeline, "latency", run, work).replace(trigger_seconds=1.0)
    create_topics(settings, pipeline)
    log_path = work / f"{pipeline.name}-latency-{run}.log"
    job = launch_stream_job(settings, pipeline.name, log_path)
    sampler = MemorySampler(job.pid, WORKER_SID, broker_pid=broker_pid)
    sampler.start()
    layout = PipelineLayout.of(settings, pipeline)
    first_bronze = layout.progress_dir() / f"{pipeline.query_of(pipeline.sources[0], 'bronze')}.json"
    topic, follow_ups = pipeline_topics(settings, pipeline)
    try:
        # Start producing only once the job runs (so JVM start-up is not latency).
        deadline = time.monotonic() + 300
        while not first_bronze.exists():
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"streaming job did not start: see {log_path}")
            time.sleep(0.5)
        config = GeneratorConfig(seed=77, rate=rate, producers=1)
        measured_from = time.time() + warmup
        sampler.cpu.start, sampler.cpu.end = measured_from, measured_from + seconds
        report = produce(
            settings,
            topic,
            config,
            duration_s=warmup + seconds,
            realtime=True,
            events=pipeline.sample_events,
            topics=follow_ups,
        )
        total = produced_records(settings, pipeline)
        deadline = time.monotonic() + 120
        while processed_rows(settings, pipeline) < total and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2 * settings.gold_trigger_seconds)  # the last silver commits reach gold
    finally:
        sampler.stopped.set()
        stop_process_group(job, timeout_s=30)
    silver = {
        source.name: commit_latencies(layout.source_table(source, "silver"), produced_after=measured_from)
        for source in pipeline.sources
    }
    by_source = {
        name: sorted(commit - t for commit, produced in commits for t in produced) for name, commits in silver.items()
    }
    events = sorted(lag for lags in by_source.values() for lag in lags)
    progress = layout.progress_dir() / "progress.jsonl"
    gold = {
        table.name: sorted(
            gold_latencies(
                [silver[s.name] for s in pipeline.inputs(table)],
                LakeTable(layout.table_uri(f"gold/{table.name}")),
                gold_batch_starts(
                    progress, f"{layout.namespace}.{pipeline.name}.{layout.gold_query_of(table.name).name}"
                ),
            )
        )
        for table in pipeline.gold
    }
    return {
        "offered_rate": rate,
        "achieved_rate": report.rate,
        "events": len(events),
        "p50_s": percentile(events, 0.5),
        "p95_s": percentile(events, 0.95),
        "max_s": events[-1] if events else float("nan"),
        # each source's own (a source declaring a slower trigger lags by up to it; the events' p95 hides a small one)
        "source_p50_p95_s": {name: (percentile(x, 0.5), percentile(x, 0.95)) for name, x in by_source.items()}
        if len(by_source) > 1
        else {},
        "gold_p95_s": {name: percentile(lags, 0.95) for name, lags in gold.items()},
        "peak_rss_gb": sampler.peak / 2**30,
        "peak_pss_gb": sampler.peak_pss / 2**30,
        "steady_pss_gb": sampler.steady_pss / 2**30 if sampler.steady_pss else float("nan"),
        "pss_by_minute_gb": [peak / 2**30 for peak in sampler.minute_peaks],
        "peak_pss_by_role": sampler.peak_roles,
        "executor_peak_rss_gb": sampler.executor_peak / 2**30,
        "progress": str(progress),
        "compiles_per_trigger": compiles_per_trigger([progress]),
        "cpu_by_role": sampler.cpu.by_role(),
        "cpu_seconds": sampler.cpu.seconds(),
    }


def percentile(values: list[float], q: float) -> float:
    return values[int(q * (len(values) - 1))] if values else float("nan")


# One silver commit: (its time, the Kafka timestamps of the measured events it made visible), epoch s.
SilverCommit = tuple[float, list[float]]


def table_commits(table: LakeTable) -> Iterator[tuple[float, list[dict[str, Any]]]]:
    """Each commit after the table's creation: (when it was made, epoch s; its actions)."""
    for version in range(1, table.version() + 1) if table.exists() else ():
        actions = table.commit_actions(version) or []
        commit_ms = next((a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a), None)
        if commit_ms is not None:
            yield commit_ms / 1000, actions


def commit_latencies(table: LakeTable, *, produced_after: float) -> list[SilverCommit]:
    """Per silver commit: when it was made and the Kafka timestamps (epoch s) of the events in it that
    were produced after ``produced_after``. An event's latency is the first minus the second. A
    compaction's files (``dataChange`` false) hold rows an earlier commit made visible: counting them
    again gave a run whose writer compacted silver a p95 of 82 s (rsvps, local[3], one run of three)."""
    out: list[SilverCommit] = []
    for committed, actions in table_commits(table):
        stamps: list[float] = []
        for action in actions:
            if "add" not in action or not action["add"].get("dataChange", True):
                continue
            fs, path = filesystem(f"{table.uri}/{action['add']['path']}")
            column = pq.read_table(path, filesystem=fs, columns=["kafka_timestamp"]).column(0)
            produced = (t.timestamp() for t in column.to_pylist() if t is not None)
            stamps.extend(t for t in produced if t >= produced_after)
        if stamps:
            out.append((committed, stamps))
    return out


def gold_batch_starts(progress: Path, query: str) -> dict[int, float]:
    """When each micro-batch of ``query`` started (epoch s), from the job's progress history."""
    starts: dict[int, float] = {}
    if not progress.exists():
        return starts
    for line in progress.read_text().splitlines():
        record = json.loads(line)
        if record.get("name") == query and record.get("batch_time"):
            starts[int(record["batch_id"])] = parse_time(record["batch_time"]).timestamp()
    return starts


def gold_latencies(inputs: list[list[SilverCommit]], gold: LakeTable, starts: dict[int, float]) -> list[float]:
    """Produced -> visible in a gold table, per event: the commit of the first gold micro-batch that
    started after the event's silver commit (a batch reads the silver versions there are when it
    starts) minus the event's Kafka timestamp. An aggregate shows the event's effect from then on; a
    table that emits closed windows only (append mode) holds it in state until the window closes."""
    batches: list[tuple[float, float]] = []  # (started, committed), epoch s
    for committed, actions in table_commits(gold):
        batch = next((a["txn"]["version"] for a in actions if "txn" in a), None)
        if batch is not None and batch in starts:
            batches.append((starts[batch], committed))
    batches.sort()
    out: list[float] = []
    for commits in inputs:
        for silver_commit, produced in commits:
            visible = next((done for began, done in batches if began >= silver_commit), None)
            if visible is not None:
                out.extend(visible - t for t in produced)
    return out


# ---- several runs: median and spread ----------------------------------------------------------------


def spread(values: list[float], unit: str = "", digits: int = 0) -> str:
    """``median [min-max]`` of a figure over runs: one run is not a figure on a shared 2-core host."""
    values = [v for v in values if v == v]  # NaN: a run that measured nothing
    if not values:
        return "n/a"
    fmt = f"{{:,.{digits}f}}"
    median = fmt.format(statistics.median(values)) + unit
    if len(values) == 1:
        return median
    return f"{median} [{fmt.format(min(values))}-{fmt.format(max(values))}{unit}]"


TARGETS = {
    "events_per_s": ">= 40,000",
    "p95_s": "<= 2 s",
    "gold_p95_s": "<= 8 s",
    "drain_rss_gb": "<= 2 GB",
    "latency_rss_gb": "<= 1.5 GB",
    "recompute_events_per_s": ">= 300,000",
}


def attempt(
    figures: dict[str, Any], measure: str, run: Callable[[], dict[str, Any]], *, broker_pid: int | None = None
) -> dict[str, Any] | None:
    """``run()``'s figures under ``measure``; a job that died is recorded (and printed) instead, so one
    pipeline's failure does not end the other pipelines' runs. With ``broker_pid`` (the embedded
    broker's), also the CPU the broker used meanwhile: its seconds, and its share of a core."""
    began, broker_before = time.monotonic(), cpu_seconds(broker_pid)
    try:
        figures[measure] = run()
    except Terminated:  # the bench itself was killed: stop, cleaning up on the way out
        raise
    except SystemExit as exc:
        figures.setdefault("failed", []).append(f"{measure}: {exc}")
        print(f"    FAILED: {exc}", flush=True)
        return None
    broker_after = cpu_seconds(broker_pid)
    if broker_before is not None and broker_after is not None:
        used = broker_after - broker_before
        figures[measure]["broker_cpu_s"] = round(used, 1)
        figures[measure]["broker_core_share"] = round(used / (time.monotonic() - began), 3)
    return figures[measure]


def summarize_runs(pipeline: str, runs: list[dict[str, Any]]) -> list[str]:
    throughput = [r["throughput"] for r in runs if "throughput" in r]
    latency = [r["latency"] for r in runs if "latency" in r]
    recompute = [r["recompute"] for r in runs if "recompute" in r]
    audit = [r["audit"] for r in runs if "audit" in r]
    lines = [f"{pipeline} ({len(runs)} run(s); median [min-max]):"]
    lines += [f"  FAILED {failure}" for r in runs for failure in r.get("failed", [])]
    machine = machine_line(runs)
    if machine:
        lines.append(machine)
    if throughput:
        lines.append(
            f"  Kafka -> silver while draining ({'/'.join(f'{b:,}' for b in drain_batches(throughput))}-record"
            " micro-batches):"
            f" {spread([t['events_per_s'] for t in throughput], ' events/s')} (target {TARGETS['events_per_s']})"
        )
        lines.append(
            f"  peak RSS draining: {spread([t['peak_rss_gb'] for t in throughput], ' GB', 2)}"
            f" (target {TARGETS['drain_rss_gb']}), PSS {spread([t['peak_pss_gb'] for t in throughput], ' GB', 2)}"
            + _executors([t["executor_peak_rss_gb"] for t in throughput])
        )
        lines += broker_line(throughput, "over the drain (the backlog's preload included)")
        lines += cpu_line(throughput, f"between {DRAIN_MEASURED[0]:.0%} and {DRAIN_MEASURED[1]:.0%} of the drain")
        lines += jvm_lines(throughput)
    if recompute:
        lines.append(
            f"  batch recompute of the backlog's hour (silver and gold from bronze): "
            f"{spread([b['events_per_s'] for b in recompute], ' events/s')} in the job, "
            f"{spread([b['wall_events_per_s'] for b in recompute], ' events/s')} with Spark's start"
            f" (target {TARGETS['recompute_events_per_s']}); "
            f"peak RSS {spread([b['peak_rss_gb'] for b in recompute], ' GB', 2)}"
        )
    if audit:
        failed = sorted({name for a in audit for name in a.get("failed_suites", [])})
        lines.append(
            f"  audit of that hour (every suite, the reconciliation, parity): "
            f"{spread([a['events_per_s'] for a in audit], ' events/s')} in the job, "
            f"{spread([a['wall_events_per_s'] for a in audit], ' events/s')} with Spark's start; "
            f"peak RSS {spread([a['peak_rss_gb'] for a in audit], ' GB', 2)}"
            + (f"; suites that failed: {', '.join(failed)}" if failed else "")
        )
    if latency:
        lines.append(
            f"  produced -> silver at {spread([x['achieved_rate'] for x in latency], ' events/s')}: "
            f"p50 {spread([x['p50_s'] for x in latency], ' s', 2)}, "
            f"p95 {spread([x['p95_s'] for x in latency], ' s', 2)} (target {TARGETS['p95_s']})"
        )
        for source in latency[0].get("source_p50_p95_s", {}):
            figures = [x["source_p50_p95_s"][source] for x in latency]
            lines.append(
                f"    of which {source}: p50 {spread([f[0] for f in figures], ' s', 2)}, "
                f"p95 {spread([f[1] for f in figures], ' s', 2)}"
            )
        for table in latency[0]["gold_p95_s"]:
            lines.append(
                f"  produced -> gold {table}: p95 {spread([x['gold_p95_s'][table] for x in latency], ' s', 2)}"
                f" (target {TARGETS['gold_p95_s']})"
            )
        lines += broker_line(latency, "over the latency run (start-up included)")
        lines += cpu_line(latency, "over the measured seconds at that rate")
        compiles = [x["compiles_per_trigger"] for x in latency if x.get("compiles_per_trigger") is not None]
        if compiles:
            lines.append(f"  Spark code compiled at that rate: {spread(compiles, ' classes per trigger', 2)}")
        lines.append(
            f"  peak RSS at that rate: {spread([x['peak_rss_gb'] for x in latency], ' GB', 2)}"
            f" (target {TARGETS['latency_rss_gb']}), PSS {spread([x['peak_pss_gb'] for x in latency], ' GB', 2)}"
            + _executors([x["executor_peak_rss_gb"] for x in latency])
        )
        lines.append(
            "  peak PSS at that rate once Spark's start-up workers had exited: "
            + spread([x.get("steady_pss_gb", float("nan")) for x in latency], " GB", 2)
        )
        by_minute = minute_line(latency)
        if by_minute:
            lines.append(by_minute)
    return lines


def minute_line(latency: list[dict[str, Any]]) -> str:
    """The PSS peak of each minute of the job (the median over runs), for runs of more than 3 minutes:
    whether memory levels off or keeps growing. Empty for shorter runs."""
    series = [x.get("pss_by_minute_gb") or [] for x in latency]
    minutes = min(len(s) for s in series) if series else 0
    if minutes <= 3:
        return ""
    peaks = [statistics.median(s[m] for s in series) for m in range(minutes)]
    return "  PSS peak in each minute of the job at that rate: " + ", ".join(f"{p:.2f}" for p in peaks) + " GB"


def cpu_line(measures: list[dict[str, Any]], when: str) -> list[str]:
    """Where the CPU went ``when`` (a drain's measured stretch, the offered rate's measured seconds):
    each role's share of a core, the median over runs, the busiest first (total: of the machine's
    cores together). Results written before a measure recorded its CPU give no line."""
    shares: dict[str, list[float]] = {}
    for x in measures:
        window = x.get("cpu_seconds") or 0.0
        for role, (_, used) in (x.get("cpu_by_role") or {}).items() if window else ():
            shares.setdefault(role, []).append(100 * used / window)
    if not shares:
        return []
    medians = sorted(((statistics.median(v), role) for role, v in shares.items()), reverse=True)
    total = sum(share for share, _ in medians)
    parts = ", ".join(f"{role} {share:.0f}%" for share, role in medians if share >= 0.5)
    return [f"  CPU {when}, % of a core (median): {total:.0f}% in all; {parts}"]


def jvm_lines(throughput: list[dict[str, Any]]) -> list[str]:
    """What the drains' flight recordings say (``--jvm-profile``), all runs together; or why there is none."""
    profiles = [t["jvm_profile"] for t in throughput if t.get("jvm_profile")]
    lines = [f"  JVM profile left out: {t['jvm_profile_problem']}" for t in throughput if t.get("jvm_profile_problem")]
    if not profiles:
        return lines
    profile = merged(profiles)
    samples: dict[str, int] = profile["samples"]
    total = sum(samples.values()) or 1
    kinds = ", ".join(f"{kind} {count / total:.0%}" for kind, count in samples.items())
    lines.append(f"  the JVM's CPU samples over the measured drain ({total:,}, JFR): {kinds}")
    lines.append(f"  the JVM's garbage collection over the measured drain: {gc_line(profile)}")
    if profile.get("allocated"):
        lines.append(f"  the JVM's allocation over the measured drain: {allocation_line(profile)}")
    return lines


def broker_line(measures: list[dict[str, Any]], when: str) -> list[str]:
    """The embedded broker's CPU over ``measures`` (none on the cluster profile, whose broker the bench
    does not start as a child of its own)."""
    share = [m["broker_core_share"] * 100 for m in measures if m.get("broker_core_share") is not None]
    if not share:
        return []
    used = spread([m["broker_cpu_s"] for m in measures if m.get("broker_cpu_s") is not None], " s", 1)
    return [f"  the embedded broker {when}: {used} of CPU, {spread(share, '% of a core')}"]


def _executors(values: list[float]) -> str:
    return f" + executors {spread(values, ' GB', 2)}" if WORKER_SID else ""


# ---- where the time goes: the per-phase profile -------------------------------------------------------

# Spark's parts of a trigger (StreamingQueryProgress.durationMs), in the order they run.
SPARK_PARTS = ("latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets")


def phase_profile(progress_files: list[Path], *, min_rows: int = 1) -> dict[str, dict[str, Any]]:
    """Per query: the batches with at least ``min_rows`` input rows, and the median ms of each of Spark's
    parts of a trigger and of each writer phase (:mod:`tidewater.phase_clock`), over all the files."""
    by_query: dict[str, list[dict[str, Any]]] = {}
    for path in progress_files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if int(record.get("num_input_rows") or 0) >= min_rows and record.get("duration_ms"):
                by_query.setdefault(str(record["name"]).rsplit(".", 1)[-1], []).append(record)
    profile: dict[str, dict[str, Any]] = {}
    for query, records in sorted(by_query.items()):
        parts: dict[str, list[float]] = {}
        for record in records:
            for name, ms in record["duration_ms"].items():
                parts.setdefault(f"spark:{name}", []).append(float(ms))
            for name, ms in (record.get("phases_ms") or {}).items():
                parts.setdefault(name, []).append(float(ms))
        profile[query] = {
            "batches": len(records),
            "rows": statistics.median(int(r["num_input_rows"]) for r in records),
            "median_ms": {name: statistics.median(values) for name, values in parts.items()},
        }
    return profile


def compiles_per_trigger(progress_files: list[Path]) -> float | None:
    """Classes Spark's code generator compiled per trigger (any query's) once the job was running: from
    each file's first progress record to its last (``codegen_compiles_total``, JVM-wide), over the
    triggers between them. Near 0 when every query's plan is the same from one micro-batch to the next."""
    compiles = triggers = 0
    for path in progress_files:
        if not path.exists():
            continue
        totals = [
            int(record["codegen_compiles_total"])
            for line in path.read_text().splitlines()
            if (record := json.loads(line)).get("codegen_compiles_total") is not None
        ]
        if len(totals) > 1:
            compiles += totals[-1] - totals[0]
            triggers += len(totals) - 1
    return compiles / triggers if triggers else None


def tree_order(phases: list[str]) -> list[str]:
    """Phase paths in the order they ran, each under its parent: a phase another thread timed (the
    bronze commit, beside the parse) starts after its parent's siblings did, but belongs under it."""
    first = {name: index for index, name in enumerate(phases)}

    def key(name: str) -> tuple[int, ...]:
        parts = name.split("/")
        return tuple(first.get("/".join(parts[: i + 1]), len(first)) for i in range(len(parts)))

    return sorted(phases, key=key)


def render_memory(title: str, runs: list[dict[str, list[float]]]) -> list[str]:
    """Each run's PSS at its peak by process role (:func:`by_role`): medians over the runs."""

    def median(role: str, field: int) -> float:
        return statistics.median(run.get(role, [0, 0])[field] for run in runs)

    roles = sorted({role for run in runs for role in run}, key=lambda role: -median(role, 1))
    lines = [
        f"### {title}: the job's process tree at its PSS peak ({len(runs)} run(s), medians)",
        "",
        "| process | count | PSS MiB |",
        "|---|---:|---:|",
    ]
    for role in roles:
        lines.append(f"| {role} | {median(role, 0):g} | {median(role, 1):,.0f} |")
    total = statistics.median(sum(entry[1] for entry in run.values()) for run in runs)
    lines += [f"| **total** | | **{total:,.0f}** |", ""]
    return lines


def render_profile(title: str, profile: dict[str, dict[str, Any]]) -> list[str]:
    """A Markdown table per query: Spark's parts of a trigger, then the writer's phases as a tree."""
    lines = [f"### {title}", ""]
    for query, entry in profile.items():
        medians = entry["median_ms"]
        trigger = medians.get("spark:triggerExecution") or 0.0
        lines += [
            f"**{query}**: {entry['batches']} batches, median {entry['rows']:,.0f} input rows per batch",
            "",
            "| part of the trigger (median per batch) | ms | share |",
            "|---|---:|---:|",
        ]
        rows = [(f"Spark `{p}`", medians[f"spark:{p}"]) for p in SPARK_PARTS if f"spark:{p}" in medians]
        writer = tree_order([k for k in medians if not k.startswith("spark:") and k != "total"])
        if "total" in medians:
            rows.append(("writer (inside addBatch)", medians["total"]))
        for name in writer:
            depth = name.count("/") + 1
            rows.append(("&nbsp;&nbsp;" * depth + name.rsplit("/", 1)[-1], medians[name]))
        rows.append(("**trigger** (`triggerExecution`)", trigger))
        for label, ms in rows:
            share = f"{100 * ms / trigger:.0f}%" if trigger else ""
            lines.append(f"| {label} | {ms:,.0f} | {share} |")
        lines.append("")
    return lines


# ---- the command ----------------------------------------------------------------------------------------


LOOP_STEPS = 10_000_000  # the machine figure: seconds for this many steps of a Python loop on one core


def loop_seconds(samples: int = 5, steps: int = 2_000_000) -> list[float]:
    """Seconds one core takes for :data:`LOOP_STEPS` steps of a fixed Python loop, ``samples`` times
    (each a shorter loop, scaled). Machines of one kind differ from day to day and from minute to minute
    (on 2026-11-28 this one took 0.70 s, then 1.7-2.4 s ten minutes later with nothing else running),
    and the figures move with it: the bench takes these samples around every measure and reports them
    beside its figures. A best-of-three hid that: it kept the one fast moment."""
    seconds = []
    for _ in range(samples):
        began = time.perf_counter()
        total = 0
        for step in range(steps):
            total += step
        seconds.append((time.perf_counter() - began) * LOOP_STEPS / steps)
    return seconds


TOUCH_MIB = 256


def touch_seconds(samples: int = 3, mib: int = TOUCH_MIB) -> list[float]:
    """Seconds to touch ``mib`` MiB of fresh anonymous memory, a write per page, ``samples`` times: what
    a new page costs, which the Python loop does not show. A streaming job faults in pages all the time
    (forked Python workers, Arrow buffers, a heap that grows back). On 2026-11-28 1 GiB took 2.7 s to
    touch (~10 µs a page) in a slow spell; later 256 MiB took 0.21-0.24 s with the loop at 0.68 s,
    and ads still ran far behind its usual latency: neither probe says everything about a machine."""
    seconds = []
    for _ in range(samples):
        began = time.perf_counter()
        with mmap.mmap(-1, mib << 20) as memory:
            for offset in range(0, mib << 20, mmap.PAGESIZE):
                memory[offset] = 1
        seconds.append(time.perf_counter() - began)
    return seconds


def probe_machine(figures: dict[str, Any], when: str) -> None:
    """Add the machine's samples, taken now (``when``: before/after which measure), to a run's figures:
    the Python loop (a core's speed) and the first touch of fresh memory (a page's cost)."""
    loop, touch = loop_seconds(), touch_seconds()
    figures.setdefault("loop_s", {})[when] = [round(s, 3) for s in loop]
    figures.setdefault("touch_s", {})[when] = [round(s, 3) for s in touch]
    touched = spread(touch, " s", 2)
    print(f"    machine {when}: 10M-step loop {spread(loop, ' s', 2)}, {TOUCH_MIB} MiB touched in {touched}")


def machine_line(runs: list[dict[str, Any]]) -> str | None:
    """The machine's speed while a pipeline's runs measured: every sample taken around them."""
    loop = [s for r in runs for taken in (r.get("loop_s") or {}).values() for s in taken]
    touch = [s for r in runs for taken in (r.get("touch_s") or {}).values() for s in taken]
    if not loop:
        return None
    return (
        f"  machine around these runs: 10M-step Python loop in {spread(loop, ' s', 2)}, "
        f"{TOUCH_MIB} MiB of fresh memory touched in {spread(touch, ' s', 2)} "
        f"({len(loop)} + {len(touch)} samples)"
    )


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) process ``pid`` used so far, or None if it is not there to read."""
    try:
        fields = stat_fields(f"/proc/{pid}/stat")
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", help="comma-separated (default: every pipeline that declares sample events)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measure per pipeline (median and spread)")
    parser.add_argument(
        "--backlog",
        type=int,
        default=1_000_000,
        help="events preloaded for the throughput run (and the recomputed hour)",
    )
    parser.add_argument("--warmup-seconds", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--latency-seconds", type=float, default=90.0)
    parser.add_argument(
        "--drain-batch",
        type=int,
        help="records per micro-batch while draining (default: TIDEWATER_MAX_OFFSETS_PER_TRIGGER, 200,000 unless set)",
    )
    parser.add_argument(
        "--jvm-profile",
        action="store_true",
        help="record the streaming job's JVM with JDK Flight Recorder over each drain's measured stretch:"
        " its CPU by kind of work and its garbage collection, in the summary and the --profile report"
        " (the driver's JVM: with --cluster, not the executors')",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--skip-recompute",
        action="store_true",
        help="skip the batch recompute of the drained backlog's hour (and its audit)",
    )
    parser.add_argument("--skip-audit", action="store_true", help="skip the audit of the recomputed hour")
    parser.add_argument(
        "--profile",
        nargs="?",
        const=str(DEFAULT_PROFILE),
        metavar="REPORT",
        help=f"also write where each micro-batch's time goes, per phase, to REPORT (default {DEFAULT_PROFILE})",
    )
    parser.add_argument("--cluster", action="store_true", help="run on the cluster profile (see above)")
    parser.add_argument("--work-dir", help="keep logs, progress files and tables here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    drain_batch = args.drain_batch if args.drain_batch is not None else Settings.from_env().max_offsets_per_trigger
    if drain_batch < 1:
        parser.error("--drain-batch must be at least 1")
    if args.backlog < 3 * drain_batch:
        parser.error(
            f"--backlog must be at least {3 * drain_batch:,}: the drain rate is taken between 20% and 90% of "
            f"it, and a micro-batch drains {drain_batch:,} records"
        )
    exit_on_sigterm()  # a killed bench still stops its job, broker and cluster
    available = {name: p for name, p in all_pipelines().items() if p.sample_events is not None}
    names = args.pipelines.split(",") if args.pipelines else sorted(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error(f"--pipelines: {', '.join(unknown)} unknown or without sample events; have {sorted(available)}")

    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    machine = (
        f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.platform()}; "
        f"a 10M-step Python loop on one core in {spread(loop_seconds(), ' s', 2)} at the start"
    )
    print(f"machine: {machine}", flush=True)
    results: dict[str, Any] = {"machine": machine, "pipelines": {}}
    with tempfile.TemporaryDirectory(prefix="tidewater-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        broker_pid: int | None = None  # the embedded broker's, whose CPU the latency run reports
        if args.cluster:
            base = stack.enter_context(cluster_profile(work))
        else:
            broker = stack.enter_context(EmbeddedBroker())
            broker_pid = broker.process.pid if broker.process else None
            base = Settings.from_env(state_dir=str(work), kafka_bootstrap_servers=broker.bootstrap_servers)
        where = f"{base.spark_master}, lake {base.lake_uri}"
        results["where"] = where
        print(f"where: {where}", flush=True)
        for name in names:
            pipeline = available[name]
            runs: list[dict[str, Any]] = []
            master = job_master(base, name)
            if master != base.spark_master:
                print(f"{name}'s streaming job runs on {master} (TIDEWATER_STREAM_EXTRA_TASK_SLOTS)", flush=True)
            for run in range(1, args.runs + 1):
                figures: dict[str, Any] = {}
                probe_machine(figures, "before")
                if not args.skip_throughput:
                    print(
                        f"{name} run {run}: throughput, draining {args.backlog:,} events"
                        f" in micro-batches of {drain_batch:,}",
                        flush=True,
                    )
                    measure = partial(
                        measure_throughput,
                        base,
                        pipeline,
                        args.backlog,
                        run,
                        work,
                        drain_batch=drain_batch,
                        jvm_profile=args.jvm_profile,
                    )
                    t = attempt(figures, "throughput", measure, broker_pid=broker_pid)
                    if t:
                        print(
                            f"    {t['events_per_s']:,.0f} events/s, peak RSS {t['peak_rss_gb']:.2f} GB"
                            f" (PSS {t['peak_pss_gb']:.2f} GB)",
                            flush=True,
                        )
                    if t and not args.skip_recompute:
                        print(f"{name} run {run}: batch recompute of that backlog's hour from bronze", flush=True)
                        b = attempt(figures, "recompute", partial(measure_recompute, base, pipeline, run, work, t))
                        if b:
                            print(
                                f"    {b['events_per_s']:,.0f} events/s in the job ({b['seconds']:.1f} s), "
                                f"{b['wall_events_per_s']:,.0f} events/s with Spark's start "
                                f"({b['wall_seconds']:.1f} s); "
                                f"peak RSS {b['peak_rss_gb']:.2f} GB",
                                flush=True,
                            )
                            print("    phases: " + ", ".join(f"{k} {v} s" for k, v in b["phases_s"].items()))
                    if t and not args.skip_recompute and not args.skip_audit and "recompute" in figures:
                        print(f"{name} run {run}: audit of that hour (every suite and check)", flush=True)
                        a = attempt(figures, "audit", partial(measure_audit, base, pipeline, run, work, t))
                        if a:
                            failed = f"; suites failed: {', '.join(a['failed_suites'])}" if a["failed_suites"] else ""
                            print(
                                f"    {a['events_per_s']:,.0f} events/s in the job ({a['seconds']:.1f} s), "
                                f"{a['wall_events_per_s']:,.0f} events/s with Spark's start "
                                f"({a['wall_seconds']:.1f} s); peak RSS {a['peak_rss_gb']:.2f} GB{failed}",
                                flush=True,
                            )
                            print("    phases: " + ", ".join(f"{k} {v} s" for k, v in a["phases_s"].items()))
                    probe_machine(figures, "after the drain")
                if not args.skip_latency:
                    print(
                        f"{name} run {run}: latency, {args.rate:g} events/s for {args.warmup_seconds:g} s warm-up"
                        f" + {args.latency_seconds:g} s, 1 s trigger",
                        flush=True,
                    )
                    measure = partial(
                        measure_latency,
                        base,
                        pipeline,
                        args.rate,
                        args.latency_seconds,
                        args.warmup_seconds,
                        run,
                        work,
                        broker_pid,
                    )
                    x = attempt(figures, "latency", measure, broker_pid=broker_pid)
                    if x:
                        print(
                            f"    silver p50 {x['p50_s']:.2f} s p95 {x['p95_s']:.2f} s; gold p95 "
                            + ", ".join(f"{k} {v:.2f} s" for k, v in x["gold_p95_s"].items())
                            + f"; peak RSS {x['peak_rss_gb']:.2f} GB (PSS {x['peak_pss_gb']:.2f} GB)",
                            flush=True,
                        )
                    probe_machine(figures, "after the latency run")
                runs.append(figures)
            results["pipelines"][name] = runs
            print("\n".join(summarize_runs(name, runs)), flush=True)
        print("\nsummary (" + where + ")")
        for name, runs in results["pipelines"].items():
            print("\n".join(summarize_runs(name, runs)))
        if args.profile:
            write_profile(Path(args.profile), results, machine, where)
    print(json.dumps(results, indent=2))
    return 0


DEFAULT_PROFILE = Path(__file__).with_name("PROFILE.md")


def write_profile(path: Path, results: dict[str, Any], machine: str, where: str) -> None:
    lines = [
        "# Where a micro-batch's time goes",
        "",
        f"Written by `./tw bench --profile` on {dt.date.today().isoformat()}; {machine}; {where}.",
        "Medians per micro-batch over every run; Spark's parts of a trigger (`durationMs`) and, inside",
        "`addBatch`, the writer's phases (`tidewater.phase_clock`; an indented phase is part of the one",
        "above it). `read and parse` is one Spark job: the Kafka read (each payload checked against its",
        "contract in the reader) and the parse, each row brought to the driver with its bronze columns",
        "beside its silver and quarantine ones. The parse is part of the query's plan, so Spark plans it in",
        "`queryPlanning` and `read and parse` only runs it. delta-rs writes the bronze rows on the driver",
        "(`bronze/commit`, on a thread of its own while silver's rows are divided: not part of `bronze`'s",
        "time; `silver/bronze commit wait` is how long silver then waited for it before its key lookup).",
        "A batch whose job failed is written apart: `bronze/read` (the rows cached) and `silver/parse`",
        "(over the cache, the poison records isolated). After each phase's tables, where the job's memory",
        "was at its PSS peak, each process by role (`process_role`).",
        "",
    ]
    for name, runs in results["pipelines"].items():
        lines += [f"## {name}", "", *[f"    {line}" for line in summarize_runs(name, runs)[1:]], ""]
        batches = "/".join(batch_label(b) for b in drain_batches([r["throughput"] for r in runs if "throughput" in r]))
        for phase, title, min_rows in (
            ("throughput", f"draining a backlog ({batches} micro-batches)", 1000),
            ("latency", "at the offered rate (1 s trigger)", 1),
        ):
            files = [Path(r[phase]["progress"]) for r in runs if phase in r]
            if files:
                lines += render_profile(title, phase_profile(files, min_rows=min_rows))
                compiles = compiles_per_trigger(files)
                if compiles is not None:
                    lines += [f"Spark code compiled {title.split(' (')[0]}: {compiles:.2f} classes per trigger.", ""]
            roles = [r[phase]["peak_pss_by_role"] for r in runs if r.get(phase, {}).get("peak_pss_by_role")]
            if roles:
                lines += render_memory(f"memory {title.split(' (')[0]}", roles)
            recorded = [r[phase]["jvm_profile"] for r in runs if r.get(phase, {}).get("jvm_profile")]
            if recorded:
                when = title.split(" (")[0]
                what = f"the JVM {when}: its CPU by kind of work and what it allocated ({len(recorded)} run(s), JFR)"
                lines += render(what, merged(recorded))
    path.write_text("\n".join(lines) + "\n")
    print(f"profile written to {path}", flush=True)


@contextlib.contextmanager
def cluster_profile(work: Path) -> Iterator[Settings]:
    """The cluster profile's services without Airflow (nothing else submits jobs), in a folder the
    postgres user can reach; the settings of a job on it."""
    global WORKER_SID
    from tidewater.orchestration.cluster import Cluster

    root = Path(tempfile.mkdtemp(prefix="tidewater-bench-cluster-"))
    root.chmod(0o755)
    cluster = Cluster(Settings.from_env(state_dir=str(root)))
    try:
        cluster.up(progress=lambda line: print(f"  {line}", flush=True), airflow=False)
        os.environ.update(cluster.environment())  # this process reads the S3 lake too
        WORKER_SID = int(cluster.read()["services"]["spark-worker"]["pid"])
        yield cluster.settings().replace(state_dir=str(work))
    finally:
        WORKER_SID = None
        cluster.down(progress=lambda line: print(f"  {line}", flush=True))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
