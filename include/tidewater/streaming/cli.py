"""``tidewater stream PIPELINE``: run a pipeline's streaming queries (what spark_jobs/stream.py calls).

The long-running job ends, exiting 0 after releasing its checkpoint leases, on SIGTERM/SIGINT or on a
stop request written beside its checkpoints after ``--launched-at`` (see
:mod:`tidewater.streaming.stop_request`).
"""

from __future__ import annotations

import argparse

from tidewater.config import Settings, check_namespace
from tidewater.errors import one_line
from tidewater.processes import StopOnSignal


def register(sub: argparse._SubParsersAction) -> None:
    stream = sub.add_parser("stream", help="run a pipeline's streaming queries")
    stream.add_argument("pipeline")
    stream.add_argument("--namespace", default=None, help="lake namespace (default: TIDEWATER_NAMESPACE or live)")
    stream.add_argument(
        "--available-now", action="store_true", help="process what is available, tier by tier, then exit"
    )
    stream.add_argument(
        "--trigger-seconds",
        type=float,
        default=None,
        help="the source queries' trigger (default: TIDEWATER_TRIGGER_SECONDS); a source that declares"
        " trigger_interval keeps its own, gold keeps TIDEWATER_GOLD_TRIGGER_SECONDS (or the interval a gold"
        " table declares)",
    )
    stream.add_argument(
        "--launched-at",
        type=float,
        default=None,
        help="unix time the job was launched (by the supervisor); stop requests older than it are ignored",
    )
    stream.set_defaults(func=cmd_stream)

    host = sub.add_parser(
        "stream-host",
        help="one streaming job for every supervised pipeline (TIDEWATER_STREAM_HOST; the supervisors launch it)",
    )
    host.add_argument("--namespace", default=None, help="lake namespace (default: TIDEWATER_NAMESPACE or live)")
    host.set_defaults(func=cmd_stream_host)


def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.pipelines import get_pipeline
    from tidewater.spark import build_session
    from tidewater.streaming.jobs import job_master
    from tidewater.streaming.runner import PipelineStreams

    pipeline = get_pipeline(args.pipeline)
    stopper = StopOnSignal().install()
    streams = PipelineStreams(settings, pipeline, namespace=args.namespace, launched_at=args.launched_at)
    spark = None
    try:
        streams.preflight()  # one-line errors before a JVM starts (no Kafka servers set, too)
        master = job_master(settings, pipeline.name)  # spark-submit's, when it launched this job
        spark = build_session(settings, f"tidewater-stream-{pipeline.name}", streaming=True, master=master)
        if args.available_now:
            streams.run_available_now(spark, give_back_startup_workers=True)  # this process runs it once
        else:
            print(f"tidewater: streaming {pipeline.name} ({', '.join(t.query for t in streams.tiers)})", flush=True)
            streams.run_forever(spark, stopper.event, trigger_seconds=args.trigger_seconds)
    finally:
        streams.close()  # stops queries, releases checkpoint leases
        if spark is not None:
            spark.stop()
    return 0


def cmd_stream_host(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.spark import build_session
    from tidewater.streaming.host import StreamHost, host_master

    stopper = StopOnSignal().install()
    namespace = check_namespace(args.namespace, "--namespace") if args.namespace else settings.namespace
    host = StreamHost(settings, namespace, stopper.event)
    try:
        spark = build_session(settings, "tidewater-stream-host", streaming=True, master=host_master(settings))
    except Exception as exc:  # the pipelines waiting for this host say why in their own logs
        host.fail_pending(f"tidewater: {one_line(exc)} (the stream host did not start)")
        raise
    try:
        print(f"tidewater: stream host for namespace {host.namespace} ({spark.sparkContext.master})", flush=True)
        host.run(spark)
    finally:
        spark.stop()
    return 0
