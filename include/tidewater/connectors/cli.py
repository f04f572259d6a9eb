"""``tidewater broker`` and ``tidewater topics``: the embedded Kafka broker and topic administration."""

from __future__ import annotations

import argparse
from pathlib import Path

from tidewater.config import Settings
from tidewater.processes import StopOnSignal


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run the embedded broker until Ctrl-C")
    broker.add_argument("--port", type=int, default=0)
    broker.add_argument(
        "--durable", action="store_true", help="keep the log on the embedded S3 server (restarts resume)"
    )
    broker.add_argument("--data-dir", default="", help="the durable broker's folder (default: <state dir>/broker)")
    broker.set_defaults(func=cmd_broker)

    topics = sub.add_parser("topics", help="manage topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=4)
    create.set_defaults(func=cmd_topics)


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.broker import DurableBroker, EmbeddedBroker

    stopper = StopOnSignal().install()
    port = args.port or settings.embedded_broker_port
    if args.durable:
        data_dir = Path(args.data_dir or Path(settings.state_dir, "broker")).absolute()
        with DurableBroker(data_dir, port=port) as durable:
            print(
                f"tidewater: embedded broker (durable: log on the S3 server {durable.s3.endpoint_url}, data in "
                f"{data_dir}) on {durable.bootstrap_servers} (Ctrl-C stops it)",
                flush=True,
            )
            stopper.event.wait()
        return 0
    with EmbeddedBroker(port=port) as broker:
        print(f"tidewater: embedded broker (in-memory) on {broker.bootstrap_servers} (Ctrl-C stops it)", flush=True)
        stopper.event.wait()
    return 0


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.generator.producer import ensure_topic

    ensure_topic(settings, args.name, args.partitions)
    print(f"tidewater: topic {args.name} ready on {settings.kafka_bootstrap_servers}")
    return 0
