"""The cluster profile: a team deployment's services, each a real server, started on this machine.

    tidewater cluster up       PostgreSQL (leases, table locks, Airflow's metadata), the S3 server (the
                               lake's bucket and the broker's), tansu with its log on that S3 server, a
                               Spark standalone master and worker, Airflow (api-server, scheduler,
                               dag-processor, triggerer) on PostgreSQL with the LocalExecutor, or
                               with TIDEWATER_AIRFLOW_EXECUTOR=celery (``up --executor celery``) the
                               CeleryExecutor, a Celery worker and Redis as its queue
    tidewater cluster status   each service: address, pid, up or down
    tidewater cluster env      the profile's variables: ``eval "$(./tw cluster env)"`` points any command at it
    tidewater cluster down     stop the streams, then every service ``up`` started, by PID

Only configuration differs from the embedded default: the platform finds every service through the
same TIDEWATER_*/AWS_* variables a real deployment sets (docker-compose.yml uses the same names), so
``./tw run --profile cluster`` runs the unchanged code with streams and batch jobs submitted to the
standalone master, the lake on s3://, locks and leases in PostgreSQL and Airflow's metadata there too.

Everything lives in ``<state_dir>/cluster``:

    cluster.json    ports, pids and the profile's environment (mode 0600: it holds the S3 secret)
    platform/       the profile's own state folder (checkpoints, supervisor state, Airflow home), apart
                    from the embedded default's, so the two never mix
    postgres/, broker/ (broker/s3: the S3 server), spark/, redis/ (Celery only), logs/

Every service runs in a process group of its own, all on 127.0.0.1; ``down`` signals only the groups
``up`` recorded, and only while their leader's command line is still that service's (a reused pid of
another program is left alone).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewater.broker import DurableBroker, EmbeddedBroker, free_port, port_free
from tidewater.config import Settings
from tidewater.errors import TidewaterError
from tidewater.postgres import LocalPostgres
from tidewater.processes import command_line, end_groups, group_rss_bytes, signal_group
from tidewater.redis_server import LocalRedis
from tidewater.spark_cluster import StandaloneCluster

CLUSTER_FILE = "cluster.json"
LAKE_BUCKET = "lake"
BROKER_BUCKET = "tansu"  # DurableBroker's bucket
LOCKS_DATABASE = "tidewater"
AIRFLOW_DATABASE = "airflow"
# The worker offers more cores than the host has: a core here is a job's slot, not a CPU, so every
# stream and a batch job or two run side by side, one slot each (TIDEWATER_SPARK_CORES_MAX).
WORKER_CORES = 8
WORKER_MEMORY = "8g"

Progress = Callable[[str], None]


class ClusterError(TidewaterError):
    """The cluster profile could not start, or is not running."""


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    pid: int | None
    up: bool
    rss_bytes: int = 0  # resident memory of its process group (PostgreSQL: the postmaster's group)

    def line(self) -> str:
        state = "up" if self.up else "down"
        memory = f"{self.rss_bytes / 2**20:,.0f} MiB" if self.up else "-"
        return f"{self.name:<24} {state:<5} pid {self.pid or '-':<8} {memory:>10}  {self.address}"


class Cluster:
    """The cluster profile of one state folder: what ``up`` started, found again from ``cluster.json``."""

    def __init__(self, settings: Settings) -> None:
        self.base = settings
        self.dir = Path(settings.state_dir).absolute() / "cluster"
        self.file = self.dir / CLUSTER_FILE

    # ---- the record ---------------------------------------------------------------------------------

    def read(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.file.read_text()))
        except (OSError, ValueError):
            return {}

    def _write(self, record: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record, indent=1) + "\n")

    def environment(self) -> dict[str, str]:
        """The profile's TIDEWATER_*/AWS_* variables (empty when the cluster was never started)."""
        return dict(self.read().get("env", {}))

    def settings(self) -> Settings:
        """The platform's settings on the cluster: the ones this profile was made from, with the profile's
        variables over them (the services' addresses, the lake, the lock backend, the state folder)."""
        env = self.environment()
        if not env:
            raise ClusterError(f"no cluster was started from {self.dir}: run ./tw cluster up")
        return Settings.from_env({**self.base.to_env(), **env})

    # ---- status -------------------------------------------------------------------------------------

    def status(self) -> list[ServiceStatus]:
        services = self.read().get("services", {})
        statuses = []
        for name, service in services.items():
            pid = service.get("pid")
            up = bool(pid) and _ours(pid, service["marker"])
            statuses.append(ServiceStatus(name, service["address"], pid, up, group_rss_bytes(pid) if up else 0))
        return statuses

    def is_up(self) -> bool:
        statuses = self.status()
        return bool(statuses) and all(s.up for s in statuses)

    # ---- up -----------------------------------------------------------------------------------------

    def up(self, progress: Progress = print, *, airflow: bool = True) -> bool:
        """Start every service (a no-op when all are up); False if it was up already. Without
        ``airflow`` nothing supervises streams: the services alone, for a benchmark's own jobs."""
        statuses = self.status()
        if statuses and all(s.up for s in statuses):
            progress(f"tidewater: the cluster in {self.dir} is up already")
            return False
        if any(s.up for s in statuses):
            running = ", ".join(s.name for s in statuses if s.up)
            raise ClusterError(f"part of the cluster in {self.dir} is running ({running}): ./tw cluster down first")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # the postgres user reaches its data folder through it
        previous = self.read()
        ports = previous.get("ports", {})
        services: dict[str, dict[str, Any]] = {}
        record: dict[str, Any] = {"ports": ports, "services": services, "started_at": time.time()}
        logs = self.dir / "logs"
        logs.mkdir(exist_ok=True)
        began = time.monotonic()
        try:
            progress("tidewater: cluster: PostgreSQL...")
            postgres = LocalPostgres(self.dir / "postgres", _port(ports, "postgres"), database=LOCKS_DATABASE)
            postgres.start()
            postgres.create_database(AIRFLOW_DATABASE)
            services["postgres"] = {
                "address": f"127.0.0.1:{postgres.port}",
                "pid": postgres.pid(),
                "marker": str(postgres.data_dir),
            }
            self._write(record)

            redis = None
            if self.base.airflow_executor == "celery":
                progress("tidewater: cluster: Redis (the CeleryExecutor's queue)...")
                redis = LocalRedis(self.dir / "redis", _port(ports, "redis"))
                redis.start()
                services["redis"] = {"address": redis.url, "pid": redis.pid, "marker": f"127.0.0.1:{redis.port}"}
                self._write(record)

            progress("tidewater: cluster: S3 server and broker (log on S3)...")
            broker = DurableBroker(
                self.dir / "broker",
                port=_port(ports, "broker"),
                bucket=BROKER_BUCKET,
                log_dir=logs,
                other_buckets=(LAKE_BUCKET,),
            )
            broker.start()
            ports["broker"] = broker.port
            s3 = broker.s3
            services["s3"] = {"address": s3.endpoint_url, "pid": s3.pid, "marker": str(s3.data_dir)}
            services["broker"] = {
                "address": broker.bootstrap_servers,
                "pid": broker.pids["broker"],
                "marker": f"tcp://127.0.0.1:{broker.port}",
            }
            self._write(record)

            progress("tidewater: cluster: Spark standalone master and worker...")
            spark = StandaloneCluster(
                self.dir / "spark",
                port=_port(ports, "spark_master"),
                ui_port=_port(ports, "spark_master_ui"),
                worker_ui_port=_port(ports, "spark_worker_ui"),
                cores=WORKER_CORES,
                memory=WORKER_MEMORY,
            )
            spark.start()
            master, worker = spark.processes
            services["spark-master"] = {
                "address": f"{spark.master_url} (UI http://127.0.0.1:{spark.ui_port})",
                "pid": master.pid,
                "marker": "deploy.master.Master",
            }
            services["spark-worker"] = {"address": "", "pid": worker.pid, "marker": "deploy.worker.Worker"}

            ports["airflow"] = ports.get("airflow") or self.base.airflow_port
            if not port_free(ports["airflow"]):
                ports["airflow"] = free_port()
            env = {
                "TIDEWATER_STATE_DIR": str(self.dir / "platform"),
                "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                "TIDEWATER_LAKE_ROOT": f"s3://{LAKE_BUCKET}/tidewater",
                "TIDEWATER_S3_ENDPOINT_URL": s3.endpoint_url,
                "TIDEWATER_S3_REGION": s3.region,
                **s3.env(),  # AWS_*: credentials, and the endpoint over any inherited one
                "TIDEWATER_SPARK_MASTER": spark.master_url,
                "TIDEWATER_LOCK_BACKEND": "postgres",
                # A Spark job per pipeline: drivers may run on any host of the cluster (stop requests reach
                # them there), and one pipeline's failure or memory stays its own.
                "TIDEWATER_STREAM_HOST": "false",
                "TIDEWATER_POSTGRES_DSN": postgres.dsn,
                "TIDEWATER_AIRFLOW_DATABASE_URL": postgres.url(AIRFLOW_DATABASE),
                "TIDEWATER_AIRFLOW_PORT": str(ports["airflow"]),
                "TIDEWATER_AIRFLOW_EXECUTOR": self.base.airflow_executor,
            }
            if redis is not None:
                env["TIDEWATER_CELERY_BROKER_URL"] = redis.url
            record["env"] = env
            self._write(record)
            if airflow:
                self._start_airflow(record, progress)
        except BaseException:
            self._write(record)
            self.down(progress)
            raise
        record["startup_seconds"] = round(time.monotonic() - began, 1)
        self._write(record)
        progress(f"tidewater: cluster up in {record['startup_seconds']:g} s")
        return True

    def _start_airflow(self, record: dict[str, Any], progress: Progress) -> None:
        from tidewater.orchestration.airflow_local import LocalAirflow
        from tidewater.orchestration.platform import PlatformState

        settings = self.settings()
        # The scheduled batch DAGs start at the hour the profile first ran (as on the embedded default).
        start = settings.batch_start_date or PlatformState(settings).first_start_hour()
        record["env"]["TIDEWATER_BATCH_START_DATE"] = start
        self._write(record)
        settings = self.settings()
        progress("tidewater: cluster: Airflow on PostgreSQL (api-server, scheduler, dag-processor, triggerer)...")
        aws = {k: v for k, v in record["env"].items() if k.startswith("AWS_")}
        airflow = LocalAirflow(settings, extra_env=aws)
        try:
            airflow.start()
        finally:
            for name, process in airflow.processes.items():
                record["services"][f"airflow-{name}"] = {
                    "address": airflow.url if name == "api-server" else "",
                    "pid": process.pid,
                    # Celery renames its main process "[celeryd: ...] (celery worker ...)".
                    "marker": "celery worker" if name == "celery-worker" else "airflow",
                }
            self._write(record)
        if airflow.secrets.created:
            progress(f"tidewater: cluster: Airflow admin password (shown once): {airflow.secrets.admin_password}")
        progress(f"tidewater: cluster: Airflow UI at {airflow.url} (user admin; password in {settings.airflow_home})")

    def restart_broker(self, *, kill: bool = True, down_s: float = 0.0) -> int:
        """Stop the broker (SIGKILL: a crash; else SIGTERM) and start it again on the same port and the
        same bucket, as an operator restarting one host would; its topics and offsets are in the S3
        server, so nothing is lost. Returns the new broker's pid."""
        record = self.read()
        service = record.get("services", {}).get("broker")
        if not service or not self.environment():
            raise ClusterError(f"no cluster was started from {self.dir}: run ./tw cluster up")
        pid = service.get("pid")
        if pid and _ours(pid, service["marker"]):
            if kill:
                signal_group(pid, signal.SIGKILL)
            end_groups({pid: service["marker"]}, timeout_s=15)
        time.sleep(down_s)
        aws = {k: v for k, v in self.environment().items() if k.startswith("AWS_")}
        broker = EmbeddedBroker(
            port=int(record["ports"]["broker"]),
            log_path=self.dir / "logs" / "broker.log",
            storage=f"s3://{BROKER_BUCKET}/",
            storage_env=aws,
        ).start(timeout_s=30)
        assert broker.process is not None
        service["pid"] = broker.process.pid
        self._write(record)
        return broker.process.pid

    # ---- down ---------------------------------------------------------------------------------------

    def down(self, progress: Progress = print) -> list[str]:
        """Stop the streams (while Airflow is already gone, so nothing restarts them), then every
        service in the reverse order of ``up``; the names of the services stopped."""
        record = self.read()
        services: dict[str, dict[str, Any]] = record.get("services", {})
        stopped: list[str] = []
        airflow = [name for name in services if name.startswith("airflow-")]
        stopped += self._end(services, airflow, timeout_s=15)
        if record.get("env"):
            from tidewater.orchestration.platform import stop_streams

            try:
                stop_streams(self.settings())
            except TidewaterError as exc:
                progress(f"tidewater: cluster: streams not stopped cleanly: {exc}")
        for name in ("redis", "spark-worker", "spark-master", "broker", "s3"):
            stopped += self._end(services, [name], timeout_s=20)
        if "postgres" in services:
            pid = services["postgres"].get("pid")
            server = LocalPostgres(Path(services["postgres"]["marker"]), 0)
            if pid and server.adopt(int(pid)):
                server.stop()
                stopped.append("postgres")
        for service in services.values():
            service["pid"] = None
        if record:
            record["stopped_at"] = time.time()
            self._write(record)
        progress(f"tidewater: cluster: stopped {', '.join(stopped) or 'nothing (nothing was running)'}")
        return stopped

    @staticmethod
    def _end(services: dict[str, dict[str, Any]], names: list[str], *, timeout_s: float) -> list[str]:
        """Stop the named services together; the names of those that were running."""
        groups = {int(services[n]["pid"]): n for n in names if n in services and services[n].get("pid")}
        ended = end_groups({pgid: services[name]["marker"] for pgid, name in groups.items()}, timeout_s=timeout_s)
        return [groups[pgid] for pgid in ended]


def _ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` still runs and is the service recorded with ``marker`` (not a reused pid)."""
    command = command_line(pid)
    return command is not None and marker in command


def _port(ports: dict[str, int], name: str) -> int:
    """The port ``name`` had last time while it is free (addresses stay put across restarts), else a new one."""
    if not (ports.get(name) and port_free(int(ports[name]))):
        ports[name] = free_port()
    return int(ports[name])
