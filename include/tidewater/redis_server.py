"""A Redis server of our own on 127.0.0.1: the Celery broker of the cluster profile's CeleryExecutor option.

Debian's ``redis-server`` (``scripts/bootstrap.sh`` installs it), started in the foreground in its own
process group with a config on the command line: loopback only, protected mode, no snapshots and no
append-only file (Airflow re-queues what a lost queue held: the scheduler's task states live in
PostgreSQL, Redis only carries "run this" messages). ``stop()`` ends exactly the server it started.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.errors import TidewaterError
from tidewater.processes import stop_process_group

START_TIMEOUT_S = 30


class RedisError(TidewaterError):
    """The local Redis server could not be started."""


def redis_binary() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else "")
    if not found:
        raise RedisError(
            "no redis-server: install the Debian package redis-server (./tw does on first run), "
            "or use TIDEWATER_AIRFLOW_EXECUTOR=local"
        )
    return found


@dataclass
class LocalRedis:
    """One server: its folder (working directory, log) and port."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.folder / "redis.log"

    def command(self) -> list[str]:
        return [
            redis_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--protected-mode",
            "yes",
            "--dir",
            str(self.folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log_path),
        ]

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisError(f"redis-server exited with code {self.process.returncode}: see {self.log_path}")
            if self.ping():
                return
            time.sleep(0.1)
        self.stop()
        raise RedisError(f"redis-server did not answer on 127.0.0.1:{self.port} in {START_TIMEOUT_S} s")

    def ping(self) -> bool:
        """Does the server answer PING (the inline protocol: no client library needed)?"""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, timeout_s: float = 10) -> None:
        if self.process is not None:
            stop_process_group(self.process, timeout_s=timeout_s)
            self.process = None
