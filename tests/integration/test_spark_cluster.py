"""Executors on a Spark standalone cluster write the lake where the driver says, and nowhere else.

Real Spark standalone master and worker (from the pyspark wheel, on 127.0.0.1), a real S3 server
(SeaweedFS), a driver in its own process. The worker is started with no ``TIDEWATER_*`` or ``AWS_*``
variable, as on a cluster whose workers were started long before the job: the executors can reach the
lake only through what the driver forwards (``spark.executorEnv.*``). Without it, an s3:// write from
an executor would go to the public AWS endpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.lake import storage
from tidewater.lake.tables import LakeTable
from tidewater.s3server import S3Server
from tidewater.spark_cluster import StandaloneCluster

pytestmark = pytest.mark.slow

JOB = textwrap.dedent(
    """
    import json, os, socket, sys
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


@contextlib.contextmanager
def lake_environment(env: dict[str, str]) -> Iterator[None]:
    """This process's TIDEWATER_*/AWS_* variables exactly as in ``env`` (other tests' S3 settings set
    aside, cached storage settings forgotten), restored afterwards."""
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"), buckets=("lake",))
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark"), free_port(), free_port(), free_port())
    try:
        server.start()
        standalone.start()
        yield {"s3": server, "spark": standalone}
    finally:
        standalone.stop()
        server.stop()


def test_executors_write_to_the_configured_s3_endpoint(cluster, tmp_path: Path):
    server, standalone = cluster["s3"], cluster["spark"]
    settings = Settings(
        state_dir=str(tmp_path / "state"),
        spark_master=standalone.master_url,
        spark_driver_memory="1g",
        lake_root="s3://lake/cluster",
        s3_endpoint_url=server.endpoint_url,
        s3_allow_http=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWATER_", "AWS_"))}
    env.update(settings.to_env())
    env.update({k: v for k, v in server.env().items() if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    source_uri, target_uri = "s3://lake/cluster/source", "s3://lake/cluster/target"
    with lake_environment(env):  # this process writes the source table with the job's settings
        source = LakeTable(source_uri)
        rows = pa.table({"id": pa.array(range(100), pa.int64()), "name": pa.array([f"n{i}" for i in range(100)])})
        source.ensure(rows.schema, description="rows the executors copy")
        source.append_arrow(rows)
        LakeTable(target_uri).ensure(rows.schema, description="the executors' copy")
    job = subprocess.run(
        [sys.executable, "-c", JOB, source_uri, target_uri, str(tmp_path / "checkpoint")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert result["master"] == standalone.master_url
    # Every executor (a JVM the worker started, with no AWS_* of its own) was told the endpoint.
    assert {tuple(s[:2]) for s in result["seen"]} == {(server.endpoint_url, "s3://lake/cluster")}
    assert all(pid != result["driver_pid"] for *_, pid in result["seen"])
    # The copy is in the S3 server's bucket: written by the executors, committed by the driver.
    listed = server.client().list_objects_v2(Bucket="lake", Prefix="cluster/target/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert any(k.endswith(".parquet") for k in keys) and any("_delta_log" in k for k in keys)
    with lake_environment(env):
        copied = LakeTable(target_uri).open().to_pyarrow_table().sort_by("id")
    assert copied.column("id").to_pylist() == list(range(100))
