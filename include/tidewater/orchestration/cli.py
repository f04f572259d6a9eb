"""``tidewater platform``, ``tidewater stop`` and ``tidewater streams``: the platform's lifecycle."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidewater.config import AIRFLOW_EXECUTORS, Settings
from tidewater.errors import TidewaterError
from tidewater.processes import StopOnSignal

if TYPE_CHECKING:
    from tidewater.orchestration.platform import Generators


def register(sub: argparse._SubParsersAction) -> None:
    platform = sub.add_parser("platform", help="run broker, generator, Airflow and the streams until Ctrl-C")
    # 150/s to each of three pipelines is what a 2-core host starts reliably (README, bench_platform).
    platform.add_argument("--rate", type=float, default=150.0, help="generated events/s per pipeline (0: none)")
    platform.add_argument("--seed", type=int, default=42)
    platform.add_argument("--report-seconds", type=float, default=10.0, help="how often to print table counts")
    platform.add_argument(
        "--durable-broker",
        action="store_true",
        help="keep the embedded broker's log on the embedded S3 server (<state dir>/broker): a new run resumes "
        "the last one instead of archiving it (tansu 0.6.0 reads slower as its log grows: see the README)",
    )
    platform.add_argument(
        "--profile",
        choices=("embedded", "cluster"),
        default="embedded",
        help="embedded (default): one process tree on this host; cluster: the services of `tidewater cluster up` "
        "(started first if they are not running, and stopped at the end if this command started them)",
    )
    platform.set_defaults(func=cmd_platform)

    cluster = sub.add_parser(
        "cluster",
        help="the cluster profile on this host: PostgreSQL, S3 server, durable broker, Spark standalone, Airflow",
    )
    cluster.add_argument("action", choices=("up", "down", "status", "env"))
    cluster.add_argument(
        "--executor",
        choices=AIRFLOW_EXECUTORS,
        default=None,
        help="up: Airflow's executor (default: TIDEWATER_AIRFLOW_EXECUTOR); celery adds Redis and a Celery worker",
    )
    cluster.set_defaults(func=cmd_cluster)

    stop = sub.add_parser("stop", help="stop the platform running from this state folder")
    stop.add_argument("--timeout", type=float, default=180.0)
    stop.set_defaults(func=cmd_stop)

    streams = sub.add_parser("streams", help="health of each pipeline's supervised stream (or stop them)")
    streams.add_argument("action", nargs="?", choices=("status", "stop"), default="status")
    streams.add_argument("--namespace", default=None)
    streams.set_defaults(func=cmd_streams)


def cmd_cluster(args: argparse.Namespace, settings: Settings) -> int:
    import shlex

    from tidewater.orchestration.cluster import Cluster

    if args.executor:
        settings = settings.replace(airflow_executor=args.executor)
    cluster = Cluster(settings)
    if args.action == "up":
        cluster.up(progress=_say)
        for status in cluster.status():
            print(status.line())
        print('tidewater: point any command at it with: eval "$(./tw cluster env)"')
    elif args.action == "down":
        cluster.down(progress=_say)
    elif args.action == "status":
        statuses = cluster.status()
        if not statuses:
            print(f"tidewater: no cluster was started from {cluster.dir}")
            return 1
        for status in statuses:
            print(status.line())
        return 0 if all(s.up for s in statuses) else 1
    else:
        for name, value in sorted(cluster.settings() and cluster.environment().items()):
            print(f"export {name}={shlex.quote(value)}")
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_platform(args: argparse.Namespace, settings: Settings) -> int:
    """Broker, generator, Airflow (which starts and supervises the streams) until Ctrl-C or ``tidewater stop``."""
    if args.profile == "cluster":
        return _platform_on_cluster(args, settings)
    from tidewater.broker import DurableBroker, EmbeddedBroker
    from tidewater.orchestration.airflow_env import passwords_file
    from tidewater.orchestration.airflow_local import LocalAirflow
    from tidewater.orchestration.platform import PlatformState, crowded_host, in_memory_broker_growth
    from tidewater.pipelines import all_pipelines

    state = PlatformState(settings)
    state.claim()  # one platform per state folder
    stopper = StopOnSignal().install()
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
        generator = _feed(args, settings, stopper)
        if broker is not None and not args.durable_broker:
            offered = args.rate * len(generator.pipelines) if generator is not None else 0.0
            print(f"tidewater: note: {in_memory_broker_growth(offered)}", flush=True)

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
        crowded = crowded_host(sorted(all_pipelines(settings)), os.cpu_count())
        if crowded:
            print(f"tidewater: warning: {crowded}", flush=True)
        print(f"tidewater: lake at {settings.lake_uri}/{settings.namespace}/", flush=True)
        print("tidewater: Ctrl-C (or ./tw stop) stops everything this command started", flush=True)

        running = airflow

        def airflow_exited() -> str | None:
            exited = [(n, p.returncode) for n, p in running.processes.items() if p.poll() is not None]
            return f"airflow {exited[0][0]} exited with code {exited[0][1]}: see {running.log_dir}" if exited else None

        return _report_until_stopped(args, settings, stopper, generator, airflow_exited)
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


def _feed(args: argparse.Namespace, settings: Settings, stopper: StopOnSignal) -> Generators | None:
    """Every pipeline's topics, and the sample-event generator unless ``--rate 0``."""
    from tidewater.generator.producer import ensure_topic
    from tidewater.orchestration.platform import start_generator
    from tidewater.pipelines import all_pipelines

    for pipeline in all_pipelines(settings).values():
        for source in pipeline.sources:
            ensure_topic(settings, settings.topic(source.topic), settings.kafka_topic_partitions)
    if args.rate <= 0:
        return None
    generator = start_generator(settings, rate=args.rate, seed=args.seed, stop=stopper.event)
    fed = ", ".join(generator.pipelines) or "none (no pipeline declares sample events)"
    print(f"tidewater: generator producing ~{args.rate:g} events/s to each pipeline: {fed}", flush=True)
    return generator


def _report_until_stopped(
    args: argparse.Namespace,
    settings: Settings,
    stopper: StopOnSignal,
    generator: Generators | None,
    broken: Callable[[], str | None],
) -> int:
    """Print the tables' counts and the streams' health every ``--report-seconds`` until Ctrl-C or
    ``tidewater stop``; fail in one line when the generator or what ``broken`` watches fails."""
    from tidewater.orchestration.platform import StreamReporter

    reporter = StreamReporter(settings)
    while not stopper.event.wait(args.report_seconds):
        if generator is not None and generator.error:
            raise TidewaterError(f"generator failed: {generator.error}")
        problem = broken()
        if problem:
            raise TidewaterError(problem)
        print(reporter.report(), flush=True)
    print("tidewater: stopping", flush=True)
    return 0


def _platform_on_cluster(args: argparse.Namespace, settings: Settings) -> int:
    """The platform on the cluster profile's services: they run Airflow and the streams; this command
    feeds the topics and reports until Ctrl-C (stopping the cluster only if it started it)."""
    from tidewater.orchestration.cluster import Cluster
    from tidewater.orchestration.platform import PlatformState

    cluster = Cluster(settings)
    stopper = StopOnSignal().install()
    started = False
    state: PlatformState | None = None
    generator = None
    try:
        started = cluster.up(progress=_say)
        settings = cluster.settings()
        state = PlatformState(settings)
        state.claim()
        generator = _feed(args, settings, stopper)
        for status in cluster.status():
            print(status.line(), flush=True)
        print(f"tidewater: Airflow UI at http://127.0.0.1:{settings.airflow_port}  (user admin)", flush=True)
        print("tidewater: the supervising DAG submits each pipeline's stream to the Spark master", flush=True)
        print(f"tidewater: lake at {settings.lake_uri}/{settings.namespace}/", flush=True)
        print(
            "tidewater: Ctrl-C (or ./tw stop) stops the generator"
            + (" and the cluster" if started else " (the cluster was running before: ./tw cluster down)"),
            flush=True,
        )

        def services_down() -> str | None:
            down = [s.name for s in cluster.status() if not s.up]
            return f"cluster service(s) stopped: {', '.join(down)}: see {cluster.dir}/logs" if down else None

        return _report_until_stopped(args, settings, stopper, generator, services_down)
    finally:
        stopper.event.set()
        if generator is not None:
            generator.join(timeout=10)
        if started:
            cluster.down(progress=_say)
        if state is not None:
            state.release()


def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.cluster import Cluster
    from tidewater.orchestration.platform import PlatformState

    pid = PlatformState(settings).signal_stop(timeout_s=args.timeout)
    cluster = Cluster(settings)
    if pid is None and cluster.environment():  # the platform on the cluster profile keeps its own state
        pid = PlatformState(cluster.settings()).signal_stop(timeout_s=args.timeout)
    print(f"tidewater: platform (pid {pid}) stopped" if pid else "tidewater: no platform is running here")
    return 0


def cmd_streams(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.supervisor import StreamControl
    from tidewater.pipelines import all_pipelines

    for name in sorted(all_pipelines(settings)):
        control = StreamControl(settings, name, args.namespace)
        if args.action == "stop":
            control.set_desired("stopped", by="tidewater streams stop")
            print(control.stop(reason="tidewater streams stop").summary())
        else:
            print(control.health().summary())
    return 0
