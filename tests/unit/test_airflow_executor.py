"""Airflow's executor from the settings: LocalExecutor by default, CeleryExecutor on Redis as the option."""

from __future__ import annotations

import pytest

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.orchestration.airflow_env import executor_environment
from tidewater.orchestration.airflow_local import components

PG = "postgresql+psycopg2://postgres@127.0.0.1:5433/airflow"


def test_the_default_is_the_local_executor_and_the_four_components():
    assert executor_environment(Settings()) == {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
    assert list(components(Settings())) == ["api-server", "scheduler", "dag-processor", "triggerer"]


def test_celery_queues_on_redis_keeps_results_in_the_metadata_db_and_adds_a_worker():
    settings = Settings(
        airflow_executor="celery",
        celery_broker_url="redis://127.0.0.1:6390/0",
        airflow_database_url=PG,
        airflow_parallelism=3,
    )
    env = executor_environment(settings)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6390/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + PG
    assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "3"
    assert components(settings)["celery-worker"] == ["celery", "worker", "--skip-serve-logs"]


@pytest.mark.parametrize(
    "changes",
    [
        {"airflow_database_url": PG},  # no queue
        {"celery_broker_url": "redis://127.0.0.1:6390/0"},  # SQLite: workers on other hosts cannot share it
    ],
)
def test_celery_without_a_queue_or_a_shared_database_is_one_clear_line(changes):
    with pytest.raises(ConfigError, match="TIDEWATER_AIRFLOW_EXECUTOR='celery' needs") as error:
        executor_environment(Settings(airflow_executor="celery", **changes))
    assert "\n" not in str(error.value)


def test_an_unknown_executor_or_queue_is_refused_by_the_settings():
    with pytest.raises(ConfigError, match="TIDEWATER_AIRFLOW_EXECUTOR"):
        Settings.from_env({"TIDEWATER_AIRFLOW_EXECUTOR": "kubernetes"})
    with pytest.raises(ConfigError, match="TIDEWATER_CELERY_BROKER_URL"):
        Settings.from_env({"TIDEWATER_CELERY_BROKER_URL": "amqp://127.0.0.1"})
