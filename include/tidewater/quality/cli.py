"""``tidewater audit run|suites``: data-quality audits (what spark_jobs/audit.py runs) and their suites.

    tidewater audit run --pipeline P --start ISO --end ISO [--checks bronze,records,silver,reconciliation,gold]
                        [--namespace NS] [--trigger scheduled|backfill|replay|correction|manual]
                        [--dag-id D --run-id R --task-id T]
    tidewater audit suites [--check | --write]

``run`` prints ``tidewater: result {json}`` and exits 0 when every suite passed; when one failed
it still records and publishes everything, then fails in one line naming the failed expectations.
"""

from __future__ import annotations

import argparse
import json

from tidewater.batch.result import RESULT_PREFIX
from tidewater.config import Settings
from tidewater.errors import ConfigError, OneLineParser
from tidewater.pipelines import pipeline_option


def register(sub: argparse._SubParsersAction) -> None:
    from tidewater.quality.audit import CHECKS, TRIGGERS

    audit = sub.add_parser("audit", help="data-quality and reconciliation audits (Great Expectations)")
    commands = audit.add_subparsers(dest="audit_command", required=True, parser_class=OneLineParser)
    run = commands.add_parser("run", help="audit one interval: suites, reconciliation, audit table, Data Docs")
    run.add_argument("--pipeline", required=True)
    run.add_argument("--start", required=True, help="ISO-8601, inclusive (no offset: UTC)")
    run.add_argument("--end", required=True, help="ISO-8601, exclusive (no offset: UTC)")
    run.add_argument("--checks", default=",".join(CHECKS), help=f"comma list of {', '.join(CHECKS)} (default: all)")
    run.add_argument("--namespace", default=None, help="lake namespace (default: TIDEWATER_NAMESPACE or live)")
    run.add_argument("--trigger", default="manual", help=f"what asked for it: {', '.join(TRIGGERS)}")
    run.add_argument("--dag-id", default="")
    run.add_argument("--run-id", default="")
    run.add_argument("--task-id", default="")
    run.set_defaults(func=cmd_run)
    suites = commands.add_parser("suites", help="compare (or --write) the committed suites with the declarations")
    mode = suites.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a committed suite is stale (default)")
    mode.add_argument("--write", action="store_true", help="regenerate the committed suites")
    suites.set_defaults(func=cmd_suites)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.batch.interval import Interval
    from tidewater.lake.tables import check_lake_root
    from tidewater.pipelines.layout import PipelineLayout
    from tidewater.quality import suites
    from tidewater.quality.audit import AuditFailedError, AuditRequest, run_audit
    from tidewater.quality.validate import preload_great_expectations
    from tidewater.spark import build_session

    pipeline = pipeline_option(args.pipeline)
    request = AuditRequest(
        pipeline=pipeline,
        interval=Interval.parse(args.start, args.end),
        checks=tuple(c.strip() for c in args.checks.split(",") if c.strip()),
        namespace=args.namespace,
        trigger=args.trigger,
        dag_id=args.dag_id,
        dag_run_id=args.run_id,
        task_id=args.task_id,
    )
    check_lake_root(settings.lake_uri)
    layout = PipelineLayout.of(settings, pipeline, args.namespace)
    for name in layout.tier_tables("bronze" if request.needs_bronze else "silver"):
        layout.table(name).open()  # one line if missing
    for layer in suites.layers_of(pipeline):
        suites.load_suite(pipeline, layer)  # stale or missing suites fail before a JVM starts
    preload = preload_great_expectations()
    spark = build_session(settings, f"tidewater-audit-{pipeline.name}")
    try:
        preload.join()
        result = run_audit(spark, settings, request)
    finally:
        spark.stop()
    print(f"{RESULT_PREFIX}{json.dumps(result.to_dict(), sort_keys=True)}", flush=True)
    if not result.success:
        raise AuditFailedError(result.summary())
    return 0


def cmd_suites(args: argparse.Namespace, settings: Settings) -> int:
    from tidewater.pipelines import all_pipelines
    from tidewater.quality import suites

    if args.write:
        for pipeline in all_pipelines().values():
            for path in suites.write_suites(pipeline):
                print(f"wrote {path}")
        return 0
    stale = [reason for pipeline in all_pipelines().values() for reason in suites.stale_suites(pipeline)]
    if stale:
        raise ConfigError(f"{'; '.join(stale)}: run `tidewater audit suites --write`, review and commit")
    print("expectation suites match the pipeline declarations")
    return 0
