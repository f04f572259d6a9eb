"""``tidewater batch recompute|replay|correct``: the commands spark_jobs/batch.py runs.

    tidewater batch recompute --pipeline P --start ISO --end ISO --run-id ID [--namespace NS] [--layers silver,gold]
    tidewater batch replay    --pipeline P --start ISO --end ISO --run-id ID [--namespace NS]
                              [--source bronze|kafka] [--target live|sandbox] [--sandbox-namespace NAME]
                              [--entity V ...]
    tidewater batch correct   --pipeline P --start ISO --end ISO --run-id ID [--namespace NS]

Every argument is checked before a JVM starts, each failing in one line with exit status 2. The
last line of a successful run is ``tidewater: result {json}`` (see :class:`BatchResult`).
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidewater.batch.result import RESULT_PREFIX
from tidewater.config import Settings, check_namespace
from tidewater.errors import ConfigError, OneLineParser
from tidewater.pipelines import pipeline_option

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tidewater.batch.requests import ReplayRequest
    from tidewater.batch.result import BatchResult
    from tidewater.pipelines.base import Pipeline

COMMANDS = {
    "recompute": "rebuild silver and gold of an event-time interval from bronze (the scheduled batch)",
    "replay": "rebuild a range (optionally some entities) from bronze or Kafka, into live or a sandbox",
    "correct": "correct closed gold windows from silver (late data), recording every change in the ledger",
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``batch`` command and its sub-commands to the ``tidewater`` parser."""
    batch = sub.add_parser("batch", help="bounded recomputes: interval recompute, replay, late-data correction")
    commands = batch.add_subparsers(dest="batch_command", required=True, parser_class=OneLineParser)
    for name, text in COMMANDS.items():
        parser = commands.add_parser(name, help=text, description=text)
        parser.add_argument("--pipeline", required=True)
        parser.add_argument("--start", required=True, help="ISO-8601, inclusive (no offset: UTC)")
        parser.add_argument("--end", required=True, help="ISO-8601, exclusive (no offset: UTC)")
        parser.add_argument("--run-id", required=True, help="labels every commit and ledger entry (e.g. the DAG run)")
        parser.add_argument(
            "--namespace",
            default=None,
            help="the lake namespace read and (unless a sandbox replay) written (default: TIDEWATER_NAMESPACE or live)",
        )
        if name == "recompute":
            parser.add_argument(
                "--layers",
                default="silver,gold",
                help="silver, gold or both (default); gold alone is recomputed from the silver table",
            )
        if name == "replay":
            parser.add_argument("--source", default="bronze", help="bronze (default) or kafka")
            parser.add_argument("--target", default="sandbox", help="sandbox (default) or live")
            parser.add_argument("--sandbox-namespace", default=None, help="namespace a sandbox replay writes to")
            parser.add_argument(
                "--entity", action="append", default=[], help="restrict to this entity value (repeatable)"
            )
        parser.set_defaults(func=lambda args, settings: run(args, settings))


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Validate, start Spark, run, stop Spark, print the result line."""
    job = prepare(args, settings)
    from tidewater.spark import build_session

    spark = build_session(settings, f"tidewater-batch-{args.batch_command}-{args.pipeline}")
    try:
        result = job(spark)
    finally:
        spark.stop()
    print(f"{RESULT_PREFIX}{result.to_json()}", flush=True)
    return 0


def prepare(args: argparse.Namespace, settings: Settings) -> Callable[[SparkSession], BatchResult]:
    """Every check that needs no JVM, then the job as a function of the Spark session."""
    from tidewater.batch import recompute
    from tidewater.batch.correction import correct_late_data
    from tidewater.batch.interval import Interval
    from tidewater.batch.requests import BRONZE
    from tidewater.batch.targets import check_run_id
    from tidewater.lake.tables import check_lake_root
    from tidewater.pipelines.layout import PipelineLayout

    pipeline = pipeline_option(args.pipeline)
    namespace = check_namespace(args.namespace or settings.namespace, "--namespace")
    request = replay_request(args, settings, pipeline, namespace=namespace) if args.batch_command == "replay" else None
    interval = request.interval if request is not None else Interval.parse(args.start, args.end)
    run_id = check_run_id(args.run_id)
    check_lake_root(settings.lake_uri)
    layout = PipelineLayout.of(settings, pipeline, namespace)
    common: dict[str, Any] = {"run_id": run_id, "namespace": namespace}

    if args.batch_command == "recompute":
        for name in layout.tier_tables("bronze"):
            layout.table(name).open()  # LakePathError in one line if the namespace has no bronze
        layers = tuple(layer.strip() for layer in args.layers.split(",") if layer.strip())
        if not layers or any(layer not in recompute.LAYERS for layer in layers):
            raise ConfigError(f"--layers {args.layers!r}: give silver, gold or silver,gold")
        return lambda spark: recompute.recompute_interval(
            spark, settings, pipeline, interval.start, interval.end, layers=layers, **common
        )
    if args.batch_command == "correct":
        for name in layout.tier_tables("silver"):
            layout.table(name).open()
        return lambda spark: correct_late_data(spark, settings, pipeline, interval.start, interval.end, **common)

    assert request is not None, "replay is the one command left"
    if request.source == BRONZE:
        for name in layout.tier_tables("bronze"):
            layout.table(name).open()
    else:
        _check_topic(settings, pipeline)
    return lambda spark: recompute.run_replay(spark, settings, pipeline, request, **common)


def replay_request(
    args: argparse.Namespace,
    settings: Settings,
    pipeline: Pipeline,
    *,
    namespace: str | None = None,
    now: dt.datetime | None = None,
) -> ReplayRequest:
    """The replay command's options as a request, checked by the rules the replay DAG's validate task
    applies to the same request (:meth:`ReplayRequest.parse`), refusals naming the options."""
    from tidewater.batch.requests import OPTIONS, ReplayRequest

    return ReplayRequest.parse(
        settings,
        pipeline,
        start=args.start,
        end=args.end,
        source=args.source,
        target=args.target,
        sandbox_namespace=args.sandbox_namespace,
        entities=args.entity,
        namespace=namespace,
        now=now,
        spelling=OPTIONS,
    )


def _check_topic(settings: Settings, pipeline: Pipeline) -> None:
    """Broker reachable and topics present (one-line errors), before Spark plans a Kafka read."""
    from tidewater.connectors.kafka_client import topic_partitions

    for source in pipeline.sources:
        topic_partitions(settings, settings.topic(source.topic))
