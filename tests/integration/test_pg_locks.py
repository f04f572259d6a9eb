"""Table locks across hosts: PostgreSQL session advisory locks on a real local server.

Real PostgreSQL (the Debian binaries, on 127.0.0.1), real processes: the holder runs in another
process tree (``start_new_session``), as a driver on another host would; the server, not a shared file
system, decides who holds the lock, and frees it the moment the holder's connection dies.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pipeline_helpers import delta_rows, produce_generated, run_stream
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.errors import CheckpointError
from tidewater.generator.producer import ensure_topic
from tidewater.lake.locks import TableLockTimeoutError
from tidewater.lake.pg_locks import PostgresLock
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.samples import GeneratorConfig
from tidewater.postgres import LocalPostgres
from tidewater.streaming.checkpoint import Checkpoint, claim, lease_holder

HOLDER = textwrap.dedent(
    """
    import sys, time
    from tidewater.lake.pg_locks import PostgresLock
    lock = PostgresLock(sys.argv[1], sys.argv[2], timeout_s=30)
    with lock.hold("a recompute on another host"):
        print("held", flush=True)
        time.sleep(float(sys.argv[3]))
        releasing = time.time()  # before the release: whoever gets the lock next gets it after this
    print("released", releasing, flush=True)
    """
)


@pytest.fixture(scope="module")
def postgres():
    # The server runs as the postgres user: its folder must be reachable by it (pytest's is root-only).
    root = Path(tempfile.mkdtemp(prefix="tidewater-pg-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "data", free_port())
    try:
        server.start()
        pid = server.pid()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert pid is not None and not server.running(pid)


def hold_elsewhere(postgres: LocalPostgres, name: str, seconds: float) -> subprocess.Popen[str]:
    """A holder in its own process tree; returns once it holds the lock."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, postgres.dsn, name, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_holder_in_another_process_tree_excludes_us_until_it_releases(postgres):
    holder = hold_elsewhere(postgres, "live/rsvps/gold.a", 2.0)
    try:
        lock = PostgresLock(postgres.dsn, "live/rsvps/gold.a", timeout_s=30)
        assert lock.holder().startswith("a recompute on another host (pid")
        with lock.hold("the stream's commit"):
            acquired = time.time()
            assert lock.holder() is not None
        assert lock.holder() is None
        # We got the lock only once the holder had let it go (its process may still be exiting).
        assert holder.stdout is not None
        word, released = holder.stdout.readline().split()
        assert word == "released" and acquired >= float(released)
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holders_lock_is_taken_over_at_once(postgres):
    holder = hold_elsewhere(postgres, "live/rsvps/gold.b", 600)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    lock = PostgresLock(postgres.dsn, "live/rsvps/gold.b", timeout_s=10)
    began = time.monotonic()
    with lock.hold("the next writer"):
        assert time.monotonic() - began < 5
    assert lock.holder() is None  # the dead holder's record is stale, not reported


def test_waiting_too_long_names_the_holder_in_one_line(postgres):
    holder = hold_elsewhere(postgres, "live/rsvps/gold.c", 30)
    try:
        lock = PostgresLock(postgres.dsn, "live/rsvps/gold.c", timeout_s=0.5)
        with (
            pytest.raises(TableLockTimeoutError, match=r"held by a recompute on another host .* for over 0.5 s"),
            lock.hold("an impatient writer"),
        ):
            pass
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_reentrant_within_a_thread_and_exclusive_between_threads(postgres):
    lock = PostgresLock(postgres.dsn, "live/rsvps/gold.d", timeout_s=10)
    order: list[str] = []
    with lock.hold("outer"), lock.hold("inner (the same thread: no deadlock)"):
        other = threading.Thread(target=lambda: _take(lock, order))
        other.start()
        time.sleep(0.5)
        order.append("main done")
    other.join(timeout=10)
    assert order == ["main done", "thread got it"]


def _take(lock: PostgresLock, order: list[str]) -> None:
    with lock.hold("another thread"):
        order.append("thread got it")


def test_the_platform_takes_its_table_locks_in_postgres_when_told(postgres, spark, broker, tmp_path):
    """TIDEWATER_LOCK_BACKEND=postgres: the layout's locks are advisory locks on the server, and the
    stream (silver as its own query: the Delta sink rebuilds its lock from the data source options)
    commits through them."""
    settings = Settings(
        state_dir=str(tmp_path / "state"),
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"pglock-{os.getpid()}-",
        lock_backend="postgres",
        postgres_dsn=postgres.dsn,
        silver_query=True,
        pipelines="rsvps",
    )
    layout = PipelineLayout.of(settings, get_pipeline("rsvps"))
    silver = layout.lock("silver")
    assert isinstance(silver, PostgresLock) and silver.name.endswith("/rsvps/silver")
    topic = settings.topic(get_pipeline("rsvps").source().topic)
    ensure_topic(settings, topic, 2)
    produce_generated(settings, topic, GeneratorConfig(seed=3, rate=20), 200)
    run_stream(spark, settings, "rsvps")
    assert len(delta_rows(layout, "silver")) == 200
    holder = hold_elsewhere(postgres, silver.name, 30)  # another host's recompute holds silver
    try:
        impatient = dataclasses.replace(silver, timeout_s=0.5)  # the stream's own lock, waiting less
        with pytest.raises(TableLockTimeoutError, match="a recompute on another host"), impatient.hold("a stream"):
            pass
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_a_checkpoint_lease_in_postgres_refuses_a_second_driver_and_frees_with_the_first(postgres, tmp_path):
    """Two drivers on one checkpoint, seen through two different paths (two mounts of a shared folder:
    an flock would let both in): the lease is named after the query, so the second is refused."""
    settings = Settings(state_dir=str(tmp_path / "state"), lock_backend="postgres", postgres_dsn=postgres.dsn)
    layout = PipelineLayout.of(settings, get_pipeline("rsvps"))
    lease = layout.checkpoint_lease("bronze")
    assert lease is not None and lease.name == "checkpoint:live/rsvps/bronze"

    def claim_bronze() -> Checkpoint:  # through another mount than the one the holder is seen by
        return claim(
            tmp_path / "mount-b" / "bronze",
            pipeline="rsvps",
            namespace="live",
            query="bronze",
            source="s",
            target="t",
            lease=lease,
        )

    holder = hold_elsewhere(postgres, lease.name, 600)  # a driver on another host
    try:
        assert "pid" in (lease_holder(tmp_path / "mount-a", lease) or "")
        with pytest.raises(CheckpointError, match="in use by a running driver"):
            claim_bronze()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    checkpoint = claim_bronze()
    try:
        held = lease_holder(tmp_path / "mount-a", lease)
        assert held is not None and f"pid {os.getpid()}" in held and " since " in held
    finally:
        checkpoint.release()
    assert lease_holder(tmp_path / "mount-a", lease) is None
