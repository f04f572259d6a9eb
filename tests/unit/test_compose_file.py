"""docker-compose.yml: the cluster profile's topology for Docker users, checked without a Docker engine.

The file must be a valid Compose file (the Compose Specification's JSON schema, vendored in
tests/data), set only variables tidewater reads, with a shared environment that passes the same
validation as ``./tw``, name every cluster-profile variable, point its addresses at its own services
and build its images from the project's Dockerfile, which installs requirements.lock.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from tidewater.config import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_FILE = ROOT / "tests" / "data" / "compose-spec.json"
DOCKERFILE = ROOT / "Dockerfile"
SHARED_ENV = "x-tidewater-env"
# What the cluster profile (./tw cluster up) configures tidewater with: the compose file must use these names.
CLUSTER_PROFILE_VARIABLES = (
    "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS",
    "TIDEWATER_LAKE_ROOT",
    "TIDEWATER_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "TIDEWATER_SPARK_MASTER",
    "TIDEWATER_LOCK_BACKEND",
    "TIDEWATER_POSTGRES_DSN",
    "TIDEWATER_AIRFLOW_DATABASE_URL",
    "TIDEWATER_STATE_DIR",
    "TIDEWATER_CHECKPOINT_ROOT",
    "TIDEWATER_AIRFLOW_PORT",
)
SETTING_VARIABLES = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
# Variables a user may set (shell or .env) to replace the development secrets.
CUSTOM_SECRETS = {
    "MINIO_ROOT_USER": "lake-user",
    "MINIO_ROOT_PASSWORD": "lake-pw-1",
    "POSTGRES_PASSWORD": "admin-pw-2",
    "AIRFLOW_DB_PASSWORD": "airflow-pw-3",
    "LOCKS_DB_PASSWORD": "locks-pw-4",
}


# ---- reading the file as Compose does -------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>\w+))")


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Compose's ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
    ``${VAR:+other}`` and ``$$`` in every string of ``value``."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"] or "", match["arg"] or ""
        current = variables.get(name)
        present = bool(current) if op.startswith(":") else current is not None
        if op.endswith("-"):
            return current if present else arg  # type: ignore[return-value]
        if op.endswith("?"):
            if not present:
                raise ValueError(f"${{{name}}} must be set: {arg}")
            return current  # type: ignore[return-value]
        if op.endswith("+"):
            return arg if present else ""
        return current or ""

    return _VARIABLE.sub(substitute, value)


@functools.cache
def raw_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose(variables: dict[str, str] | None = None) -> dict[str, Any]:
    """The file after YAML anchors and merges and after interpolation with ``variables`` (default: none
    set, so every default applies, as on a machine without a .env file)."""
    return interpolate(copy.deepcopy(raw_compose()), variables or {})


@functools.cache
def compose_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    )


def env_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in environment)
    return {key: "" if value is None else str(value) for key, value in environment.items()}


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def services(variables: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    return compose(variables)["services"]


def shared_env(variables: dict[str, str] | None = None) -> dict[str, str]:
    return {key: str(value) for key, value in compose(variables)[SHARED_ENV].items()}


def runs_tidewater(service: dict[str, Any]) -> bool:
    """Services whose process imports tidewater (Airflow components, topics, generator)."""
    return "docker/compose_service.py" in command_of(service)


def runs_spark_daemon(service: dict[str, Any]) -> bool:
    return "spark-class" in command_of(service)


# ---- the schema -----------------------------------------------------------------------------------


def test_the_vendored_schema_is_the_compose_specification() -> None:
    schema = compose_schema()
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert schema["title"] == "Compose Specification"
    assert "service" in schema["definitions"] and "healthcheck" in schema["definitions"]


@pytest.mark.parametrize("variables", [{}, CUSTOM_SECRETS], ids=["defaults", "custom-secrets"])
def test_the_compose_file_is_valid_against_the_compose_specification(variables: dict[str, str]) -> None:
    assert schema_errors(raw_compose()) == []
    assert schema_errors(compose(variables)) == []  # and after interpolation, as Compose checks it


BROKEN = {
    "unknown service key": lambda d: d["services"]["kafka"].update(restarts="always"),
    "misspelt healthcheck key": lambda d: d["services"]["postgres"]["healthcheck"].update(intervall="5s"),
    "unknown depends_on condition": lambda d: d["services"]["generator"]["depends_on"]["create-topics"].update(
        condition="service_done"
    ),
    "a nested environment value": lambda d: d["services"]["kafka"]["environment"].update(KAFKA_NODE_ID={"id": 1}),
    "ports as one string": lambda d: d["services"]["minio"].update(ports="127.0.0.1:9000:9000"),
    "unknown top-level key": lambda d: d.update(service={}),
}


@pytest.mark.parametrize("breakage", BROKEN.values(), ids=BROKEN.keys())
def test_the_schema_check_refuses_what_compose_would_refuse(breakage: Any) -> None:
    document = compose()
    breakage(document)
    assert schema_errors(document)


# ---- the variables --------------------------------------------------------------------------------


def test_every_tidewater_variable_the_file_sets_is_a_setting() -> None:
    document = compose()
    places = {SHARED_ENV: shared_env(), **{name: env_of(s) for name, s in document["services"].items()}}
    unknown = {
        f"{place}: {key}"
        for place, env in places.items()
        for key in env
        if key.startswith(ENV_PREFIX) and key not in SETTING_VARIABLES
    }
    assert not unknown, f"not tidewater settings (typo, or a setting that was renamed): {sorted(unknown)}"


@pytest.mark.parametrize("variables", [{}, CUSTOM_SECRETS], ids=["defaults", "custom-secrets"])
def test_the_shared_environment_passes_the_settings_validation(variables: dict[str, str]) -> None:
    env = shared_env(variables)
    settings = Settings.from_env(env)  # raises ConfigError on any value ./tw would refuse
    assert settings.lake_is_s3 and settings.s3_endpoint_url
    assert settings.lock_backend == "postgres" and settings.postgres_dsn
    assert settings.spark_master.startswith("spark://")  # the standalone master, not local[N]
    assert urlparse(settings.airflow_database_url).scheme.startswith("postgresql")
    assert settings.kafka_bootstrap_servers
    assert Path(settings.state_dir).is_absolute() and settings.checkpoint_dir.is_absolute()


@pytest.mark.parametrize("name", CLUSTER_PROFILE_VARIABLES)
def test_every_cluster_profile_variable_is_in_the_shared_environment(name: str) -> None:
    env = shared_env()
    assert name in env, f"{name} is not in {SHARED_ENV}: the compose file must use the cluster profile's names"
    assert env[name].strip(), f"{name} is empty in {SHARED_ENV}"


def test_every_service_running_tidewater_sees_the_shared_environment_and_the_spark_daemons_do_not() -> None:
    shared = shared_env()
    tidewater_services = {name: s for name, s in services().items() if runs_tidewater(s)}
    assert {"airflow-init", "airflow-api-server", "airflow-scheduler", "generator"} <= set(tidewater_services)
    for name, service in tidewater_services.items():
        env = env_of(service)
        missing_or_changed = {k for k, v in shared.items() if env.get(k) != v}
        assert not missing_or_changed, f"{name} does not see the shared {sorted(missing_or_changed)}"
        extra = {k for k in env if k.startswith((ENV_PREFIX, "AWS_")) and k not in shared}
        assert not extra, f"{name} sets {sorted(extra)} outside {SHARED_ENV}: every service must see the same"
    daemons = {name: s for name, s in services().items() if runs_spark_daemon(s)}
    assert set(daemons) == {"spark-master", "spark-worker"}
    for name, service in daemons.items():
        # As on the cluster profile: executors get the settings and credentials from their driver.
        leaked = {k for k in env_of(service) if k.startswith((ENV_PREFIX, "AWS_", "PYSPARK_"))}
        assert not leaked, f"{name} is given {sorted(leaked)}"


def test_every_interpolated_variable_has_a_default_and_secrets_reach_both_ends() -> None:
    names = {m["name"] or m["bare"] for m in _VARIABLE.finditer(COMPOSE_FILE.read_text()) if not m["escaped"]}
    without_default = {
        m["name"] or m["bare"]
        for m in _VARIABLE.finditer(COMPOSE_FILE.read_text())
        if not m["escaped"] and m["op"] not in (":-", "-")
    }
    assert not without_default, f"`docker compose up` needs these set: {sorted(without_default)}"
    assert set(CUSTOM_SECRETS) <= names
    assert not {n for n in names if n.startswith(ENV_PREFIX)}, "TIDEWATER_* are set in the file, not interpolated"
    for variables in ({}, CUSTOM_SECRETS):
        env, svc = shared_env(variables), services(variables)
        minio, postgres = env_of(svc["minio"]), env_of(svc["postgres"])
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
            minio["MINIO_ROOT_USER"],
            minio["MINIO_ROOT_PASSWORD"],
        )
        assert urlparse(env["TIDEWATER_AIRFLOW_DATABASE_URL"]).password == postgres["AIRFLOW_DB_PASSWORD"]
        assert dsn(env["TIDEWATER_POSTGRES_DSN"])["password"] == postgres["LOCKS_DB_PASSWORD"]
        if variables:
            assert minio["MINIO_ROOT_PASSWORD"] == variables["MINIO_ROOT_PASSWORD"]


# ---- the addresses point at this file's services --------------------------------------------------


def dsn(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split())


def created_databases() -> dict[str, str]:
    """Database -> owner, as docker/postgres-init.sh creates them."""
    script = (ROOT / "docker" / "postgres-init.sh").read_text()
    return dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", script))


def test_kafka_s3_and_postgres_addresses_are_services_of_this_file() -> None:
    env, svc = shared_env(), services()
    advertised = env_of(svc["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    listeners = {urlparse(listener).netloc for listener in advertised.split(",")}
    for server in env["TIDEWATER_KAFKA_BOOTSTRAP_SERVERS"].split(","):
        assert server in listeners, f"{server} is not one of kafka's advertised listeners {sorted(listeners)}"
    assert urlparse(env["TIDEWATER_S3_ENDPOINT_URL"]).hostname in svc
    assert urlparse(env["TIDEWATER_S3_ENDPOINT_URL"]).hostname == "minio"
    # Other S3 clients read the AWS_* spellings: they must name the same endpoint and region.
    for name in ("AWS_ENDPOINT", "AWS_ENDPOINT_URL"):
        assert env.get(name, env["TIDEWATER_S3_ENDPOINT_URL"]) == env["TIDEWATER_S3_ENDPOINT_URL"], name
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        assert env.get(name, env["TIDEWATER_S3_REGION"]) == env["TIDEWATER_S3_REGION"], name

    databases = created_databases()
    locks = dsn(env["TIDEWATER_POSTGRES_DSN"])
    assert locks["host"] in svc and databases.get(locks["dbname"]) == locks["user"]
    airflow = urlparse(env["TIDEWATER_AIRFLOW_DATABASE_URL"])
    assert airflow.hostname in svc and databases.get(airflow.path.lstrip("/")) == airflow.username


def test_the_lake_bucket_is_the_one_the_bucket_service_creates() -> None:
    bucket = urlparse(shared_env()["TIDEWATER_LAKE_ROOT"]).netloc
    script = " ".join(command_of(services()["create-bucket"]))
    created = re.findall(r"mc mb (?:--ignore-existing )?\w+/([\w.-]+)", script)
    assert created == [bucket]
    assert services()["create-bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_spark_master_url_and_the_shared_loopback() -> None:
    svc = services()
    master = urlparse(shared_env()["TIDEWATER_SPARK_MASTER"])
    master_cmd, worker_cmd = command_of(svc["spark-master"]), command_of(svc["spark-worker"])
    assert "org.apache.spark.deploy.master.Master" in master_cmd
    assert "org.apache.spark.deploy.worker.Worker" in worker_cmd
    assert (option(master_cmd, "--host"), int(option(master_cmd, "--port"))) == (master.hostname, master.port)
    assert worker_cmd[-1] == shared_env()["TIDEWATER_SPARK_MASTER"]
    if master.hostname in ("127.0.0.1", "localhost"):
        # tidewater's drivers bind to 127.0.0.1: master, worker and the processes that launch drivers
        # (the scheduler runs the tasks) and serve the execution API must share one network namespace.
        sharing = {"spark-master", "spark-worker", "airflow-scheduler", "airflow-api-server"}
        modes = {svc[name].get("network_mode") for name in sharing}
        assert len(modes) == 1 and next(iter(modes), "").startswith("service:"), modes
        owner = next(iter(modes)).removeprefix("service:")
        assert owner in svc and "network_mode" not in svc[owner]


def test_airflow_is_published_on_its_configured_port() -> None:
    svc, port = services(), shared_env()["TIDEWATER_AIRFLOW_PORT"]
    owner = svc["airflow-api-server"]["network_mode"].removeprefix("service:")
    assert f"127.0.0.1:{port}:{port}" in svc[owner]["ports"]
    assert "${TIDEWATER_AIRFLOW_PORT}" in " ".join(svc["airflow-api-server"]["healthcheck"]["test"])
    assert env_of(svc["airflow-api-server"]).get("AIRFLOW__API__HOST") == "0.0.0.0"


def test_state_and_checkpoints_are_on_a_volume_the_drivers_and_executors_share() -> None:
    env, svc = shared_env(), services()
    declared = set(compose()["volumes"])
    for name in ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "spark-worker"):
        mounts = {
            target: source
            for source, target, *_ in (v.split(":") for v in svc[name].get("volumes", []))
            if source in declared
        }
        for path in (env["TIDEWATER_STATE_DIR"], env["TIDEWATER_CHECKPOINT_ROOT"]):
            assert any(Path(path).is_relative_to(target) for target in mounts), f"{name} does not mount {path}"


# ---- the services' wiring -------------------------------------------------------------------------


def test_published_ports_are_bound_to_the_loopback_address() -> None:
    published = [(name, port) for name, s in services().items() for port in s.get("ports", [])]
    assert published
    for name, port in published:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond this machine"


def test_dependencies_name_services_and_wait_for_health_where_it_is_checked() -> None:
    svc = services()
    for name, service in svc.items():
        for target, rule in (service.get("depends_on") or {}).items():
            assert target in svc, f"{name} depends on unknown {target}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in svc[target], f"{name} waits for {target}'s health, which is not checked"
            if rule["condition"] == "service_completed_successfully":
                assert svc[target].get("restart", "no") == "no", f"{target} must run once to complete"
        mode = service.get("network_mode", "")
        if mode.startswith("service:"):
            assert mode.removeprefix("service:") in svc, f"{name} joins unknown {mode}"
    assert svc["airflow-scheduler"]["depends_on"]["airflow-api-server"]["condition"] == "service_healthy"
    assert svc["airflow-scheduler"]["depends_on"]["create-topics"]["condition"] == "service_completed_successfully"


def test_the_project_image_is_built_from_the_dockerfile() -> None:
    svc = services()
    built = {name: s for name, s in svc.items() if "build" in s}
    assert {"spark-master", "spark-worker", "airflow-api-server", "airflow-scheduler"} <= set(built)
    for name, service in built.items():
        build = service["build"] if isinstance(service["build"], dict) else {"context": service["build"]}
        context = (ROOT / build["context"]).resolve()
        assert context == ROOT, f"{name} builds from {context}"
        assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
        assert DOCKERFILE.is_file()
    project_images = {s["image"] for s in built.values()}
    assert len(project_images) == 1, project_images
    pulled = [name for name, s in svc.items() if s.get("image") in project_images and "build" not in s]
    assert not pulled, f"{pulled} would pull the project's image from a registry instead of building it"


def test_every_file_the_compose_file_names_exists() -> None:
    document = compose()
    declared = set(document.get("volumes") or {})
    named_files = []
    for name, service in document["services"].items():
        for volume in service.get("volumes", []):
            source = volume.get("source", "") if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith((".", "/")):
                named_files.append((name, source))
            else:
                assert source in declared, f"{name} mounts undeclared volume {source}"
        named_files += [(name, part) for part in command_of(service) if part.startswith("docker/")]
    assert ("postgres", "./docker/postgres-init.sh") in named_files
    for name, path in named_files:
        assert (ROOT / path).exists(), f"{name} names {path}, which is not in the repository"


def test_the_dockerfile_installs_the_lock_as_bootstrap_does() -> None:
    dockerfile = DOCKERFILE.read_text()
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    runs = " ".join(re.findall(r"^RUN (.*)", dockerfile.replace("\\\n", " "), flags=re.M))
    assert "-r requirements.lock" in runs and "scripts/bootstrap.sh" in runs
    assert re.search(r"-r requirements\.lock", bootstrap), "bootstrap.sh no longer installs requirements.lock"
    # The Dockerfile takes uv's pin from bootstrap.sh with this pattern: it must find one.
    assert "grep -o 'uv==[0-9.]*' scripts/bootstrap.sh" in dockerfile
    assert re.search(r"uv==[0-9.]+", bootstrap)
    base = re.search(r"^FROM python:(\d+\.\d+)-slim-bookworm\b", dockerfile, flags=re.M)
    assert base, "the base image is python:<version>-slim-bookworm"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(f"{base[1]}.0"), f"python {base[1]} does not satisfy {requires}"
    assert "openjdk-17-jre-headless" in runs
    users = re.findall(r"^USER (\S+)", dockerfile, flags=re.M)
    assert users and users[-1] not in ("root", "0"), "the image must not run as root"
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".state", ".git"} <= ignored, "the host's venv, state and history must stay out of the image"
