"""One typed settings object, read from the environment.

Every address, path, port and tuning knob lives here so that pointing the same code at a real
Kafka cluster, a MinIO bucket or a Spark cluster changes configuration only. Each field is read
from ``TIDEWATER_<FIELD_NAME_UPPER>``; S3 credentials use the standard ``AWS_*`` variables so
that delta-rs, pyarrow and boto-based tools all see the same ones.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tidewater.errors import ConfigError

ENV_PREFIX = "TIDEWATER_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_CLIENTS = ("kafka-python", "confluent")


def _default_state_dir() -> str:
    return str(Path.cwd() / ".state")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Platform configuration. Build with :meth:`from_env`; override with :meth:`replace`."""

    # Local state: embedded broker logs, generated passwords, leases, default lake and checkpoints.
    state_dir: str = field(default_factory=_default_state_dir)

    # Kafka. Empty bootstrap servers means "the embedded broker", which the platform starts.
    kafka_bootstrap_servers: str = ""
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = ""
    kafka_ssl_cafile: str = ""
    kafka_client: str = "confluent"  # reader backend of the Spark Kafka source: confluent | kafka-python
    kafka_request_timeout_ms: int = 15000
    kafka_topic_partitions: int = 4
    kafka_topic_prefix: str = ""  # prepended to every pipeline's topic (shared clusters, tests)
    embedded_broker_port: int = 0  # 0 = pick a free port

    # Lake: file:///abs/path or s3://bucket/prefix. Empty means <state_dir>/lake.
    lake_root: str = ""
    namespace: str = "live"  # sandbox replays write to another namespace
    s3_endpoint_url: str = ""  # MinIO / moto; empty for AWS
    s3_region: str = "us-east-1"
    s3_allow_http: bool = False

    # Spark.
    checkpoint_root: str = ""  # a local or shared (Hadoop) path; empty means <state_dir>/checkpoints
    spark_master: str = "local[2]"
    spark_driver_memory: str = "2g"
    spark_shuffle_partitions: int = 2
    trigger_seconds: float = 1.0
    gold_trigger_seconds: float = 5.0  # gold MERGEs less often: fewer small commits, more CPU for silver
    # False: the bronze query also writes silver from the same micro-batch (lower latency).
    # True: silver is a query of its own that polls the bronze table (decoupled tiers).
    silver_query: bool = False
    max_offsets_per_trigger: int = 200_000

    # Coordination of writers to one live table (see tidewater.lake.locks).
    table_lock_timeout_seconds: float = 900.0

    # Stream supervision (see tidewater.orchestration.supervisor).
    stream_stall_seconds: float = 300.0  # alive but no heartbeat for this long: stalled, restart it
    stream_startup_seconds: float = 240.0  # a launched driver may take this long to claim its checkpoint
    stream_stop_timeout_seconds: float = 60.0  # graceful stop, then SIGKILL
    stream_max_restarts: int = 3  # restarts of a stream dying on every start without a batch; then failed

    # Airflow (the embedded default: SQLite + LocalExecutor, components as separate processes).
    airflow_port: int = 8080
    airflow_parallelism: int = 4
    supervise_schedule: str = "*/1 * * * *"
    batch_schedule: str = "@hourly"
    # First data interval of the scheduled batch DAGs (ISO-8601). Empty: the DAGs start paused at a
    # fixed date; the platform command sets it to the hour it first ran.
    batch_start_date: str = ""
    batch_max_active_runs: int = 2  # backfills cannot starve the schedule
    # A scheduled interval is recomputed this long after it ends (deferred in the triggerer, no worker
    # slot), so its events have reached silver and its windows are behind the stream's watermark.
    batch_settle_minutes: float = 5.0
    correction_schedule: str = "*/15 * * * *"
    correction_lookback_hours: float = 6.0
    maintenance_schedule: str = "@daily"
    vacuum_retention_hours: int = 168

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every field from ``TIDEWATER_*`` variables, then apply ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f.name, f.type, raw)
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

    def kafka_client_config(self) -> dict[str, Any]:
        """Security and timeout options in kafka-python's naming."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers.split(","),
            "security_protocol": self.kafka_security_protocol,
            "request_timeout_ms": self.kafka_request_timeout_ms,
        }
        if self.kafka_sasl_mechanism:
            config["sasl_mechanism"] = self.kafka_sasl_mechanism
            config["sasl_plain_username"] = self.kafka_sasl_username
            config["sasl_plain_password"] = self.kafka_sasl_password
        if self.kafka_ssl_cafile:
            config["ssl_cafile"] = self.kafka_ssl_cafile
        return config

    def topic(self, name: str) -> str:
        return f"{self.kafka_topic_prefix}{name}"

    # ---- validation -----------------------------------------------------------------------------

    def validate(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        if self.kafka_security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"TIDEWATER_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol!r} is not one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        if self.kafka_security_protocol.startswith("SASL") and not (
            self.kafka_sasl_mechanism and self.kafka_sasl_username
        ):
            raise ConfigError(
                "SASL needs TIDEWATER_KAFKA_SASL_MECHANISM, TIDEWATER_KAFKA_SASL_USERNAME and "
                "TIDEWATER_KAFKA_SASL_PASSWORD"
            )
        if self.kafka_client not in KAFKA_CLIENTS:
            raise ConfigError(f"TIDEWATER_KAFKA_CLIENT={self.kafka_client!r} is not one of {', '.join(KAFKA_CLIENTS)}")
        scheme = urlparse(self.lake_uri).scheme
        if scheme not in ("file", "s3", "s3a"):
            raise ConfigError(
                f"TIDEWATER_LAKE_ROOT={self.lake_root!r} must be file:///absolute/path or s3://bucket/prefix"
            )
        if self.lake_is_s3 and not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
            raise ConfigError(
                f"lake root {self.lake_uri} is on S3 but no credentials are set: export AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (and TIDEWATER_S3_ENDPOINT_URL for MinIO)"
            )
        if "://" in self.checkpoint_root and not self.checkpoint_root.startswith("file://"):
            raise ConfigError(
                f"TIDEWATER_CHECKPOINT_ROOT={self.checkpoint_root!r}: Spark checkpoints need a local or "
                "shared file-system path, not object storage"
            )
        if not self.namespace.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"TIDEWATER_NAMESPACE={self.namespace!r} may hold only letters, digits, - and _")


def _convert(name: str, annotation: Any, raw: str) -> Any:
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
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
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}") from None
    return raw
