"""Pieces of ``tidewater platform``: its state-folder claim, the generator threads, status lines.

One platform per state folder: ``<state_dir>/platform.json`` records the running platform's pid
(for ``tidewater stop``), the hour it first ran (the batch DAGs' start date) and the identity of
the embedded broker's log its streams read; an ``flock`` on ``platform.lock`` refuses a second
platform on the same folder.

With ``--durable-broker`` tansu keeps its log in a bucket of the embedded S3 server under
``<state_dir>/broker/``, so a new run resumes the last one's topics, offsets and checkpoints. Only
when that log is not the one the last run's streams read (the in-memory broker, which is new on
every run, or a broker folder deleted while the lake remained) is the last run moved aside.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tidewater.config import Settings
from tidewater.errors import ConfigError, TidewaterError, one_line
from tidewater.json_files import read_json, write_json
from tidewater.lake.locks import try_flock
from tidewater.processes import alive as _alive
from tidewater.processes import kill_spark_leftovers

if TYPE_CHECKING:
    from tidewater.pipelines import Pipeline


class PlatformState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = Path(settings.state_dir).absolute()
        self.file = self.dir / "platform.json"
        self._lock: IO[str] | None = None

    @property
    def log_dir(self) -> Path:
        path = self.dir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def read(self) -> dict[str, Any]:
        return read_json(self.file)

    def record(self, **fields: Any) -> None:
        write_json(self.file, {**self.read(), **fields})

    def claim(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        handle = open(self.dir / "platform.lock", "a+")  # noqa: SIM115 - held while the platform runs
        if try_flock(handle) is not None:
            handle.close()
            raise ConfigError(
                f"a platform is already running from {self.dir} (pid {self.read().get('pid')}): "
                "stop it with ./tw stop, or use another TIDEWATER_STATE_DIR"
            )
        self._lock = handle
        self.record(pid=os.getpid(), started_at=_now(), embedded_broker=not self.settings.kafka_bootstrap_servers)

    def release(self) -> None:
        if self._lock is not None:
            self.record(pid=None, stopped_at=_now())
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def first_start_hour(self) -> str:
        """The hour the lake's first events arrived: where the scheduled batch DAGs start."""
        data = self.read()
        if not data.get("first_start_hour"):
            hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
            self.record(first_start_hour=hour.isoformat())
            data = self.read()
        return str(data["first_start_hour"])

    @property
    def broker_dir(self) -> Path:
        """The durable embedded broker's folder: its S3 server's data (the log's bucket), ports, logs."""
        return self.dir / "broker"

    def resume_or_archive(self, broker_identity: str | None) -> Path | None:
        """May the lake and checkpoints go on with this run's embedded broker?

        ``broker_identity`` names the durable broker's log (:attr:`tidewater.broker.DurableBroker.identity`);
        None is the in-memory broker, whose log is new on every run. The same log as the last run's:
        resume, nothing moves. Any other: the last run's offsets would point into a log that is gone,
        so that run is archived (if a stream read it). Returns the archive folder, if any."""
        recorded = self.read().get("broker_identity")
        if broker_identity is not None and recorded == broker_identity:
            return None
        archived = self.archive_previous_embedded_run()
        self.record(broker_identity=broker_identity)
        return archived

    def stop_orphans(self) -> list[str]:
        """Stop the durable broker and its S3 server a previous platform of this folder started and
        left running (that platform was killed): by their recorded pids, each checked to still be
        this folder's process (:meth:`tidewater.broker.DurableBroker.is_ours`). Call only while
        holding the claim, so no platform of this folder is running."""
        from tidewater.broker import DurableBroker

        data = self.read()
        durable = DurableBroker(self.broker_dir)
        stopped = []
        for field, name in (("broker_pid", "broker"), ("s3_server_pid", "S3 server")):
            pid = data.get(field)
            if pid and _alive(int(pid)) and durable.is_ours(int(pid)):
                _terminate(int(pid))
                stopped.append(f"the embedded {name} (pid {pid})")
        self.record(broker_pid=None, s3_server_pid=None)
        return stopped

    def archive_previous_embedded_run(self) -> Path | None:
        """The embedded broker's log is new (in-memory, or a new bucket): its topics restart at offset
        0, which the last run's checkpoints (and bronze offsets) would contradict. Move that run's
        lake, checkpoints and stream state aside, keeping them readable, instead of failing or mixing
        the two."""
        parts = [self.dir / name for name in ("checkpoints", "progress", "streams")]
        if not self.settings.lake_root:
            parts.append(self.dir / "lake")
        if not any(self.settings.checkpoint_dir.glob("*/*/*/offsets")):  # no stream read the last broker
            return None
        present = [p for p in parts if p.exists()]
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.dir / "previous-runs" / stamp
        for n in range(2, 1000):  # two archives within one second keep apart
            if not target.exists():
                break
            target = target.with_name(f"{stamp}-{n}")
        target.mkdir(parents=True)
        for path in present:
            shutil.move(str(path), str(target / path.name))
        self.record(first_start_hour=None)
        return target

    def signal_stop(self, *, timeout_s: float) -> int | None:
        """SIGTERM the running platform (it stops what it started) and wait for it to finish."""
        pid = self.read().get("pid")
        if not pid or not _alive(int(pid)):
            return None
        os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(int(pid)):
            time.sleep(0.5)
        if _alive(int(pid)):
            raise TidewaterError(f"platform pid {pid} still running after {timeout_s:g} s; see {self.log_dir}")
        return int(pid)


# Streaming jobs per core that one host starts together in good time (./tw bench platform, 2 cores):
# two pipelines had silver rows after 78 s (2026-11-28); five, since their Python workers connect back
# at interpreter start (tidewater.worker_start), after 309 s, the jobs holding 1.1-1.6 GB PSS each
# (2026-11-30; as Spark starts them, 123 missed connect-backs and four sources without silver rows at 600 s).
STREAM_JOBS_PER_CORE = 1


def crowded_host(pipelines: list[str], cores: int | None) -> str | None:
    """A warning when the platform would start more streaming jobs (one JVM each) than ``cores``
    started together when measured; None otherwise."""
    if not cores or len(pipelines) <= STREAM_JOBS_PER_CORE * cores:
        return None
    fewer = ",".join(pipelines[: STREAM_JOBS_PER_CORE * cores])
    return (
        f"{len(pipelines)} streaming jobs (one JVM each) on {cores} cores: measured on such a host, the last "
        "source got its first silver rows after about 5 minutes and the jobs held 1.1-1.6 GB each; "
        f"run fewer, e.g. TIDEWATER_PIPELINES={fewer}"
    )


# What tansu's memory engine holds for each record: it keeps every one (no retention or topic configs,
# ../shared/DESIGN.md). Measured 2026-11-29 with 259-byte values (benchmarks/bench_broker_growth.py): RSS
# 44 -> 426 MiB over 1.2M records, so little more than the value itself.
IN_MEMORY_BROKER_BYTES_PER_RECORD = 330


def in_memory_broker_growth(events_per_s: float) -> str:
    """What the in-memory embedded broker will hold as the platform runs, and what to do about it."""
    kept = "keeps every record it is sent (no retention)"
    advice = "for a platform that runs for days, point TIDEWATER_KAFKA_BOOTSTRAP_SERVERS at a Kafka with retention"
    if events_per_s <= 0:
        return f"the in-memory broker {kept}; {advice}"
    per_hour = events_per_s * IN_MEMORY_BROKER_BYTES_PER_RECORD * 3600 / 1e9
    growth = f"at ~{events_per_s:,.0f} events/s it grows ~{per_hour:.1f} GB an hour"
    return f"the in-memory broker {kept}: {growth}; {advice}"


class GeneratorThread(threading.Thread):
    """One pipeline's sample events, produced to its topic at ``rate`` in real time until ``stop``.

    The stream is what ``tidewater generate --pipeline NAME --seed SEED --rate RATE`` would send, with
    a little mess (duplicates, out-of-order events, malformed records if the pipeline declares any).
    """

    def __init__(
        self, settings: Settings, pipeline: Pipeline, *, rate: float, seed: int, stop: threading.Event
    ) -> None:
        super().__init__(name=f"generator-{pipeline.name}", daemon=True)
        self.settings, self.pipeline, self.rate, self.seed, self.stop_event = settings, pipeline, rate, seed, stop
        self.error: str | None = None

    def run(self) -> None:
        from tidewater.generator.events import GeneratorConfig
        from tidewater.generator.producer import pipeline_topics, produce

        events = self.pipeline.sample_events
        assert events is not None  # start_generator starts only pipelines that declare them
        config = GeneratorConfig(
            seed=self.seed,
            rate=self.rate,
            duplicate_rate=0.01,
            out_of_order_fraction=0.05,
            malformed_rate=0.002 if events.malformations else 0.0,
        )
        topic, follow_ups = pipeline_topics(self.settings, self.pipeline)
        try:
            produce(self.settings, topic, config, realtime=True, stop=self.stop_event, events=events, topics=follow_ups)
        except TidewaterError as exc:
            self.error = f"{self.pipeline.name}: {one_line(exc)}"


class Generators:
    """The platform's generator threads, one per pipeline that declares sample events."""

    def __init__(self, threads: list[GeneratorThread]) -> None:
        self.threads = threads

    @property
    def pipelines(self) -> list[str]:
        return [thread.pipeline.name for thread in self.threads]

    @property
    def error(self) -> str | None:
        """The first failed generator's error (its pipeline named), or None while all run."""
        return next((thread.error for thread in self.threads if thread.error), None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for every thread, ``timeout`` seconds in all (after ``stop`` is set)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def start_generator(settings: Settings, *, rate: float, seed: int, stop: threading.Event) -> Generators:
    """Feed every registered pipeline that declares sample events, each at ``rate`` events/s (the rate
    is per pipeline, not split between them: adding a pipeline leaves the others' streams as they were).
    Their topics must exist (the platform creates every pipeline's)."""
    from tidewater.pipelines import all_pipelines

    threads = [
        GeneratorThread(settings, pipeline, rate=rate, seed=seed, stop=stop)
        for _, pipeline in sorted(all_pipelines(settings).items())
        if pipeline.sample_events is not None
    ]
    for thread in threads:
        thread.start()
    return Generators(threads)


class StreamReporter:
    """The status line the platform prints: rows per table and each stream's health."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def report(self) -> str:
        from tidewater.orchestration.supervisor import StreamControl
        from tidewater.pipelines import all_pipelines

        lines = []
        for name in sorted(all_pipelines(self.settings)):
            health = StreamControl(self.settings, name).health()
            lines.append(f"{table_report(self.settings, name)}\n    stream {health.summary()}")
        return "\n".join(lines)


def stop_streams(settings: Settings) -> None:
    """Stop every live stream this state folder supervises (their desired state stays as it was, so
    the next platform start resumes them)."""
    from tidewater.orchestration.supervisor import StreamControl
    from tidewater.pipelines import all_pipelines

    for name in sorted(all_pipelines(settings)):
        control = StreamControl(settings, name)
        if control.lease_pids() or control.driver():
            health = control.stop(reason="platform stopping")
            print(f"tidewater: stream {name}: {health.state}", flush=True)
    if settings.stream_host:
        end_stream_host(settings)


def end_stream_host(settings: Settings, *, timeout_s: float = 60.0) -> None:
    """Wait for the stream host, which hosts no pipeline once they are all stopped, to leave; end the
    Spark processes left of its process group after ``timeout_s``."""
    from tidewater.streaming.host_requests import HostFiles

    pid = HostFiles(settings.state_dir, settings.namespace).last_pid()
    if pid is None:
        return
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    kill_spark_leftovers(pid)


def _terminate(pid: int, *, timeout_s: float = 15.0) -> None:
    """SIGTERM ``pid``, SIGKILL it if it is still alive after ``timeout_s``."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def table_report(settings: Settings, pipeline_name: str) -> str:
    from tidewater.lake.tables import LakeTable
    from tidewater.pipelines import get_pipeline
    from tidewater.pipelines.layout import PipelineLayout

    layout = PipelineLayout.of(settings, get_pipeline(pipeline_name))
    parts = []
    for name in layout.table_names:
        table = LakeTable(layout.table_uri(name))
        try:
            parts.append(f"{name}={table.row_count():,}")
        except TidewaterError:
            parts.append(f"{name}=-")
    return f"[{time.strftime('%H:%M:%S')}] {pipeline_name} rows: " + "  ".join(parts)
