"""Streaming benchmark: throughput Kafka -> silver, end-to-end latency, peak memory.

Runs the real streaming job (spark-submit spark_jobs/stream.py: bronze, silver and both gold
queries) against the embedded broker, on the local file system, and prints:

1. sustained events/s from Kafka to silver while draining a backlog in micro-batches of 100k
   (slope of silver's row count between 20% and 90% of the backlog, so start-up is not counted);
2. end-to-end latency p50/p95 at a fixed offered rate with a 1-second trigger: for every event,
   the time of the silver Delta commit that made it visible minus its Kafka timestamp (events of
   the first ``--warmup-seconds`` are produced but not counted: JIT and Python worker start-up);
3. peak RSS of the streaming job (JVM + Python driver + Python workers, summed over its session).

    ./tw bench                       # defaults below
    ./tw bench --backlog 300000 --rate 2000 --latency-seconds 60
    ./tw bench --profile cluster     # the same on the cluster profile (tidewater.orchestration.cluster):
                                     # Spark standalone master and worker, the lake on the S3 server,
                                     # the broker's log on it, locks and leases in PostgreSQL

On the cluster profile the executors run under the Spark worker, not in the job's process tree: their
memory is reported apart (the worker's process tree minus what it held before the job).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing import Process
from pathlib import Path

import pyarrow.parquet as pq

from tidewater.broker import EmbeddedBroker
from tidewater.config import Settings
from tidewater.generator.events import GeneratorConfig
from tidewater.generator.producer import ensure_topic, produce
from tidewater.lake.storage import filesystem
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import stop_process_group
from tidewater.streaming.jobs import launch_stream_job

RSVPS = get_pipeline("rsvps")


def session_rss_bytes(sid: int) -> int:
    """Summed resident memory of every process in session ``sid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 of stat: session id
                continue
            with open(f"/proc/{entry}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


class MemorySampler(threading.Thread):
    """Peak RSS of the job's session and, on a cluster, of the worker's (less its ``worker_base``)."""

    def __init__(self, sid: int, worker_sid: int | None = None) -> None:
        super().__init__(daemon=True)
        self.sid = sid
        self.worker_sid = worker_sid
        self.worker_base = session_rss_bytes(worker_sid) if worker_sid else 0
        self.peak = 0
        self.executor_peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.peak = max(self.peak, session_rss_bytes(self.sid))
            if self.worker_sid:
                self.executor_peak = max(self.executor_peak, session_rss_bytes(self.worker_sid) - self.worker_base)


WORKER_SID: int | None = None  # the cluster profile's Spark worker, whose process tree holds the executors


def silver_rows(settings: Settings) -> int:
    table = LakeTable(PipelineLayout.of(settings, RSVPS).table_uri("silver"))
    return table.row_count() if table.exists() else 0


def _produce_share(settings: Settings, topic: str, seed: int, count: int, start_ms: int) -> None:
    config = GeneratorConfig(seed=seed, start_time_ms=start_ms, rate=100_000, producers=1)
    produce(settings, topic, config, count=count, realtime=False)


def preload(settings: Settings, topic: str, total: int, processes: int = 2) -> float:
    """Fill the topic with ``total`` events from several producer processes; returns seconds taken."""
    started = time.monotonic()
    share = total // processes
    start_ms = int(time.time() * 1000) - 3_600_000
    workers = [
        Process(target=_produce_share, args=(settings, topic, 1000 + i, share, start_ms + i)) for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"producer process failed with exit code {worker.exitcode}")
    return time.monotonic() - started


def phase_lake(base: Settings, phase: str) -> str:
    """A lake of its own per phase: under the state folder by default, under the S3 root on a cluster."""
    return f"{base.lake_root.rstrip('/')}/{phase}" if base.lake_root else ""


def measure_throughput(base: Settings, backlog: int, work: Path) -> dict[str, float]:
    # Batches of 100k: the first (cold JVM) batch is a small part of the backlog, and the slope
    # below is taken between 20% and 90% of it, i.e. at steady state.
    settings = base.replace(
        state_dir=str(work / "throughput"), lake_root=phase_lake(base, "throughput"), max_offsets_per_trigger=100_000
    )
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 4)
    produce_s = preload(settings, topic, backlog)
    print(f"  backlog of {backlog:,} events produced in {produce_s:.1f} s", flush=True)
    job = launch_stream_job(settings, "rsvps", work / "throughput.log")
    sampler = MemorySampler(job.pid, WORKER_SID)
    sampler.start()
    samples: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            if job.poll() is not None:
                raise SystemExit(f"streaming job died: see {work / 'throughput.log'}")
            rows = silver_rows(settings)
            samples.append((time.monotonic(), rows))
            if rows >= backlog:
                break
            time.sleep(0.5)
    finally:
        sampler.stopped.set()
        stop_process_group(job, timeout_s=30)
    lo, hi = 0.2 * backlog, 0.9 * backlog
    t_lo = next(t for t, r in samples if r >= lo)
    t_hi = next(t for t, r in samples if r >= hi)
    r_lo = next(r for t, r in samples if r >= lo)
    r_hi = next(r for t, r in samples if r >= hi)
    return {
        "events_per_s": (r_hi - r_lo) / max(t_hi - t_lo, 1e-9),
        "peak_rss_gb": sampler.peak / 2**30,
        "executor_peak_rss_gb": sampler.executor_peak / 2**30,
    }


def measure_latency(base: Settings, rate: float, seconds: float, warmup: float, work: Path) -> dict[str, float]:
    settings = base.replace(state_dir=str(work / "latency"), lake_root=phase_lake(base, "latency"), trigger_seconds=1.0)
    topic = settings.topic(RSVPS.source().topic)
    ensure_topic(settings, topic, 4)
    job = launch_stream_job(settings, "rsvps", work / "latency.log")
    sampler = MemorySampler(job.pid, WORKER_SID)
    sampler.start()
    layout = PipelineLayout.of(settings, RSVPS)
    try:
        # Start producing only once the job runs (so JVM start-up is not latency).
        deadline = time.monotonic() + 300
        while not (layout.progress_dir() / "bronze.json").exists():
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"streaming job did not start: see {work / 'latency.log'}")
            time.sleep(0.5)
        config = GeneratorConfig(seed=77, rate=rate, producers=1)
        measured_from = time.time() + warmup
        report = produce(settings, topic, config, duration_s=warmup + seconds, realtime=True)
        total = report.sent
        deadline = time.monotonic() + 120
        while silver_rows(settings) < total and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        sampler.stopped.set()
        stop_process_group(job, timeout_s=30)
    latencies = commit_latencies(LakeTable(layout.table_uri("silver")), produced_after=measured_from)
    latencies.sort()
    return {
        "offered_rate": rate,
        "achieved_rate": report.rate,
        "events": len(latencies),
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[int(0.95 * (len(latencies) - 1))],
        "max_s": latencies[-1],
        "peak_rss_gb": sampler.peak / 2**30,
        "executor_peak_rss_gb": sampler.executor_peak / 2**30,
    }


def commit_latencies(table: LakeTable, *, produced_after: float) -> list[float]:
    """Per event produced after ``produced_after`` (epoch s): silver commit time (when it became
    visible) minus its Kafka timestamp (when it was produced)."""
    out: list[float] = []
    for version in range(1, table.version() + 1):
        actions = table.commit_actions(version) or []
        commit_ms = next((a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a), None)
        if commit_ms is None:
            continue
        for action in actions:
            if "add" not in action:
                continue
            fs, path = filesystem(f"{table.uri}/{action['add']['path']}")
            stamps = pq.read_table(path, filesystem=fs, columns=["kafka_timestamp"]).column(0)
            out.extend(commit_ms / 1000 - t.timestamp() for t in stamps.to_pylist() if t.timestamp() >= produced_after)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=800_000)
    parser.add_argument("--warmup-seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--work-dir", help="keep logs, progress files and tables here (default: a temp dir)")
    parser.add_argument(
        "--profile", choices=("embedded", "cluster"), default="embedded", help="where the job runs (see above)"
    )
    args = parser.parse_args(argv)

    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    machine = f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.platform()}"
    print(f"machine: {machine}", flush=True)
    results: dict[str, object] = {"machine": machine}
    with tempfile.TemporaryDirectory(prefix="tidewater-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.profile == "cluster":
            base = stack.enter_context(cluster_profile(work))
        else:
            broker = stack.enter_context(EmbeddedBroker())
            base = Settings.from_env(state_dir=str(work), kafka_bootstrap_servers=broker.bootstrap_servers)
        where = f"{base.spark_master}, lake {base.lake_uri}"
        results["where"] = where
        if not args.skip_throughput:
            print(f"throughput: Kafka -> bronze -> silver (+ gold queries running), {where}", flush=True)
            throughput = measure_throughput(base.replace(kafka_topic_prefix="tp-"), args.backlog, work)
            results["throughput"] = throughput
            print(
                f"  sustained {throughput['events_per_s']:,.0f} events/s to silver (target >= 25,000); "
                f"peak RSS {throughput['peak_rss_gb']:.2f} GB (target <= 3 GB)" + _executors(throughput),
                flush=True,
            )
        if not args.skip_latency:
            print(
                f"latency: {args.rate:g} events/s offered for {args.warmup_seconds:g} s warm-up + "
                f"{args.latency_seconds:g} s measured, 1 s trigger",
                flush=True,
            )
            latency = measure_latency(
                base.replace(kafka_topic_prefix="lat-"), args.rate, args.latency_seconds, args.warmup_seconds, work
            )
            results["latency"] = latency
            print(
                f"  produced -> visible in silver: p50 {latency['p50_s']:.2f} s, p95 {latency['p95_s']:.2f} s "
                f"(target <= 5 s), max {latency['max_s']:.2f} s over {latency['events']:,} events "
                f"(achieved {latency['achieved_rate']:,.0f}/s); peak RSS {latency['peak_rss_gb']:.2f} GB"
                + _executors(latency),
                flush=True,
            )
    print(json.dumps(results, indent=2))
    return 0


def _executors(figures: dict[str, float]) -> str:
    return f" + executors {figures['executor_peak_rss_gb']:.2f} GB" if WORKER_SID else ""


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
