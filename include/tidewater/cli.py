"""The ``tidewater`` command.

    tidewater platform            broker (embedded unless configured) + generator + Airflow + supervised streams
                                  (--profile cluster: on the services of `tidewater cluster up`)
    tidewater cluster up|down|status|env   the cluster profile: PostgreSQL, S3 server, broker on S3, Spark, Airflow
    tidewater stop                stop the platform started from this state folder
    tidewater streams [stop]      health of each supervised stream (or stop them)
    tidewater stream rsvps        run one pipeline's streaming queries (what spark_jobs/stream.py calls)
    tidewater stream-host         one streaming job for every supervised pipeline (TIDEWATER_STREAM_HOST)
    tidewater generate ...        produce RSVP events (see --help)
    tidewater broker [--durable]  run the embedded broker alone (in memory, or its log on the embedded S3 server)
    tidewater topics create NAME  create a topic
    tidewater tables              list the lake's tables: version, rows, files, size
    tidewater sql "SELECT ..."    read-only SQL over the lake's tables, paged (time travel; --tables: catalog)
    tidewater pipelines           list declared pipelines

Errors are printed as one line (``tidewater: <Kind>: <what to do>``) and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tidewater.config import Settings
from tidewater.errors import TidewaterError, one_line

log = logging.getLogger("tidewater")


def build_parser() -> argparse.ArgumentParser:
    """Each package registers its own commands; this module only assembles them."""
    from tidewater.batch import cli as batch_cli
    from tidewater.connectors import cli as connectors_cli
    from tidewater.generator import cli as generator_cli
    from tidewater.orchestration import cli as orchestration_cli
    from tidewater.pipelines import cli as pipelines_cli
    from tidewater.quality import cli as audit_cli
    from tidewater.query import cli as query_cli
    from tidewater.streaming import cli as streaming_cli

    parser = argparse.ArgumentParser(
        prog="tidewater", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for package_cli in (
        orchestration_cli,
        streaming_cli,
        generator_cli,
        connectors_cli,
        pipelines_cli,
        batch_cli,
        query_cli,
        audit_cli,
    ):
        package_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kafka-python logs every refused connection as an ERROR; our one-line error says it better.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        settings = Settings.from_env()
        return int(args.func(args, settings) or 0)
    except TidewaterError as exc:
        print(f"tidewater: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # Spark/Java errors: one line first, details in the log
        print(f"tidewater: {one_line(exc)}", file=sys.stderr, flush=True)
        log.debug("details", exc_info=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
