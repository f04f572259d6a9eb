"""Where the checkout's own files are: the package is installed editable from ``include/``."""

from __future__ import annotations

from pathlib import Path

from tidewater.errors import ConfigError


def project_root() -> Path:
    """The checkout holding dags/ and spark_jobs/ beside include/."""
    return Path(__file__).resolve().parents[2]


def spark_job(name: str) -> Path:
    """A thin spark-submit entry point under spark_jobs/."""
    path = project_root() / "spark_jobs" / f"{name}.py"
    if not path.exists():
        raise ConfigError(f"spark job {path} not found: run tidewater from its checkout (./tw)")
    return path


def dags_folder() -> Path:
    return project_root() / "dags"


def plugins_folder() -> Path:
    """Airflow's plugins folder: the thin plugin that mounts tidewater.ui in the api-server."""
    return project_root() / "plugins"
