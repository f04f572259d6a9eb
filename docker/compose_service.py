"""What docker-compose.yml's tidewater services run, built from the same settings as ``./tw``.

    python docker/compose_service.py airflow-init          migrate Airflow's metadata database, make the secrets
    python docker/compose_service.py airflow COMPONENT ...  run ``airflow COMPONENT ...`` with tidewater's configuration
    python docker/compose_service.py topics                create every selected pipeline's topics (idempotent)
    python docker/compose_service.py generate [--rate N]   produce each pipeline's sample events until stopped

Airflow's configuration is :func:`tidewater.orchestration.airflow_env.airflow_environment`, built from the
``TIDEWATER_*`` settings exactly as for ``./tw run`` (metadata database: ``TIDEWATER_AIRFLOW_DATABASE_URL``);
``AIRFLOW__*`` variables set on the container win over it (the compose file sets only
``AIRFLOW__API__HOST=0.0.0.0``, so that the published port reaches the api-server). The secrets (admin
password, JWT secret, Fernet key) are generated once into the shared state volume, by ``airflow-init``,
before any component starts. Errors are one line, as from the ``tidewater`` command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tidewater.config import Settings
from tidewater.errors import TidewaterError, one_line


def airflow_env(settings: Settings) -> dict[str, str]:
    from tidewater.orchestration.airflow_env import airflow_environment, ensure_secrets

    env = {**os.environ, **airflow_environment(settings, ensure_secrets(settings))}
    env.update({key: value for key, value in os.environ.items() if key.startswith("AIRFLOW__")})
    return env


def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def cmd_airflow(args: argparse.Namespace, settings: Settings) -> int:
    command = [airflow_bin(), *args.airflow_args]
    os.execve(command[0], command, airflow_env(settings))
    return 0  # not reached


def cmd_airflow_init(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.airflow_env import ADMIN_USER, passwords_file

    env = airflow_env(settings)
    print("tidewater: migrating Airflow's metadata database", flush=True)
    subprocess.run([airflow_bin(), "db", "migrate"], env=env, check=True, stdin=subprocess.DEVNULL)
    print(
        f"tidewater: Airflow user {ADMIN_USER}; its password is kept in {passwords_file(settings)} "
        f"(docker compose exec airflow-api-server cat {passwords_file(settings)})",
        flush=True,
    )
    return 0


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.generator.producer import ensure_topic
    from tidewater.pipelines import all_pipelines

    for pipeline in all_pipelines(settings).values():
        for source in pipeline.sources:
            topic = settings.topic(source.topic)
            ensure_topic(settings, topic, settings.kafka_topic_partitions)
            print(f"tidewater: topic {topic} ({pipeline.name})", flush=True)
    return 0


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.orchestration.platform import start_generator
    from tidewater.processes import StopOnSignal

    stopper = StopOnSignal().install()
    generators = start_generator(settings, rate=args.rate, seed=args.seed, stop=stopper.event)
    fed = ", ".join(generators.pipelines) or "none (no pipeline declares sample events)"
    print(f"tidewater: generator producing ~{args.rate:g} events/s to each pipeline: {fed}", flush=True)
    try:
        while not stopper.event.wait(5.0):
            if generators.error:
                raise TidewaterError(f"generator failed: {generators.error}")
    finally:
        stopper.event.set()
        generators.join(timeout=10)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compose_service", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("airflow-init", help="migrate Airflow's metadata database").set_defaults(func=cmd_airflow_init)
    airflow = sub.add_parser("airflow", help="an airflow command with tidewater's Airflow configuration")
    airflow.add_argument("airflow_args", nargs=argparse.REMAINDER)
    airflow.set_defaults(func=cmd_airflow)
    sub.add_parser("topics", help="create every selected pipeline's topics").set_defaults(func=cmd_topics)
    generate = sub.add_parser("generate", help="produce every selected pipeline's sample events")
    generate.add_argument("--rate", type=float, default=150.0, help="events/s per pipeline (default: %(default)s)")
    generate.add_argument("--seed", type=int, default=42)
    generate.set_defaults(func=cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args, Settings.from_env()) or 0)
    except (TidewaterError, subprocess.CalledProcessError) as exc:
        print(f"tidewater: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
