"""The cluster profile: a team deployment's services, each real, on this machine, and the platform on it.

One profile for the module, brought up by the code behind ``tidewater cluster up``: PostgreSQL, the
SeaweedFS S3 server with the lake's bucket, tansu with its log on that server, a Spark standalone master
and worker (started with no ``TIDEWATER_*`` or ``AWS_*`` variable, as on a cluster whose workers were
started long before any job), and Airflow on PostgreSQL. Its teardown is ``cluster down``, and fails if
anything the profile started is still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pytest

from pipeline_helpers import produce_generated, wait_for
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.lake import storage
from tidewater.lake.tables import LakeTable
from tidewater.orchestration.airflow_local import LocalAirflow
from tidewater.orchestration.cluster import AIRFLOW_DATABASE, Cluster
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.samples import GeneratorConfig, parse_ts
from tidewater.processes import alive

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.airflow]

SERVICES = {
    "postgres",
    "s3",
    "broker",
    "spark-master",
    "spark-worker",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
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
    base = Settings(state_dir=str(root / "state"), pipelines="rsvps", airflow_port=free_port())
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


EXECUTOR_JOB = textwrap.dedent(
    """
    import json, os, sys
    from tidewater.config import Settings
    from tidewater.spark import build_session
    settings = Settings.from_env()
    spark = build_session(settings, "cluster-executor-env")
    seen = (
        spark.sparkContext.parallelize(range(2), 2)
        .map(lambda _: (os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("TIDEWATER_LAKE_ROOT"), os.getpid()))
        .collect()
    )
    query = (
        spark.readStream.format("tidewater-delta").load(sys.argv[1])
        .writeStream.format("tidewater-delta")
        .option("appId", "cluster-copy")
        .option("checkpointLocation", sys.argv[3])
        .trigger(availableNow=True)
        .start(sys.argv[2])
    )
    query.awaitTermination(300)
    print(json.dumps({"seen": seen, "driver_pid": os.getpid(), "master": spark.sparkContext.master}))
    spark.stop()
    """
)


def test_executors_write_to_the_configured_s3_endpoint_and_nowhere_else(profile: Cluster, tmp_path: Path):
    """Without the forwarded settings, an s3:// write from an executor would go to the public AWS endpoint."""
    settings = profile.settings().replace(lake_root="s3://lake/executors", spark_driver_memory="1g")
    env = {**job_env(profile), **settings.to_env()}
    source_uri, target_uri = "s3://lake/executors/source", "s3://lake/executors/target"
    with lake_environment(env):  # this process writes the source table with the job's settings
        source = LakeTable(source_uri)
        rows = pa.table({"id": pa.array(range(100), pa.int64()), "name": pa.array([f"n{i}" for i in range(100)])})
        source.ensure(rows.schema, description="rows the executors copy")
        source.append_arrow(rows)
        LakeTable(target_uri).ensure(rows.schema, description="the executors' copy")
    job = subprocess.run(
        [sys.executable, "-c", EXECUTOR_JOB, source_uri, target_uri, str(tmp_path / "checkpoint")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["master"] == settings.spark_master
    # Every executor (a JVM the worker started, with no AWS_* of its own) was told the endpoint.
    assert {tuple(s[:2]) for s in result["seen"]} == {(settings.s3_endpoint_url, "s3://lake/executors")}
    assert all(pid != result["driver_pid"] for *_, pid in result["seen"])
    with lake_environment(env):  # written by the executors, committed by the driver, in the S3 server's bucket
        copied = LakeTable(target_uri).open().to_pyarrow_table().sort_by("id")
    assert copied.column("id").to_pylist() == list(range(100))


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
    airflow = LocalAirflow(settings)
    # The supervising DAG runs every minute; triggered now, it starts the stream without waiting.
    airflow.request("POST", "/api/v2/dags/tidewater_supervise_streams/dagRuns", {"logical_date": None})
    layout = PipelineLayout.of(settings, pipeline)

    def silver_ids() -> set[str]:
        with lake_environment(job_env(profile)):
            table = LakeTable(layout.table_uri("silver"))
            if not table.exists():
                return set()
            return set(table.open().to_pyarrow_table(columns=["event_id"]).column("event_id").to_pylist())

    wait_for(lambda: expected <= silver_ids(), timeout_s=300, what="every event in silver on the S3 lake")
    ui_port = profile.read()["ports"]["spark_master_ui"]
    apps = spark_apps(settings, ui_port)
    assert [a["name"] for a in apps] == ["tidewater-stream-rsvps"]  # submitted to the standalone master
    assert apps[0]["cores"] == settings.spark_cores_max  # its share, not every core of the worker
    # The stream's checkpoint lease is a PostgreSQL lock (the cluster's lock backend), held by its driver.
    with contextlib.closing(psycopg2.connect(settings.postgres_dsn)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT name FROM tidewater_locks")
        names = {row[0] for row in cursor.fetchall()}
    assert f"checkpoint:{layout.namespace}/rsvps/bronze" in names
