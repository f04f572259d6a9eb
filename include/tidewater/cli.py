"""The ``tidewater`` command.

    tidewater platform            broker (embedded unless configured) + generator + Airflow + supervised streams
    tidewater stop                stop the platform started from this state folder
    tidewater streams [stop]      health of each supervised stream (or stop them)
    tidewater stream rsvps        run one pipeline's streaming queries (what spark_jobs/stream.py calls)
    tidewater generate ...        produce RSVP events (see --help)
    tidewater broker [--durable]  run the embedded broker alone (in memory, or its log on the embedded S3 server)
    tidewater topics create NAME  create a topic
    tidewater tables              list the lake's tables: version, rows, files, size
    tidewater sql "SELECT ..."    read-only SQL over the lake's tables, paged (time travel; --tables: catalog)
    tidewater pipelines           list declared pipelines

Errors are printed as one line (``tidewater: <Kind>: <what to do>``) and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from tidewater.config import Settings
from tidewater.errors import ConfigError, TidewaterError, one_line
from tidewater.paths import spark_job

log = logging.getLogger("tidewater")


class _StopOnSignal:
    """SIGINT/SIGTERM set an event instead of raising, so shutdown runs in order."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None

    def install(self) -> _StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: give up on the orderly stop
        self.signal = signum
        self.event.set()


# ---- stream ---------------------------------------------------------------------------------------


def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.pipelines import get_pipeline
    from tidewater.spark import build_session
    from tidewater.streaming.runner import PipelineStreams

    if not settings.kafka_bootstrap_servers:
        raise ConfigError(
            "set TIDEWATER_KAFKA_BOOTSTRAP_SERVERS (the platform command sets it for the embedded broker)"
        )
    pipeline = get_pipeline(args.pipeline)
    stopper = _StopOnSignal().install()
    streams = PipelineStreams(settings, pipeline, namespace=args.namespace)
    spark = None
    try:
        streams.preflight()  # one-line errors before a JVM starts
        spark = build_session(settings, f"tidewater-stream-{pipeline.name}")
        if args.available_now:
            streams.run_available_now(spark)
        else:
            print(f"tidewater: streaming {pipeline.name} ({', '.join(t.query for t in streams.tiers)})", flush=True)
            streams.run_forever(spark, stopper.event, trigger_seconds=args.trigger_seconds)
    finally:
        streams.close()  # stops queries, releases checkpoint leases
        if spark is not None:
            spark.stop()
    return 0


# ---- platform -------------------------------------------------------------------------------------


def cmd_platform(args: argparse.Namespace, settings: Settings) -> int:
    """Broker, generator, Airflow (which starts and supervises the streams) until Ctrl-C or ``tidewater stop``."""
    from tidewater.broker import DurableBroker, EmbeddedBroker
    from tidewater.orchestration.airflow_env import passwords_file
    from tidewater.orchestration.airflow_local import LocalAirflow
    from tidewater.orchestration.platform import PlatformState, StreamReporter, start_generator
    from tidewater.pipelines import all_pipelines

    state = PlatformState(settings)
    state.claim()  # one platform per state folder
    stopper = _StopOnSignal().install()
    broker: EmbeddedBroker | DurableBroker | None = None
    airflow: LocalAirflow | None = None
    generator = None
    try:
        if not settings.kafka_bootstrap_servers:
            for orphan in state.stop_orphans():
                print(f"tidewater: stopped {orphan} left running by a platform that was killed", flush=True)
            if not args.durable_broker:
                archived = state.resume_or_archive(None)
                if archived:
                    print(
                        f"tidewater: the in-memory broker keeps no data between runs: moved the last run's lake "
                        f"and checkpoints to {archived}",
                        flush=True,
                    )
                broker = EmbeddedBroker(port=settings.embedded_broker_port, log_path=state.log_dir / "broker.log")
                broker.start()
                state.record(broker_pid=broker.process.pid if broker.process else None, s3_server_pid=None)
                kind = "in-memory"
            else:
                broker = DurableBroker(state.broker_dir, port=settings.embedded_broker_port, log_dir=state.log_dir)
                broker.start()
                state.record(broker_pid=broker.pids["broker"], s3_server_pid=broker.pids["s3_server"])
                archived = state.resume_or_archive(broker.identity)
                if archived:
                    print(
                        f"tidewater: the broker's log in {state.broker_dir} is not the one the last run's streams "
                        f"read (new or deleted): moved the last run's lake and checkpoints to {archived}",
                        flush=True,
                    )
                kind = f"durable: log on the local S3 server {broker.s3.endpoint_url}, data in {state.broker_dir}"
            settings = settings.replace(kafka_bootstrap_servers=broker.bootstrap_servers)
            print(f"tidewater: embedded Kafka broker (tansu, {kind}) on {broker.bootstrap_servers}", flush=True)
        settings = settings.replace(batch_start_date=settings.batch_start_date or state.first_start_hour())
        from tidewater.generator.producer import ensure_topic

        for pipeline in all_pipelines().values():
            ensure_topic(settings, settings.topic(pipeline.topic), settings.kafka_topic_partitions)
        if args.rate > 0:
            generator = start_generator(settings, rate=args.rate, seed=args.seed, stop=stopper.event)
            print(f"tidewater: generator producing ~{args.rate:g} RSVP events/s", flush=True)

        print("tidewater: starting Airflow (api-server, scheduler, dag-processor, triggerer)...", flush=True)
        airflow = LocalAirflow(settings)
        state.record(airflow_url=airflow.url)
        airflow.start()
        state.record(airflow_pids={name: p.pid for name, p in airflow.processes.items()})
        print(f"tidewater: Airflow UI at {airflow.url}  (user admin)", flush=True)
        if airflow.secrets.created:
            print(f"tidewater: admin password (shown once): {airflow.secrets.admin_password}", flush=True)
        print(f"tidewater: admin password kept in {passwords_file(settings)}", flush=True)
        print("tidewater: the supervising DAG starts each pipeline's stream within a minute or two", flush=True)
        print(f"tidewater: lake at {settings.lake_uri}/{settings.namespace}/", flush=True)
        print("tidewater: Ctrl-C (or ./tw stop) stops everything this command started", flush=True)

        reporter = StreamReporter(settings)
        while not stopper.event.wait(args.report_seconds):
            if generator is not None and generator.error:
                raise TidewaterError(f"generator failed: {generator.error}")
            for name, process in airflow.processes.items():
                if process.poll() is not None:
                    raise TidewaterError(f"airflow {name} exited with code {process.returncode}: see {airflow.log_dir}")
            print(reporter.report(), flush=True)
        print("tidewater: stopping", flush=True)
        return 0
    finally:
        stopper.event.set()
        if airflow is not None:
            airflow.stop()  # first, so nothing restarts the streams while they stop
        from tidewater.orchestration.platform import stop_streams

        stop_streams(settings)
        if generator is not None:
            generator.join(timeout=10)
        if broker is not None:
            broker.stop()
            state.record(broker_pid=None, s3_server_pid=None)
        state.release()


def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.platform import PlatformState

    pid = PlatformState(settings).signal_stop(timeout_s=args.timeout)
    print(f"tidewater: platform (pid {pid}) stopped" if pid else "tidewater: no platform is running here")
    return 0


def cmd_streams(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.supervisor import StreamControl
    from tidewater.pipelines import all_pipelines

    for name in sorted(all_pipelines()):
        control = StreamControl(settings, name, args.namespace)
        if args.action == "stop":
            control.set_desired("stopped", by="tidewater streams stop")
            print(control.stop(reason="tidewater streams stop").summary())
        else:
            print(control.health().summary())
    return 0


def launch_stream_job(
    settings: Settings,
    pipeline: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """spark-submit the streaming job in its own process group (so it can be stopped as a whole)."""
    from tidewater.streaming import faults

    # The child's environment only: the caller's (a test process, an Airflow task) stays as it was.
    defaults = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    python = {key: os.environ.get(key, value) for key, value in defaults.items()}
    spark_submit = Path(sys.executable).parent / "spark-submit"
    command = [
        str(spark_submit),
        "--master",
        settings.spark_master,
        "--driver-memory",
        settings.spark_driver_memory,
        "--conf",
        "spark.driver.host=127.0.0.1",
        str(spark_job("stream")),
        pipeline,
        *extra_args,
    ]
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # A new session holds exactly this job, so fault injection may target it as a whole.
            env={**os.environ, **python, **settings.to_env(), faults.DRIVER_PGID: "session", **(extra_env or {})},
            start_new_session=True,
        )


def stop_process_group(process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """SIGTERM the group we started (graceful stop), SIGKILL it if it does not end in time."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


def last_error_line(log_path: Path) -> str:
    """The last one-line error a tidewater process printed to ``log_path`` (``tidewater: <Kind>Error: ...``)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line.removeprefix("tidewater: ")
    return "no error reported (killed by a signal, or out of memory?)"


_ERROR_LINE = re.compile(r"^tidewater: [A-Z]\w*(Error|Exception|Failure|Exit)\b")


def table_report(settings: Settings, pipeline_name: str) -> str:
    from tidewater.lake.layout import PipelineLayout
    from tidewater.lake.tables import LakeTable
    from tidewater.pipelines import get_pipeline

    layout = PipelineLayout.of(settings, get_pipeline(pipeline_name))
    parts = []
    for name in layout.table_names:
        table = LakeTable(layout.table_uri(name))
        try:
            parts.append(f"{name}={table.row_count():,}")
        except TidewaterError:
            parts.append(f"{name}=-")
    return f"[{time.strftime('%H:%M:%S')}] rows: " + "  ".join(parts)


# ---- small commands -------------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.broker import DurableBroker, EmbeddedBroker

    stopper = _StopOnSignal().install()
    port = args.port or settings.embedded_broker_port
    if args.durable:
        data_dir = Path(args.data_dir or Path(settings.state_dir, "broker")).absolute()
        with DurableBroker(data_dir, port=port) as durable:
            print(
                f"tidewater: embedded broker (durable: log on the S3 server {durable.s3.endpoint_url}, data in "
                f"{data_dir}) on {durable.bootstrap_servers} (Ctrl-C stops it)",
                flush=True,
            )
            stopper.event.wait()
        return 0
    with EmbeddedBroker(port=port) as broker:
        print(f"tidewater: embedded broker (in-memory) on {broker.bootstrap_servers} (Ctrl-C stops it)", flush=True)
        stopper.event.wait()
    return 0


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.generator.producer import ensure_topic

    ensure_topic(settings, args.name, args.partitions)
    print(f"tidewater: topic {args.name} ready on {settings.kafka_bootstrap_servers}")
    return 0


def cmd_tables(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.lake.layout import PipelineLayout
    from tidewater.lake.tables import LakeTable
    from tidewater.pipelines import all_pipelines

    print(f"{'table':<60} {'version':>7} {'rows':>12} {'files':>6} {'MiB':>8}")
    for pipeline in all_pipelines().values():
        layout = PipelineLayout.of(settings, pipeline, args.namespace)
        for name in layout.table_names:
            table = LakeTable(layout.table_uri(name))
            if not table.exists():
                continue
            files = table.files()
            rows = sum(f.num_records or 0 for f in files)
            size = sum(f.size for f in files) / 2**20
            print(f"{table.uri:<60} {table.version():>7} {rows:>12,} {len(files):>6} {size:>8.1f}")
    return 0


def cmd_pipelines(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.pipelines import all_pipelines

    for pipeline in all_pipelines().values():
        gold = ", ".join(g.name for g in pipeline.gold)
        print(f"{pipeline.name}: topic {pipeline.topic}, watermark {pipeline.watermark}, gold: {gold}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from tidewater.batch import cli as batch_cli
    from tidewater.generator import cli as generator_cli
    from tidewater.quality import cli as audit_cli
    from tidewater.query import cli as query_cli

    parser = argparse.ArgumentParser(
        prog="tidewater", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    platform = sub.add_parser("platform", help="run broker, generator, Airflow and the streams until Ctrl-C")
    platform.add_argument("--rate", type=float, default=500.0, help="generated events per second (0: none)")
    platform.add_argument("--seed", type=int, default=42)
    platform.add_argument("--report-seconds", type=float, default=10.0, help="how often to print table counts")
    platform.add_argument(
        "--durable-broker",
        action="store_true",
        help="keep the embedded broker's log on the embedded S3 server (<state dir>/broker): a new run resumes "
        "the last one instead of archiving it (tansu 0.6.0 reads slower as its log grows: see the README)",
    )
    platform.set_defaults(func=cmd_platform)

    stop = sub.add_parser("stop", help="stop the platform running from this state folder")
    stop.add_argument("--timeout", type=float, default=180.0)
    stop.set_defaults(func=cmd_stop)

    streams = sub.add_parser("streams", help="health of each pipeline's supervised stream (or stop them)")
    streams.add_argument("action", nargs="?", choices=("status", "stop"), default="status")
    streams.add_argument("--namespace", default=None)
    streams.set_defaults(func=cmd_streams)

    stream = sub.add_parser("stream", help="run a pipeline's streaming queries")
    stream.add_argument("pipeline")
    stream.add_argument("--namespace", default=None, help="lake namespace (default: TIDEWATER_NAMESPACE or live)")
    stream.add_argument(
        "--available-now", action="store_true", help="process what is available, tier by tier, then exit"
    )
    stream.add_argument("--trigger-seconds", type=float, default=None)
    stream.set_defaults(func=cmd_stream)

    generate = sub.add_parser("generate", help="produce RSVP events")
    generator_cli.add_arguments(generate)
    generate.set_defaults(func=lambda a, s: generator_cli.run(a, s))

    broker = sub.add_parser("broker", help="run the embedded broker until Ctrl-C")
    broker.add_argument("--port", type=int, default=0)
    broker.add_argument(
        "--durable", action="store_true", help="keep the log on the embedded S3 server (restarts resume)"
    )
    broker.add_argument("--data-dir", default="", help="the durable broker's folder (default: <state dir>/broker)")
    broker.set_defaults(func=cmd_broker)

    topics = sub.add_parser("topics", help="manage topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=4)
    create.set_defaults(func=cmd_topics)

    tables = sub.add_parser("tables", help="list the lake's tables")
    tables.add_argument("--namespace", default=None)
    tables.set_defaults(func=cmd_tables)

    pipelines = sub.add_parser("pipelines", help="list declared pipelines")
    pipelines.set_defaults(func=cmd_pipelines)

    batch_cli.register(sub)
    query_cli.register(sub)
    audit_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kafka-python logs every refused connection as an ERROR; our one-line error says it better.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings.from_env()
        return int(args.func(args, settings) or 0)
    except TidewaterError as exc:
        print(f"tidewater: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # Spark/Java errors: one line first, details in the log
        print(f"tidewater: {one_line(exc)}", file=sys.stderr, flush=True)
        log.debug("details", exc_info=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
