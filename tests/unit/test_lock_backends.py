"""Which table lock a deployment uses, and how a lock travels to the Delta stream sink as options."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.lake.lock_options import lock_from_options, lock_options
from tidewater.lake.locks import TableLock
from tidewater.lake.pg_locks import PostgresLock, lock_key
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout

DSN = "host=127.0.0.1 port=5432 user=postgres dbname=tidewater"


def test_flock_by_default_postgres_when_told(tmp_path: Path):
    rsvps = get_pipeline("rsvps")
    default = PipelineLayout.of(Settings(state_dir=str(tmp_path)), rsvps).lock("silver")
    assert isinstance(default, TableLock) and default.path.name == "silver.lock"
    told = Settings(state_dir=str(tmp_path), lock_backend="postgres", postgres_dsn=DSN)
    lock = PipelineLayout.of(told, rsvps).lock("gold/venue_response_counts")
    assert isinstance(lock, PostgresLock)
    assert (lock.dsn, lock.name, lock.timeout_s) == (DSN, "live/rsvps/gold.venue_response_counts", 900.0)


def test_a_postgres_backend_without_a_dsn_is_one_line():
    with pytest.raises(ConfigError, match="TIDEWATER_LOCK_BACKEND='postgres' needs TIDEWATER_POSTGRES_DSN"):
        Settings.from_env({"TIDEWATER_LOCK_BACKEND": "postgres"})
    with pytest.raises(ConfigError, match="TIDEWATER_LOCK_BACKEND='zookeeper'"):
        Settings.from_env({"TIDEWATER_LOCK_BACKEND": "zookeeper"})


def test_a_lock_survives_the_trip_through_data_source_options(tmp_path: Path):
    pg = PostgresLock(DSN, "live/rsvps/bronze", 12.5)
    assert lock_from_options(lock_options(pg), "s3://lake/bronze") == pg
    flock = TableLock(tmp_path / "bronze.lock", table="s3://lake/bronze", timeout_s=3.0)
    assert lock_from_options(lock_options(flock), "s3://lake/bronze") == flock
    assert lock_from_options({}, "s3://lake/bronze") is None


def test_lock_keys_are_stable_signed_64_bit_integers():
    assert lock_key("live/rsvps/silver") == lock_key("live/rsvps/silver") != lock_key("live/rsvps/bronze")
    assert all(-(2**63) <= lock_key(f"t{i}") < 2**63 for i in range(100))
