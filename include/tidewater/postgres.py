"""A PostgreSQL server of our own on 127.0.0.1: for the cluster profile's leases and Airflow's metadata.

The Debian binaries (``/usr/lib/postgresql/<version>/bin``) run as the ``postgres`` user when we are
root (PostgreSQL refuses to run as root): ``initdb`` once per data folder, then ``pg_ctl start`` with
the socket in the data folder and only the loopback address. ``stop()`` ends exactly the server this
object started (``pg_ctl stop -m fast``, then the postmaster's pid if that fails).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.errors import TidewaterError
from tidewater.processes import alive

START_TIMEOUT_S = 60


class PostgresError(TidewaterError):
    """The local PostgreSQL server could not be set up or started."""


def postgres_bin() -> Path:
    """The folder of the newest installed PostgreSQL server binaries."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise PostgresError("no PostgreSQL server binaries (pg_ctl): install the Debian package postgresql")


@dataclass
class LocalPostgres:
    """One server: its data folder, port and database; :attr:`dsn` connects as ``postgres``."""

    data_dir: Path
    port: int
    database: str = "tidewater"
    _started: bool = field(default=False, init=False)

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={self.database} connect_timeout=10"

    def url(self, database: str | None = None) -> str:
        """The SQLAlchemy URL of ``database`` (default: this server's), for Airflow's metadata."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database or self.database}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(postgres_bin() / args[0]), *args[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses root
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres", "postgres")

    def start(self) -> LocalPostgres:
        """initdb (first time), start, create the database; fails in one line with the server's log."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            blocked = [p for p in self.data_dir.parent.resolve().parents if not os.stat(p).st_mode & 0o001]
            if blocked or not os.stat(self.data_dir.parent).st_mode & 0o001:
                closed = blocked[0] if blocked else self.data_dir.parent
                raise PostgresError(
                    f"the postgres user cannot reach {self.data_dir} ({closed} is not searchable by others): "
                    "put the server's data folder under a world-searchable path"
                )
        if not (self.data_dir / "PG_VERSION").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir.chmod(0o700)
            self._own(self.data_dir)
            made = self._run(
                "initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"
            )
            if made.returncode != 0:
                raise PostgresError(f"initdb {self.data_dir} failed: {made.stderr.strip()[-500:]}")
        self.log_path.touch()
        self._own(self.log_path)
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data_dir} -c fsync=off"
        started = self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-w", "-o", options, "start")
        if started.returncode != 0:
            log = self.log_path.read_text(errors="replace")[-800:] if self.log_path.exists() else ""
            raise PostgresError(f"PostgreSQL did not start on 127.0.0.1:{self.port}: {started.stderr.strip()} {log}")
        self._started = True
        self.create_database(self.database)
        return self

    def adopt(self, pid: int) -> bool:
        """Take charge of this folder's server started by an earlier process (``tidewater cluster up``),
        if ``pid`` (what that process recorded) is still its postmaster; :meth:`stop` then stops it."""
        self._started = self.pid() == pid and self.running(pid)
        return self._started

    def create_database(self, name: str) -> None:
        """Create database ``name`` unless it exists."""
        import psycopg2

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                connection = psycopg2.connect(self.dsn.replace(f"dbname={self.database}", "dbname=postgres"))
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def pid(self) -> int | None:
        """The postmaster's pid (None when not running)."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            return int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self, pid: int) -> bool:
        """Whether ``pid`` is a live process (an exited one waiting to be reaped does not count)."""
        return alive(pid)

    def stop(self) -> None:
        """Stop the server this object started (fast shutdown; the postmaster killed if that fails)."""
        if not self._started:
            return
        pid = self.pid()
        stopped = self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
        if stopped.returncode != 0 and pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._started = False
