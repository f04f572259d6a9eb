"""One typed settings object, read from the environment.

Every address, path, port and tuning knob lives here so that pointing the same code at a real
Kafka cluster, a MinIO bucket or a Spark cluster changes configuration only. Each field is read
from ``TIDEWATER_<FIELD_NAME_UPPER>``; S3 credentials use the standard ``AWS_*`` variables so
that delta-rs, pyarrow and boto-based tools all see the same ones.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidewater.errors import ConfigError

ENV_PREFIX = "TIDEWATER_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_CLIENTS = ("kafka-python", "confluent")
LOCK_BACKENDS = ("flock", "postgres")
AIRFLOW_EXECUTORS = ("local", "celery")
CONTINUOUS = "@continuous"  # Airflow's schedule: the next run starts as soon as the last one ends
SASL_MECHANISMS = ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
# A lake namespace is one plain path segment under the lake and checkpoint roots (``live``, a sandbox):
# never empty, ".", ".." or anything with "/". Every place that takes one checks it with
# check_namespace (or is_namespace), so the settings, the CLIs, the replay request, the SQL catalog
# and the UI accept the same names and refuse the rest with the same words.
NAMESPACE_PATTERN = r"[A-Za-z0-9_-]+"
NAMESPACE_RULE = "may hold only letters, digits, - and _"
SPARK_MASTER = r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?|local-cluster\[.+\]|spark://\S+|yarn|k8s://\S+|mesos://\S+"


def is_namespace(name: object) -> bool:
    """Whether ``name`` is a valid lake namespace (see NAMESPACE_PATTERN)."""
    return isinstance(name, str) and re.fullmatch(NAMESPACE_PATTERN, name) is not None


def check_namespace(name: str, what: str = "namespace") -> str:
    """``name`` if it is a valid lake namespace, else one ConfigError line; ``what`` is how the
    caller's input spells it (``--namespace``, ``sandbox_namespace``), so the person knows what to fix."""
    if not is_namespace(name):
        raise ConfigError(f"{what} {name!r} {NAMESPACE_RULE}")
    return name


def _default_state_dir() -> str:
    return str(Path.cwd() / ".state")


# ---- how each setting is checked ----------------------------------------------------------------
# Every field declares its check in its metadata (``setting(default, check)``), and
# Settings.validate runs all of them, so a new setting cannot skip validation; a unit test fails for
# a number without bounds. Each check returns what is wrong as "must be ..." text, or None.


class Check:
    def problem(self, value: Any) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Range(Check):
    """A number within bounds (ge/gt below, le/lt above); floats must be finite."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def problem(self, value: Any) -> str | None:
        if not math.isfinite(value):
            return f"must be a finite number {self.describe()}"
        if (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        ):
            return f"must be {self.describe()}"
        return None

    def describe(self) -> str:
        if self.ge is not None and self.le is not None:
            return f"from {_number(self.ge)} to {_number(self.le)}"
        bounds = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return " and ".join(f"{op} {_number(bound)}" for op, bound in bounds if bound is not None)

    @property
    def bounded(self) -> bool:
        return (self.ge is not None or self.gt is not None) and (self.le is not None or self.lt is not None)


@dataclass(frozen=True)
class OneOf(Check):
    choices: tuple[str, ...]

    def problem(self, value: Any) -> str | None:
        if value in self.choices:
            return None
        return "must be one of " + ", ".join("empty" if c == "" else c for c in self.choices)


@dataclass(frozen=True)
class Pattern(Check):
    """Text matching a regular expression (whole value); ``what`` says what that means."""

    regex: str
    what: str

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, str) and re.fullmatch(self.regex, value) else f"must be {self.what}"


# Both JVM-option settings take the same form.
JVM_OPTIONS = Pattern(r"\s*(-\S+(\s+-\S+)*)?\s*", "JVM options, each starting with '-' (e.g. -XX:+UseSerialGC)")


@dataclass(frozen=True)
class Namespace(Check):
    """A lake namespace (see :func:`check_namespace`): the same rule and words as everywhere else."""

    def problem(self, value: Any) -> str | None:
        return None if is_namespace(value) else NAMESPACE_RULE


@dataclass(frozen=True)
class Text(Check):
    """Free text (a path, a name, a secret); ``nonempty`` refuses "" and blanks."""

    nonempty: bool = False

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str) or "\0" in value or "\n" in value:
            return "must be one line of text"
        return "must not be empty" if self.nonempty and not value.strip() else None


@dataclass(frozen=True)
class Flag(Check):
    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else "must be true or false"


_JVM_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def jvm_bytes(value: Any) -> int | None:
    """A JVM memory size as -Xmx takes it (digits and an optional k/m/g/t, either case) in bytes; None
    when ``value`` is not one."""
    match = re.fullmatch(r"(\d+)([kKmMgGtT]?)", value) if isinstance(value, str) else None
    return None if match is None else int(match.group(1)) * _JVM_UNITS[match.group(2).lower()]


@dataclass(frozen=True)
class JvmMemory(Check):
    """A JVM memory size (:func:`jvm_bytes`) of at least ``minimum`` bytes."""

    minimum: int

    def problem(self, value: Any) -> str | None:
        size = jvm_bytes(value)
        if size is None:
            return "must be a JVM memory size such as 512m, 2g, 2G, 1048576k or plain bytes"
        if size < self.minimum:
            return f"must be at least {self.minimum >> 20}m, the smallest driver heap Spark starts with"
        return None


@dataclass(frozen=True)
class Schedule(Check):
    """A cron expression or an @preset, as Airflow takes it; ``continuous`` also admits @continuous (a
    new run as soon as the last one ends), which only a DAG whose runs wait for something can use."""

    continuous: bool = False

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str) and value.strip() and _valid_cron(value.strip()):
            return None
        if self.continuous and value == CONTINUOUS:
            return None
        extra = ", @continuous" if self.continuous else ""
        return f"must be a cron expression such as '*/15 * * * *' or a preset such as @hourly or @daily{extra}"


@dataclass(frozen=True)
class IsoTime(Check):
    """Empty, or an ISO-8601 date/time."""

    def problem(self, value: Any) -> str | None:
        if value == "":
            return None
        try:
            dt.datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return "must be empty or an ISO-8601 time such as 2026-11-21T10:00:00+00:00"
        return None


@dataclass(frozen=True)
class Servers(Check):
    """Empty, or ``host:port[,host:port]`` with ports 1..65535."""

    def problem(self, value: Any) -> str | None:
        if value == "":
            return None
        for server in str(value).split(","):
            match = re.fullmatch(r"(?:[A-Za-z_]+://)?(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+)(?::(\d+))?", server.strip())
            if match is None:
                return f"must be host:port[,host:port]; {server.strip()!r} is not"
            if match.group(2) is not None and not 1 <= int(match.group(2)) <= 65535:
                return f"must be host:port[,host:port] with ports 1 to 65535; {server.strip()!r} is not"
        return None


@dataclass(frozen=True)
class HttpUrl(Check):
    """Empty, or ``http(s)://host[:port][/path]`` with a port 1..65535."""

    def problem(self, value: Any) -> str | None:
        if value == "":
            return None
        parsed = urlparse(str(value))
        try:
            port = parsed.port
        except ValueError:
            port = -1
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1 or port == 0:
            return "must be empty or an http(s)://host[:port] URL with a port 1 to 65535"
        return None


@dataclass(frozen=True)
class ExistingFile(Check):
    """Empty, or the path of a readable file."""

    def problem(self, value: Any) -> str | None:
        if value == "" or (isinstance(value, str) and os.path.isfile(value) and os.access(value, os.R_OK)):
            return None
        return "must be empty or the path of a readable file (no such file here)"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _valid_cron(expression: str) -> bool:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - croniter comes with Airflow; a rough check without it
        return expression.startswith("@") or len(expression.split()) in (5, 6)
    return bool(croniter.is_valid(expression))


CHECK = "check"


def setting(default: Any = dataclasses.MISSING, check: Check | None = None, *, factory: Any = None) -> Any:
    """A settings field with its check (see :meth:`Settings.validate`)."""
    if factory is not None:
        return field(default_factory=factory, metadata={CHECK: check})
    return field(default=default, metadata={CHECK: check})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Platform configuration. Build with :meth:`from_env`; override with :meth:`replace`."""

    # Local state: embedded broker logs, generated passwords, leases, default lake and checkpoints.
    state_dir: str = setting(check=Text(nonempty=True), factory=_default_state_dir)

    # Kafka. Empty bootstrap servers means "the embedded broker", which the platform starts.
    kafka_bootstrap_servers: str = setting("", Servers())
    kafka_security_protocol: str = setting("PLAINTEXT", OneOf(SECURITY_PROTOCOLS))
    kafka_sasl_mechanism: str = setting("", OneOf(SASL_MECHANISMS))
    kafka_sasl_username: str = setting("", Text())
    kafka_sasl_password: str = setting("", Text())
    kafka_ssl_cafile: str = setting("", ExistingFile())
    # Reader backend of the Spark Kafka source: confluent | kafka-python.
    kafka_client: str = setting("confluent", OneOf(KAFKA_CLIENTS))
    kafka_request_timeout_ms: int = setting(15000, Range(ge=100, le=600_000))
    kafka_topic_partitions: int = setting(4, Range(ge=1, le=100_000))
    # Prepended to every pipeline's topic (shared clusters, tests).
    kafka_topic_prefix: str = setting("", Pattern(r"[A-Za-z0-9._-]{0,200}", "letters, digits, '.', '_' and '-' only"))
    embedded_broker_port: int = setting(0, Range(ge=0, le=65535))  # 0 = pick a free port

    # Pipelines declared outside tidewater.pipelines: comma-separated module names (importable) or
    # paths of .py files, each defining PIPELINE. Children (spark-submit jobs, Airflow) inherit it.
    pipeline_modules: str = setting(
        "", Pattern(r"(\s*[\w./-]+\s*(,\s*[\w./-]+\s*)*)?", "comma-separated module names or .py file paths")
    )
    # Which declared pipelines this deployment runs (streams, DAGs, generator, catalog): comma-separated
    # names; empty: every one declared.
    pipelines: str = setting("", Pattern(r"(\s*[\w-]+\s*(,\s*[\w-]+\s*)*)?", "comma-separated pipeline names"))

    # Lake: file:///abs/path or s3://bucket/prefix. Empty means <state_dir>/lake.
    lake_root: str = setting("", Text())
    # Sandbox replays write to another namespace.
    namespace: str = setting("live", Namespace())
    s3_endpoint_url: str = setting("", HttpUrl())  # MinIO / moto; empty for AWS
    s3_region: str = setting("us-east-1", Text(nonempty=True))
    s3_allow_http: bool = setting(False, Flag())

    # Spark.
    # A local or shared (Hadoop) path; empty means <state_dir>/checkpoints.
    checkpoint_root: str = setting("", Text())
    spark_master: str = setting(
        "local[2]", Pattern(SPARK_MASTER, "local, local[N], local[*], spark://host:port, yarn or k8s://...")
    )
    spark_driver_memory: str = setting("2g", JvmMemory(minimum=450 << 20))
    # The streaming job's heap. It holds one micro-batch (at most max_offsets_per_trigger records) and
    # keeps its state in RocksDB, off the heap; batch jobs hold whole intervals (spark_driver_memory).
    # Measured (rsvps, 100k batches): 2g -> 1g took the draining job from 5.8 to 4.1 GB RSS, same rate.
    stream_driver_memory: str = setting("1g", JvmMemory(minimum=450 << 20))
    # The streaming job's JVM options. The serial collector: one GC thread, no concurrent marking beside
    # the queries' tasks on a 2-core host. Measured against G1, rsvps at 2,000 events/s: PSS 1.86 against
    # 2.02 GB, silver p95 1.82 against 1.87 s; ads 2.37 against 2.67 GB; draining within the runs' spread.
    # A heap of several GB pauses longer with it: -XX:+UseParallelGC there.
    # A heap that starts small (the JVM's default is 1/64 of the host's memory, 378 MiB on 24 GB, and it
    # never shrinks below that) and free ratios that give memory back after a full collection: rsvps at
    # 1,000 events/s held 1.47-1.48 GB PSS once running against 1.60-1.62 GB (README).
    # A 128 MiB young generation (32 MiB until the twenty-fifth stop). A 200k-record micro-batch's rows
    # pass through this heap on their way to Python and outlived a 32 MiB one: copied to the old
    # generation, they filled it, and rsvps' drain ran a full collection every ~0.7 s and stood paused
    # 35% of the time (JFR: bench --jvm-profile). Draining 2M, 39,391-39,921 against 32,559-33,398
    # events/s, PSS 2.43-2.46 against 2.32-2.41 GB; pageviews at 2,000 events/s 1.47 GB PSS. Without the
    # free ratios it drained 43-44k events/s but held 1.53 GB there (README, twenty-fifth stop).
    stream_java_options: str = setting(
        "-XX:+UseSerialGC -Xms64m -Xmn128m -XX:MinHeapFreeRatio=20 -XX:MaxHeapFreeRatio=40",
        JVM_OPTIONS,
    )
    # Spark's own memory pages in the streaming job (Tungsten's execution memory: the hash maps of
    # aggregations, sorts, shuffle buffers) live off the JVM's heap, up to this much ("0": on the heap,
    # Spark's default). On the heap they are long[] pages that outlive the young generation: a draining
    # vending job held 48-136 MiB of them at a full collection, and the serial collector's heap grows
    # to what a collection leaves plus its free ratio and keeps it. Off the heap a page is freed when
    # its task gives it back. Above that size a task spills to disk, as it would on the heap.
    stream_off_heap_memory: str = setting("256m", JvmMemory(minimum=0))
    # JVM options of every Spark JVM a tidewater job starts: each driver (batch, audit, stream; after the
    # stream's own) and, on a cluster master, its executors. None by default. -XX:TieredStopAtLevel=1
    # (no C2 compiler) suits JVMs that live seconds to a minute, where C2's compilations cost more CPU
    # than they return: the test suite's jobs run with it (README). A JVM that lives long keeps C2.
    spark_java_options: str = setting("", JVM_OPTIONS)
    # On a local master, the streaming job's task slots beyond the master's cores (batch jobs keep the
    # master's). Each source query's micro-batch wants a slot every trigger, and a gold query holds one
    # for its whole micro-batch, often seconds: with every slot taken, a source's micro-batch queued for
    # one although the FAIR pools favour it. A slot more lets the OS share the cores instead. "auto": at
    # least one slot more than the job's source queries (a pipeline of two sources on local[2] -> local[3]).
    # Measured at 2,000 events/s, local[2] -> local[3]: vending (2 sources, 3 gold queries) silver p95
    # 3.47 -> 2.32 s, PSS +0.2 GB; ads (2 sources, 2 gold) 2.99 -> 2.3 s, +0.1 GB; rsvps (1 source,
    # 2 gold) 1.71 -> 1.68 s, +0.11 GB: no gain, so auto leaves it on local[2].
    stream_extra_task_slots: str = setting(
        "auto", Pattern(r"auto|[0-9]|[1-5][0-9]|6[0-4]", "auto, or a number of task slots from 0 to 64")
    )
    # On a cluster master only (spark://, yarn, k8s): each job's share. One core per job lets one worker
    # run every stream and batch job side by side (a job takes all free cores by default).
    spark_cores_max: int = setting(1, Range(ge=1, le=100_000))
    spark_executor_memory: str = setting("1g", JvmMemory(minimum=450 << 20))
    spark_shuffle_partitions: int = setting(2, Range(ge=1, le=100_000))
    # A new gold query's state partitions (kept by its checkpoint for good: an existing query keeps its
    # own). Gold state is small (windows x keys): one partition took a gold trigger from 466 to ~370 ms
    # (rsvps, 10k rows) and leaves the second core of a 2-core host to the source's micro-batch.
    gold_shuffle_partitions: int = setting(1, Range(ge=1, le=100_000))
    trigger_seconds: float = setting(1.0, Range(gt=0, le=86_400))
    # Gold MERGEs less often: fewer small commits, more CPU for silver.
    gold_trigger_seconds: float = setting(5.0, Range(gt=0, le=86_400))
    # Keys the streaming de-duplication's in-memory index of silver holds (12 bytes each; see
    # tidewater.lake.key_index): past it the oldest silver files are scanned at every micro-batch.
    dedup_index_max_keys: int = setting(8_000_000, Range(ge=0, le=10**10))
    # Every this many commits of a table, a stream writer compacts its partitions holding at least as many
    # files below stream_compaction_target_bytes (tidewater.lake.compaction); 0: only the maintenance DAG
    # compacts. A 1 s trigger adds 86,400 files a day per table, and every commit and read pays for them
    # (benchmarks/bench_commits.py).
    stream_compaction_files: int = setting(100, Range(ge=0, le=1_000_000))
    stream_compaction_target_bytes: int = setting(16 << 20, Range(ge=1 << 20, le=1 << 40))
    # False: the bronze query also writes silver from the same micro-batch (lower latency).
    # True: silver is a query of its own that polls the bronze table (decoupled tiers).
    silver_query: bool = setting(False, Flag())
    # True: a gold query over one silver reads each micro-batch ahead on the driver (the Delta source's
    # prefetch): lower latency at a steady rate, less throughput draining a backlog (rsvps, 2 cores:
    # silver p95 1.88 s against ~2.0 s at 2,000 events/s; 18,904 against 25,581 events/s draining).
    gold_prefetch: bool = setting(False, Flag())
    # Stop Spark's Python workers that only start data-source queries (source lookup, creation, read
    # planning) once every query has started and planned its reads, instead of Spark's fixed 60 s idle
    # timeout (their daemons Spark keeps for good); a later query start makes Spark start them again.
    # See tidewater.streaming.startup_workers.
    release_startup_workers: bool = setting(True, Flag())
    # True: a pipeline's gold tables emitted in append mode over the same inputs share one query, which
    # reads each input's silver once (see tidewater.pipelines.base.Pipeline.gold_queries). False: a
    # query per gold table. Changing it starts the gold queries it regroups from new checkpoints.
    gold_shared_queries: bool = setting(True, Flag())
    max_offsets_per_trigger: int = setting(200_000, Range(ge=1, le=2**31 - 1))
    # Silver rows a gold micro-batch reads at most (the Delta source's maxRowsPerTrigger, a soft bound), so
    # a gold query catching up on a backlog holds a slice of it at a time in its sort and state calls.
    # Above a drain's gold micro-batches: bounding vending's at 200,000 left its drain's peak where it was
    # and cost 2-5% of its rate (3 interleaved pairs, 2026-12-01).
    gold_max_rows_per_trigger: int = setting(1_000_000, Range(ge=1, le=2**31 - 1))

    # Coordination of writers to one live table (see tidewater.lake.locks).
    table_lock_timeout_seconds: float = setting(900.0, Range(ge=0, le=7 * 86_400))
    # flock: one host (a flock holds on one mount of one machine only); postgres: session advisory locks
    # on TIDEWATER_POSTGRES_DSN, which hold across hosts (see tidewater.lake.pg_locks).
    lock_backend: str = setting("flock", OneOf(LOCK_BACKENDS))
    postgres_dsn: str = setting("", Text())  # libpq, e.g. "host=127.0.0.1 port=5432 user=tidewater dbname=tidewater"

    # Stream supervision (see tidewater.orchestration.supervisor).
    # Alive but no heartbeat for this long: stalled, restart it.
    stream_stall_seconds: float = setting(300.0, Range(gt=0, le=7 * 86_400))
    # A launched driver may take this long to claim its checkpoint.
    stream_startup_seconds: float = setting(240.0, Range(gt=0, le=86_400))
    # > 0: streaming jobs start their queries one at a time on a host (tidewater.streaming.start_gate); a
    # job holds the gate at most this long, one waiting skips a holder stuck past twice it. Off (0) by
    # default: on the platform's slow-day start a job alone still missed Spark's connect-back window.
    stream_start_gate_seconds: float = setting(0.0, Range(ge=0, le=86_400))
    stream_stop_timeout_seconds: float = setting(60.0, Range(ge=0, le=86_400))  # graceful stop, then SIGKILL
    # Restarts of a stream dying on every start without a batch; then failed.
    stream_max_restarts: int = setting(3, Range(ge=0, le=1000))
    # True: one streaming job (the stream host: one JVM, one Python driver and worker pool) runs every
    # supervised pipeline's queries, each pipeline still started, stopped and restarted by its own
    # supervisor (tidewater.streaming.host); a kill or an out-of-memory of the host ends every pipeline at
    # once, and each is restarted from its checkpoints. False: a Spark job per pipeline (~1.1-1.5 GB PSS
    # each on 2 cores; the cluster profile's choice). Five pipelines on 2 cores (./tw bench platform, 3
    # runs): 3,704-3,840 MiB PSS with Airflow, every source's silver rows after 87-112 s; 9,252 MiB and
    # 309 s with a job per pipeline.
    stream_host: bool = setting(True, Flag())

    # Airflow (the embedded default: SQLite + LocalExecutor, components as separate processes).
    airflow_port: int = setting(8080, Range(ge=1, le=65535))
    airflow_parallelism: int = setting(4, Range(ge=1, le=1024))
    # Airflow's metadata database (SQLAlchemy URL); empty: SQLite under <state_dir>/airflow, which
    # serialises every write (the cluster profile sets a PostgreSQL one).
    airflow_database_url: str = setting(
        "",
        Pattern(
            r"(sqlite:///\S+|postgresql(\+\w+)?://\S+|mysql(\+\w+)?://\S+)?",
            "empty, sqlite:///PATH or postgresql://...",
        ),
    )
    # "local": tasks run as children of the scheduler (one host). "celery": the scheduler queues them on
    # a Redis broker for `airflow celery worker`s, on this host or others (the cluster profile's option).
    airflow_executor: str = setting("local", OneOf(AIRFLOW_EXECUTORS))
    celery_broker_url: str = setting("", Pattern(r"(redis://\S+)?", "empty or redis://HOST:PORT/DB"))
    # @continuous: one run at a time, whose tasks watch the streams from the triggerer and end when
    # one needs a hand (or after supervise_watch_seconds); a cron schedule: one check per run.
    supervise_schedule: str = setting(CONTINUOUS, Schedule(continuous=True))
    supervise_watch_seconds: float = setting(3600.0, Range(ge=1, le=86_400))
    supervise_poll_seconds: float = setting(5.0, Range(ge=0.1, le=3600))
    batch_schedule: str = setting("@hourly", Schedule())
    # First data interval of the scheduled batch DAGs (ISO-8601). Empty: the DAGs start paused at a
    # fixed date; the platform command sets it to the hour it first ran.
    batch_start_date: str = setting("", IsoTime())
    batch_max_active_runs: int = setting(2, Range(ge=1, le=100))  # backfills cannot starve the schedule
    # A scheduled interval is recomputed this long after it ends (deferred in the triggerer, no worker
    # slot), so its events have reached silver and its windows are behind the stream's watermark.
    batch_settle_minutes: float = setting(5.0, Range(ge=0, le=24 * 60))
    correction_schedule: str = setting("*/15 * * * *", Schedule())
    correction_lookback_hours: float = setting(6.0, Range(gt=0, le=24 * 366))
    maintenance_schedule: str = setting("@daily", Schedule())
    vacuum_retention_hours: int = setting(168, Range(ge=0, le=24 * 3660))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every field from ``TIDEWATER_*`` variables, then apply ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f, raw)
        values.update(overrides)
        settings = cls(**values)
        settings.validate(env)
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The variables that recreate these settings in a child process (spark-submit, executors)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[ENV_PREFIX + f.name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    # ---- derived values -------------------------------------------------------------------------

    @property
    def lake_uri(self) -> str:
        """The lake root as a URI with no trailing slash."""
        root = self.lake_root or Path(self.state_dir, "lake").as_uri()
        if "://" not in root:
            root = Path(root).absolute().as_uri()
        return root.rstrip("/")

    @property
    def lake_is_s3(self) -> bool:
        return self.lake_uri.startswith(("s3://", "s3a://"))

    @property
    def checkpoint_dir(self) -> Path:
        root = self.checkpoint_root or str(Path(self.state_dir, "checkpoints"))
        if root.startswith("file://"):
            root = urlparse(root).path
        return Path(root).absolute()

    @property
    def airflow_home(self) -> Path:
        return Path(self.state_dir, "airflow").absolute()

    def storage_options(self) -> dict[str, str]:
        """Options for delta-rs (object_store) for the lake root; empty for the local file system."""
        return self.s3_storage_options() if self.lake_is_s3 else {}

    def s3_storage_options(self) -> dict[str, str]:
        """delta-rs options for any s3:// URI: region, endpoint, credentials from AWS_*."""
        opts = {
            "AWS_REGION": self.s3_region,
            # Safe concurrent commits on S3-compatible stores that lack atomic rename (MinIO).
            "aws_conditional_put": "etag",
        }
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            if os.environ.get(key):
                opts[key] = os.environ[key]
        if self.s3_endpoint_url:
            opts["AWS_ENDPOINT_URL"] = self.s3_endpoint_url
        if self.s3_allow_http or self.s3_endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
        return opts

    def topic(self, name: str) -> str:
        return f"{self.kafka_topic_prefix}{name}"

    # ---- validation -----------------------------------------------------------------------------

    def validate(self, environ: Mapping[str, str] | None = None) -> None:
        """Every field against its declared type and check, then the rules that span fields; the first
        problem is raised as a one-line ConfigError naming the variable and what it must be."""
        env = os.environ if environ is None else environ
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            check = f.metadata.get(CHECK)
            problem = _type_problem(_kind(f.type), value, check)
            if problem is None and check is not None:
                problem = check.problem(value)
            if problem is not None:
                raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}={value!r}: {problem}{_default_hint(f)}")
        if self.kafka_security_protocol.startswith("SASL") and not (
            self.kafka_sasl_mechanism and self.kafka_sasl_username
        ):
            raise ConfigError(
                f"TIDEWATER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol!r}: SASL needs "
                "TIDEWATER_KAFKA_SASL_MECHANISM, TIDEWATER_KAFKA_SASL_USERNAME and TIDEWATER_KAFKA_SASL_PASSWORD; "
                "set them, or use PLAINTEXT or SSL"
            )
        scheme = urlparse(self.lake_uri).scheme
        if scheme not in ("file", "s3", "s3a"):
            raise ConfigError(
                f"TIDEWATER_LAKE_ROOT={self.lake_root!r}: must be file:///absolute/path or s3://bucket/prefix"
            )
        if self.lake_is_s3 and not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
            raise ConfigError(
                f"TIDEWATER_LAKE_ROOT={self.lake_root!r}: the lake is on S3 but no credentials are set; export "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and TIDEWATER_S3_ENDPOINT_URL for MinIO)"
            )
        if self.lock_backend == "postgres" and not self.postgres_dsn.strip():
            raise ConfigError(
                "TIDEWATER_LOCK_BACKEND='postgres' needs TIDEWATER_POSTGRES_DSN (e.g. 'host=127.0.0.1 port=5432 "
                "user=tidewater dbname=tidewater'); set it, or use the flock backend on one host"
            )
        if "://" in self.checkpoint_root and not self.checkpoint_root.startswith("file://"):
            raise ConfigError(
                f"TIDEWATER_CHECKPOINT_ROOT={self.checkpoint_root!r}: Spark checkpoints need a local or "
                "shared file-system path, not object storage"
            )


def _kind(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _type_problem(kind: str, value: Any, check: Check | None) -> str | None:
    """The value against the field's declared type (overrides and direct construction are not parsed)."""
    wanted = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}.get(kind)
    if wanted is None or (isinstance(value, wanted) and (kind == "bool" or not isinstance(value, bool))):
        return None
    return _expected(kind, check)


def _expected(kind: str, check: Check | None) -> str:
    if kind in ("int", "float"):
        noun = "a whole number" if kind == "int" else "a number"
        return f"must be {noun} {check.describe()}" if isinstance(check, Range) else f"must be {noun}"
    if kind == "bool":
        return "must be true or false (also 1/0, yes/no, on/off)"
    return f"must be a {kind}"


def _default_hint(f: dataclasses.Field[Any]) -> str:
    if f.default is dataclasses.MISSING:
        return "; fix it or unset it for the default"
    default = f.default
    shown = str(default).lower() if isinstance(default, bool) else ("empty" if default == "" else repr(default))
    return f"; fix it or unset it for the default ({shown})"


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = _kind(f.type)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
    except ValueError:
        problem = _expected(kind, f.metadata.get(CHECK))
        raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}={raw!r}: {problem}{_default_hint(f)}") from None
    return raw
