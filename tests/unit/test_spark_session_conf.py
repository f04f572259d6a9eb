"""What a tidewater Spark session is configured with, and what its executors on other hosts receive."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

from tidewater import class_data
from tidewater.config import JvmMemory, Settings
from tidewater.errors import ConfigError
from tidewater.spark import (
    DIRECT_RESULT_SIZE,
    GOLD_POOL,
    JOIN_STATE_FORMAT,
    ROCKSDB_PROVIDER,
    SCHEDULER_POOLS_XML,
    SOURCES_POOL,
    executor_env,
    is_local_master,
    java_options_of,
    session_conf,
    stream_master,
    unread_hadoop_defaults,
)
from tidewater.spark_cluster import StandaloneCluster
from tidewater.streaming.jobs import stream_job_command

S3 = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "PYSPARK_PYTHON": "/venv/bin/python"}


def test_a_local_master_shares_the_drivers_environment():
    conf = session_conf(Settings(spark_master="local[2]"), S3)
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert conf["spark.sql.session.timeZone"] == "UTC"
    # a batch session too: the tests' shared session runs the streams of in-process tests
    for streaming in (False, True):
        assert JOIN_STATE_FORMAT.items() <= session_conf(Settings(), {}, streaming=streaming).items()
    # nothing of the driver's environment (credentials) is copied; one variable every Python function
    # gets, so that a state machine's workers share the others' pool (tests/integration/test_stream_host.py)
    assert [key for key in conf if key.startswith("spark.executorEnv.")] == [
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK"
    ]
    assert "spark.cores.max" not in conf  # local[N] has its N threads, nothing to share
    assert all(is_local_master(m) for m in ("local", "local[2]", "local[*]", "local[2,3]"))
    assert not any(is_local_master(m) for m in ("spark://127.0.0.1:7077", "yarn", "k8s://https://h:443"))


def test_no_session_propagates_constraints():
    """Every session, batch or stream, local or on a cluster: constraint propagation cost a cold batch
    job 5-7 s of planning on the parse's plans (see session_conf), and only ever infers filters."""
    for settings in (Settings(), Settings(spark_master="spark://127.0.0.1:7077")):
        for streaming in (False, True):
            conf = session_conf(settings, S3, streaming=streaming)
            assert conf["spark.sql.constraintPropagation.enabled"] == "false"


def test_a_tasks_result_comes_back_as_it_is_up_to_what_one_rpc_message_carries():
    """Every session: a micro-batch's task results (tens of MiB) skip the block manager and its fetch,
    two more copies on the driver's heap; above Spark's cap (spark.rpc.message.maxSize, 128 MiB unless
    set) a larger setting would be cut to it silently, so it is no larger."""
    for settings in (Settings(), Settings(spark_master="spark://127.0.0.1:7077")):
        for streaming in (False, True):
            conf = session_conf(settings, S3, streaming=streaming)
            assert conf["spark.task.maxDirectResultSize"] == DIRECT_RESULT_SIZE
            assert "spark.rpc.message.maxSize" not in conf  # Spark's 128 MiB
    # read as the settings read a JVM size: 2 MiB or more (above Spark's 1 MiB default), at most 128 MiB
    assert JvmMemory(minimum=2 << 20).problem(DIRECT_RESULT_SIZE) is None
    assert JvmMemory(minimum=(128 << 20) + 1).problem(DIRECT_RESULT_SIZE) is not None


def test_a_cluster_masters_executors_get_the_settings_and_the_s3_endpoint_and_credentials():
    settings = Settings(
        spark_master="spark://127.0.0.1:7077",
        lake_root="s3://lake/tidewater",
        s3_endpoint_url="http://127.0.0.1:8333",
        s3_region="eu-central-1",
        kafka_bootstrap_servers="127.0.0.1:9092",
    )
    conf = session_conf(settings, S3)
    forwarded = {k.removeprefix("spark.executorEnv."): v for k, v in conf.items() if k.startswith("spark.executorEnv.")}
    assert forwarded["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"  # not the public AWS endpoint
    assert forwarded["AWS_REGION"] == "eu-central-1"
    assert (forwarded["AWS_ACCESS_KEY_ID"], forwarded["AWS_SECRET_ACCESS_KEY"]) == ("key", "secret")
    assert forwarded["PYSPARK_PYTHON"] == "/venv/bin/python"
    assert forwarded["TIDEWATER_LAKE_ROOT"] == "s3://lake/tidewater"
    assert forwarded["TIDEWATER_KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert {k for k in forwarded if k.startswith("TIDEWATER_")} == set(settings.to_env())


def test_each_job_on_a_cluster_takes_its_share_not_every_free_core():
    settings = Settings(spark_master="spark://127.0.0.1:7077", spark_cores_max=2, spark_executor_memory="3g")
    conf = session_conf(settings, {})
    assert (conf["spark.cores.max"], conf["spark.executor.cores"], conf["spark.executor.memory"]) == ("2", "2", "3g")


def test_an_endpoint_in_the_environment_wins_and_nothing_unset_is_forwarded():
    env = executor_env(Settings(s3_endpoint_url="http://127.0.0.1:8333"), {"AWS_ENDPOINT_URL": "http://10.0.0.5:9000"})
    assert env["AWS_ENDPOINT_URL"] == "http://10.0.0.5:9000"
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_SESSION_TOKEN" not in env


def test_the_jvms_temporary_files_go_to_the_drivers_scratch_folder():
    conf = session_conf(Settings(spark_java_options=""), {}, scratch="/state/scratch/123")
    assert conf["spark.local.dir"] == "/state/scratch/123"
    assert conf["spark.driver.extraJavaOptions"] == "-Djava.io.tmpdir=/state/scratch/123"  # RocksDB, LZ4 libs
    assert "spark.local.dir" not in session_conf(Settings(spark_java_options=""), {})


def test_a_scratch_folder_is_per_process_and_a_dead_processs_one_is_removed(tmp_path):
    import os
    import subprocess

    from tidewater.processes import scratch_dir

    gone = subprocess.Popen(["true"])
    gone.wait()
    leftover = tmp_path / str(gone.pid)
    (leftover / "spark-1234").mkdir(parents=True)
    living = tmp_path / "1"  # pid 1 is alive: never touched
    living.mkdir()
    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    mine = scratch_dir(tmp_path)
    assert mine == str(tmp_path / str(os.getpid()))
    assert os.path.isdir(mine)
    assert not leftover.exists() and living.exists() and unrelated.exists()


def test_a_busy_python_worker_is_never_killed_for_silence():
    """spark.python.worker.killOnIdleTimeout ends a worker that sent nothing for the idle timeout even
    while it computes (a state processor folding a large micro-batch): the query then fails."""
    conf = session_conf(Settings(state_dir="/tmp/x"))
    assert conf.get("spark.python.worker.killOnIdleTimeout", "false") == "false"
    assert conf["spark.python.worker.reuse"] == "true"


def test_the_streaming_job_has_its_own_heap() -> None:
    """A stream holds one micro-batch at a time (state in RocksDB, off the heap); batch jobs hold intervals."""
    settings = Settings(spark_driver_memory="3g", stream_driver_memory="768m")
    assert session_conf(settings, {})["spark.driver.memory"] == "3g"
    assert session_conf(settings, {}, streaming=True)["spark.driver.memory"] == "768m"
    assert Settings().stream_driver_memory == "1g"


def test_the_streaming_job_runs_with_its_own_jvm_options_however_it_is_started(monkeypatch) -> None:
    """In a session that starts its JVM (``tidewater stream``) and on spark-submit's command line (the
    supervisor, the benchmarks): the same options, which batch jobs do not get."""
    monkeypatch.setattr(class_data, "java_options", lambda: [])  # no class-data archive here
    settings = Settings(spark_java_options="", stream_java_options="-XX:+UseSerialGC -XX:MaxMetaspaceSize=256m")
    streaming = session_conf(settings, {}, scratch="/state/scratch/7", streaming=True)
    assert streaming["spark.driver.extraJavaOptions"] == (
        "-Djava.io.tmpdir=/state/scratch/7 -XX:+UseSerialGC -XX:MaxMetaspaceSize=256m"
    )
    batch = session_conf(settings, {}, scratch="/state/scratch/7")
    assert batch["spark.driver.extraJavaOptions"] == "-Djava.io.tmpdir=/state/scratch/7"
    assert "spark.driver.extraJavaOptions" not in session_conf(
        Settings(spark_java_options="", stream_java_options=""), {}, streaming=True
    )
    assert Settings().stream_java_options.split()[0] == "-XX:+UseSerialGC"

    command = stream_job_command(settings, "rsvps", ())
    at = command.index("--driver-java-options")
    assert command[at + 1] == "-XX:+UseSerialGC -XX:MaxMetaspaceSize=256m" and at < command.index("rsvps")
    assert "--driver-java-options" not in stream_job_command(
        Settings(spark_java_options="", stream_java_options=" "), "rsvps", ()
    )


def test_the_streaming_job_serves_its_sources_before_gold() -> None:
    """A source's micro-batch (silver latency) takes the next free core; a gold job gets the rest."""
    streaming = session_conf(Settings(), {}, scratch="/state/scratch/7", streaming=True)
    assert streaming["spark.scheduler.mode"] == "FAIR"
    assert streaming["spark.scheduler.allocation.file"] == "/state/scratch/7/scheduler-pools.xml"
    batch = session_conf(Settings(), {}, scratch="/state/scratch/7")
    assert "spark.scheduler.mode" not in batch and "spark.scheduler.allocation.file" not in batch

    pools = {pool.get("name"): pool for pool in ET.fromstring(SCHEDULER_POOLS_XML).iter("pool")}
    assert set(pools) == {SOURCES_POOL, GOLD_POOL}
    share = {name: int(pool.findtext("minShare")) for name, pool in pools.items()}
    weight = {name: int(pool.findtext("weight")) for name, pool in pools.items()}
    assert share[SOURCES_POOL] >= 2 and share[GOLD_POOL] == 0  # local[2]: both cores on a source's demand
    assert weight[SOURCES_POOL] > weight[GOLD_POOL]


def test_the_streaming_jobs_checkpoints_are_renamed_without_a_process_per_file() -> None:
    """Without Hadoop's native library, FileContext's rename ran `readlink` for each checkpoint file
    (702 of the 918 processes ads started in 60 s at 300 events/s). The local file system stays the
    checksummed one: RocksDB's snapshot upload needs it (test_state_snapshots.py)."""
    streaming = session_conf(Settings(), streaming=True)
    assert streaming["spark.sql.streaming.checkpointFileManagerClass"].endswith(".FileSystemBasedCheckpointFileManager")
    assert not any(key.startswith("spark.hadoop.fs.file.") for key in streaming)
    batch = session_conf(Settings())
    assert "spark.sql.streaming.checkpointFileManagerClass" not in batch


def test_a_streaming_job_gets_at_least_a_task_slot_more_than_its_source_queries() -> None:
    default = Settings()  # local[2], auto
    assert [stream_master(default, source_queries) for source_queries in (1, 2, 4)] == [
        "local[2]",
        "local[3]",
        "local[5]",
    ]
    assert stream_master(Settings(spark_master="local"), 1) == "local[2]"
    assert stream_master(Settings(spark_master="local[4, 2]", stream_extra_task_slots="2"), 1) == "local[6, 2]"
    assert stream_master(Settings(spark_master="local[*]", stream_extra_task_slots="1"), 1) == (
        f"local[{(os.cpu_count() or 1) + 1}]"
    )
    assert stream_master(Settings(stream_extra_task_slots="0"), 9) == "local[2]"
    assert stream_master(Settings(spark_master="spark://127.0.0.1:7077"), 9) == "spark://127.0.0.1:7077"
    # from the declarations (spark-submit starts the JVM with it): two sources, or one source's bronze
    # and silver queries apart, get a third slot
    for pipeline, settings, master in (
        ("vending", default, "local[3]"),
        ("ads", default, "local[3]"),
        ("rsvps", default, "local[2]"),
        ("rsvps", Settings(silver_query=True), "local[3]"),
    ):
        command = stream_job_command(settings, pipeline, ())
        assert command[command.index("--master") + 1] == master, pipeline
    with pytest.raises(ConfigError, match="TIDEWATER_STREAM_EXTRA_TASK_SLOTS='-1': must be auto, or a number"):
        Settings.from_env({"TIDEWATER_STREAM_EXTRA_TASK_SLOTS": "-1"})


def test_every_driver_jvm_maps_the_class_data_archive_when_there_is_one(monkeypatch) -> None:
    """Sessions (batch and streaming) and the streaming job's spark-submit get the archive's options
    after their own; without an archive nothing changes (the test above)."""
    archive = ["-XX:SharedArchiveFile=/venv/share/tidewater/class-data/spark-1.jsa", "-Xlog:cds=off"]
    settings = Settings(spark_java_options="", stream_java_options="-XX:+UseSerialGC")
    batch = session_conf(settings, {}, scratch="/s", class_data_options=archive)
    assert batch["spark.driver.extraJavaOptions"] == "-Djava.io.tmpdir=/s " + " ".join(archive)
    streaming = session_conf(settings, {}, scratch="/s", streaming=True, class_data_options=archive)
    assert streaming["spark.driver.extraJavaOptions"] == "-Djava.io.tmpdir=/s -XX:+UseSerialGC " + " ".join(archive)
    monkeypatch.setattr(class_data, "java_options", lambda: archive)
    command = stream_job_command(settings, "rsvps", ())
    assert command[command.index("--driver-java-options") + 1] == "-XX:+UseSerialGC " + " ".join(archive)


def test_a_clusters_executors_and_daemons_map_the_class_data_archive_too(monkeypatch, tmp_path) -> None:
    """Each job's executors are new JVMs, and so are the standalone master and worker: all get the
    archive's options (executors through the session, the daemons through SPARK_DAEMON_JAVA_OPTS, after
    any the caller set). A local master has no executor JVM, and without an archive nothing is added."""
    archive = ["-XX:SharedArchiveFile=/venv/share/tidewater/class-data/spark-1.jsa", "-Xlog:cds=off"]
    cluster = Settings(spark_java_options="", spark_master="spark://127.0.0.1:7077")
    conf = session_conf(cluster, {}, class_data_options=archive)
    assert conf["spark.executor.extraJavaOptions"] == " ".join(archive)
    assert "spark.executor.extraJavaOptions" not in session_conf(cluster, {})
    assert "spark.executor.extraJavaOptions" not in session_conf(
        Settings(spark_java_options=""), {}, class_data_options=archive
    )

    standalone = StandaloneCluster(tmp_path, port=1, ui_port=2, worker_ui_port=3)
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", "-Xss4m")
    monkeypatch.setattr(class_data, "java_options", lambda: archive)
    assert standalone._env()["SPARK_DAEMON_JAVA_OPTS"] == "-Xss4m " + " ".join(archive)
    monkeypatch.setattr(class_data, "java_options", lambda: [])
    assert standalone._env()["SPARK_DAEMON_JAVA_OPTS"] == "-Xss4m"


def test_the_deployments_jvm_options_reach_every_driver_and_executor(monkeypatch) -> None:
    """``spark_java_options`` (e.g. no C2 compiler for short jobs) go to every driver however it starts
    (a session, the streaming job's and the operator's spark-submit), after the stream's own and before
    the archive's, and to a cluster's executors; a bad value is one line naming the variable."""
    archive = ["-XX:SharedArchiveFile=/venv/share/tidewater/class-data/spark-1.jsa", "-Xlog:cds=off"]
    settings = Settings(spark_java_options="-XX:TieredStopAtLevel=1", stream_java_options="-XX:+UseSerialGC")
    assert java_options_of(settings, archive) == ["-XX:TieredStopAtLevel=1", *archive]
    streaming = java_options_of(settings, archive, streaming=True)
    assert streaming == ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *archive]
    batch = session_conf(settings, {}, scratch="/s", class_data_options=archive)
    assert batch["spark.driver.extraJavaOptions"] == " ".join(
        ["-Djava.io.tmpdir=/s", "-XX:TieredStopAtLevel=1", *archive]
    )
    stream = session_conf(settings, {}, scratch="/s", streaming=True, class_data_options=archive)
    assert stream["spark.driver.extraJavaOptions"] == " ".join(["-Djava.io.tmpdir=/s", *streaming])
    assert "spark.executor.extraJavaOptions" not in batch  # a local master has no executor JVM
    cluster = settings.replace(spark_master="spark://127.0.0.1:7077")
    executors = session_conf(cluster, {}, class_data_options=archive)["spark.executor.extraJavaOptions"]
    assert executors == " ".join(["-XX:TieredStopAtLevel=1", *archive])
    assert "spark.executor.extraJavaOptions" not in session_conf(cluster.replace(spark_java_options=""), {})
    monkeypatch.setattr(class_data, "java_options", lambda: archive)
    command = stream_job_command(settings, "rsvps", ())
    assert command[command.index("--driver-java-options") + 1] == " ".join(streaming)
    with pytest.raises(ConfigError, match="TIDEWATER_SPARK_JAVA_OPTIONS='TieredStopAtLevel=1': must be JVM options"):
        Settings.from_env({"TIDEWATER_SPARK_JAVA_OPTIONS": "TieredStopAtLevel=1"})


def test_only_properties_that_yarns_or_mapreduces_defaults_alone_set_are_unread():
    def prop(name: str, *sources: str) -> str:
        sourced = "".join(f"<source>{source}</source>" for source in sources)
        return f"<property><name>{name}</name><value>v</value>{sourced}</property>"

    xml = (
        "<configuration>"
        + "".join(
            [
                prop("yarn.admin.acl", "yarn-default.xml"),
                prop("mapreduce.jobhistory.client.thread-count", "mapred-default.xml"),
                prop("fs.s3a.endpoint", "core-default.xml"),
                prop("mapreduce.fileoutputcommitter.algorithm.version", "mapred-default.xml", "programmatically"),
                prop("yarn.both", "yarn-default.xml", "mapred-default.xml"),
                prop("set.with.no.source"),
            ]
        )
        + "</configuration>"
    )
    assert unread_hadoop_defaults(xml) == ["yarn.admin.acl", "mapreduce.jobhistory.client.thread-count", "yarn.both"]


def test_the_streaming_jobs_spark_pages_live_off_the_heap_unless_set_to_zero():
    """Tungsten's pages of the streaming job off the JVM's heap (TIDEWATER_STREAM_OFF_HEAP_MEMORY, see
    Settings); batch jobs keep Spark's default, and "0" in any unit brings the stream's back on the heap."""
    streaming = session_conf(Settings(), {}, streaming=True)
    assert streaming["spark.memory.offHeap.enabled"] == "true"
    assert streaming["spark.memory.offHeap.size"] == Settings().stream_off_heap_memory == "256m"
    assert "spark.memory.offHeap.enabled" not in session_conf(Settings(), {})
    for zero in ("0", "0m", "0G"):
        assert "spark.memory.offHeap.enabled" not in session_conf(
            Settings(stream_off_heap_memory=zero), {}, streaming=True
        )
