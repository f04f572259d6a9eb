"""The local Airflow deployment's configuration: environment variables and generated secrets.

Everything Airflow needs is passed as ``AIRFLOW__*`` variables built from :class:`Settings`, so
the components, task processes and ``airflow`` CLI calls all see one configuration and no
``airflow.cfg`` has to be edited. Secrets (admin password, JWT secret, API secret key, Fernet key)
are generated once and kept, readable by the owner only, under ``<state_dir>/airflow``; there is
no fixed default password.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet

from tidewater.config import Settings
from tidewater.errors import ConfigError
from tidewater.paths import dags_folder, plugins_folder
from tidewater.processes import SPARK_PROCESSES_ONLY, spark_child_env

ADMIN_USER = "admin"
SECRETS_FILE = "tidewater-secrets.json"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


@dataclass(frozen=True)
class AirflowSecrets:
    admin_password: str
    jwt_secret: str
    api_secret_key: str
    fernet_key: str
    created: bool  # True the first time: the only time the password is printed


def passwords_file(settings: Settings) -> Path:
    return settings.airflow_home / PASSWORDS_FILE


def ensure_secrets(settings: Settings) -> AirflowSecrets:
    """Load the deployment's secrets, generating them on first use (files mode 0600)."""
    home = settings.airflow_home
    home.mkdir(parents=True, exist_ok=True)
    path = home / SECRETS_FILE
    created = not path.exists()
    if created:
        values = {
            "jwt_secret": secrets.token_urlsafe(48),
            "api_secret_key": secrets.token_urlsafe(32),
            "fernet_key": Fernet.generate_key().decode(),
        }
        _write_private(path, json.dumps(values, indent=2))
    values = json.loads(path.read_text())
    pw_path = passwords_file(settings)
    if not pw_path.exists():
        _write_private(pw_path, json.dumps({ADMIN_USER: secrets.token_urlsafe(18)}))
        created = True
    password = json.loads(pw_path.read_text())[ADMIN_USER]
    return AirflowSecrets(
        admin_password=password,
        jwt_secret=values["jwt_secret"],
        api_secret_key=values["api_secret_key"],
        fernet_key=values["fernet_key"],
        created=created,
    )


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def api_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.airflow_port}"


def executor_environment(settings: Settings) -> dict[str, str]:
    """Airflow's executor: LocalExecutor, or CeleryExecutor on Redis with results in the metadata DB."""
    if settings.airflow_executor != "celery":
        return {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
    # Checked here, not in Settings: `cluster up` is given "celery" before the Redis it starts exists.
    if not (settings.celery_broker_url and settings.airflow_database_url.startswith(("postgresql", "mysql"))):
        raise ConfigError(
            "TIDEWATER_AIRFLOW_EXECUTOR='celery' needs TIDEWATER_CELERY_BROKER_URL (redis://127.0.0.1:6379/0) "
            "and a PostgreSQL TIDEWATER_AIRFLOW_DATABASE_URL (workers share it); "
            "`./tw cluster up --executor celery` sets both"
        )
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": settings.celery_broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + settings.airflow_database_url,
        # Each worker slot forks a task supervisor; a Spark task then starts its own JVM.
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(settings.airflow_parallelism),
        "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
    }


def airflow_environment(settings: Settings, airflow_secrets: AirflowSecrets) -> dict[str, str]:
    """Variables for every Airflow process (components, tasks, CLI) of the local deployment."""
    home = settings.airflow_home
    venv_bin = str(Path(sys.executable).parent)
    spark_conn = {"conn_type": "spark", "host": settings.spark_master, "extra": {"deploy-mode": "client"}}
    return {
        **settings.to_env(),  # task processes read their Settings from these
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder()),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder()),  # the lake pages (tidewater.ui)
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **executor_environment(settings),
        "AIRFLOW__CORE__PARALLELISM": str(settings.airflow_parallelism),
        "AIRFLOW__CORE__DEFAULT_TIMEZONE": "utc",
        "AIRFLOW__CORE__FERNET_KEY": airflow_secrets.fernet_key,
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file(settings)),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url(settings)}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": settings.airflow_database_url or f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(settings.airflow_port),
        "AIRFLOW__API__BASE_URL": api_url(settings),
        "AIRFLOW__API__SECRET_KEY": airflow_secrets.api_secret_key,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__EXPOSE_CONFIG": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": airflow_secrets.jwt_secret,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark_conn),
        # spark-submit, airflow and the venv interpreter first on PATH; Spark's Python is the venv's.
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        **{name: value for name, value in spark_child_env().items() if name not in SPARK_PROCESSES_ONLY},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
