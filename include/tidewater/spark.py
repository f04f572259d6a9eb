"""The SparkSession every tidewater job uses, built from :class:`~tidewater.config.Settings`.

Local by default (``local[2]``), bound to 127.0.0.1, UTC session time zone (event times are
UTC end to end), RocksDB state store (state that survives restarts without holding it all on the
JVM heap), and the tidewater data sources registered.
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence

from pyspark.sql import SparkSession

from tidewater import class_data
from tidewater.config import Settings, jvm_bytes
from tidewater.processes import scratch_dir, spark_child_env

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# The streaming job's scheduler pools. Its queries share the cores; under Spark's default FIFO a gold
# query's job, submitted first, holds every slot until its tasks end, and a source's micro-batch (the
# silver latency users see) waits behind it. A pool below its minShare is served first, so a source's
# task takes the next free slot; gold takes the rest.
SOURCES_POOL = "sources"
GOLD_POOL = "gold"
SCHEDULER_POOLS_XML = f"""<?xml version="1.0"?>
<allocations>
  <pool name="{SOURCES_POOL}"><schedulingMode>FIFO</schedulingMode><weight>4</weight><minShare>2</minShare></pool>
  <pool name="{GOLD_POOL}"><schedulingMode>FAIR</schedulingMode><weight>1</weight><minShare>0</minShare></pool>
</allocations>
"""

log = logging.getLogger(__name__)


def prepare_environment(settings: Settings) -> None:
    """Environment the JVM and Python workers inherit: the venv interpreter, loopback, our settings."""
    os.environ.update(spark_child_env())
    os.environ.update(settings.to_env())


# What executors on other hosts need from the driver's environment to reach the same lake and broker.
FORWARDED_TO_EXECUTORS = (
    "PYSPARK_PYTHON",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
)


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


_LOCAL_SLOTS = re.compile(r"local(?:\[(\*|\d+)(,\s*\d+)?\])?")


def stream_master(settings: Settings, source_queries: int) -> str:
    """A streaming job's master: on ``local``, ``local[N]`` or ``local[*]``, that many task slots plus
    ``stream_extra_task_slots`` (auto: at least one more than the job's ``source_queries``; see the
    setting); any other master as it is."""
    match = _LOCAL_SLOTS.fullmatch(settings.spark_master)
    if match is None:
        return settings.spark_master
    cores = match.group(1) or "1"
    slots = (os.cpu_count() or 1) if cores == "*" else int(cores)
    wanted = settings.stream_extra_task_slots
    extra = max(0, source_queries + 1 - slots) if wanted == "auto" else int(wanted)
    return f"local[{slots + extra}{match.group(2) or ''}]" if extra else settings.spark_master


def executor_env(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment an executor on another host needs: every tidewater setting and the S3
    endpoint and credentials. On ``local[N]`` executors are threads of the driver and share its
    environment; a standalone cluster's executors are started by their worker and inherit nothing, so
    an s3:// write would otherwise go to the public AWS endpoint."""
    current = os.environ if environ is None else environ
    forwarded = {name: current[name] for name in FORWARDED_TO_EXECUTORS if current.get(name)}
    if settings.s3_endpoint_url:
        forwarded.setdefault("AWS_ENDPOINT_URL", settings.s3_endpoint_url)
    forwarded.setdefault("AWS_REGION", settings.s3_region)
    return {**forwarded, **settings.to_env()}


# Checkpoints (offsets, commits, state) on the local file system with fewer processes per file. Without
# Hadoop's native library (pip's PySpark has none), the default manager's FileContext ran `readlink` for
# each rename's link status: ads at 300 events/s started 15 processes a second (JFR; ~190 of the 918 in
# 60 s were the checksummed file system's `chmod` of each file it creates, which stays), and a
# checkpoint write took ~200 ms. The FileSystem-based manager renames with File.renameTo.
# Not Hadoop's raw local file system for file: paths, though it would spare the chmod too: RocksDB
# uploads each state snapshot with FileSystem.copyFromLocalFile, which casts FileSystem.getLocal to
# the checksummed LocalFileSystem. With the raw one every upload failed, and a commit that had to
# upload one ended its query: ads' CTR at its 121st micro-batch, ten minutes in (2026-11-29;
# tests/integration/test_state_snapshots.py).
CHECKPOINT_FILE_MANAGER = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


# Stream-stream joins keep their state in Spark's format 4, indexed by event time, so a micro-batch
# evicts only the rows the watermark passed. Formats 2 and 3 scan all of a join's state on every
# micro-batch: ads' join of impressions and clicks (state held 12 minutes, and an hour for orphan
# clicks) went from 3.4 s a trigger at 1 minute to 20.8 s at 14.5 (3.27M rows), and fell behind. On
# format 4 the same bench held 3-4 s to the 12th minute, when its eviction begins (2026-11-29, README;
# benchmarks/bench_join_state.py measures the two formats apart).
# Spark 4.2 still gates format 4 behind its own flag ("under development"). A checkpoint keeps the
# format it was started with (Spark restores it from the offset log), so older checkpoints go on in
# theirs; the flag must stay on while any checkpoint of format 4 exists.
JOIN_STATE_FORMAT_KEY = "spark.sql.streaming.join.stateFormatVersion"
JOIN_STATE_FORMAT = {
    "spark.sql.streaming.join.stateFormatV4.enabled": "true",
    JOIN_STATE_FORMAT_KEY: "4",
}


# Compiled classes Spark keeps (its default: 100). A stream generates code for every micro-batch, and
# each gold watermark is written into the code as a literal, so every trigger adds classes that are
# never used again. Spark's cache is a Guava LRU in four segments of 25: those one-off classes evicted
# the ones every batch reuses, and the same code was compiled again (ads: 373 compiles, 24 s of Janino
# in a 60 s latency run with its start-up), then compiled again by the JIT. With 1,000: 176 compiles,
# and the job's PSS did not move (1.56 GB, three runs each way).
CODEGEN_CACHE_ENTRIES = 1000


# A task's result up to this size goes back to the driver as it is. Above Spark's default (1 MiB) the
# executor stores it as a block and the driver fetches it through its block-transfer service, in local
# mode too: two more copies of every micro-batch's rows on the JVM's heap on their way to Python
# (ads' drain: 0.8 of 25 GiB allocated, JFR), and the stored copy held until fetched. Spark caps it at
# spark.rpc.message.maxSize (128 MiB by default), above which results still go through the block manager.
# rsvps draining 2M records, 4 interleaved pairs (2026-12-01): PSS 2.27-2.40 GB against 2.43-2.74 GB
# (summed RSS 2.77-2.86 against 2.97-3.31), the rate the same (43,210-44,751 against 39,948-45,347/s).
DIRECT_RESULT_SIZE = "128m"


def session_conf(
    settings: Settings,
    environ: Mapping[str, str] | None = None,
    *,
    scratch: str | None = None,
    streaming: bool = False,
    class_data_options: Sequence[str] = (),
) -> dict[str, str]:
    """Every Spark setting of a tidewater session (pure: tested without a JVM).

    ``scratch`` is the driver's temporary folder (see :func:`tidewater.processes.scratch_dir`);
    ``streaming``: the streaming job's session, whose heap is ``stream_driver_memory``;
    ``class_data_options``: the JVM options that map the class-data archive (:mod:`tidewater.class_data`),
    given to the driver and, on a cluster, to the executors."""
    conf = {
        "spark.driver.memory": settings.stream_driver_memory if streaming else settings.spark_driver_memory,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "false",  # small batches: planning cost beats AQE gains
        # Constraint propagation only infers filters (no result depends on it). On the parse's plans,
        # wide projections of aliases and CASE WHENs, a cold JVM spent 5-7 s of a batch job in
        # Project.getAllValidConstraints before its first job ran (a 600-row recompute: silver 10.7-11.9
        # s against 4.9-5.8 s without it), and a stream re-plans the parse every micro-batch (ads at
        # 1k/s: its read and parse 1.2-1.4 s against 0.9-1.0 s per trigger).
        "spark.sql.constraintPropagation.enabled": "false",
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        "spark.task.maxDirectResultSize": DIRECT_RESULT_SIZE,
        # Reused workers idle in the pool for a minute are ended by Spark itself (PythonWorkerFactory).
        # Not spark.python.worker.killOnIdleTimeout: it kills a *busy* worker that sent nothing for the
        # timeout, which ended a state processor folding a 400k-record micro-batch (bench, payments).
        "spark.python.worker.reuse": "true",
        # Spark keeps a pool of Python workers (and a daemon) per distinct environment. Its UDFs', Arrow
        # maps' and Python data sources' workers get SPARK_SIMPLIFIED_TRACEBACK=1, transformWithState's
        # do not, so a job with a state machine ran two pools of task workers, each as large as its task
        # slots (vending at 2,000 events/s: six on local[3], 528 MiB PSS; one pool: three, 307 MiB, and
        # the job's PSS 1.62 GB against 1.84-1.86). Every Python function's environment holds it now.
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
    } | JOIN_STATE_FORMAT
    # Applies where the session starts the JVM; spark-submit gets them from stream_job_command and the operator.
    java_options = [f"-Djava.io.tmpdir={scratch}"] if scratch else []
    java_options += java_options_of(settings, class_data_options, streaming=streaming)
    if java_options:
        conf["spark.driver.extraJavaOptions"] = " ".join(java_options)
    if streaming:
        conf |= CHECKPOINT_FILE_MANAGER
        if jvm_bytes(settings.stream_off_heap_memory):
            conf |= {
                "spark.memory.offHeap.enabled": "true",
                "spark.memory.offHeap.size": settings.stream_off_heap_memory,
            }
    if scratch:
        conf["spark.local.dir"] = scratch
        if streaming:
            conf |= {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": scheduler_pools_file(scratch)}
    if not is_local_master(settings.spark_master):
        conf |= {
            "spark.cores.max": str(settings.spark_cores_max),
            "spark.executor.cores": str(settings.spark_cores_max),
            "spark.executor.memory": settings.spark_executor_memory,
        }
        # Each job's executors are new JVMs: they map the archive too (~2.3 s off each application's
        # first jobs on the standalone master). A node without the file runs them as without it.
        if executor_options := java_options_of(settings, class_data_options):  # those of a batch driver
            conf["spark.executor.extraJavaOptions"] = " ".join(executor_options)
        # Secrets among them are redacted wherever Spark shows its conf (spark.redaction.regex).
        conf |= {f"spark.executorEnv.{name}": value for name, value in executor_env(settings, environ).items()}
    return conf


def java_options_of(settings: Settings, class_data_options: Sequence[str], *, streaming: bool = False) -> list[str]:
    """A job JVM's options, however it starts (a session, spark-submit; executors take a batch driver's):
    the streaming job's own (``stream_java_options``), then the deployment's (``spark_java_options``),
    then the class-data archive's (:func:`tidewater.class_data.java_options`)."""
    own = settings.stream_java_options.split() if streaming else []
    return [*own, *settings.spark_java_options.split(), *class_data_options]


def scheduler_pools_file(scratch: str) -> str:
    return os.path.join(scratch, "scheduler-pools.xml")


def build_session(
    settings: Settings, app_name: str = "tidewater", *, streaming: bool = False, master: str | None = None
) -> SparkSession:
    """A tidewater session on ``master`` (default: ``TIDEWATER_SPARK_MASTER``; a streaming job's is
    :func:`stream_master`)."""
    prepare_environment(settings)
    builder = SparkSession.builder.master(master or settings.spark_master).appName(app_name)
    scratch = scratch_dir(os.path.join(settings.state_dir, "scratch"))
    if streaming:
        with open(scheduler_pools_file(scratch), "w", encoding="utf-8") as handle:
            handle.write(SCHEDULER_POOLS_XML)
    conf = session_conf(settings, scratch=scratch, streaming=streaming, class_data_options=class_data.java_options())
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if streaming:
        drop_unread_hadoop_defaults(spark)
    register_data_sources(spark)
    if streaming and is_local_master(spark.sparkContext.master):
        start_runner_forkserver(spark)
    return spark


def start_runner_forkserver(spark: SparkSession) -> None:
    """The fork server of this driver's streaming-source runners (:mod:`tidewater.runner_forkserver`)."""
    from tidewater import runner_forkserver

    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined]
    if runner_forkserver.start(jvm_pid) is None and not runner_forkserver.switched_off(os.environ):
        log.warning("the streaming-source runners' fork server did not start: each runner imports on its own")


# Hadoop files of defaults that only YARN and MapReduce read. Hadoop loads every default file that a
# class it loaded registered, so a Spark driver holds their 721 properties beside core-default.xml's
# 376 (1,103 in all), and Spark broadcasts that whole configuration again and again while it plans a
# stream: every build of a stream-stream join's plan node broadcasts it (a query of two joins: 21
# broadcasts a micro-batch), each property gzipped on its own.
YARN_AND_MAPREDUCE_DEFAULTS = frozenset({"yarn-default.xml", "mapred-default.xml"})


def unread_hadoop_defaults(configuration_xml: str) -> list[str]:
    """The properties of a Hadoop configuration (as ``Configuration.writeXml`` writes it) that come
    from YARN's and MapReduce's default files alone: set nowhere else, read by nothing a tidewater job
    runs (local or Spark standalone, Delta through delta-rs, checkpoints through the file systems of
    core-default.xml)."""
    names = []
    for prop in ET.fromstring(configuration_xml).iter("property"):
        sources = {source.text for source in prop.iter("source")}
        if sources and sources <= YARN_AND_MAPREDUCE_DEFAULTS:
            names.append(prop.findtext("name"))
    return names


def drop_unread_hadoop_defaults(spark: SparkSession) -> int:
    """Unset :func:`unread_hadoop_defaults` in the driver's Hadoop configuration; returns how many.

    For the streaming session, which plans every micro-batch: its join queries broadcast a
    configuration of 420 properties instead of 1,141. ads at 1,000 events/s (2026-11-30, two pairs):
    its join query planned in 713-785 ms instead of 1,207-1,414 a micro-batch, silver p95 3.8-4.1 s
    instead of 5.9-8.7. ~0.4 s once, at the job's start, which a batch job (it plans once) would not
    win back."""
    configuration = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    names = unread_hadoop_defaults(hadoop_configuration_xml(spark))
    for name in names:
        configuration.unset(name)
    return len(names)


def hadoop_configuration_xml(spark: SparkSession) -> str:
    """The driver's Hadoop configuration as ``Configuration.writeXml`` writes it: each property with
    its value (secrets redacted) and the sources that set it. One py4j call for all of them."""
    writer = spark.sparkContext._jvm.java.io.StringWriter()  # type: ignore[union-attr]
    spark.sparkContext._jsc.hadoopConfiguration().writeXml(writer)  # type: ignore[union-attr]
    return writer.toString()


def register_data_sources(spark: SparkSession) -> None:
    from tidewater.connectors.delta import DeltaDataSource
    from tidewater.connectors.kafka_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(DeltaDataSource)
