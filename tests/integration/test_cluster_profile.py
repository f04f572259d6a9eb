"""The cluster profile: a team deployment's services, each real, on this machine, and the platform on it.

One profile for the module, brought up by the code behind ``tidewater cluster up``: PostgreSQL, the
SeaweedFS S3 server with the lake's bucket, tansu with its log on that server, a Spark standalone master
and worker (started with no ``TIDEWATER_*`` or ``AWS_*`` variable, as on a cluster whose workers were
started long before any job), and Airflow on PostgreSQL with the CeleryExecutor option (Redis and a
Celery worker run every task: supervision, the backfill's Spark jobs and audits). Its teardown is
``cluster down``, and fails if anything the profile started is still running.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from kafka import KafkaProducer

from pipeline_helpers import produce_generated, wait_for
from tidewater import class_data
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.generator.events import GeneratorConfig, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.lake import storage
from tidewater.lake.pg_locks import PostgresLock
from tidewater.lake.tables import LakeTable
from tidewater.orchestration.airflow_local import LocalAirflow
from tidewater.orchestration.cluster import AIRFLOW_DATABASE, Cluster
from tidewater.orchestration.supervisor import RUNNING, STOPPED, StreamControl
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import alive, group_members

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.airflow]

SERVICES = {
    "postgres",
    "redis",
    "s3",
    "broker",
    "spark-master",
    "spark-worker",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-celery-worker",
}


@contextlib.contextmanager
def lake_environment(env: dict[str, str]) -> Iterator[None]:
    """This process's TIDEWATER_*/AWS_* variables exactly as in ``env`` (the session's moto S3 settings
    set aside, cached storage settings forgotten), restored afterwards."""
    ours = ("TIDEWATER_", "AWS_")
    saved = {k: v for k, v in os.environ.items() if k.startswith(ours)}
    for key in saved:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith(ours)})
    storage.reset_cache()
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(ours)]:
            del os.environ[key]
        os.environ.update(saved)
        storage.reset_cache()


def job_env(cluster: Cluster) -> dict[str, str]:
    """A process environment on the profile: this one's, without the session's S3 settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWATER_", "AWS_"))}
    return {**env, **cluster.settings().to_env(), **cluster.environment()}


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**job_env(cluster), "TIDEWATER_STATE_DIR": str(cluster.dir.parent)}
    return subprocess.run(
        [sys.executable, "-m", "tidewater.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def profile() -> Iterator[Cluster]:
    # PostgreSQL runs as the postgres user: its folder must be reachable by it (pytest's is root-only).
    root = Path(tempfile.mkdtemp(prefix="tidewater-cluster-"))
    root.chmod(0o755)
    # The CeleryExecutor option (Redis, a Celery worker): the LocalExecutor is the embedded default's tests'.
    base = Settings(
        state_dir=str(root / "state"), pipelines="rsvps", airflow_port=free_port(), airflow_executor="celery"
    )
    cluster = Cluster(base)
    recorded: list[int] = []
    try:
        cluster.up(progress=print)
        recorded = [s.pid for s in cluster.status() if s.pid]
        yield cluster
    finally:
        cluster.down(progress=print)
        shutil.rmtree(root, ignore_errors=True)
    assert len(recorded) == len(SERVICES)
    assert not [pid for pid in recorded if alive(pid)], "cluster down left a service running"


def test_every_service_is_up_and_the_commands_report_it(profile: Cluster):
    status = cli(profile, "cluster", "status")
    assert status.returncode == 0, status.stderr
    lines = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()}
    assert lines == dict.fromkeys(SERVICES, "up")

    again = cli(profile, "cluster", "up")
    assert again.returncode == 0 and "up already" in again.stdout, again.stdout + again.stderr

    exported = cli(profile, "cluster", "env")
    variables = dict(line.removeprefix("export ").split("=", 1) for line in exported.stdout.splitlines())
    assert variables["TIDEWATER_LAKE_ROOT"] == "s3://lake/tidewater"
    assert variables["TIDEWATER_SPARK_MASTER"].startswith("'spark://127.0.0.1:") or variables[
        "TIDEWATER_SPARK_MASTER"
    ].startswith("spark://127.0.0.1:")
    assert variables["TIDEWATER_LOCK_BACKEND"] == "postgres"

    # Airflow keeps its metadata in the profile's PostgreSQL: the DAGs it parsed are rows there.
    settings = profile.settings()
    dsn = settings.postgres_dsn.replace("dbname=tidewater", f"dbname={AIRFLOW_DATABASE}")

    def parsed_dags() -> set[str]:
        with contextlib.closing(psycopg2.connect(dsn)) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT dag_id FROM dag")
            return {row[0] for row in cursor.fetchall()}

    dags = wait_for(parsed_dags, timeout_s=120, what="the DAGs in Airflow's PostgreSQL database")
    assert {"tidewater_supervise_streams", "tidewater_batch_rsvps"} <= dags
    health = LocalAirflow(settings).request("GET", "/api/v2/monitor/health", auth=False)
    assert health["metadatabase"]["status"] == "healthy"


def environ(pid: int) -> dict[str, str]:
    """A process's environment, as /proc shows it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def silver_ids(profile: Cluster) -> set[str]:
    """The event ids in rsvps' silver on the profile's S3 lake, as delta-rs reads them."""
    layout = PipelineLayout.of(profile.settings(), get_pipeline("rsvps"))
    with lake_environment(job_env(profile)):
        table = LakeTable(layout.table_uri("silver"))
        if not table.exists():
            return set()
        return set(table.open().to_pyarrow_table(columns=["event_id"]).column("event_id").to_pylist())


def bronze_coordinates(profile: Cluster) -> list[tuple[int, int]]:
    """(partition, offset) of every row of rsvps' bronze on the profile's S3 lake."""
    layout = PipelineLayout.of(profile.settings(), get_pipeline("rsvps"))
    with lake_environment(job_env(profile)):
        bronze = LakeTable(layout.table_uri("bronze")).open().to_pyarrow_table(columns=["partition", "offset"])
    return list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))


def spark_apps(settings: Settings, ui_port: int) -> list[dict[str, Any]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return list(json.loads(response.read()).get("activeapps", []))


def test_airflow_on_postgres_supervises_a_stream_on_the_standalone_master_into_the_s3_lake(profile: Cluster):
    settings = profile.settings()
    pipeline = get_pipeline("rsvps")
    topic = settings.topic(pipeline.source().topic)
    ensure_topic(settings, topic, settings.kafka_topic_partitions)
    config = GeneratorConfig(seed=12, start_time_ms=parse_ts("2026-11-25T10:00:00Z"), rate=50)
    sent = produce_generated(settings, topic, config, 1500)
    expected = {r.event_id for r in sent if r.kind != "malformed"}
    # Nobody triggers anything: the supervising DAG's continuous schedule has a run going, and its
    # watch wakes for the stream wanted running.
    layout = PipelineLayout.of(settings, pipeline)

    wait_for(lambda: expected <= silver_ids(profile), timeout_s=300, what="every event in silver on the S3 lake")
    ui_port = profile.read()["ports"]["spark_master_ui"]
    # (Airflow's scheduled jobs, e.g. the quarter-hourly late-data correction, may be running beside it.)
    apps = [a for a in spark_apps(settings, ui_port) if a["name"].startswith("tidewater-stream-")]
    assert [a["name"] for a in apps] == ["tidewater-stream-rsvps"]  # submitted to the standalone master
    assert apps[0]["cores"] == settings.spark_cores_max  # its share, not every core of the worker

    # The executor (a JVM the worker started; the worker has no TIDEWATER_*/AWS_* variable, as on a
    # cluster whose workers were started long before the job) knows the lake, the S3 endpoint and the
    # broker only because the driver forwarded them: without that an s3:// write from it would go to
    # the public AWS endpoint. Its Parquet files are in the profile's bucket.
    worker = int(profile.read()["services"]["spark-worker"]["pid"])
    assert not {k for k in environ(worker) if k.startswith(("TIDEWATER_", "AWS_"))}
    executors = [pid for pid, cmd in group_members(worker) if "CoarseGrainedExecutorBackend" in cmd]
    assert executors, group_members(worker)
    for executor in executors:
        env = environ(executor)
        assert env["AWS_ENDPOINT_URL"] == settings.s3_endpoint_url
        assert env["TIDEWATER_LAKE_ROOT"] == "s3://lake/tidewater"
        assert env["TIDEWATER_KAFKA_BOOTSTRAP_SERVERS"] == settings.kafka_bootstrap_servers
    # The executors and the worker map the install's class-data archive, as the driver does (HotSpot
    # maps an archive it uses and silently skips one it cannot; tidewater.class_data).
    if options := class_data.java_options():
        archive = options[0].removeprefix("-XX:SharedArchiveFile=")
        for pid in (*executors, worker):
            assert archive in Path(f"/proc/{pid}/maps").read_text(), (pid, archive)
    with lake_environment(job_env(profile)):
        fs, path = storage.filesystem(layout.table_uri("silver"))
        files = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    assert any(f.path.endswith(".parquet") for f in files)
    # A second driver on the same checkpoints is refused in one line, before any JVM starts.
    second = subprocess.run(
        [sys.executable, "-m", "tidewater.cli", "stream", "rsvps"],
        env=job_env(profile),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2, second.stderr
    assert "in use by a running driver" in second.stderr and "Traceback" not in second.stderr

    # The stream's checkpoint lease is a PostgreSQL lock (the cluster's lock backend), held by its driver.
    with contextlib.closing(psycopg2.connect(settings.postgres_dsn)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT name FROM tidewater_locks")
        names = {row[0] for row in cursor.fetchall()}
    assert f"checkpoint:{layout.namespace}/rsvps/bronze" in names


def run_dag(settings: Settings, dag_id: str, conf: dict[str, Any] | None = None, *, timeout_s: float = 240) -> str:
    """Trigger one run of ``dag_id`` over REST (as the UI's trigger button does); its final state."""
    airflow = LocalAirflow(settings)
    run = airflow.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}"
    return wait_for(
        lambda: (state := airflow.request("GET", path)["state"]) in ("success", "failed") and state,
        timeout_s=timeout_s,
        what=f"{dag_id} run {run['dag_run_id']}",
    )


def test_the_stream_does_not_need_airflow_and_airflow_starts_no_second_copy(profile: Cluster):
    """Runs after the supervision test, on its stream. Every Airflow process is paused (SIGSTOP: for the
    stream, as good as Airflow being down): the stream, detached from the task that launched it, keeps
    committing. Resumed, a supervision run finds the stream's lease and starts no second copy."""
    settings = profile.settings()
    control = StreamControl(settings, "rsvps")
    driver = control.health().pid
    assert driver and control.health().state == RUNNING
    services = profile.read()["services"]
    groups = [int(s["pid"]) for name, s in services.items() if name.startswith("airflow-") and s.get("pid")]
    paused = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    try:
        # Events of 09:00: an hour the other tests neither send to nor recompute.
        sent = send_batch(settings, 13, "2026-11-25T09:00:00Z", 300)
        expected = {r.event_id for r in sent if r.kind != "malformed"}
        wait_for(lambda: expected <= silver_ids(profile), timeout_s=180, what="commits while Airflow is paused")
        assert control.health().pid == driver
    finally:
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
    resumed = dt.datetime.now(dt.UTC).replace(microsecond=0)

    def observed_after_resume() -> dict[str, Any] | None:  # the triggerer's watch looked again
        seen = json.loads((control.dir / "health.json").read_text())
        return seen if dt.datetime.fromisoformat(seen["checked_at"]) > resumed else None

    seen = wait_for(observed_after_resume, timeout_s=120, what="the supervising watch to look at the stream again")
    assert seen["state"] == RUNNING and seen["pid"] == driver, seen
    time.sleep(2 * settings.supervise_poll_seconds)  # a round it woke for would start within a poll or two
    assert control.health().pid == driver and control.lease_pids() == {driver}
    # Starts since the pause: none. (Before it, the supervisor may have started the stream twice: on a busy
    # host its first driver can start before the supervision test creates the topic, exit, and be restarted.)
    # (An event's pid is the spark-submit process the supervisor launched, not the Python driver under it.)
    starts = [e for e in control.events() if e["event"] == "start"]
    assert starts and not [e for e in starts if dt.datetime.fromisoformat(e["at"]) >= paused], starts


def send_batch(settings: Settings, seed: int, start: str, count: int) -> list[Any]:
    topic = settings.topic(get_pipeline("rsvps").source().topic)
    return produce_generated(settings, topic, GeneratorConfig(seed=seed, start_time_ms=parse_ts(start), rate=50), count)


def test_a_broker_restart_and_a_killed_driver_lose_nothing_and_write_nothing_twice(profile: Cluster):
    """Runs after the supervision test, on its stream. The broker (its log on the S3 server) is killed
    with SIGKILL while a producer sends and the stream reads, and started again on the same bucket and
    port; then the driver is killed with SIGKILL and the supervisor launches it again on the standalone
    master. Bronze holds every record sent exactly once, silver every event."""
    settings = profile.settings()
    control = StreamControl(settings, "rsvps")
    assert control.lease_pids(), "the supervision test's stream should be running"

    before = bronze_coordinates(profile)
    topic = settings.topic(get_pipeline("rsvps").source().topic)
    config = GeneratorConfig(seed=21, start_time_ms=parse_ts("2026-11-25T11:00:00Z"), rate=50, duplicate_rate=0.03)
    sent: list[Any] = list(generate(config, 1500))
    acked: list[Any] = []
    failures: list[BaseException] = []
    producer = KafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True, linger_ms=5
    )

    def trickle() -> None:  # the producer rides through the broker's kill -9 on its retries
        for start in range(0, len(sent), 250):
            chunk = sent[start : start + 250]
            futures = [(r, producer.send(topic, key=r.key, value=r.value, timestamp_ms=r.timestamp_ms)) for r in chunk]
            producer.flush(timeout=60)
            for record, future in futures:
                try:
                    future.get(timeout=0)
                    acked.append(record)
                except Exception as exc:
                    failures.append(exc)
            time.sleep(0.5)

    sender = threading.Thread(target=trickle, daemon=True)
    try:
        sender.start()
        time.sleep(1.0)
        profile.restart_broker(kill=True, down_s=3.0)  # mid-stream: its reads fail meanwhile, and retry
        sender.join(timeout=180)
    finally:
        producer.close(timeout=5)
    assert not sender.is_alive() and not failures, failures[:3]
    assert len(acked) == len(sent)
    expected = {r.event_id for r in sent if r.kind != "malformed"}
    wait_for(lambda: expected <= silver_ids(profile), timeout_s=240, what="the events sent around the broker restart")

    killed = control.lease_pids()
    for pid in killed:  # the driver's whole process group: JVM and Python
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    sent += send_batch(settings, 23, "2026-11-25T12:00:00Z", 600)  # the watch notices the kill within a poll
    expected = {r.event_id for r in sent if r.kind != "malformed"}
    wait_for(lambda: expected <= silver_ids(profile), timeout_s=300, what="the events sent after the driver's kill")

    relaunched = control.lease_pids()
    assert relaunched and not relaunched & killed
    airflow = LocalAirflow(settings)

    def incident_shown() -> bool:  # the run that relaunched the stream fails, so the grid shows it
        runs = airflow.request("GET", "/api/v2/dags/tidewater_supervise_streams/dagRuns?limit=100")["dag_runs"]
        return any(r["state"] == "failed" for r in runs)

    wait_for(incident_shown, timeout_s=120, what="the supervision run that relaunched the stream to show as failed")
    coordinates = bronze_coordinates(profile)
    assert len(coordinates) == len(set(coordinates))  # no record twice, across the restart and the kill
    assert len(coordinates) == len(before) + len(sent)  # and none lost


def test_the_s3_servers_conditional_put_is_what_keeps_a_lock_bypassing_writer_from_losing_a_commit(
    profile: Cluster,
):
    """A writer that ignores the table locks commits from a stale snapshot, at the version another
    writer already committed. The lake's commits are conditional puts (``aws_conditional_put=etag``:
    ``If-None-Match: *``), so the server refuses the stale commit (412) and the first one stays; the
    same put without the condition replaces it: a lost commit. delta-rs itself, on the refusal,
    re-reads the log and commits on top: both writers' rows kept."""
    import boto3
    from botocore.exceptions import ClientError
    from deltalake import DeltaTable, write_deltalake

    env = profile.environment()
    options = {
        "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
        "AWS_ENDPOINT_URL": env["TIDEWATER_S3_ENDPOINT_URL"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "aws_conditional_put": "etag",
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=options["AWS_ENDPOINT_URL"],
        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    uri, log_entry = "s3://lake/race/table", "race/table/_delta_log/00000000000000000001.json"
    write_deltalake(uri, pa.table({"writer": pa.array(["setup"])}), storage_options=options)
    stale = DeltaTable(uri, storage_options=options)  # the bypassing writer's snapshot: version 0
    write_deltalake(
        uri,
        pa.table(
            {"writer": pa.array(["first"])},
        ),
        mode="append",
        storage_options=options,
    )
    first_commit = s3.get_object(Bucket="lake", Key=log_entry)["Body"].read()

    bypassing_commit = b'{"commitInfo":{"operation":"WRITE","by":"a writer without the lock"}}\n'
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket="lake", Key=log_entry, Body=bypassing_commit, IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] in ("PreconditionFailed", "412")
    assert s3.get_object(Bucket="lake", Key=log_entry)["Body"].read() == first_commit  # kept

    write_deltalake(stale, pa.table({"writer": pa.array(["second"])}), mode="append")  # delta-rs: retried on top
    table = DeltaTable(uri, storage_options=options)
    assert (table.version(), sorted(table.to_pyarrow_table()["writer"].to_pylist())) == (
        2,
        ["first", "second", "setup"],
    )

    # Without the condition the server takes the stale commit over the first one: the first writer's
    # rows are silently gone from the table (what the conditional put prevents).
    s3.put_object(Bucket="lake", Key=log_entry, Body=bypassing_commit)
    assert s3.get_object(Bucket="lake", Key=log_entry)["Body"].read() == bypassing_commit
    assert "first" not in DeltaTable(uri, storage_options=options, version=1).to_pyarrow_table()["writer"].to_pylist()


def test_two_recomputes_from_two_process_trees_are_serialized_by_the_postgres_lock(profile: Cluster):
    """Two ``tidewater batch recompute`` of the same hour, each in its own process tree, race for rsvps'
    silver on the S3 lake. The test holds silver's lock first (from its own
    connection, as a third writer would): PostgreSQL shows both recomputes waiting on it. Released, they
    take it one after the other: both succeed, each replace is its own commit, and silver holds exactly
    the events it held (a recompute reproduces the stream). The stream is stopped first, so the only
    waiters are the two recomputes; it is stopped as from the UI, through the control DAG."""
    settings = profile.settings()
    pipeline = get_pipeline("rsvps")
    layout = PipelineLayout.of(settings, pipeline)
    # The backfill test (next) compares the gold windows the stream had closed. On the stream's one core,
    # sources first, gold runs a batch or two behind silver, and the driver was just relaunched: let every
    # gold query's watermark pass the 10:00 events' windows before stopping it.
    closed = dt.datetime(2026, 11, 25, 10, 10, tzinfo=dt.UTC)
    wait_for(
        lambda: all(_last_watermark(layout, layout.gold_query_of(g.name).name) >= closed for g in pipeline.gold),
        timeout_s=240,
        what="every gold query's watermark past the 10:00 events' windows",
    )
    # Stopped from the UI's control DAG (a stop request the driver polls; no signal needed on a cluster).
    control = StreamControl(settings, "rsvps")
    assert run_dag(settings, "tidewater_stream_control", {"pipeline": "rsvps", "action": "stop"}) == "success"
    assert not control.lease_pids()
    stop = [e for e in control.events() if e["event"] == "stop"][-1]
    assert stop["how"] == "request" and not stop["forced"], stop  # the driver stopped itself: no signal sent
    before = silver_ids(profile)
    version_before = _silver_version(profile, layout)
    lock = layout.lock("silver")
    assert isinstance(lock, PostgresLock)
    held = lock.acquire("test: a third writer holding silver")
    command = [sys.executable, "-m", "tidewater.cli", "batch", "recompute", "--pipeline", "rsvps"]
    interval = ["--start", "2026-11-25T10:00", "--end", "2026-11-25T13:00", "--layers", "silver"]
    racers: list[subprocess.Popen[str]] = []
    try:
        for run in ("race-1", "race-2"):
            racers.append(
                subprocess.Popen(
                    [*command, *interval, "--run-id", run],
                    # In-process Spark (local[1]): what is under test is the lock, not the master; two
                    # more applications on the standalone master would only cost two executor JVMs.
                    env={**job_env(profile), "TIDEWATER_SPARK_MASTER": "local[1]"},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )

        def sessions_on_the_lock() -> int:  # each taker polls from its own session, named after the lock
            with contextlib.closing(psycopg2.connect(settings.postgres_dsn)) as connection, connection.cursor() as c:
                c.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (f"tidewater lock {lock.name}"[:63],),
                )
                return int(c.fetchone()[0])

        # ours, holding it, and one per recompute, waiting
        wait_for(lambda: sessions_on_the_lock() == 3, timeout_s=240, what="both recomputes waiting on silver's lock")
        assert _silver_version(profile, layout) == version_before  # neither got past the lock
    finally:
        held.release()
    outputs = []
    for racer in racers:
        out, _ = racer.communicate(timeout=600)
        outputs.append(out)
        assert racer.returncode == 0, out[-3000:]
    assert all("tidewater: result " in out for out in outputs)
    with lake_environment(job_env(profile)):
        commits = LakeTable(layout.table_uri("silver")).history(limit=2)
    assert sorted(c.get("tidewater.run_id") for c in commits) == ["race-1", "race-2"]
    assert _silver_version(profile, layout) == version_before + 2  # one commit each, one after the other
    assert silver_ids(profile) == before
    assert control.health().state == STOPPED  # the minute's supervision runs left it stopped


def _silver_version(profile: Cluster, layout: PipelineLayout) -> int:
    with lake_environment(job_env(profile)):
        return LakeTable(layout.table_uri("silver")).version()


def _rows(profile: Cluster, uri: str, drop: tuple[str, ...] = ()) -> list[tuple]:
    """A table on the profile's S3 lake as sorted tuples (``drop``: columns left out)."""
    with lake_environment(job_env(profile)):
        table = LakeTable(uri).open().to_pyarrow_table()
    table = table.select([c for c in table.column_names if c not in drop])
    return sorted(tuple(sorted(row.items())) for row in table.to_pylist())


def _last_watermark(layout: PipelineLayout, query: str) -> dt.datetime:
    """The event-time watermark of the stream's ``query`` at its last micro-batch (its progress log)."""
    name = f"{layout.namespace}.{layout.pipeline.name}.{query}"
    progress = (json.loads(line) for line in (layout.progress_dir() / "progress.jsonl").read_text().splitlines())
    marks = [entry["watermark"] for entry in progress if entry.get("name") == name and entry.get("watermark")]
    assert marks, f"no watermark reported by {name}"
    return dt.datetime.fromisoformat(marks[-1].replace("Z", "+00:00"))


def test_a_rest_backfill_on_postgres_recomputes_and_audits_an_hour_like_the_stream(profile: Cluster):
    """Runs last, the stream stopped: a backfill of 10:00-11:00 created through Airflow's REST API runs
    the batch DAG on Airflow-on-PostgreSQL, its Spark jobs on the standalone master. Every task succeeds,
    every suite of the interval and its gold passes (parity with gold recomputed from silver included) and
    is in the audit table labelled ``backfill``, and the recompute reproduces what the stream wrote:
    the same silver rows, the same values in every gold window the stream had closed."""
    settings = profile.settings()
    pipeline = get_pipeline("rsvps")
    layout = PipelineLayout.of(settings, pipeline)
    dag_id = "tidewater_batch_rsvps"
    hour = "2026-11-25T10:00:00+00:00"
    silver_before = _rows(profile, layout.table_uri("silver"))
    # The windows the stream had closed: its gold queries' last watermark passed their end (the previous
    # test waited for it to pass the 10:00 events' windows). Gold may lag silver when the stream is
    # stopped, sources having the cores first; a window it had not closed may lack events the backfill counts.
    gold_before = {
        g.name: [
            row
            for row in _rows(profile, layout.table_uri(f"gold/{g.name}"), ("status", "revision"))
            if dict(row)["window_end"] <= _last_watermark(layout, layout.gold_query_of(g.name).name)
        ]
        for g in pipeline.gold
    }
    assert all(gold_before.values()), {name: len(rows) for name, rows in gold_before.items()}
    airflow = LocalAirflow(settings)
    backfill = airflow.request(
        "POST",
        "/api/v2/backfills",
        {"dag_id": dag_id, "from_date": hour, "to_date": hour, "max_active_runs": 1, "reprocess_behavior": "none"},
    )

    def finished() -> dict[str, Any] | None:
        runs = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?run_type=backfill&limit=10")["dag_runs"]
        return runs[0] if len(runs) == 1 and runs[0]["state"] in ("success", "failed") else None

    run = wait_for(finished, timeout_s=600, what=f"backfill {backfill['id']} of {hour}")
    instances = airflow.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances")
    states = {t["task_id"]: t["state"] for t in instances["task_instances"]}
    print("task durations (s):", {t["task_id"]: round(t["duration"] or 0, 1) for t in instances["task_instances"]})
    print("run:", run["start_date"], "->", run["end_date"], "queued", run.get("queued_at"))
    failed = {
        task: _task_log_tail(settings, dag_id, run["dag_run_id"], task)
        for task, st in states.items()
        if st != "success"
    }
    for task, tail in failed.items():
        print(f"--- {task} ({states[task]}):\n{tail}")
    assert run["state"] == "success" and not failed, states
    assert run["data_interval_start"].startswith("2026-11-25T10:00:00")

    with lake_environment(job_env(profile)):
        audits = LakeTable(layout.audit_uri()).open().to_pyarrow_table().to_pylist()
        # Not the last commit alone: the hourly schedule's run of the hour just ended (at :05) may commit after it.
        commits = LakeTable(layout.table_uri("silver")).history(limit=10)
    ours = [a for a in audits if a["dag_run_id"] == run["dag_run_id"]]
    assert {(a["task_id"], a["suite"]) for a in ours} == {
        ("audit_interval", "rsvps.bronze"),
        ("audit_interval", "rsvps.records"),
        ("audit_interval", "rsvps.silver"),
        ("audit_interval", "rsvps.reconciliation"),
        ("audit_gold", "rsvps.gold.venue_response_counts"),
        ("audit_gold", "rsvps.gold.trending_venues"),
        ("audit_gold", "rsvps.parity.gold.venue_response_counts"),
        ("audit_gold", "rsvps.parity.gold.trending_venues"),
    }, ours
    assert all(a["success"] and a["trigger"] == "backfill" for a in ours), ours
    assert run["dag_run_id"] in {c.get("tidewater.run_id") for c in commits}, commits
    assert _rows(profile, layout.table_uri("silver")) == silver_before
    for gold in pipeline.gold:  # the windows the stream had closed, reproduced; the rest filled in
        after = _rows(profile, layout.table_uri(f"gold/{gold.name}"), ("status", "revision"))
        assert after and set(gold_before[gold.name]) <= set(after), gold.name


def _task_log_tail(settings: Settings, dag_id: str, run_id: str, task_id: str, lines: int = 40) -> str:
    """The end of a task's latest attempt log (what a failed assertion should show)."""
    folder = settings.airflow_home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    attempts = sorted(folder.glob("attempt=*.log"))
    return (
        "\n".join(attempts[-1].read_text(errors="replace").splitlines()[-lines:]) if attempts else f"no log in {folder}"
    )
